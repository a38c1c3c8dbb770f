"""kit.serve.client: SSE parsing, event classification, request records (cases E1-E2, exact time stamps), the
request body and headers, the model listing's errors, error texts."""

import json
import time

import pytest
from sse_server import chars, script

from kit.serve import client, record
from kit.serve.aggregate import aggregate
from kit.serve.load import LoadConfig
from kit.serve.loop import run_coro
from kit.serve.sse import SSEParser, StreamCapture, classify_event
from kit.serve.texts import describe_exception, short_error
from kit.serve.workload import RequestInput


def sse_bytes(payload) -> bytes:
    if isinstance(payload, bytes):  # a raw frame (typed events)
        return payload
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def replay(name: str, chat: bool = True, split: bool = False) -> StreamCapture:
    """Feed a scripted scenario to the real parser and capture with its *exact* time stamps (t0 = 0)."""
    cap, parser = StreamCapture(t_send=0.0), SSEParser()
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
    rec = record.request_record(cap, RequestInput("p", 4, 64), client.token_counter(chars))
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
    rec = record.request_record(replay("e1u"), RequestInput("p", 4, 64), None)
    assert rec["tokens_per_chunk_source"] == "usage"
    assert rec["itl_ms"] == pytest.approx([100.0] * 5)
    assert rec["output_tokens"] == 6 and rec["tpot_ms"] == pytest.approx(100.0)


def test_e2_one_and_zero_output_tokens():
    a = record.request_record(replay("e2a", chat=False), RequestInput("p", 4, 64), client.token_counter(chars))
    assert a["ok"] and a["ttft_ms"] == pytest.approx(300.0) and a["tpot_ms"] is None and a["itl_ms"] == []
    b = record.request_record(replay("e2b", chat=False), RequestInput("p", 4, 64), client.token_counter(chars))
    assert b["ok"] and b["output_tokens"] == 0 and b["ttft_ms"] is None and b["tpot_ms"] is None
    c = record.request_record(replay("e2c", chat=False), RequestInput("p", 4, 64), None)
    assert c["ok"] and c["output_tokens"] == 2
    assert c["itl_ms"] == pytest.approx([100.0])  # the whitespace chunk (0 tokens) adds no ITL entry
    # B (no usage, tokenizer says whitespace is 0 tokens) gives the same
    cap = replay("e2c", chat=False)
    cap.chunk_usage = {}
    assert record.request_record(cap, RequestInput("p", 4, 64), client.token_counter(chars))["itl_ms"] == pytest.approx(
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
    assert out == [b'{"a":\n1}']
    assert p.close() == [b"[DONE]"]


def test_classify_events():
    assert classify_event({"choices": [], "usage": {"completion_tokens": 3}})[2] == {"completion_tokens": 3}
    assert classify_event({"choices": [{"delta": {"role": "assistant"}}]})[0] == ""
    assert classify_event({"choices": [{"delta": {"reasoning_content": "hm"}}]})[0] == "hm"
    assert classify_event({"choices": [{"text": "", "token_ids": [5, 6]}]})[1] == 2
    assert "boom" in classify_event({"object": "error", "message": "boom"})[4]
    assert "boom" in classify_event({"error": {"message": "boom"}})[4]


def test_done_is_never_parsed_and_bad_json_is_an_error():
    cap = StreamCapture()
    cap.add_events(["[DONE]"], 1.0)
    assert cap.done and cap.error is None
    cap.add_events(["{not json"], 1.1)
    assert "malformed" in cap.error


def test_stream_without_done_finish_or_usage_is_truncated():
    cap = StreamCapture()
    cap.add_events([json.dumps({"choices": [{"text": "a"}]})], 0.1)
    cap.finish()
    assert "truncated" in cap.error
    cap2 = StreamCapture()
    cap2.add_events([json.dumps({"choices": [{"text": "a", "finish_reason": "length"}]})], 0.1)
    cap2.finish()
    assert cap2.error is None  # transformers serve: no [DONE], but a finish reason


def test_output_tokens_estimated_without_usage():
    cap = StreamCapture()
    cap.add_events([json.dumps({"choices": [{"text": "ab", "finish_reason": None}]})], 0.1)
    cap.add_events([json.dumps({"choices": [{"text": "c", "finish_reason": "stop"}]})], 0.2)
    rec = record.request_record(cap, RequestInput("p", 1, 3), client.token_counter(chars))
    assert rec["output_tokens"] == 3 and rec["output_tokens_estimated"]
    # the first chunk carried 2 tokens: one 0-ms entry, so the mean ITL equals the TPOT (case E5)
    assert rec["tpot_ms"] == pytest.approx(50.0) and rec["itl_ms"] == pytest.approx([0.0, 100.0])


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
    assert f"{url}/v1/models" in msg and "timed out after 0." in msg and "within the 0.5 s" in msg
    assert "TimeoutError: )" not in msg
    assert describe_exception(TimeoutError()) == "TimeoutError: no details"


def test_short_error():
    long = short_error("HTTP 500: " + "word " * 200, 80)
    assert len(long) == 80 and long.endswith("…")
    assert short_error("HTTP 404: <p>Not &amp; found</p>\n<p>sorry</p>") == "HTTP 404: Not & found sorry"


# ---------------------------------------------------------------- E5-E7: one per-token accounting
def test_e5_first_chunk_with_several_tokens_enters_zero_ms_entries():
    rec = record.request_record(replay("e5", chat=False), RequestInput("p", 4, 7), None)
    assert rec["tokens_per_chunk_source"] == "usage" and rec["output_tokens"] == 7
    assert rec["ttft_ms"] == pytest.approx(500.0) and rec["e2el_ms"] == pytest.approx(900.0)
    assert rec["tpot_ms"] == pytest.approx(400.0 / 6)
    assert rec["itl_ms"] == pytest.approx([0.0, 0.0, 100.0, 100.0, 100.0, 100.0])  # n = 6 = output_tokens - 1
    assert sum(rec["itl_ms"]) / len(rec["itl_ms"]) == pytest.approx(rec["tpot_ms"])
    assert rec["chunk_gaps_ms"] == pytest.approx([100.0] * 4)


@pytest.mark.parametrize(
    "times, tokens",
    [
        ([0.5, 0.6, 0.7, 0.8, 0.9], [3, 1, 1, 1, 1]),  # E5
        ([0.2, 0.3, 0.5], [4, 4, 4]),  # several tokens in every chunk
        ([0.1, 0.15, 0.4, 0.9], [2, 0, 3, 1]),  # a 0-token chunk folded into the next gap
        ([1.0, 1.0, 1.3], [1, 5, 2]),  # two chunks in one read (0-ms gap)
    ],
)
def test_mean_itl_equals_tpot_whenever_the_chunk_counts_add_up(times, tokens):
    from kit import metrics as M

    tm = M.request_timings(times, tokens, sum(tokens), t0_s=0.0)
    assert len(tm.itl_ms) == sum(tokens) - 1
    assert sum(tm.itl_ms) / len(tm.itl_ms) == pytest.approx(tm.tpot_ms)


def test_e7_several_tokens_per_chunk_without_counts_leaves_itl_unknown(caplog):
    cap = replay("e7", chat=False)
    rec = record.request_record(cap, RequestInput("p", 4, 40), None)
    assert rec["output_tokens"] == 40 and rec["ttft_ms"] == pytest.approx(200.0)
    assert rec["e2el_ms"] == pytest.approx(560.0) and rec["tpot_ms"] == pytest.approx(360.0 / 39)
    assert rec["chunk_gaps_ms"] == pytest.approx([40.0] * 9)
    assert rec["itl_ms"] is None and rec["itl_unknown"]  # never the 40-ms chunk gaps under the ITL name
    with caplog.at_level("WARNING", logger="kit"):
        row = aggregate([rec], LoadConfig(url="http://x"), {"duration_s": 1.0})
    assert row["itl_n"] == 0 and row["x_itl_unknown"] == 1 and row["x_chunk_gap_ms_p50"] == pytest.approx(40.0)
    assert "per-token ITL unknown" in row["x_itl_warning"] and "per-token ITL unknown" in caplog.text
    # with a tokenizer (or per-chunk usage) the per-token ITL follows E5's rule: 3 zeros + [10] x 36
    tok = record.request_record(replay("e7", chat=False), RequestInput("p", 4, 40), client.token_counter(chars))
    assert tok["itl_ms"] == pytest.approx([0.0] * 3 + [10.0] * 36)
    # one token per chunk and no counts: the chunk gaps are the ITL (nothing is unknown)
    one = record.request_record(replay("normal", chat=False), RequestInput("p", 4, 64), None)
    assert one["tokens_per_chunk_source"] == "assumed_1" and one["itl_ms"] == pytest.approx(one["chunk_gaps_ms"])


# ---------------------------------------------------------------- E6: errors in every shape
@pytest.mark.parametrize("name", ["e6", "e6text", "e6nodata", "e6type", "e6obj", "e6finish"])
def test_e6_an_error_in_any_protocol_shape_fails_the_request(name):
    cap = replay(name, chat=False)
    rec = record.request_record(cap, RequestInput("p", 4, 64), None)
    assert not rec["ok"] and rec["error"]
    if name in ("e6", "e6text", "e6type", "e6obj"):
        assert "engine overloaded" in rec["error"]
    row = aggregate([rec], LoadConfig(url="http://x"), {"duration_s": 1.0})
    assert row["completed"] == 0 and row["failed"] == 1


def test_sglang_abort_finish_reason_and_object_error_are_failures():
    abort = {"choices": [{"text": "", "finish_reason": {"type": "abort", "message": "out of memory"}}]}
    assert "out of memory" in classify_event(abort)[4]
    assert "boom" in classify_event({"type": "error", "error": {"message": "boom"}})[4]
    assert classify_event({"choices": [{"text": "a", "finish_reason": {"type": "length"}}]})[3] == "length"


# ---------------------------------------------------------------- the hot path: per read, exact
def _stream_bytes(payloads) -> bytes:
    return b"".join(sse_bytes(p) for p in payloads)


def test_reads_split_anywhere_give_the_same_capture_as_one_event_per_read():
    texts = ["t", "é", 'say "hi"', "back\\slash", "ok", "", "\n", "t", "日本"]
    events = [{"id": "x", "choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in texts]
    events += [{"id": "x", "choices": [{"index": 0, "text": "z", "finish_reason": "length"}], "usage": {"x": 1}}]
    raw = _stream_bytes(events + ["[DONE]"]).replace(b"\n\n", b"\r\n\r\n", 3)
    ref = StreamCapture()
    parser = SSEParser()
    for b in raw:  # one byte per read: every event alone, stamped with its index
        ref.add_events(parser.feed(bytes([b])), 0.0)
    for cut in (1, 7, 50, 333, len(raw)):
        cap, parser = StreamCapture(), SSEParser()
        for i in range(0, len(raw), cut):
            cap.add_events(parser.feed(raw[i : i + cut]), 0.0)
        cap.add_events(parser.close(), 0.0)
        assert cap.chunk_texts == ref.chunk_texts == [t for t in texts if t] + ["z"]
        assert (cap.done, cap.finish_reason, cap.usage, cap.error) == (True, "length", {"x": 1}, None)


def _capture_state(cap: StreamCapture) -> tuple:
    return (
        cap.chunk_times,
        cap.chunk_texts,
        cap.chunk_usage,
        cap.chunk_token_ids,
        cap.n_events,
        cap.usage,
        cap.finish_reason,
        cap.done,
        cap.error,
    )


@pytest.mark.parametrize("chat", [False, True])
def test_the_per_read_fast_path_records_exactly_what_the_event_parser_does(chat):
    """StreamCapture.add_read (one regular-expression pass over a read once the stream's layout is known) against
    the parser + add_events path, on the same reads with the same stamps: plain texts, texts JSON must escape
    (quote, backslash, newline, a raw control character the fast path must not take), non-ASCII, an empty
    text, a mid-stream usage chunk, a chunk with another layout, an error event, CRLF line ends, and every read
    cut (whole events, events split across reads, one byte at a time)."""

    def ev(text, **extra):
        if chat:
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        else:
            choice = {"index": 0, "text": text, "finish_reason": None}
        return {"id": "c1", "object": "x", "model": "m", "choices": [choice], **extra}

    texts = ["a", "bb", " the", "é", "日本", 'q"uote', "back\\slash", "new\nline", "", "t", "t"]
    payloads = [ev(t) for t in texts] + [ev("u", usage={"completion_tokens": 9})]
    payloads += [ev(t) for t in ("v", "w")] + [{"id": "other", "choices": [{"index": 0, "text": "x"}]}]
    raw_ctrl = json.dumps(ev("CTRL")).replace("CTRL", "c\u0001").encode().replace(b"\\u0001", b"\x01")
    body = _stream_bytes(payloads) + b"data: " + raw_ctrl + b"\n\n" + _stream_bytes([ev("y"), ev("z")] * 20)
    body += b'event: error\ndata: {"message": "late"}\n\n' + _stream_bytes([ev("after"), "[DONE]"])
    body += _stream_bytes([ev("crlf")]).replace(b"\n\n", b"\r\n\r\n")
    for cut in (1, 5, 64, 211, 1000, len(body)):
        reads = [body[i : i + cut] for i in range(0, len(body), cut)]
        ref, pr = StreamCapture(), SSEParser()
        fast, pf = StreamCapture(), SSEParser()
        for k, r in enumerate(reads):
            ref.add_events(pr.feed(r), float(k))
            fast.add_read(pf, r, float(k))
        ref.add_events(pr.close(), 99.0)
        fast.add_events(pf.close(), 99.0)
        assert _capture_state(fast) == _capture_state(ref), cut
    assert fast._sep is not None  # the layout was learnt, so the fast path ran
    assert "\x01" not in "".join(ref.chunk_texts)  # a raw control character: a malformed event (strict JSON), not text
    assert ref.error.startswith("malformed event (not JSON)") and ref.done and "after" in ref.chunk_texts


def test_whole_event_reads_take_the_fast_path_and_a_held_tail_does_not():
    ev = {"id": "c", "choices": [{"index": 0, "text": "t"}]}
    cap, parser = StreamCapture(), SSEParser()
    cap.add_read(parser, sse_bytes(ev), 1.0)  # learns the layout
    calls = []
    parser.feed = lambda raw, _feed=parser.feed: calls.append(raw) or _feed(raw)
    cap.add_read(parser, sse_bytes({**ev, "choices": [{"index": 0, "text": "ab"}]}) * 3, 2.0)
    assert calls == [] and cap.chunk_texts == ["t", "ab", "ab", "ab"] and cap.chunk_times == [1.0, 2.0, 2.0, 2.0]
    whole = sse_bytes(ev)
    cap.add_read(parser, whole[:10], 3.0)  # half an event: held by the parser
    cap.add_read(parser, whole[10:] + whole, 4.0)  # the rest and a whole one: through the parser (a tail is held)
    assert len(calls) == 2 and cap.chunk_texts[-2:] == ["t", "t"] and cap.chunk_times[-2:] == [4.0, 4.0]
    from kit.serve.sse import EventTooLarge

    big = sse_bytes({**ev, "choices": [{"index": 0, "text": "x" * 200}]})  # the stream's layout, one long text
    with pytest.raises(EventTooLarge):  # a read over the event cap goes to the parser, which refuses it
        cap.add_read(SSEParser(max_event_bytes=64), big, 5.0)


def _feed_reads(reads, stamps=None) -> StreamCapture:
    cap, parser = StreamCapture(), SSEParser()
    for k, r in enumerate(reads):
        cap.add_read(parser, r, float(k if stamps is None else stamps[k]))
    cap.add_events(parser.close(), 99.0)
    return cap


def test_the_sse_stream_format_edges_a_server_may_send():
    """WHATWG SSE: a leading byte-order mark is ignored (also split over reads); CR-only line ends complete an
    event in the read that carries them (no event waits for the next read); an event with empty data is not
    dispatched; a lone surrogate escape becomes U+FFFD instead of failing the request."""
    a, b = sse_bytes({"choices": [{"text": " a"}]}), sse_bytes({"choices": [{"text": " b"}]})
    bom = b"\xef\xbb\xbf"
    for reads in ([bom + a, b], [bom[:1], bom[1:] + a, b], [bom[:2], bom[2:], a, b]):
        cap = _feed_reads(reads)
        assert cap.chunk_texts == [" a", " b"] and cap.error is None, reads
    cr = [a.replace(b"\n", b"\r"), b.replace(b"\n", b"\r")]
    assert _feed_reads(cr).chunk_times == [0.0, 1.0]  # each stamped with its own read
    crlf = a.replace(b"\n", b"\r\n")
    cap = _feed_reads([crlf[:-1], crlf[-1:] + b.replace(b"\n", b"\r\n")])  # a CRLF split over two reads
    assert cap.chunk_texts == [" a", " b"] and cap.chunk_times == [0.0, 1.0] and cap.error is None
    cap = _feed_reads([a, b"data:\n\n", b"data: \n\n", b])
    assert cap.chunk_texts == [" a", " b"] and cap.error is None and cap.n_events == 2
    cap = _feed_reads([b'data: {"choices": [{"text": " \\ud800x"}]}\n\n', b])
    assert cap.chunk_texts == [" \ufffdx", " b"] and cap.error is None


def test_an_event_trickling_in_is_held_as_pieces_not_copied_per_read():
    parser = SSEParser()
    assert parser.feed(b"data: ") == []
    for _ in range(500):  # one 1 KiB piece per read, no line end yet: kept, not joined and searched again
        assert parser.feed(b"x" * 1024) == []
    assert len(parser._pieces) == 501 and parser._held == 6 + 500 * 1024
    assert parser.feed(b"\n") == [] and len(parser._pieces) == 502
    assert parser.feed(b"\n") == [b"x" * 512000] and parser._pieces == []


def test_an_oversized_event_or_endless_line_fails_with_bounded_memory():
    from kit.serve.sse import MAX_EVENT_BYTES, EventTooLarge

    assert MAX_EVENT_BYTES == 4 * 2**20  # the documented default
    p, fed = SSEParser(max_event_bytes=65536), 0
    with pytest.raises(EventTooLarge, match="65536 bytes"):
        p.feed(b"data: ")
        while fed < 10 * 2**20:  # an endless line: fails once the unfinished line passes the cap
            p.feed(b"x" * 4096)
            fed += 4096
    assert fed <= 65536
    with pytest.raises(EventTooLarge):  # one complete event bigger than the cap, in one read
        SSEParser(max_event_bytes=1024).feed(b"data: " + b"y" * 5000 + b"\n\ndata: 1\n\n")
    assert SSEParser(max_event_bytes=1024).feed(b"data: " + b"y" * 900 + b"\n\n") == [b"y" * 900]
