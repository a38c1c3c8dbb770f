"""One in-process point: a static, preallocated KV cache, a batch prefill, then timed decode steps.

A *point* is (model, dtype, batch B = concurrency, context C = KV-cache length, decode steps S). Procedure:

1. Allocate a ``transformers.StaticCache`` for ``C + max(warmup_steps, S)`` tokens (preallocated once; a
   DynamicCache re-concatenates every step and was measured up to 4x slower at B=32, L=4096 on CPU).
2. Reach context C, either by a real prefill of B x C random token ids (``kv_fill="prefill"``, timed: this is
   the static batch's TTFT; in chunks of ``prefill_chunk`` tokens when set, see :func:`prefill`) or by writing
   random values into the cache (``kv_fill="synthetic"``, untimed, so decode at 32k+ tokens can be measured
   without a 32k prefill).
3. For each of ``repeats`` interleaved blocks: [prefill again if kv_fill="prefill"], rewind the cache to C, run
   ``warmup_steps`` untimed decode steps, rewind to C, then time S decode steps. A decode step is one forward of
   B x 1 tokens against the cache plus the greedy pick of the next token (argmax); each step is timed with
   ``time.perf_counter`` around it and the device synchronised before the clock is read. Nothing else runs
   inside a timed step.

Metrics follow :mod:`kit.metrics` (one definition each). The cache attends over its whole preallocated length
with a mask (transformers' static-cache attention), so ``achieved_gb_s`` counts weights + the whole cache buffer.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from dataclasses import dataclass

import torch

from kit import hardware, metrics
from kit.errors import UserError
from kit.models import max_positions, param_bytes

KV_FILLS = ("prefill", "synthetic")
#: most measurement blocks per point: past it a typo (1e9) would never end
MAX_REPEATS = 1000


@dataclass(frozen=True)
class PointConfig:
    """What one point measures. ``context_len`` = KV length at the start of decode (tokens)."""

    concurrency: int
    context_len: int
    decode_steps: int = 16
    warmup_steps: int = 3
    repeats: int = 3
    kv_fill: str = "prefill"
    #: tokens per prefill chunk (None: the whole context in one forward); see :func:`prefill`
    prefill_chunk: int | None = None

    def validate(self, max_positions: int | None = None) -> PointConfig:
        """Raise UserError naming a bad value and what is allowed; with ``max_positions`` (the model's), the
        cache of context + the larger of warm-up and decode steps must fit in it (the message names the steps
        when they alone leave no room for any context)."""
        for name in ("concurrency", "context_len", "decode_steps", "repeats"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"{name}={v!r} must be an integer >= 1")
        if self.repeats > MAX_REPEATS:
            raise UserError(f"repeats={self.repeats} must be an integer from 1 to {MAX_REPEATS} (blocks per point)")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise UserError(f"warmup_steps={self.warmup_steps!r} must be an integer >= 0")
        if self.kv_fill not in KV_FILLS:
            raise UserError(f"kv_fill={self.kv_fill!r}; allowed: {KV_FILLS}")
        c = self.prefill_chunk
        if c is not None and (not isinstance(c, int) or isinstance(c, bool) or c < 1):
            raise UserError(f"prefill_chunk={c!r} must be an integer >= 1 (tokens per chunk) or None (one forward)")
        if max_positions and self.cache_len > max_positions:
            name = "decode_steps" if self.decode_steps >= self.warmup_steps else "warmup_steps"
            steps = getattr(self, name)
            room, cap = max_positions - steps, max_positions  # room: the longest context these steps leave
            if room >= 1:
                head, fix = f"context_len={self.context_len}", f"context_len <= {room}"
            else:
                head = f"{name}={steps}"
                fix = f"{name} <= {cap - self.context_len}" if self.context_len < cap else f"context + steps <= {cap}"
            raise UserError(
                f"{head} needs a cache of {self.cache_len} tokens (context {self.context_len} + {steps} "
                f"{name.replace('_', ' ')}) but the model supports at most {cap} positions; use {fix}"
            )
        return self

    @property
    def cache_len(self) -> int:
        return self.context_len + max(self.warmup_steps, self.decode_steps)

    def processed_tokens(self) -> tuple[int, int]:
        """``(output tokens, input + output tokens)`` the point processes, warm-up included (its energy per token):
        ``repeats × B × (warm-up + decode steps)`` generated, plus ``repeats × B × context`` prompt tokens when the
        cache is filled by a real prefill."""
        new = self.repeats * self.concurrency * (self.warmup_steps + self.decode_steps)
        return new, new + (self.repeats * self.concurrency * self.context_len if self.kv_fill == "prefill" else 0)


class Forward:
    """Calls a transformers causal LM one way on every 5.x version: the cache keyword is ``cache`` (5.24+) or
    ``past_key_values`` (older), and older versions also take ``cache_position``."""

    def __init__(self, model):
        self.model = model
        params = inspect.signature(model.forward).parameters
        inner = inspect.signature(model.model.forward).parameters if hasattr(model, "model") else params
        self.cache_kw = "cache" if "cache" in params or "cache" in inner else "past_key_values"
        self.takes_cache_position = "cache_position" in params or "cache_position" in inner

    def __call__(self, ids, positions, cache):
        kw = {self.cache_kw: cache, "position_ids": positions, "use_cache": True, "logits_to_keep": 1}
        if self.takes_cache_position:
            kw["cache_position"] = positions[0]
        return self.model(input_ids=ids, **kw).logits


def new_cache(model, max_cache_len: int):
    """A ``transformers.StaticCache`` for ``max_cache_len`` tokens (allocated lazily on first update)."""
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_cache_len)


def _layers(cache):
    return [layer for layer in getattr(cache, "layers", []) if getattr(layer, "keys", None) is not None]


def set_cache_length(cache, length: int) -> None:
    """Rewind/advance every static layer's fill level to ``length`` tokens (later writes overwrite stale ones)."""
    for layer in getattr(cache, "layers", []):
        cl = getattr(layer, "cumulative_length", None)
        if isinstance(cl, torch.Tensor):
            cl.fill_(length)


def cache_bytes(cache) -> int:
    """Bytes of the allocated key/value buffers of a cache."""
    return sum(t.numel() * t.element_size() for layer in _layers(cache) for t in (layer.keys, layer.values))


def cache_bytes_per_token(cache, batch: int) -> float:
    """Bytes one token of one sequence occupies in an allocated cache (all layers, K and V, as stored): the
    *measured* counterpart of the planner's :func:`kit.plan.sizes.kv_bytes_per_token` (from the architecture)."""
    layers = _layers(cache)
    if not layers:
        return float("nan")
    max_len = layers[0].keys.shape[-2]
    return cache_bytes(cache) / (batch * max_len)


def measured_kv_bytes_per_token(model, batch: int = 2, tokens: int = 8, max_cache_len: int = 64) -> float:
    """Bytes per token per sequence of ``model``'s static KV cache, measured: allocate a cache of
    ``max_cache_len`` tokens, run one forward of ``batch`` × ``tokens`` ids through it (allocating every layer's
    buffers) and divide the allocated bytes by ``batch × max_cache_len`` (:func:`cache_bytes_per_token`).

    Raises:
        UserError: ``tokens`` not in [1, max_cache_len] or ``batch`` < 1.
    """
    if batch < 1 or not 1 <= tokens <= max_cache_len:
        raise UserError(
            f"batch={batch}, tokens={tokens}, max_cache_len={max_cache_len}; need batch >= 1 and "
            "1 <= tokens <= max_cache_len"
        )
    device = next(model.parameters()).device
    cache = new_cache(model, max_cache_len)
    pos = torch.arange(tokens, device=device).unsqueeze(0).expand(batch, -1)
    with torch.inference_mode():
        Forward(model)(torch.zeros(batch, tokens, dtype=torch.long, device=device), pos, cache)
    return cache_bytes_per_token(cache, batch)


def prefill(fwd: Forward, ids: torch.Tensor, positions: torch.Tensor, cache, chunk: int | None = None):
    """Prefill ``ids`` (B x C token ids) into an empty static ``cache`` at ``positions`` (B x >= C); returns the
    logits of the last position (B x 1 x vocab).

    ``chunk=None``: one forward of B x C tokens. transformers' sdpa path then skips the mask (``is_causal`` with
    an empty cache) but every activation is B x C x hidden (MLP: B x C x intermediate), and a kernel without a
    fused causal path falls back to a C x C score matrix per head.

    ``chunk=N``: ``ceil(C / N)`` forwards of B x N tokens, each attending to the whole static buffer. Memory per
    step is linear in the context: the boolean mask transformers builds for a non-empty static cache is
    N x cache_len bytes (1 x 1 x N x cache_len, broadcast over the batch by a view), the attention scores at most
    B x heads x N x cache_len elements (only where sdpa falls back to its math kernel), the keys/values
    B x heads x cache_len x head_dim per layer when sdpa repeats grouped kv heads; nothing is C x C. Each chunk
    attends over the whole preallocated buffer (masked), so a chunked prefill does up to ~2x the attention work
    of an unchunked causal one at long contexts.
    """
    C = ids.shape[1]
    step = C if chunk is None else min(chunk, C)
    for s in range(0, C, step):
        logits = fwd(ids[:, s : s + step], positions[:, s : min(s + step, C)], cache)
    return logits


def synthetic_fill(model, cache, batch: int, context_len: int, device, positions, fwd: Forward, seed: int = 0):
    """Initialise ``cache`` with one real token, then fill positions [0, context_len) with random N(0, 1) keys
    and values, and set the fill level to ``context_len``. Untimed."""
    ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
    fwd(ids, positions[:, 0:1], cache)
    g = torch.Generator(device=device).manual_seed(seed)
    for layer in _layers(cache):
        for buf in (layer.keys, layer.values):
            buf[:, :, :context_len].normal_(generator=g)  # in place on the device: no host copy of a 32k cache
    set_cache_length(cache, context_len)


def run_point(
    model, point: PointConfig, device: str = "cpu", seed: int = 0, compile: bool = False, compile_backend="inductor"
) -> dict:
    """Measure one point and return a record in the :mod:`kit.results` schema (status "ok").

    Args:
        model: a transformers causal LM built by :func:`kit.models.build_model`.
        point: what to measure; validated against the model's max positions.
        device: the torch device the model lives on.
        compile: decode steps through :class:`kit.measure.compiled.CompiledDecode` (torch.compile; CUDA/HIP graphs
            on GPUs); prefill stays eager.
        compile_backend: torch.compile backend ("inductor"; "eager" = dynamo tracing only, for quick checks).

    Returns:
        dict with prefill_ms(+_min), ttft_ms, tpot_ms_p50/p90/p99/min/mean, tpot_n, decode_tok_s,
        tok_s_per_stream, prefill_tok_s, achieved_gb_s, peak_mem_gb, kv_cache_gb, weights_gb and x_ extras
        (x_step_ms: every timed step, ms; x_engine_mode; compiled: x_compile_s, x_recompiles_timed).

    Raises:
        ValueError: bad point. torch.OutOfMemoryError: the device ran out of memory (the caller records it).
    """
    return point_record(time_point(model, point, device, seed, compile, compile_backend))


def time_point(
    model, point: PointConfig, device="cpu", seed=0, compile=False, compile_backend="inductor", around_timed=None
) -> dict:
    """The raw measurement of :func:`run_point`: ``point``, ``step_ms`` / ``prefill_ms`` (every timed decode step
    and prefill, ms), ``kv_bytes``, ``weights_bytes``, ``peak_gb`` + ``peak_method``, ``finite`` and ``extras``
    (x_ columns). :func:`point_record` turns it into a row; a tensor-parallel worker first replaces the times by
    the slowest rank's and the bytes by the sum over ranks.

    ``around_timed``: a context manager (e.g. a ``torch.profiler.profile``) held around the timed decode steps of
    every repeat (warm-up and prefill stay outside it); each timed step then also runs inside a
    ``torch.profiler.record_function("kit.decode_step")`` range, so a trace marks the steps. Its steps are timed
    as usual, so they include the profiler's own cost: :mod:`kit.measure.profile` keeps them apart from the
    unprofiled figures."""
    cfg = model.config
    point.validate(max_positions(cfg))
    B, C, S = point.concurrency, point.context_len, point.decode_steps
    dev = torch.device(device)
    fwd = Forward(model)
    hardware.reset_peak_memory(dev)
    vocab = int(cfg.vocab_size)
    g = torch.Generator(device="cpu").manual_seed(seed)
    positions = torch.arange(point.cache_len, device=dev).unsqueeze(0).expand(B, -1)
    cache = new_cache(model, point.cache_len)
    prefill_ms: list[float] = []
    step_ms: list[float] = []
    sync = hardware.synchronize
    step, extras = fwd, {"x_engine_mode": "eager"}
    if compile:
        from kit.measure.compiled import CompiledDecode, dynamo_compiles

        step = CompiledDecode(fwd, B, dev, backend=compile_backend)
        extras = {"x_engine_mode": step.engine_mode, "x_compile_mode": step.mode, "x_prefill_mode": "eager"}
        recompiles = 0
    with torch.inference_mode():
        if point.kv_fill == "synthetic":
            synthetic_fill(model, cache, B, C, dev, positions, fwd, seed)
        for rep in range(point.repeats):
            if point.kv_fill == "prefill":
                prompt = torch.randint(0, vocab, (B, C), generator=g).to(dev)
                set_cache_length(cache, 0)
                sync(dev)
                t0 = time.perf_counter()
                logits = prefill(fwd, prompt, positions, cache, point.prefill_chunk)
                tok = logits[:, -1].argmax(-1, keepdim=True)
                sync(dev)
                prefill_ms.append((time.perf_counter() - t0) * 1000.0)
            else:
                tok = torch.randint(0, vocab, (B, 1), generator=g).to(dev)
            if compile and rep == 0:  # the compile: outside every timed region
                set_cache_length(cache, C)
                t0 = time.perf_counter()
                step(tok, positions[:, C : C + 1], cache)
                sync(dev)
                extras["x_compile_s"] = time.perf_counter() - t0
            for phase, n in (("warmup", point.warmup_steps), ("timed", S)):
                set_cache_length(cache, C)
                before = dynamo_compiles() if compile else 0
                marked = around_timed is not None and phase == "timed"
                with around_timed if marked else contextlib.nullcontext():
                    for i in range(n):
                        pos = positions[:, C + i : C + i + 1]
                        sync(dev)
                        t0 = time.perf_counter()
                        with torch.profiler.record_function("kit.decode_step") if marked else contextlib.nullcontext():
                            logits = step(tok, pos, cache)
                            tok = logits[:, -1].argmax(-1, keepdim=True)
                            sync(dev)
                        if phase == "timed":
                            step_ms.append((time.perf_counter() - t0) * 1000.0)
                if compile and phase == "timed":
                    recompiles += dynamo_compiles() - before
    if compile:
        extras["x_recompiles_timed"] = recompiles
    peak_gb, peak_method = hardware.peak_memory_gb(dev)
    raw = dict(point=point, step_ms=step_ms, prefill_ms=prefill_ms, kv_bytes=cache_bytes(cache))
    raw.update(weights_bytes=param_bytes(model), peak_gb=peak_gb, peak_method=peak_method, extras=extras)
    raw["finite"] = bool(torch.isfinite(logits).all().item())
    return raw


def point_record(raw: dict) -> dict:
    """The results row of a raw measurement (:func:`time_point`): latency statistics with n (:mod:`kit.metrics`),
    throughputs, bytes as GB. ``achieved_gb_s`` = (weights + whole cache buffer) bytes / TPOT p50.

    Raises:
        RuntimeError: no decode step was timed."""
    point, step_ms, prefill_ms = raw["point"], raw["step_ms"], raw["prefill_ms"]
    B, C = point.concurrency, point.context_len
    if not step_ms:
        raise RuntimeError("no decode step was timed")
    tpot = metrics.Latency.from_values(step_ms)
    pre = metrics.Latency.from_values(prefill_ms)
    rec = {
        "backend": "engine",
        "status": "ok",
        "concurrency": B,
        "context_len": C,
        "decode_steps": point.decode_steps,
        "kv_fill": point.kv_fill,
        "repeats": point.repeats,
        "x_prefill_chunk": point.prefill_chunk if point.kv_fill == "prefill" else None,
        "prefill_ms": pre.p50 if prefill_ms else None,
        "prefill_ms_min": pre.min if prefill_ms else None,
        "ttft_ms": pre.p50 if prefill_ms else None,
        "tpot_ms_p50": tpot.p50,
        "tpot_ms_p90": tpot.p90,
        "tpot_ms_p99": tpot.p99,
        "tpot_ms_min": tpot.min,
        "tpot_ms_mean": tpot.mean,
        "tpot_n": tpot.n,
        "decode_tok_s": metrics.decode_tok_s(B, tpot.p50),
        "tok_s_per_stream": metrics.tok_s_per_stream(tpot.p50),
        "prefill_tok_s": metrics.prefill_tok_s(B, C, pre.p50) if prefill_ms else None,
        "achieved_gb_s": metrics.achieved_gb_s(raw["weights_bytes"] + raw["kv_bytes"], tpot.p50 / 1000.0),
        "peak_mem_gb": raw["peak_gb"],
        "peak_mem_method": raw["peak_method"],
        "kv_cache_gb": raw["kv_bytes"] / 1e9,
        "weights_gb": raw["weights_bytes"] / 1e9,
        "x_step_ms": list(step_ms),
        "x_prefill_ms": list(prefill_ms),
        "x_logits_finite": raw["finite"],
        **raw["extras"],
    }
    if not raw["finite"]:
        rec["error"] = "non-finite logits in the last decode step (dtype overflow?): speed figures are not trustworthy"
    return rec


def bare_decode_loop_ms(model, batch: int, context_len: int, steps: int, device: str = "cpu") -> float:
    """Reference for harness overhead: ``steps`` plain forward calls (B x 1 tokens, same static cache, no per-step
    timing or synchronisation), timed as a whole; returns ms per step. Used by ``kit bench``."""
    dev = torch.device(device)
    fwd = Forward(model)
    positions = torch.arange(context_len + steps, device=dev).unsqueeze(0).expand(batch, -1)
    cache = new_cache(model, context_len + steps)
    with torch.inference_mode():
        synthetic_fill(model, cache, batch, context_len, dev, positions, fwd)
        tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        set_cache_length(cache, context_len)
        for i in range(min(3, steps)):  # warm-up
            tok = fwd(tok, positions[:, context_len + i : context_len + i + 1], cache)[:, -1].argmax(-1, keepdim=True)
        set_cache_length(cache, context_len)
        hardware.synchronize(dev)
        t0 = time.perf_counter()
        for i in range(steps):
            tok = fwd(tok, positions[:, context_len + i : context_len + i + 1], cache)[:, -1].argmax(-1, keepdim=True)
        hardware.synchronize(dev)
        return (time.perf_counter() - t0) * 1000.0 / steps
