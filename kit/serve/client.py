"""The streaming client of the served view: one request to an OpenAI-compatible server and its record.

Holds the tokenizer helpers, the request body and headers, :func:`stream_request` (send one streaming request to
``/v1/completions`` or ``/v1/chat/completions`` and time every server-sent event; the SSE parser and the event
classifier are :mod:`kit.serve.sse`; its record is :func:`kit.serve.record.request_record`) and
:func:`get_model_id`. The one request loop that drives many such requests is :mod:`kit.serve.loop`; the served
sweep is :mod:`kit.serve.sweep` and ``kit serve-bench`` :mod:`kit.serve.cli`. Definitions of every metric:
docs/metrics.md, "Served".

Measuring choices (and the mistakes they avoid):

- Time stamps are taken once per network read; an event is stamped when its last byte arrived.
- Only token-bearing chunks (non-empty ``text`` / ``delta.content`` / reasoning content / token ids) count:
  role-only, empty and usage-only (``choices: []``) chunks do not. ``[DONE]`` is never parsed as JSON, and a
  stream that simply ends (``transformers serve`` sends no ``[DONE]``) is fine when it carried a finish reason
  or usage.
- ``output_tokens`` = ``usage.completion_tokens`` (asked for with ``stream_options.include_usage``); without
  it, the tokenizer count of the text (``output_tokens_estimated = True``).
- ITL is token-normalised: a chunk carrying k tokens (speculative decoding, MTP, detokeniser batching) adds k
  entries of gap/k, and the first chunk's k - 1 extra tokens enter as 0-ms entries, so a request's mean ITL is
  its TPOT. Tokens per chunk come from continuous usage stats, token ids or the tokenizer; without them the
  per-token ITL is unknown when the chunks carried more tokens than there are chunks (never the chunk gaps
  under the ITL name). The source is recorded per request.
- Failures (HTTP error, redirect, error event in any shape, timeout, stall, oversized event, broken stream,
  refused connection) are captured, never raised: every request has a total, a first-byte and a per-read
  timeout.

The API key is read from an environment variable (``OPENAI_API_KEY`` by default) and never written anywhere; URLs
in records and messages are redacted (:mod:`kit.serve.redact`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kit.errors import UserError
from kit.serve.http1 import StreamConnection, StreamError, StreamPool, build_request
from kit.serve.redact import endpoint_url, redact_url, scrub, secrets_of
from kit.serve.sse import MAX_EVENT_BYTES, EventTooLarge, SSEParser, StreamCapture
from kit.serve.texts import describe_exception, short_error, timeout_text

if TYPE_CHECKING:  # annotations only: kit.serve.load imports this module
    from kit.serve.workload import RequestInput

#: ``LoadConfig.endpoint`` → the path of its streaming API
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
#: longest error text a request record keeps (the HTTP error body included), characters, cut after scrubbing
ERROR_TEXT_CHARS = 600
#: environment variable read for the API key when none is named
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
#: what an HTTP header value may hold: visible characters and inner spaces/tabs (RFC 9110 field-value), no CR/LF
HEADER_VALUE = re.compile(r"[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*")


# ---------------------------------------------------------------- tokenizer helpers
def load_tokenizer(name_or_path: str):
    """A Hugging Face tokenizer from a local directory or the local cache (never downloads; never runs a
    checkpoint's own code: ``trust_remote_code=False``).

    Raises:
        UserError: nothing loadable at ``name_or_path`` on this machine (one line naming it and what to pass).
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - any failure means "no tokenizer here"
        if Path(name_or_path).is_dir():
            raise UserError(
                f"cannot load a tokenizer from the directory {name_or_path!r} ({short_error(describe_exception(e))})"
            ) from e
        raise UserError(
            f"no tokenizer {name_or_path!r} on this machine: not a local directory and not in the Hugging Face "
            "cache (the kit never downloads); pass --tokenizer PATH to a local copy, or --tokenizer '' for none"
        ) from e


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


def auth_headers(api_key_env: str | None = DEFAULT_API_KEY_ENV, url: str | None = None) -> dict:
    """``{"Authorization": "Bearer <key>"}`` when the environment variable ``api_key_env`` holds a key, else ``{}``.
    The key is read at call time and never written anywhere. A ``url`` with credentials (``http://user:pw@host``)
    gets none: its credentials go as HTTP basic auth (one ``Authorization`` header only; the URL is explicit).

    Raises:
        UserError: the key holds a line break or another control character (it would inject headers)."""
    if url is not None and "@" in urlsplit(str(url)).netloc:
        return {}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key and not HEADER_VALUE.fullmatch(key):  # a line break would add headers of its own to every request
        raise UserError(
            f"the API key in ${api_key_env} holds a line break or another control character; an API key is printable "
            "text (check how the variable was set)"
        )
    return {"Authorization": f"Bearer {key}"} if key else {}


def request_headers(api_key_env: str | None = DEFAULT_API_KEY_ENV, url: str | None = None) -> dict:
    """HTTP headers of a streaming request: JSON in, server-sent events out, plus :func:`auth_headers`."""
    return {"Content-Type": "application/json", "Accept": "text/event-stream", **auth_headers(api_key_env, url)}


@dataclass(frozen=True)
class StreamLimits:
    """How long one streaming request may take and how large its events may be.

    Attributes:
        timeout_s: the whole request, s.
        stall_timeout_s: longest silence within the body, s.
        first_byte_timeout_s: longest wait for the response head after sending, s (None: ``stall_timeout_s``).
        max_event_bytes: largest SSE event (or unfinished line) accepted, bytes.
        secrets: strings masked in error texts (URL credentials, the API key).
    """

    timeout_s: float
    stall_timeout_s: float
    first_byte_timeout_s: float | None = None
    max_event_bytes: int = MAX_EVENT_BYTES
    secrets: tuple[str, ...] = ()

    @property
    def first_byte_s(self) -> float:
        """The head's deadline, s."""
        return self.stall_timeout_s if self.first_byte_timeout_s is None else self.first_byte_timeout_s

    @property
    def connect_s(self) -> float:
        """The TCP connect's deadline, s (at most 30 s, the request's and the head's)."""
        return min(30.0, self.timeout_s, self.first_byte_s)


async def stream_request(pool: StreamPool, url: str, body: dict, headers: dict, limits: StreamLimits) -> StreamCapture:
    """Send one streaming request over a connection of ``pool`` (:class:`kit.serve.http1.StreamPool`) and capture
    every event's arrival time. Never raises for server faults.

    Redirects are not followed (the numbers must describe the server the user named): a 3xx is a failed request
    naming where it pointed. The response head must arrive within ``limits.first_byte_s``, every later read within
    ``limits.stall_timeout_s``, the whole request within ``limits.timeout_s`` (all s). An SSE event over
    ``limits.max_event_bytes`` fails the request. A kept-alive connection that the server closed before answering
    is replaced once by a new one. Error texts carry the redacted URL (:func:`kit.serve.redact.redact_url`) and
    have ``limits.secrets`` masked.

    Returns:
        :class:`kit.serve.sse.StreamCapture`; ``error`` is set for an HTTP status other than 200, a redirect,
        an error event (any shape, :func:`kit.serve.sse.classify_event`), a timeout, an oversized event, a broken
        or truncated stream, or a failed connection.
    """
    cap = StreamCapture(max_events=max_events_for(body))
    parser = SSEParser(limits.max_event_bytes)
    shown = redact_url(url)
    st: dict = {"phase": "connect", "conn": None}  # where a timeout happened; the connection to release
    sink = partial(cap.add_read, parser)  # called in the connection's data_received: per read, not per event
    cap.t_send = time.perf_counter()
    try:
        key, request = build_request(url, json.dumps(body).encode(), headers)
        async with asyncio.timeout(limits.timeout_s):
            status, resp_headers = await _open(pool, key, request, sink, limits, st)
            st["phase"] = "body"
            cap.http_status = status
            await _wait_body(st["conn"], limits.stall_timeout_s)
            _judge(cap, st["conn"], parser, status, resp_headers, shown)
    except TimeoutError:
        el = time.perf_counter() - cap.t_send
        limit = {"connect": limits.connect_s, "headers": limits.first_byte_s}.get(st["phase"], limits.stall_timeout_s)
        cap.error = timeout_text(st["phase"], shown, el, limits.timeout_s, limit)
    except EventTooLarge as e:
        cap.error = f"{e}; the request is counted as failed ({shown})"
    except StreamError as e:
        what = {"broken": "broken stream", "disconnected": "server disconnected", "connect": "connection failed"}
        cap.error = f"{what[e.kind]}: {e} ({shown})"
    except (OSError, ValueError) as e:
        cap.error = f"{describe_exception(e)} ({shown})"
    finally:
        conn = st["conn"]
        if conn is not None:
            if cap.error is not None and not conn.done.done():
                conn.keep_alive = False
            pool.release(conn)
    cap.t_end = time.perf_counter()
    cap.error = scrub(cap.error, limits.secrets)  # before the cut: a cut must never leave part of a secret
    if cap.error is not None and len(cap.error) > ERROR_TEXT_CHARS:
        cap.error = cap.error[:ERROR_TEXT_CHARS] + " ..."
    return cap


def max_events_for(body: dict) -> int:
    """Most SSE events one request may bring: 4 per output token asked for (``max_tokens``; detokenisers may split a
    token over chunks) + 64 (role, usage, finish, [DONE], keep-alives), at least 1024."""
    try:
        asked = int(body.get("max_tokens") or 0)
    except (TypeError, ValueError):
        asked = 0
    return max(1024, 4 * asked + 64)


async def _open(pool: StreamPool, key, request: bytes, sink, limits: StreamLimits, st: dict) -> tuple[int, dict]:
    """Send ``request`` on a pooled (or new) connection and wait for the response head; ``(status, headers)``.
    A kept-alive connection the server closed before answering is replaced once by a new one. ``st`` holds the
    phase (for a timeout's text) and the connection (for its release)."""
    for attempt in (0, 1):
        st["phase"] = "connect"
        conn = pool.take(key)
        reused = conn is not None
        if conn is None:
            conn = await pool.connect(key, limits.connect_s)
        st["phase"], st["conn"] = "headers", conn
        conn.start(request, sink)
        try:
            return await asyncio.wait_for(asyncio.shield(conn.head), limits.first_byte_s)
        except StreamError as e:
            st["conn"] = None
            pool.release(conn)
            if not (reused and e.kind == "disconnected" and attempt == 0):
                raise
    raise AssertionError("unreachable: the second attempt returns or raises")


def _judge(cap: StreamCapture, conn: StreamConnection, parser: SSEParser, status: int, headers: dict, shown: str):
    """Set ``cap.error`` from a finished response: a redirect (never followed), an HTTP error (404/405 name what was
    posted to), or a 200 whose body was not a stream; else finish the capture's events."""
    if 300 <= status < 400:
        where = redact_url(headers.get("location", "(no Location)"))
        cap.error = (
            f"HTTP {status} redirect to {where} not followed (the kit sends requests only to the URL it was given; "
            "pass the final URL)"
        )
    elif status != 200:
        where = f" (POST {shown})" if status in (404, 405) else ""  # most often a wrong path or endpoint
        cap.error = f"HTTP {status}{where}: {conn.error_body.decode('utf-8', 'replace')}"  # cut after scrubbing
    else:
        cap.add_events(parser.close(), time.perf_counter())
        cap.finish()
        ctype = headers.get("content-type", "")
        if cap.error and not cap.n_events and "event-stream" not in ctype:
            cap.error = (
                f"HTTP 200 with Content-Type {ctype or '(none)'!r} and no server-sent event: not a stream "
                '(does the server honour "stream": true on this endpoint?)'
            )


async def _wait_body(conn: StreamConnection, stall_timeout_s: float) -> None:
    """Until the response body has ended. A stall (no read for ``stall_timeout_s``) raises ``TimeoutError``; its
    watchdog is one timer that wakes at most once per ``stall_timeout_s`` (not one re-armed per read)."""
    if conn.done.done():
        return conn.done.result()
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as guard:

        def check() -> None:
            nonlocal handle
            idle = time.perf_counter() - conn.last_read
            if idle >= stall_timeout_s:
                guard.reschedule(loop.time())  # fires now: TimeoutError at the await below
            else:
                handle = loop.call_later(stall_timeout_s - idle, check)

        handle = loop.call_later(stall_timeout_s, check)
        try:
            await asyncio.shield(conn.done)
        finally:
            handle.cancel()


async def get_model_id(base_url: str, api_key_env: str = DEFAULT_API_KEY_ENV, timeout_s: float = 10.0) -> str:
    """The first model id listed by ``GET /v1/models`` (:func:`list_model_ids`, its errors)."""
    return (await list_model_ids(base_url, api_key_env, timeout_s))[0]


async def list_model_ids(base_url: str, api_key_env: str = DEFAULT_API_KEY_ENV, timeout_s: float = 10.0) -> list[str]:
    """The model ids listed by ``GET /v1/models``, in the server's order (at least one), waiting at most
    ``timeout_s`` seconds in all (the load generator passes ``LoadConfig.models_timeout_s``, i.e.
    ``--models-timeout-s``). Redirects are not followed.

    Raises:
        UserError: the server cannot be reached, does not answer within ``timeout_s``, redirects, answers with an
            HTTP error or something that is not a model list, or lists no model (the message says which, after
            how long, and the URL, redacted; no secret of the URL or the API key is in it).
    """
    import aiohttp

    url = endpoint_url(base_url, "/v1/models")
    shown, secrets = redact_url(url), secrets_of(base_url, api_key_env)
    hint = "pass the model id explicitly (--model)"
    t0 = time.perf_counter()

    def fail(why: str, e: BaseException | None = None) -> UserError:
        return UserError(scrub(f"cannot list models at {shown} ({why}); {hint}", secrets))

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            async with s.get(url, headers=auth_headers(api_key_env, url), allow_redirects=False) as r:
                if 300 <= r.status < 400:
                    where = redact_url(r.headers.get("Location", "(no Location)"))
                    raise fail(f"HTTP {r.status} redirect to {where} not followed")
                if r.status != 200:
                    text = (await r.content.read(2000)).decode("utf-8", "replace")
                    raise fail(f"HTTP {r.status}: {short_error(scrub(text, secrets), 160)}")  # scrubbed, then cut
                data = json.loads(await r.content.read(MAX_EVENT_BYTES))
    except UserError:
        raise
    except ValueError as e:  # a body that is not JSON
        raise fail(f"not a JSON model list: {describe_exception(e)}") from None
    except TimeoutError:
        el = time.perf_counter() - t0
        raise UserError(
            scrub(
                f"cannot list models at {shown}: timed out after {el:.1f} s (no complete answer within the "
                f"{timeout_s:g} s --models-timeout-s); {hint}",
                secrets,
            )
        ) from None
    except (aiohttp.ClientConnectionError, OSError) as e:  # nothing (or not HTTP) listening there
        why = describe_exception(e)
        raise UserError(
            scrub(f"cannot list models at {shown} (cannot connect: {why}): is a server running there?", secrets)
        ) from None
    except Exception as e:  # noqa: BLE001
        raise fail(describe_exception(e)) from None
    items = data.get("data") if isinstance(data, dict) else None
    items = items if isinstance(items, list) else []  # {"data": 5}, a string ...: not a model list
    models = [m.get("id") for m in items if isinstance(m, dict) and isinstance(m.get("id"), str) and m.get("id")]
    if not models:
        raise UserError(f"{shown} lists no model; {hint}")
    return models
