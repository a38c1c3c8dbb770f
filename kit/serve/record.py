"""The record of one streamed request: from a :class:`kit.serve.sse.StreamCapture` to the detail-file row.

:func:`request_record` turns a capture into the request's metrics (TTFT, TPOT, ITL token-normalised, E2E latency,
tokens; via :func:`kit.metrics.request_timings`), with the checks that keep a server's word honest: usage counts
must be counts (:func:`usage_count`), and a stream that arrived whole in one network read (a buffering proxy) has
no per-token timing. Definitions: docs/metrics.md, "Served benchmarks".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kit import metrics as M
from kit.serve.sse import StreamCapture

if TYPE_CHECKING:  # annotations only
    from kit.serve.workload import RequestInput


def tokens_per_chunk(cap: StreamCapture, count_tokens) -> tuple[list[int] | None, str]:
    """Tokens each token-bearing chunk carried and where that came from (see :func:`request_record`)."""
    n = len(cap.chunk_times)
    counts = cap.chunk_usage.values()
    if n and len(cap.chunk_usage) == n and all(usage_count({"n": u}, "n")[0] is not None for u in counts):
        prev, per_chunk = 0, []
        for i in range(n):
            u = cap.chunk_usage[i]
            per_chunk.append(max(0, u - prev))
            prev = max(prev, u)
        return per_chunk, "usage"
    if n and len(cap.chunk_token_ids) == n:
        return [int(cap.chunk_token_ids[i]) for i in range(n)], "token_ids"
    if n and count_tokens is not None:
        return count_tokens(cap.chunk_texts), "tokenizer"
    return None, "unknown"


def request_record(
    cap: StreamCapture,
    req: RequestInput,
    count_tokens=None,
    t0_run: float = 0.0,
    client_queue_ms: float = 0.0,
    request_id: int = 0,
    warmup: bool = False,
) -> dict:
    """Per-request metrics (the detail-file row) from a :class:`StreamCapture`, via :func:`kit.metrics.request_timings`.

    Tokens per chunk: continuous usage deltas when every token-bearing chunk carries usage, else token-id
    counts, else ``count_tokens`` (tokenizer, ``add_special_tokens=False``); ``tokens_per_chunk_source`` says
    which. Without any of them the tokens per chunk are unknown: when ``output_tokens`` is no more than the
    chunk count each chunk is taken as one token (``"assumed_1"``), otherwise the per-token ITL is unknown
    (``itl_ms`` None, ``itl_unknown`` True; the chunk gaps keep their own name; docs/metrics.md, case E7).
    ``output_tokens``: ``usage.completion_tokens``, else the tokenizer count of the whole text, else the chunk
    count (then ``output_tokens_estimated`` is True). Times in the record are ms; ``sent_s`` / ``end_s`` are
    seconds since the run started. A usage count that is not one (negative, fractional, over
    :data:`MAX_USAGE_TOKENS`) fails the request (:func:`usage_count`). When every token-bearing chunk arrived in one
    network read (``buffered``: a proxy that buffers the stream; :data:`BUFFERED_MIN_CHUNKS` chunks at least), the
    per-token timing is unknown: ``tpot_ms`` and
    ``itl_ms`` are None, never 0.
    """
    n = len(cap.chunk_times)
    usage_ct, bad_usage = usage_count(cap.usage, "completion_tokens")
    pt, bad_prompt = usage_count(cap.usage, "prompt_tokens")
    per_chunk, source = tokens_per_chunk(cap, count_tokens)
    if usage_ct is not None:
        out_tok, est = usage_ct, False
    elif count_tokens is not None:
        out_tok, est = (count_tokens(["".join(cap.chunk_texts)])[0] if n else 0), True
    else:
        out_tok, est = (sum(per_chunk) if per_chunk is not None else n), True
    if per_chunk is None and out_tok <= n:
        per_chunk, source = [1] * n, "assumed_1"
    # every token-bearing chunk in one network read (a buffering proxy): the gaps between them are not the server's
    buffered = n >= BUFFERED_MIN_CHUNKS and cap.chunk_times[0] == cap.chunk_times[-1]
    error = cap.error or bad_usage or bad_prompt
    tm = M.request_timings(cap.chunk_times, None if buffered else per_chunk, out_tok, t0_s=cap.t_send)
    tpot = None if buffered else tm.tpot_ms
    t_send = cap.t_send
    return {
        "request_id": request_id,
        "warmup": warmup,
        "ok": error is None,
        "error": error,
        "http_status": cap.http_status,
        "sent_s": t_send - t0_run,
        "end_s": cap.t_end - t0_run,
        "client_queue_ms": client_queue_ms,
        "ttft_ms": tm.ttft_ms,
        "e2el_ms": tm.e2el_ms,
        "tpot_ms": tpot,
        "tok_s_per_user": M.tok_s_per_stream(tpot) if tpot else None,
        "chunk_gaps_ms": tm.chunk_gaps_ms,
        "itl_ms": tm.itl_ms,
        "itl_unknown": tm.itl_ms is None,
        "buffered": buffered,
        "chunk_times_ms": [(t - t_send) * 1000.0 for t in cap.chunk_times],
        "output_tokens": out_tok,
        "output_tokens_estimated": est,
        "tokens_per_chunk_source": "buffered" if buffered else source,
        "input_tokens": pt if pt is not None else req.input_tokens,
        # the prompt length asked for, the client's count of what it sent, the server's count (usage)
        "prompt_tokens_target": req.target_tokens,
        "prompt_tokens_sent": req.input_tokens,
        "prompt_tokens_server": pt,
        "max_tokens": req.max_tokens,
        # prompt tokens the server served from its prefix cache (OpenAI usage.prompt_tokens_details; vLLM with
        # --enable-prompt-tokens-details); None when it does not say
        "cached_tokens": cached_tokens(cap.usage),
        "osl_mismatch": bool(error is None and out_tok != req.max_tokens),
        "n_chunks": n,
        "n_events": cap.n_events,
        "finish_reason": cap.finish_reason,
        "done_seen": cap.done,
    }


#: a stream whose token-bearing chunks (at least this many) all came in one network read was buffered on the way: a
#: client descheduled for a few ms can read 2 or 3 chunks at once, not this many of a real server's stream
BUFFERED_MIN_CHUNKS = 8
#: the largest token count a server's usage may report (larger ones, like negative ones, are not counts)
MAX_USAGE_TOKENS = 100_000_000


def usage_count(usage: dict | None, key: str) -> tuple[int | None, str | None]:
    """``(count, None)`` for a usage field that is a token count (an integer in [0, :data:`MAX_USAGE_TOKENS`]),
    ``(None, None)`` when absent, ``(None, error)`` when it is something else (the request then fails with that
    error: a server reporting 10^30 or −5 tokens is not to be believed, nor its other figures)."""
    v = (usage or {}).get(key)
    if v is None:
        return None, None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v <= MAX_USAGE_TOKENS) or v != int(v):
        return None, (
            f"the server's usage.{key}={v!r} is not a token count (an integer in [0, {MAX_USAGE_TOKENS:,}]); the "
            "request's figures are not used"
        )
    return int(v), None


def cached_tokens(usage: dict | None) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of a final usage object (OpenAI API), or None."""
    details = (usage or {}).get("prompt_tokens_details")
    return usage_count(details if isinstance(details, dict) else None, "cached_tokens")[0]
