"""kit.serve.client: SSE parsing, event classification, request records (cases E1-E2, exact time stamps), the
request body and headers, the model listing's errors, error texts."""

import asyncio
import json
import time

import pytest
from sse_server import chars, script

from kit.serve import client
from kit.serve.aggregate import aggregate
from kit.serve.load import LoadConfig, run_coro
from kit.serve.sse import SSEParser, classify_event
from kit.serve.workload import RequestInput


def sse_bytes(payload) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def replay(name: str, chat: bool = True, split: bool = False) -> client.StreamCapture:
    """Feed a scripted scenario to the real parser and capture with its *exact* time stamps (t0 = 0)."""
    cap, parser = client.StreamCapture(t_send=0.0), SSEParser()
    for t, payload in script(name, chat, 64, 5.0):
        raw = sse_bytes(payload)
        if split:  # the event arrives in two network reads; it completes (and is stamped) at the second
            cap.add_events(parser.feed(raw[:7]), t - 0.01)
            cap.add_events(parser.feed(raw[7:]), t)
        else:
            cap.add_events(parser.feed(raw), t)
    cap.add_events(parser.close(), 99.0)
    cap.finish()
    return cap


# ---------------------------------------------------------------- E1-E2, exact
@pytest.mark.parametrize("split", [False, True])
def test_e1_role_chunk_multi_token_chunk_usage_chunk(split):
    cap = replay("e1", split=split)
    assert cap.error is None and cap.done
    rec = client.request_record(cap, RequestInput("p", 4, 64), client.token_counter(chars))
    assert rec["ok"]
    assert rec["ttft_ms"] == pytest.approx(500.0)  # not 50 (the role-only chunk)
    assert rec["e2el_ms"] == pytest.approx(1000.0)
    assert rec["output_tokens"] == 6 and not rec["output_tokens_estimated"]  # not 4 chunks, not 64
    assert rec["tpot_ms"] == pytest.approx(100.0)
    assert rec["chunk_gaps_ms"] == pytest.approx([100.0, 300.0, 100.0])
    assert rec["itl_ms"] == pytest.approx([100.0] * 5)
    assert 500.0 not in [round(x, 6) for x in rec["itl_ms"]]  # the ITL list never contains the TTFT
    assert rec["osl_mismatch"]  # 6 tokens for max_tokens 64 is flagged


def test_e1_with_continuous_usage_needs_no_tokenizer():
    rec = client.request_record(replay("e1u"), RequestInput("p", 4, 64), None)
    assert rec["tokens_per_chunk_source"] == "usage"
    assert rec["itl_ms"] == pytest.approx([100.0] * 5)
    assert rec["output_tokens"] == 6 and rec["tpot_ms"] == pytest.approx(100.0)


def test_e2_one_and_zero_output_tokens():
    a = client.request_record(replay("e2a", chat=False), RequestInput("p", 4, 64), client.token_counter(chars))
    assert a["ok"] and a["ttft_ms"] == pytest.approx(300.0) and a["tpot_ms"] is None and a["itl_ms"] == []
    b = client.request_record(replay("e2b", chat=False), RequestInput("p", 4, 64), client.token_counter(chars))
    assert b["ok"] and b["output_tokens"] == 0 and b["ttft_ms"] is None and b["tpot_ms"] is None
    c = client.request_record(replay("e2c", chat=False), RequestInput("p", 4, 64), None)
    assert c["ok"] and c["output_tokens"] == 2
    assert c["itl_ms"] == pytest.approx([100.0])  # the whitespace chunk (0 tokens) adds no ITL entry
    # B (no usage, tokenizer says whitespace is 0 tokens) gives the same
    cap = replay("e2c", chat=False)
    cap.chunk_usage = [None] * len(cap.chunk_usage)
    assert client.request_record(cap, RequestInput("p", 4, 64), client.token_counter(chars))["itl_ms"] == pytest.approx(
        [100.0]
    )
    cfg = LoadConfig(url="http://x", slo_tpot_ms=50.0)
    row = aggregate([a, b, c], cfg, {"duration_s": 1.0})
    assert row["completed"] == 3 and row["failed"] == 0
    assert row["tpot_n"] == 1  # only C has a TPOT; A (1 token) and B (0 tokens) are excluded, no ZeroDivision
    assert row["x_good_requests"] == 2  # A and B pass the TPOT SLO by definition; C's 100 ms does not


# ---------------------------------------------------------------- parsing details
def test_sse_parser_crlf_multiline_comments_and_eof_without_blank_line():
    p = SSEParser()
    out = p.feed(b': keep-alive\r\n\r\ndata: {"a":\r\ndata: 1}\r\n\r\nevent: x\ndata: [DONE]')
    assert out == ['{"a":\n1}']
    assert p.close() == ["[DONE]"]


def test_classify_events():
    assert classify_event({"choices": [], "usage": {"completion_tokens": 3}})[2] == {"completion_tokens": 3}
    assert classify_event({"choices": [{"delta": {"role": "assistant"}}]})[0] == ""
    assert classify_event({"choices": [{"delta": {"reasoning_content": "hm"}}]})[0] == "hm"
    assert classify_event({"choices": [{"text": "", "token_ids": [5, 6]}]})[1] == 2
    assert "boom" in classify_event({"object": "error", "message": "boom"})[4]
    assert "boom" in classify_event({"error": {"message": "boom"}})[4]


def test_done_is_never_parsed_and_bad_json_is_an_error():
    cap = client.StreamCapture()
    cap.add_events(["[DONE]"], 1.0)
    assert cap.done and cap.error is None
    cap.add_events(["{not json"], 1.1)
    assert "malformed" in cap.error


def test_stream_without_done_finish_or_usage_is_truncated():
    cap = client.StreamCapture()
    cap.add_events([json.dumps({"choices": [{"text": "a"}]})], 0.1)
    cap.finish()
    assert "truncated" in cap.error
    cap2 = client.StreamCapture()
    cap2.add_events([json.dumps({"choices": [{"text": "a", "finish_reason": "length"}]})], 0.1)
    cap2.finish()
    assert cap2.error is None  # transformers serve: no [DONE], but a finish reason


def test_output_tokens_estimated_without_usage():
    cap = client.StreamCapture()
    cap.add_events([json.dumps({"choices": [{"text": "ab", "finish_reason": None}]})], 0.1)
    cap.add_events([json.dumps({"choices": [{"text": "c", "finish_reason": "stop"}]})], 0.2)
    rec = client.request_record(cap, RequestInput("p", 1, 3), client.token_counter(chars))
    assert rec["output_tokens"] == 3 and rec["output_tokens_estimated"]
    assert rec["tpot_ms"] == pytest.approx(50.0) and rec["itl_ms"] == pytest.approx([100.0])


# ---------------------------------------------------------------- body, headers
def test_request_body():
    cfg = LoadConfig(url="http://x", endpoint="chat", ignore_eos=True, continuous_usage=True, extra_body={"top_k": 1})
    body = cfg.request_body("m", RequestInput("hello", 1, 7))
    assert body["messages"] == [{"role": "user", "content": "hello"}] and body["max_tokens"] == 7
    assert body["stream"] and body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["ignore_eos"] and body["top_k"] == 1
    assert body == client.request_body(
        "chat", "m", RequestInput("hello", 1, 7), ignore_eos=True, continuous_usage=True, extra_body={"top_k": 1}
    )
    plain = LoadConfig(url="http://x").request_body("m", RequestInput([1, 2], 2, 3))
    assert plain["prompt"] == [1, 2] and "ignore_eos" not in plain
    assert plain["stream_options"] == {"include_usage": True}


def test_headers_carry_the_key_from_the_environment_only(monkeypatch):
    monkeypatch.setenv("KIT_TEST_API_KEY", "sk-very-secret-123")
    cfg = LoadConfig(url="http://x", api_key_env="KIT_TEST_API_KEY")
    assert cfg.request_headers()["Authorization"] == "Bearer sk-very-secret-123"
    assert cfg.request_headers()["Accept"] == "text/event-stream"
    monkeypatch.delenv("KIT_TEST_API_KEY")
    assert "Authorization" not in cfg.request_headers() and client.auth_headers("KIT_TEST_API_KEY") == {}


# ---------------------------------------------------------------- model listing, error texts
def test_model_listing_timeout_is_descriptive_and_honours_timeout_s(silent_server):
    url = silent_server.url
    t = time.perf_counter()
    with pytest.raises(ValueError) as ei:
        run_coro(client.get_model_id(url, timeout_s=0.5))
    assert time.perf_counter() - t < 3
    msg = str(ei.value)
    assert f"{url}/v1/models" in msg and "timed out after 0.5 s" in msg and "TimeoutError: )" not in msg
    assert client.describe_exception(asyncio.TimeoutError()) == "TimeoutError: no details"


def test_short_error():
    long = client.short_error("HTTP 500: " + "word " * 200, 80)
    assert len(long) == 80 and long.endswith("…")
    assert client.short_error("HTTP 404: <p>Not &amp; found</p>\n<p>sorry</p>") == "HTTP 404: Not & found sorry"
