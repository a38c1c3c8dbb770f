"""Every metric the kit reports, defined once, as pure functions on numbers and arrays.

Column names carry units. Sources for the conventions: vLLM ``vllm/benchmarks/serve.py`` (``calculate_metrics``),
SGLang ``bench_serving.py`` / ``bench_one_batch.py``, AIPerf metric docs, InferenceX ``utils/process_result.py``,
nccl-tests ``doc/PERFORMANCE.md``. Where those tools disagree the choice here is the kit's and is stated. Every
metric with its formula, unit, source and worked cases (E1 ... C1): ``docs/metrics.md`` (a page of the docs site).

In-process, static batch (B = concurrency, C = context_len):
    ttft_ms        = prefill_ms                         (a static batch's first token comes out of prefill)
    tpot_ms_pXX    = percentile over decode steps of step wall time (all sequences advance together: TPOT = ITL)
    decode_tok_s   = B / (tpot_ms_p50 / 1000)
    tok_s_per_stream = 1000 / tpot_ms_p50
    prefill_tok_s  = B × C / (prefill_ms / 1000)
    achieved_gb_s  = (weight bytes + KV bytes read per step) / (tpot_ms_p50 / 1000) / 1e9

Served, per request (t0 = request sent, after the concurrency-slot wait ``client_queue_ms``):
    ttft_ms  = first token-bearing chunk − t0;   e2el_ms = last token-bearing chunk − t0
    tpot_ms  = (e2el_ms − ttft_ms) / (output_tokens − 1), only when output_tokens > 1 (else missing)
    chunk_gaps_ms = gaps between consecutive token-bearing chunks
    itl_ms   = each chunk gap split evenly over the tokens that chunk carried (token-normalised)
    itl_ms   also holds the first chunk's k − 1 extra tokens as 0-ms entries, so a request's mean ITL = its TPOT

Served, aggregates: request_throughput = completed / duration_s; output_tok_s = Σ out / duration_s;
total_tok_s = (Σ in + Σ out) / duration_s; goodput_rps = #requests meeting every SLO (inclusive) / duration_s
(a request with ≤ 1 output token passes the TPOT SLO). Means of TTFT/TPOT/E2EL are per request; ITL pools tokens.

Percentiles: ``numpy.percentile(method="linear")`` (the vLLM/SGLang convention); always report ``n``.

Cost: usd_per_mtok = usd_per_gpu_hr × n_gpus / (tok_s × 3600) × 1e6; tok_per_usd = tok_s × 3600 /
(usd_per_gpu_hr × n_gpus); tok_s_per_gpu = tok_s / n_gpus.

Collectives (nccl-tests): algbw = S / t; busbw = algbw × 2(n−1)/n (all-reduce), × (n−1)/n (all-gather,
reduce-scatter, all-to-all), × 1 (broadcast, reduce, send/recv).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kit.errors import UserError

PERCENTILE_METHOD = "linear"


def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    """Percentiles of ``values`` (NaN/None dropped) by ``numpy.percentile(method="linear")``.

    Returns:
        ``{"p50": .., "p90": .., "p99": .., "n": count}``; with n == 0 every percentile is NaN.
    """
    arr = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))], dtype=float)
    out: dict[str, float] = {"n": int(arr.size)}
    for q in qs:
        key = f"p{q:g}"
        out[key] = float(np.percentile(arr, q, method=PERCENTILE_METHOD)) if arr.size else float("nan")
    return out


@dataclass(frozen=True)
class Latency:
    """Summary of a latency sample in ms: median, p90, p99, min, mean and the sample count n."""

    p50: float
    p90: float
    p99: float
    min: float
    mean: float
    n: int

    @classmethod
    def from_values(cls, values_ms: Iterable[float]) -> Latency:
        v = [float(x) for x in values_ms if x is not None and not math.isnan(float(x))]
        if not v:
            nan = float("nan")
            return cls(nan, nan, nan, nan, nan, 0)
        p = percentiles(v)
        return cls(p["p50"], p["p90"], p["p99"], float(min(v)), float(np.mean(v)), len(v))

    def __str__(self) -> str:
        return (
            f"p50 {self.p50:.3f} ms, p90 {self.p90:.3f}, p99 {self.p99:.3f}, min {self.min:.3f}, "
            f"mean {self.mean:.3f} (n={self.n})"
        )


# ---------------------------------------------------------------- in-process
def decode_tok_s(batch: int, tpot_ms: float) -> float:
    """Aggregate decode throughput, tok/s = batch / (tpot_ms / 1000)."""
    return batch / (tpot_ms / 1000.0) if tpot_ms > 0 else float("nan")


def tok_s_per_stream(tpot_ms: float) -> float:
    """Per-user interactivity, tok/s = 1000 / tpot_ms."""
    return 1000.0 / tpot_ms if tpot_ms > 0 else float("nan")


def prefill_tok_s(batch: int, context_len: int, prefill_ms: float) -> float:
    """Prefill throughput, tok/s = batch × context_len / (prefill_ms / 1000)."""
    return batch * context_len / (prefill_ms / 1000.0) if prefill_ms > 0 else float("nan")


def achieved_gb_s(bytes_moved: float, seconds: float) -> float:
    """Achieved bandwidth, GB/s = bytes / seconds / 1e9."""
    return bytes_moved / seconds / 1e9 if seconds > 0 else float("nan")


# ---------------------------------------------------------------- served, per request
@dataclass
class RequestTimings:
    """Per-request served metrics (ms). Missing values are ``None``."""

    ttft_ms: float | None
    e2el_ms: float | None
    tpot_ms: float | None
    output_tokens: int
    chunk_gaps_ms: list[float]
    itl_ms: list[float] | None  # None: tokens per chunk unknown (case E7)


def request_timings(
    chunk_times_s: Sequence[float], chunk_tokens: Sequence[int] | None, output_tokens: int, t0_s: float = 0.0
) -> RequestTimings:
    """Per-request TTFT, E2EL, TPOT, chunk gaps and token-normalised ITL from token-bearing chunks.

    The per-token rule (docs/metrics.md, "Served benchmarks"; cases E1, E5, E7): each chunk gap is split evenly
    over the tokens the later chunk carried, and the first chunk's k − 1 extra tokens enter ``itl_ms`` as 0-ms
    entries (its wait is the TTFT, not a gap), so ``len(itl_ms) = output_tokens − 1`` and
    ``mean(itl_ms) = tpot_ms`` whenever the chunk counts add up to ``output_tokens``.

    Args:
        chunk_times_s: arrival time (s) of each *token-bearing* chunk, in order (role-only, empty and usage-only
            chunks must already be excluded).
        chunk_tokens: tokens each chunk carried (from usage deltas or the tokenizer); a chunk with 0 tokens
            (e.g. whitespace that tokenises to nothing) adds no ITL entry and its gap is folded into the next.
            None: unknown, then ``itl_ms`` is None (the chunk gaps are still computed, every chunk a gap).
        output_tokens: completion tokens of the request (usage.completion_tokens or a tokenizer count).
        t0_s: the time the request was sent (after any client queue wait).

    Returns:
        :class:`RequestTimings`. With no token-bearing chunk, ttft/e2el/tpot are None; tpot is None unless
        output_tokens > 1 (never a division by zero).

    Raises:
        UserError: chunk_times_s and chunk_tokens differ in length.
    """
    if chunk_tokens is not None and len(chunk_times_s) != len(chunk_tokens):
        raise UserError(f"chunk_times_s has {len(chunk_times_s)} entries but chunk_tokens has {len(chunk_tokens)}")
    if not len(chunk_times_s):
        return RequestTimings(None, None, None, int(output_tokens), [], None if chunk_tokens is None else [])
    t_first, t_last = chunk_times_s[0], chunk_times_s[-1]
    ttft = (t_first - t0_s) * 1000.0
    e2el = (t_last - t0_s) * 1000.0
    tpot = tpot_ms(ttft, e2el, output_tokens)
    if chunk_tokens is None:
        gaps = [(b - a) * 1000.0 for a, b in zip(chunk_times_s, chunk_times_s[1:])]
        return RequestTimings(ttft, e2el, tpot, int(output_tokens), gaps, None)
    gaps: list[float] = []
    itl: list[float] = [0.0] * max(0, int(chunk_tokens[0]) - 1)
    prev = t_first
    for t, k in zip(chunk_times_s[1:], chunk_tokens[1:]):
        k = int(k)
        if k <= 0:
            continue  # carries no token: no ITL entry; its time is part of the next token's gap
        gap = (t - prev) * 1000.0
        gaps.append(gap)
        if k == 1:
            itl.append(gap)
        else:
            itl.extend([gap / k] * k)
        prev = t
    return RequestTimings(ttft, e2el, tpot, int(output_tokens), gaps, itl)


def tpot_ms(ttft_ms: float, e2el_ms: float, output_tokens: int) -> float | None:
    """TPOT, ms = (e2el_ms − ttft_ms) / (output_tokens − 1); None when output_tokens ≤ 1."""
    return (e2el_ms - ttft_ms) / (output_tokens - 1) if output_tokens > 1 else None


def meets_slo(
    ttft: float | None,
    tpot: float | None,
    e2el: float | None,
    output_tokens: int,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    slo_e2el_ms: float | None = None,
) -> bool:
    """Whether one request meets every given SLO (inclusive ≤). ≤ 1 output token passes the TPOT SLO."""
    if slo_ttft_ms is not None and (ttft is None or ttft > slo_ttft_ms):
        return False
    if slo_tpot_ms is not None and output_tokens > 1 and (tpot is None or tpot > slo_tpot_ms):
        return False
    if slo_e2el_ms is not None and (e2el is None or e2el > slo_e2el_ms):
        return False
    return True


def goodput_rps(n_good: int, duration_s: float) -> float:
    """Goodput, req/s = requests meeting every SLO / duration_s."""
    return n_good / duration_s if duration_s > 0 else float("nan")


def throughputs(completed: int, input_tokens: int, output_tokens: int, duration_s: float) -> dict[str, float]:
    """Served throughputs over a run: request_throughput (req/s), output_tok_s, total_tok_s."""
    if duration_s <= 0:
        nan = float("nan")
        return {"request_throughput": nan, "output_tok_s": nan, "total_tok_s": nan}
    return {
        "request_throughput": completed / duration_s,
        "output_tok_s": output_tokens / duration_s,
        "total_tok_s": (input_tokens + output_tokens) / duration_s,
    }


# ---------------------------------------------------------------- cost
def usd_per_mtok(tok_s: float, usd_per_gpu_hr: float, n_gpus: int = 1) -> float:
    """$ per million tokens = usd_per_gpu_hr × n_gpus / (tok_s × 3600) × 1e6 (NaN when tok_s ≤ 0)."""
    if not tok_s or tok_s <= 0 or usd_per_gpu_hr is None:
        return float("nan")
    return usd_per_gpu_hr * n_gpus / (tok_s * 3600.0) * 1e6


def tok_per_usd(tok_s: float, usd_per_gpu_hr: float, n_gpus: int = 1) -> float:
    """Tokens per $ = tok_s × 3600 / (usd_per_gpu_hr × n_gpus)."""
    if not usd_per_gpu_hr or usd_per_gpu_hr <= 0:
        return float("nan")
    return tok_s * 3600.0 / (usd_per_gpu_hr * n_gpus)


def tok_s_per_gpu(tok_s: float, n_gpus: int) -> float:
    """tok/s/GPU = tok_s / n_gpus."""
    return tok_s / n_gpus


# ---------------------------------------------------------------- collectives
_BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def busbw_factor(op: str, n_ranks: int) -> float:
    """busbw / algbw of a collective over ``n_ranks`` (all-reduce 2(n−1)/n, all-gather, reduce-scatter and
    all-to-all (n−1)/n, broadcast, reduce and send/recv 1), the nccl-tests convention (nccl-tests
    doc/PERFORMANCE.md; all-to-all as its alltoall_perf). The size S the factor applies to is the whole buffer: the
    gathered output of all-gather, the input of reduce-scatter, one rank's whole send buffer (n chunks) of
    all-to-all, the reduced buffer of all-reduce.

    Raises:
        ValueError: unknown ``op`` or ``n_ranks`` < 1.
    """
    if op not in _BUSBW_FACTOR:
        raise UserError(f"unknown collective {op!r}; allowed: {sorted(_BUSBW_FACTOR)}")
    if n_ranks < 1:
        raise UserError(f"n_ranks={n_ranks} must be >= 1")
    return _BUSBW_FACTOR[op](n_ranks)


def bus_bandwidth_gb_s(op: str, size_bytes: float, seconds: float, n_ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for a collective, nccl-tests convention: algbw = S / t with S the whole buffer
    (see :func:`busbw_factor`), busbw = algbw × the op's factor.

    Raises:
        ValueError: unknown op (lists the allowed ones) or n_ranks < 1.
    """
    factor = busbw_factor(op, n_ranks)
    alg = size_bytes / seconds / 1e9
    return alg, alg * factor
