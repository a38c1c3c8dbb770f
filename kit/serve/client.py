"""The streaming client of the served view: one request to an OpenAI-compatible server, SSE parsing, request records.

Holds the tokenizer helpers, the incremental SSE parser and event classifier, the request body and headers,
:func:`stream_request` (send one streaming request to ``/v1/completions`` or ``/v1/chat/completions`` and time
every server-sent event), :func:`request_record` (one request's metrics, via :mod:`kit.metrics`) and
:func:`get_model_id`. The load generator that drives many such requests (:class:`kit.serve.load.LoadConfig`) is
:mod:`kit.serve.load`; the served sweep and ``kit serve-bench`` are :mod:`kit.serve.sweep`. Definitions of every
metric: ``METRICS.md``, "Served".

Measuring choices (and the mistakes they avoid):

- Time stamps are taken once per network read; an event is stamped when its last byte arrived.
- Only token-bearing chunks (non-empty ``text`` / ``delta.content`` / reasoning content / token ids) count:
  role-only, empty and usage-only (``choices: []``) chunks do not. ``[DONE]`` is never parsed as JSON, and a
  stream that simply ends (``transformers serve`` sends no ``[DONE]``) is fine when it carried a finish reason
  or usage.
- ``output_tokens`` = ``usage.completion_tokens`` (asked for with ``stream_options.include_usage``); without
  it, the tokenizer count of the text (``output_tokens_estimated = True``).
- ITL is token-normalised: a chunk carrying k tokens (speculative decoding, MTP, detokeniser batching) adds k
  entries of gap/k. Tokens per chunk come from continuous usage stats, token ids, the tokenizer, or (last
  resort) one per chunk; the source is recorded per request.
- Failures (HTTP error, error event, timeout, stall, broken stream, refused connection) are captured, never
  raised: every request has a total and a per-read timeout.

The API key is read from an environment variable (``OPENAI_API_KEY`` by default) and never written anywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kit import metrics as M
from kit.errors import UserError
from kit.serve.sse import SSEParser, classify_event

if TYPE_CHECKING:  # annotations only: kit.serve.load imports this module
    from kit.serve.workload import RequestInput

#: ``LoadConfig.endpoint`` → the path of its streaming API
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
#: environment variable read for the API key when none is named
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


# ---------------------------------------------------------------- tokenizer helpers
def load_tokenizer(name_or_path: str):
    """A Hugging Face tokenizer from a local directory or the local cache (never downloads).

    Raises:
        UserError: nothing loadable at ``name_or_path`` offline (the message names it).
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure means "no tokenizer here"
        raise UserError(f"cannot load a tokenizer from {name_or_path!r} offline: {e}") from e


def token_counter(tokenizer) -> Callable[[list[str]], list[int]] | None:
    """``texts -> token counts`` (``add_special_tokens=False``) from an HF tokenizer, a ``str -> int`` callable,
    or ``None``."""
    if tokenizer is None:
        return None
    if hasattr(tokenizer, "encode") and callable(tokenizer) and hasattr(tokenizer, "vocab_size"):

        def count(texts: list[str]) -> list[int]:
            if not texts:
                return []
            ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
            return [len(x) for x in ids]

        return count
    if callable(tokenizer):
        return lambda texts: [int(tokenizer(t)) for t in texts]
    raise UserError(f"tokenizer={tokenizer!r}: give a Hugging Face tokenizer, a callable str -> int, or None")


# ---------------------------------------------------------------- SSE parsing
@dataclass
class StreamCapture:
    """What one streamed request produced (times are ``time.perf_counter()`` seconds)."""

    t_send: float = 0.0
    t_end: float = 0.0
    http_status: int | None = None
    error: str | None = None
    chunk_times: list = field(default_factory=list)  # token-bearing chunks only
    chunk_texts: list = field(default_factory=list)
    chunk_usage: list = field(default_factory=list)  # cumulative completion_tokens in that chunk, or None
    chunk_token_ids: list = field(default_factory=list)  # number of token ids in that chunk, or None
    usage: dict | None = None
    finish_reason: str | None = None
    done: bool = False
    n_events: int = 0

    def add_events(self, payloads: Sequence[str], now: float) -> None:
        """Record complete SSE ``data`` payloads that arrived at ``now`` (s). ``[DONE]`` is not parsed as
        JSON; only token-bearing chunks get a time stamp; the first error (error event, bad JSON) is kept."""
        for data in payloads:
            self.n_events += 1
            if data.strip() == "[DONE]":
                self.done = True
                continue
            try:
                obj = json.loads(data)
            except json.JSONDecodeError:
                self.error = self.error or f"malformed event (not JSON): {data[:200]!r}"
                continue
            text, n_ids, usage, finish, err = classify_event(obj)
            if err:
                self.error = self.error or err
                continue
            if usage is not None:
                self.usage = usage
            if finish:
                self.finish_reason = finish
            if text or n_ids:
                self.chunk_times.append(now)
                self.chunk_texts.append(text)
                ct = usage.get("completion_tokens") if usage else None
                self.chunk_usage.append(int(ct) if isinstance(ct, (int, float)) else None)
                self.chunk_token_ids.append(n_ids)

    def finish(self) -> None:
        """Called at a clean end of stream: a stream with no [DONE], finish reason or usage was cut short."""
        if self.error is None and not (self.done or self.finish_reason or self.usage):
            self.error = "stream ended without [DONE], finish_reason or usage (truncated?)"


# ---------------------------------------------------------------- one request
def request_body(
    endpoint: str,
    model: str,
    req: RequestInput,
    *,
    temperature: float = 0.0,
    ignore_eos: bool = False,
    continuous_usage: bool = False,
    extra_body: dict | None = None,
) -> dict:
    """The JSON body of one streaming request (OpenAI API) for ``req`` (a :class:`kit.serve.workload.RequestInput`).

    Always asks for the usage chunk (``stream_options.include_usage``), with ``continuous_usage`` also for usage in
    every chunk (vLLM ``continuous_usage_stats``). ``endpoint="chat"`` sends the prompt as one user message (a
    token-id prompt is joined as text); ``"completions"`` sends it as ``prompt``. ``extra_body`` is merged last.
    """
    opts = {"include_usage": True, **({"continuous_usage_stats": True} if continuous_usage else {})}
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": int(req.max_tokens),
        "stream": True,
        "stream_options": opts,
        "temperature": temperature,
    }
    if endpoint == "chat":
        prompt = req.prompt if isinstance(req.prompt, str) else " ".join(map(str, req.prompt))
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = req.prompt
    if ignore_eos:
        body["ignore_eos"] = True
    body.update(extra_body or {})
    return body


def auth_headers(api_key_env: str | None = DEFAULT_API_KEY_ENV) -> dict:
    """``{"Authorization": "Bearer <key>"}`` when the environment variable ``api_key_env`` holds a key, else ``{}``.
    The key is read at call time and never written anywhere."""
    key = os.environ.get(api_key_env) if api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def request_headers(api_key_env: str | None = DEFAULT_API_KEY_ENV) -> dict:
    """HTTP headers of a streaming request: JSON in, server-sent events out, plus :func:`auth_headers`."""
    return {"Content-Type": "application/json", "Accept": "text/event-stream", **auth_headers(api_key_env)}


def describe_exception(e: BaseException) -> str:
    """``"TypeName: message"``, never with an empty message (then the repr of its args, or "no details")."""
    msg = str(e).strip()
    if not msg:
        msg = ", ".join(repr(a) for a in getattr(e, "args", ()) if a not in (None, "")) or "no details"
    return f"{type(e).__name__}: {msg}"


def _timeout_text(
    e: BaseException,
    url: str,
    elapsed_s: float,
    timeout_s: float,
    stall_timeout_s: float,
    connect_s: float | None,
    http_status: int | None,
) -> str:
    """What timed out, after how many seconds, and where (one request of :func:`stream_request`)."""
    import aiohttp

    if isinstance(e, aiohttp.ConnectionTimeoutError) or (
        isinstance(e, aiohttp.ServerTimeoutError) and "connection timeout" in str(e).lower()
    ):
        return f"timeout: could not connect to {url} within {connect_s or timeout_s:g} s"
    if elapsed_s >= timeout_s * 0.99:
        state = "" if http_status is not None else " (no response received)"
        return f"timeout: request to {url} exceeded {timeout_s:g} s (total timeout){state}"
    if http_status is None:
        return (
            f"timeout: no response from {url} within {stall_timeout_s:g} s (stall timeout; the server "
            "accepted the connection but sent nothing)"
        )
    return f"timeout: stream from {url} stalled (no data for {stall_timeout_s:g} s)"


def short_error(text: Any, limit: int = 200) -> str:
    """One line of at most ``limit`` characters from an error text, for summaries (the detail file keeps the
    full text): an HTML page is reduced to its ``<title>`` (else its text without tags), whitespace and line
    breaks are collapsed, and a longer text is cut with "…"."""
    import html
    import re

    s = str(text)
    if re.search(r"<\s*(!doctype|html|head|body|title|h1|p|div|pre|center)\b", s, re.I):
        title = re.search(r"<title[^>]*>(.*?)</title\s*>", s, re.I | re.S)
        if title:  # keep what precedes the page (e.g. "HTTP 502: ") and the page's title
            s = s[: s.find("<")] + title.group(1)
        else:
            s = re.sub(r"(?is)<(script|style)\b.*?</\1\s*>", " ", s)
            s = re.sub(r"<[^>]*>", " ", s)
        s = html.unescape(s)
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: max(1, limit - 1)].rstrip() + "…"


async def stream_request(
    session, url: str, body: dict, headers: dict, timeout_s: float, stall_timeout_s: float
) -> StreamCapture:
    """Send one streaming request and capture every event's arrival time. Never raises for server faults.

    Returns:
        :class:`StreamCapture`; ``error`` is set for an HTTP status other than 200, an error event, a timeout
        (total ``timeout_s`` or a silence longer than ``stall_timeout_s``), a broken or truncated stream, or a
        failed connection.
    """
    import aiohttp

    cap = StreamCapture()
    parser = SSEParser()
    tmo = aiohttp.ClientTimeout(total=timeout_s, sock_read=stall_timeout_s, sock_connect=min(30.0, timeout_s))

    cap.t_send = time.perf_counter()
    try:
        async with session.post(url, json=body, headers=headers, timeout=tmo) as resp:
            cap.http_status = resp.status
            if resp.status != 200:
                text = (await resp.text(errors="replace"))[:500]
                cap.error = f"HTTP {resp.status}: {text}"
            else:
                async for raw in resp.content.iter_any():
                    now = time.perf_counter()
                    cap.add_events(parser.feed(raw), now)
                cap.add_events(parser.close(), time.perf_counter())
                cap.finish()
    except asyncio.TimeoutError as e:  # also aiohttp's connect / socket-read timeouts (subclasses)
        el = time.perf_counter() - cap.t_send
        cap.error = _timeout_text(e, url, el, timeout_s, stall_timeout_s, tmo.sock_connect, cap.http_status)
    except aiohttp.ClientPayloadError as e:
        cap.error = f"broken stream: {str(e).strip() or describe_exception(e)} ({url})"
    except aiohttp.ServerDisconnectedError as e:
        cap.error = f"server disconnected: {str(e).strip() or describe_exception(e)} ({url})"
    except aiohttp.ClientConnectorError as e:
        cap.error = f"connection failed: {str(e).strip() or describe_exception(e)}"
    except aiohttp.ClientError as e:
        cap.error = f"{describe_exception(e)} ({url})"
    except OSError as e:
        cap.error = f"{describe_exception(e)} ({url})"
    cap.t_end = time.perf_counter()
    return cap


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
    counts, else ``count_tokens`` (tokenizer, ``add_special_tokens=False``), else 1 per chunk
    (``tokens_per_chunk_source`` says which). ``output_tokens``: ``usage.completion_tokens``, else the
    tokenizer count of the whole text, else the chunk count (then ``output_tokens_estimated`` is True).
    Times in the record are ms; ``sent_s`` / ``end_s`` are seconds since the run started.
    """
    n = len(cap.chunk_times)
    usage_ct = cap.usage.get("completion_tokens") if cap.usage else None
    if n and all(u is not None for u in cap.chunk_usage):
        prev, per_chunk = 0, []
        for u in cap.chunk_usage:
            per_chunk.append(max(0, u - prev))
            prev = max(prev, u)
        source = "usage"
    elif n and all(x is not None for x in cap.chunk_token_ids):
        per_chunk, source = [int(x) for x in cap.chunk_token_ids], "token_ids"
    elif n and count_tokens is not None:
        per_chunk, source = count_tokens(cap.chunk_texts), "tokenizer"
    else:
        per_chunk, source = [1] * n, "assumed_1"
    if isinstance(usage_ct, (int, float)):
        out_tok, est = int(usage_ct), False
    elif count_tokens is not None:
        out_tok, est = (count_tokens(["".join(cap.chunk_texts)])[0] if n else 0), True
    else:
        out_tok, est = sum(per_chunk), True
    ok = cap.error is None
    tm = M.request_timings(cap.chunk_times, per_chunk, out_tok, t0_s=cap.t_send)
    pt = cap.usage.get("prompt_tokens") if cap.usage else None
    return {
        "request_id": request_id,
        "warmup": warmup,
        "ok": ok,
        "error": cap.error,
        "http_status": cap.http_status,
        "sent_s": cap.t_send - t0_run,
        "end_s": cap.t_end - t0_run,
        "client_queue_ms": client_queue_ms,
        "ttft_ms": tm.ttft_ms,
        "e2el_ms": tm.e2el_ms,
        "tpot_ms": tm.tpot_ms,
        "tok_s_per_user": M.tok_s_per_stream(tm.tpot_ms) if tm.tpot_ms else None,
        "chunk_gaps_ms": tm.chunk_gaps_ms,
        "itl_ms": tm.itl_ms,
        "chunk_times_ms": [(t - cap.t_send) * 1000.0 for t in cap.chunk_times],
        "output_tokens": out_tok,
        "output_tokens_estimated": est,
        "tokens_per_chunk_source": source,
        "input_tokens": int(pt) if isinstance(pt, (int, float)) else req.input_tokens,
        "max_tokens": req.max_tokens,
        "osl_mismatch": bool(ok and out_tok != req.max_tokens),
        "n_chunks": n,
        "n_events": cap.n_events,
        "finish_reason": cap.finish_reason,
        "done_seen": cap.done,
    }


async def get_model_id(base_url: str, api_key_env: str = DEFAULT_API_KEY_ENV, timeout_s: float = 10.0) -> str:
    """The first model id listed by ``GET /v1/models``, waiting at most ``timeout_s`` seconds in all (the load
    generator passes its ``LoadConfig.timeout_s``, i.e. ``--timeout-s``).

    Raises:
        UserError: the server cannot be reached, does not answer within ``timeout_s``, answers with an HTTP
            error or something that is not a model list, or lists no model (the message says which, after how
            long, and the URL).
    """
    import aiohttp

    url = base_url.rstrip("/") + "/v1/models"
    headers = auth_headers(api_key_env)
    hint = "pass the model id explicitly (--model)"
    t0 = time.perf_counter()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            async with s.get(url, headers=headers) as r:
                if r.status != 200:
                    text = await r.text(errors="replace")
                    raise UserError(f"cannot list models at {url} (HTTP {r.status}: {short_error(text, 160)}); {hint}")
                data = await r.json(content_type=None)
    except UserError:
        raise
    except ValueError as e:  # a body that is not JSON
        raise UserError(f"cannot list models at {url} (not a JSON model list: {describe_exception(e)}); {hint}") from e
    except asyncio.TimeoutError as e:
        el = time.perf_counter() - t0
        what = "could not connect" if isinstance(e, aiohttp.ConnectionTimeoutError) else "no complete answer"
        raise UserError(
            f"cannot list models at {url}: timed out after {el:.1f} s ({what} within the "
            f"{timeout_s:g} s timeout); {hint}"
        ) from e
    except Exception as e:  # noqa: BLE001
        raise UserError(f"cannot list models at {url} ({describe_exception(e)}); {hint}") from e
    items = (data or {}).get("data", []) if isinstance(data, dict) else []
    models = [m.get("id") for m in items if isinstance(m, dict) and m.get("id")]
    if not models:
        raise UserError(f"{url} lists no model; {hint}")
    return models[0]
