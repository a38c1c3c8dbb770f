"""Workloads of the served view: the requests a load point sends and when they arrive.

:class:`RequestInput` is one request (prompt and lengths); :func:`build_workload` draws ``n`` random prompts of a
target input length (ISL) asking for a target output length (OSL), optionally spread uniformly around them;
:data:`WORKLOAD_PRESETS` names the usual ISL/OSL pairs; :func:`arrival_gaps_s` draws the gaps between arrivals for
a request rate and burstiness. The load generator that sends them is :mod:`kit.serve.load`. Prompts are random
(no prefix sharing), so a server's prefix cache cannot shorten prefill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kit.errors import UserError

if TYPE_CHECKING:  # the type only: kit.serve.load imports this module
    from kit.serve.load import LoadConfig

#: ISL/OSL workload presets (tokens): the seed's 1024/400 and InferenceX-style 1k/1k, 1k/8k, 8k/1k.
WORKLOAD_PRESETS: dict[str, tuple[int, int]] = {
    "seed": (1024, 400),
    "1k/1k": (1024, 1024),
    "1k/8k": (1024, 8192),
    "8k/1k": (8192, 1024),
}


@dataclass
class RequestInput:
    """One request of a workload: a prompt (text, or token ids for ``/v1/completions``) and its lengths (tokens;
    ``input_tokens`` is None when unknown)."""

    prompt: str | list[int]
    input_tokens: int | None
    max_tokens: int


def build_workload(
    n: int,
    isl: int,
    osl: int,
    tokenizer=None,
    seed: int = 0,
    isl_range: float = 0.0,
    osl_range: float = 0.0,
    as_token_ids: bool = False,
) -> list[RequestInput]:
    """``n`` random prompts of ~``isl`` tokens, each asking for ~``osl`` output tokens.

    With an HF tokenizer, prompts are random non-special token ids decoded to text and re-encoded (truncated to
    the target length), and ``input_tokens`` is the re-encoded length. With ``as_token_ids`` (or no tokenizer)
    the prompt is the token id list itself (``/v1/completions`` accepts it). Without a tokenizer and without
    ``as_token_ids``, the prompt is ``isl`` random words and ``input_tokens`` is None (unknown).

    Raises:
        UserError: n, isl or osl < 1, or a range outside [0, 1).
    """
    if n < 1 or isl < 1 or osl < 1:
        raise UserError(f"n={n}, isl={isl}, osl={osl}; all must be >= 1")
    for name, r in (("isl_range", isl_range), ("osl_range", osl_range)):
        if not 0.0 <= r < 1.0:
            raise UserError(f"{name}={r}; must be in [0, 1)")
    rng = np.random.default_rng(seed)

    def draw(x: int, r: float) -> int:
        lo, hi = max(1, int(round(x * (1 - r)))), max(1, int(round(x * (1 + r))))
        return int(rng.integers(lo, hi + 1)) if hi > lo else x

    hf = tokenizer is not None and hasattr(tokenizer, "decode") and hasattr(tokenizer, "vocab_size")
    if hf:
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        vocab = np.array([i for i in range(int(tokenizer.vocab_size)) if i not in special])
    out = []
    for _ in range(n):
        li, lo_ = draw(isl, isl_range), draw(osl, osl_range)
        if hf:
            ids = [int(x) for x in rng.choice(vocab, size=li)]
            if as_token_ids:
                out.append(RequestInput(ids, li, lo_))
                continue
            text = tokenizer.decode(ids)
            re_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(re_ids) > li:
                text = tokenizer.decode(re_ids[:li])
                re_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(RequestInput(text, len(re_ids), lo_))
        elif as_token_ids:
            out.append(RequestInput([int(x) for x in rng.integers(1000, 20000, size=li)], li, lo_))
        else:
            words = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta"]
            out.append(RequestInput(" ".join(rng.choice(words, size=li)), None, lo_))
    return out


def arrival_gaps_s(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Gaps (s) before each of ``n`` requests: zeros for ``request_rate = inf``, else
    Gamma(shape=b, scale=1/(rate·b)) with burstiness b (b = 1: Poisson): mean 1/rate, variance 1/(rate²·b), so
    ``burstiness = inf`` gives gaps of exactly 1/rate. Convention of vLLM's ``benchmarks/serve.py``; METRICS.md
    "Arrivals". Every gap returned is finite and >= 0.

    Raises:
        UserError: rate or burstiness NaN or not > 0 (each named).
    """
    for name, v in (("request_rate", request_rate), ("burstiness", burstiness)):
        if not (float(v) > 0):  # also NaN
            raise UserError(f"{name}={v!r}; must be > 0 (inf allowed)")
    if math.isinf(request_rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        return np.full(n, 1.0 / request_rate)
    rng = np.random.default_rng(seed + 7919)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    if not np.isfinite(gaps).all():  # e.g. a rate so small that 1/rate overflows
        raise UserError(f"request_rate={request_rate!r}, burstiness={burstiness!r} give non-finite arrival gaps")
    return gaps


def default_workload(cfg: LoadConfig, tokenizer=None) -> list[RequestInput]:
    """The requests a load point sends when none are given: warm-up + measured (256 when unbounded), at most 1024
    distinct prompts (reused round-robin); token-id prompts on ``/v1/completions`` without a tokenizer."""
    n = (cfg.num_requests or 256) + cfg.warmup_requests
    return build_workload(
        min(n, 1024),
        cfg.isl,
        cfg.osl,
        tokenizer,
        cfg.seed,
        cfg.isl_range,
        cfg.osl_range,
        as_token_ids=tokenizer is None and cfg.endpoint == "completions",
    )
