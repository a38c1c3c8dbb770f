"""The playground's generation: one prompt, greedy tokens one at a time, each one timed as it arrives.

Two sources, one event stream. Every event is a JSON-ready dict:

- ``{"type": "start", "source": ..., "model": ..., "prompt_tokens": n}`` once the request is under way;
- ``{"type": "token", "text": str, "n": tokens so far, "t_ms": since the request, "ttft_ms", "itl_ms": this
  token's ITL (None for the first), "tok_s": running tok/s}`` per token (per chunk for an endpoint: a chunk of k
  tokens adds k, its ITL token-normalised as :func:`kit.metrics.request_timings` does);
- ``{"type": "summary", "summary": {...}, "line": str}`` at a clean end (:func:`summary`);
- ``{"type": "error", "message": str}`` for anything that went wrong (no exception reaches the page);
- ``{"type": "stopped", ...}`` when Stop ended it early (the summary of what arrived comes first).

In-process (:func:`in_process_tokens`): a kit preset (random weights) or a local checkpoint, built once per
(model, dtype) by :class:`ModelCache`; a prefill of the prompt into a static cache (:func:`kit.measure.engine.prefill`)
then decode steps of one token (:class:`kit.measure.engine.Forward`, greedy argmax), the device synchronised before
each time stamp. It runs in a worker thread (torch work off the event loop) and checks a stop flag before every step.
A preset has no tokenizer: its prompt is encoded as UTF-8 bytes (one token per byte) and each generated id shown as
``" t<id>"``; with random weights the text is noise, the timings are real. A checkpoint directory with a tokenizer
uses it.

Endpoint (:func:`endpoint_tokens`): ``POST /v1/completions`` (``stream: true``, usage asked for), the body and
headers of :mod:`kit.serve.client`, the events parsed by :mod:`kit.serve.sse`. Timeouts name what happened: no
connection, no first byte, or a stall (no data for ``stall_s``) mid-stream; Stop closes the connection.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from kit import metrics
from kit.errors import UserError
from kit.serve.client import DEFAULT_API_KEY_ENV

#: most characters a prompt may have (a 100k-token prompt is allowed through to be refused by the model's limit)
MAX_PROMPT_CHARS = 2_000_000
#: most tokens the playground generates per request
MAX_NEW_TOKENS = 4096


def byte_ids(text: str) -> list[int]:
    """The token ids of ``text`` for a model without a tokenizer: its UTF-8 bytes (0..255), one token each."""
    return list(text.encode("utf-8"))


def id_text(token_id: int) -> str:
    """How a generated id of a model without a tokenizer is shown: ``" t<id>"``."""
    return f" t{int(token_id)}"


def check_request(prompt: str, max_tokens: int) -> None:
    """Refuse an empty or oversized prompt and a bad ``max_tokens`` before any work.

    Raises:
        UserError: an empty prompt, one over :data:`MAX_PROMPT_CHARS` characters, ``max_tokens`` not an integer in
            1..:data:`MAX_NEW_TOKENS`.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("the prompt is empty: type a prompt (or pick one) and press Send")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"the prompt has {len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,} are accepted")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"max_tokens={max_tokens!r}: give an integer from 1 to {MAX_NEW_TOKENS}")


@dataclass
class Loaded:
    """A model built for the tour: the module, its tokenizer (None: bytes in, ``t<id>`` out) and its device."""

    model: object
    tokenizer: object | None
    device: str


class ModelCache:
    """In-process models, built once per (model, dtype, device) and kept (a lock makes concurrent first loads
    build once)."""

    def __init__(self):
        self._models: dict[tuple[str, str, str], Loaded] = {}
        self._lock = threading.Lock()

    def put(self, model: str, dtype: str, device: str, module, tokenizer=None) -> None:
        """Use an already built ``module`` for (``model``, ``dtype``, ``device``) (a caller that has one)."""
        with self._lock:
            self._models[(str(model), str(dtype), str(device))] = Loaded(module, tokenizer, device)

    def get(self, model: str, dtype: str = "float32", device: str = "cpu") -> Loaded:
        """The model ``model`` (a kit preset or a local checkpoint directory) in ``dtype`` on ``device``.

        Raises:
            UserError / UnknownNameError: an unknown preset that is not a checkpoint directory (the message lists
                the presets), a bad dtype, a checkpoint without weights, a model predicted not to fit in the memory
                free now (:func:`kit.measure.memguard.check_sweep_memory`, as ``kit sweep`` refuses it: a 70B
                preset on a laptop would meet the OOM killer, not an error).
        """
        from kit.measure.memguard import check_sweep_memory
        from kit.measure.sweep import SweepConfig
        from kit.models import build_model, is_checkpoint_dir, param_bytes

        key = (str(model), str(dtype), str(device))
        with self._lock:
            if key not in self._models:
                kind = str(device).split(":")[0]
                one = SweepConfig(model=str(model), dtypes=[dtype], device=kind, kv_lens=[2048], concurrencies=[1])
                resident = sum(param_bytes(x.model) for x in self._models.values())
                try:
                    check_sweep_memory(one.validate(), kind, resident)
                except UserError as e:
                    raise UserError(f"the in-process model {model!r} ({dtype}) does not fit here: {e}") from None
                m = build_model(str(model), dtype, device)
                tok = None
                if is_checkpoint_dir(model):
                    from kit.serve.client import load_tokenizer

                    try:
                        tok = load_tokenizer(str(model))
                    except UserError:
                        tok = None
                self._models[key] = Loaded(m, tok, device)
            return self._models[key]


class Timeline:
    """The live numbers of one stream: per-token times (s, ``time.perf_counter``) from the send at ``t0``."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.times: list[float] = []  # one per token-bearing chunk
        self.tokens: list[int] = []  # tokens each chunk carried
        self.text: list[str] = []

    def add(self, text: str, now: float, k: int = 1) -> dict:
        """Record a chunk of ``k`` tokens that arrived at ``now``; returns its ``token`` event."""
        prev = self.times[-1] if self.times else None
        self.times.append(now)
        self.tokens.append(max(0, int(k)))
        self.text.append(text)
        n = sum(self.tokens)
        ttft = (self.times[0] - self.t0) * 1000.0
        itl = None if prev is None or k <= 0 else (now - prev) * 1000.0 / k
        tpot = metrics.tpot_ms(ttft, (now - self.t0) * 1000.0, n)
        return {
            "type": "token",
            "text": text,
            "n": n,
            "k": int(k),
            "t_ms": (now - self.t0) * 1000.0,
            "ttft_ms": ttft,
            "itl_ms": itl,
            "tok_s": metrics.tok_s_per_stream(tpot) if tpot else None,
        }


def summary(tl: Timeline, output_tokens: int | None = None) -> dict:
    """The request's summary in the kit's metric terms (:func:`kit.metrics.request_timings`; ITL pooled per token,
    percentiles by :func:`kit.metrics.percentiles`): ``ttft_ms``, ``tpot_ms``, ``e2el_ms``, ``output_tokens``,
    ``itl_ms_p50/p90/p99``, ``itl_n``, ``tok_s_per_stream`` (1000 / TPOT), ``line`` (one line of text)."""
    n = int(output_tokens if output_tokens is not None else sum(tl.tokens))
    rt = metrics.request_timings(tl.times, tl.tokens, n, tl.t0)
    itl = metrics.percentiles(rt.itl_ms or [])
    out = {
        "ttft_ms": rt.ttft_ms,
        "tpot_ms": rt.tpot_ms,
        "e2el_ms": rt.e2el_ms,
        "output_tokens": n,
        "itl_ms_p50": itl["p50"],
        "itl_ms_p90": itl["p90"],
        "itl_ms_p99": itl["p99"],
        "itl_n": itl["n"],
        "tok_s_per_stream": metrics.tok_s_per_stream(rt.tpot_ms) if rt.tpot_ms else None,
    }
    # JSON has no NaN: a number that does not exist (the ITL of a 1-token answer) is None, said "n/a" with why
    out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}
    out["line"] = summary_line(out)
    return out


def _ms(v, why: str = "") -> str:
    if v is None or not math.isfinite(v):
        return f"n/a ({why})" if why else "n/a"
    return f"{v:,.1f} ms"


def summary_line(s: dict) -> str:
    """``TTFT 12.3 ms · TPOT 4.1 ms · ITL p50 4.0 ms, p90 4.4 ms (n=47) · E2E 205.0 ms · 48 output tokens ·
    243.9 tok/s per stream``; with fewer than 2 tokens TPOT, ITL and tok/s are ``n/a (1 token)`` (no gap to time)."""
    tok_s, n = s.get("tok_s_per_stream"), s["output_tokens"]
    why = f"{n} token{'' if n == 1 else 's'}" if n < 2 else ""
    rate = f"{tok_s:,.1f} tok/s per stream" if tok_s else (f"tok/s n/a ({why})" if why else "tok/s n/a")
    return (
        f"TTFT {_ms(s['ttft_ms'])} · TPOT {_ms(s['tpot_ms'], why)} · ITL p50 {_ms(s['itl_ms_p50'], why)}, p90 "
        f"{_ms(s['itl_ms_p90'], why)} (n={s['itl_n']}) · E2E {_ms(s['e2el_ms'])} · {n} output "
        f"token{'' if n == 1 else 's'} · {rate}"
    )


# ------------------------------------------------------------------------------------------------ in-process
def in_process_tokens(
    loaded: Loaded, prompt: str, max_tokens: int, stop: threading.Event, emit: Callable[[dict], None]
) -> None:
    """Generate up to ``max_tokens`` greedy tokens for ``prompt`` with ``loaded``'s model, calling ``emit`` with
    each event (see the module text); returns when done, stopped (``stop`` set) or failed. Blocking: run it in a
    worker thread.

    Raises:
        UserError: the prompt plus ``max_tokens`` exceeds the model's positions (the message names both), or the
            prompt encodes to no token.
    """
    import torch

    from kit import hardware
    from kit.measure.engine import Forward, new_cache, prefill
    from kit.models import max_positions

    model, tok, dev = loaded.model, loaded.tokenizer, torch.device(loaded.device)
    ids = tok(prompt, add_special_tokens=True)["input_ids"] if tok is not None else byte_ids(prompt)
    L = len(ids)
    if L == 0:
        raise UserError("the prompt encodes to no token: type some text")
    limit = max_positions(model.config)
    if L + max_tokens > limit:
        raise UserError(
            f"the prompt is {L:,} tokens and {max_tokens} more were asked for: {L + max_tokens:,} positions, but this "
            f"model supports at most {limit:,}; shorten the prompt (or pick a model with a longer context)"
        )
    show = (lambda i: tok.decode([i])) if tok is not None else id_text
    fwd = Forward(model)
    cache = new_cache(model, L + max_tokens)
    positions = torch.arange(L + max_tokens, device=dev).unsqueeze(0)
    emit({"type": "start", "prompt_tokens": L})
    t0 = time.perf_counter()
    tl = Timeline(t0)
    with torch.inference_mode():
        logits = prefill(fwd, torch.tensor([ids], device=dev), positions, cache)
        for i in range(max_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            hardware.synchronize(dev)
            now = time.perf_counter()
            if not bool(torch.isfinite(logits).all()):
                bad = f"non-finite logits at token {i + 1}: the numbers are not trustworthy"
                emit({"type": "error", "message": bad})
                return
            emit(tl.add(show(int(nxt.item())), now))
            if stop.is_set():
                break
            if i + 1 < max_tokens:
                logits = fwd(nxt, positions[:, L + i : L + i + 1], cache)
    s = summary(tl)
    emit({"type": "summary", "summary": s, "line": s["line"]})
    if stop.is_set():
        emit({"type": "stopped", "tokens": s["output_tokens"]})


# ------------------------------------------------------------------------------------------------ endpoint
#: seconds to wait for a TCP connection to an endpoint
CONNECT_S = 10.0


class StreamFailed(Exception):
    """The endpoint's stream failed; the message says how (it becomes the page's ``error`` event)."""


class EndpointStream:
    """The state of one endpoint stream: the URL as shown (redacted), the :class:`Timeline`, the last usage seen,
    the SSE parser; :meth:`events` turns one network read into ``token`` events."""

    def __init__(self, url: str, stall_s: float, stall_hint: str = "raise the stall timeout"):
        from kit.serve.redact import redact_url
        from kit.serve.sse import SSEParser

        self.shown, self.stall_s, self.stall_hint = redact_url(url), stall_s, stall_hint
        self.parser = SSEParser()
        self.tl = Timeline(time.perf_counter())
        self.usage: dict | None = None

    def events(self, raw: bytes, now: float) -> list[dict]:
        """The ``token`` events of one read that arrived at ``now`` (s).

        Raises:
            StreamFailed: an error event in any shape (:func:`kit.serve.sse.classify_event`), or an event that is not
                JSON.
        """
        from kit.serve.sse import ErrorEvent, classify_event

        out = []
        for p in self.parser.feed(raw):
            if isinstance(p, ErrorEvent):
                raise StreamFailed(f"{self.shown} sent an error event mid-stream: {p[:400]}")
            text = (p if isinstance(p, str) else p.decode("utf-8", "replace")).strip()
            if text == "[DONE]":
                continue
            try:
                obj = json.loads(text)
            except ValueError:
                raise StreamFailed(f"{self.shown} sent an event that is not JSON: {text[:200]}") from None
            chunk, n_ids, usage, _finish, err = classify_event(obj)
            if err:
                raise StreamFailed(f"{self.shown} failed mid-stream: {err[:400]}")
            k = n_ids if n_ids is not None else 1
            if usage:
                ct = usage.get("completion_tokens")  # continuous usage stats: cumulative completion tokens
                k = max(0, int(ct) - sum(self.tl.tokens)) if isinstance(ct, (int, float)) else k
                self.usage = usage
            if chunk or n_ids:
                out.append(self.tl.add(chunk, now, k))
        return out

    def failure(self, e: BaseException) -> str:
        """The page's message for an exception of the HTTP client: a timeout (connect / first byte, or a stall
        mid-stream), a refused connection, a broken stream."""
        from kit.serve.texts import describe_exception

        if isinstance(e, TimeoutError):  # aiohttp's connect and read timeouts are TimeoutErrors too
            if not self.tl.times:
                return f"{self.shown}: no answer within {CONNECT_S:g} s (connect) / {self.stall_s:g} s (first byte)"
            n = sum(self.tl.tokens)
            return (
                f"{self.shown} stalled: no data for {self.stall_s:g} s after {n} token{'' if n == 1 else 's'}; the "
                f"stream was closed ({self.stall_hint} for a slow server)"
            )
        if isinstance(e, OSError) or type(e).__name__ == "ClientConnectorError":
            return f"cannot connect to {self.shown} ({describe_exception(e)}): is a server running?"
        return f"{self.shown}: the stream broke ({describe_exception(e)})"

    def summary_events(self, stopped: bool) -> list[dict]:
        """The closing events: ``summary`` (and ``stopped``), or an ``error`` when no token arrived."""
        if not self.tl.times and not stopped:
            return [{"type": "error", "message": f"{self.shown} ended the stream without a single token"}]
        n_out = self.usage.get("completion_tokens") if self.usage and not stopped else None
        ok = isinstance(n_out, (int, float)) and n_out >= sum(self.tl.tokens)
        s = summary(self.tl, int(n_out) if ok else None)
        out = [{"type": "summary", "summary": s, "line": s["line"]}]
        return out + ([{"type": "stopped", "tokens": s["output_tokens"]}] if stopped else [])


async def _next_or_stop(reader, stop: asyncio.Event):
    """The next read of ``reader``, or None when ``stop`` was set first or the body ended (``reader`` done)."""
    nxt = asyncio.ensure_future(reader.__anext__())
    halt = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({nxt, halt}, return_when=asyncio.FIRST_COMPLETED)
    if halt in done:
        nxt.cancel()
        return None
    halt.cancel()
    try:
        return nxt.result()
    except StopAsyncIteration:
        return b""


async def endpoint_tokens(
    url: str,
    model: str | None,
    prompt: str,
    max_tokens: int,
    stop: asyncio.Event,
    stall_s: float = 30.0,
    api_key_env: str | None = DEFAULT_API_KEY_ENV,
    stall_hint: str = "raise the stall timeout",
) -> AsyncIterator[dict]:
    """Stream ``prompt`` from an OpenAI-compatible server at ``url`` (``/v1/completions``), yielding the events of
    the module text; ``model`` None or empty asks the server (:func:`kit.serve.client.get_model_id`). Never raises
    for the server's faults: they end the stream with an ``error`` event naming what happened (a read silent for
    ``stall_s`` s is a stall; its message ends with ``stall_hint``, what to do about it). Setting ``stop`` closes
    the connection and ends the stream with ``stopped``."""
    import aiohttp

    from kit.serve.client import ENDPOINTS, get_model_id, request_body, request_headers
    from kit.serve.redact import endpoint_url
    from kit.serve.workload import RequestInput

    st = EndpointStream(url, stall_s, stall_hint)
    try:
        model = model or await get_model_id(url, api_key_env, timeout_s=CONNECT_S + stall_s)
    except UserError as e:
        yield {"type": "error", "message": str(e)}
        return
    body = request_body("completions", model, RequestInput(prompt, None, int(max_tokens)), continuous_usage=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_S, sock_read=stall_s)
    yield {"type": "start", "model": model, "url": st.shown}
    stopped, st.tl.t0 = False, time.perf_counter()
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            full = endpoint_url(url, ENDPOINTS["completions"])
            async with session.post(
                full, json=body, headers=request_headers(api_key_env, url), allow_redirects=False
            ) as r:
                if r.status != 200:
                    text = (await r.content.read(600)).decode("utf-8", "replace").strip()
                    raise StreamFailed(f"{st.shown} answered HTTP {r.status}: {text[:400]}")
                reader = r.content.iter_any().__aiter__()
                while (raw := await _next_or_stop(reader, stop)) is not None and raw:
                    for ev in st.events(raw, time.perf_counter()):
                        yield ev
                stopped = raw is None
    except StreamFailed as e:
        yield {"type": "error", "message": str(e)}
        return
    except (TimeoutError, OSError, aiohttp.ClientError) as e:
        yield {"type": "error", "message": st.failure(e)}
        return
    for ev in st.summary_events(stopped):
        yield ev
