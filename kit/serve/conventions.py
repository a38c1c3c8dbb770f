"""Metric conventions side by side: from one capture (a served point's request records), each peer tool's
definition of ITL, TPOT and interactivity, named, with the tool it comes from, so a reader can tell why two tools
disagree about the same server.

The definitions (``docs/metrics.md``, "Interactivity and the conventions of peer tools"), as :data:`CONVENTIONS`
lists them:

- ITL, raw chunk gaps: every gap between token-bearing chunks, pooled (vLLM ``bench serve``, SGLang
  ``bench_serving``).
- ITL, token-normalised gaps: a k-token chunk's gap split into k entries, pooled (the kit).
- ITL, per-request average: (E2EL − TTFT) / (output tokens − 1) per request (AIPerf / GenAI-Perf "inter token
  latency").
- TPOT, per request: the same formula (vLLM, SGLang, the kit).
- interactivity, 1000 / TPOT per request, tok/s (InferenceX; AIPerf "output token throughput per user").
- interactivity, output tok/s ÷ concurrency, one value per point (vLLM Pareto plots).
- interactivity, 1 / p90(E2EL / output tokens), one value per point, includes TTFT (E2E-normalised).

With one token per chunk the three ITLs agree; with several tokens per chunk (speculative decoding, MTP,
detokeniser batching) raw gaps are k times the per-token figures, and the E2E-normalised interactivity is lower
than 1000 / TPOT by the share of TTFT in the request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kit import metrics as M

#: (quantity, convention, unit, source) of every row :func:`metric_conventions` returns, in order
CONVENTIONS = (
    ("ITL", "raw chunk gaps", "ms", "vLLM bench serve, SGLang bench_serving"),
    ("ITL", "token-normalised gaps", "ms", "the kit (docs/metrics.md)"),
    ("ITL", "per-request average (E2EL - TTFT) / (n - 1)", "ms", "AIPerf / GenAI-Perf"),
    ("TPOT", "per request (E2EL - TTFT) / (n - 1)", "ms", "vLLM, SGLang, the kit"),
    ("interactivity", "1000 / TPOT per request", "tok/s", "InferenceX; AIPerf output token throughput per user"),
    ("interactivity", "output tok/s / concurrency", "tok/s", "vLLM Pareto plots"),
    ("interactivity", "1 / p90(E2EL / output tokens)", "tok/s", "E2E-normalised, includes TTFT"),
)


def _stats(values: Sequence[float]) -> dict:
    p = M.percentiles(values)
    return {
        "p50": p["p50"],
        "p90": p["p90"],
        "p99": p["p99"],
        "mean": float(np.mean(values)) if values else np.nan,
        "n": p["n"],
    }


def metric_conventions(records: Sequence[dict], row: dict | None = None) -> pd.DataFrame:
    """One row per convention of :data:`CONVENTIONS`: ``quantity``, ``convention``, ``p50``, ``p90``, ``p99``,
    ``mean``, ``n`` (entries used: chunk gaps, tokens or requests), ``unit``, ``source``.

    Args:
        records: request records of one point (:func:`kit.serve.record.request_record`); failed and warm-up
            ones are left out.
        row: the point's results row, for the per-point conventions (``output_tok_s``, ``concurrency``); without
            it "output tok/s / concurrency" is NaN.

    A per-point convention fills ``p50`` = ``mean`` with its one value (its n: the requests behind it).
    """
    ok = [r for r in records if r.get("ok") and not r.get("warmup")]
    tpot = [r["tpot_ms"] for r in ok if r.get("tpot_ms")]
    per_tok = [r["e2el_ms"] / 1000.0 / r["output_tokens"] for r in ok if r.get("e2el_ms") and r.get("output_tokens")]
    e2e_norm = 1.0 / M.percentiles(per_tok, (90,))["p90"] if per_tok else np.nan
    row = row or {}
    conc, tps = row.get("concurrency"), row.get("output_tok_s")
    per_conc = float(tps) / float(conc) if conc and tps is not None and not pd.isna(tps) else np.nan

    def single(v: float, n: int) -> dict:
        return {"p50": v, "p90": np.nan, "p99": np.nan, "mean": v, "n": n}

    values = [
        _stats([x for r in ok for x in r.get("chunk_gaps_ms") or []]),
        _stats([x for r in ok for x in r.get("itl_ms") or []]),
        _stats(tpot),
        _stats(tpot),
        _stats([1000.0 / t for t in tpot]),
        single(per_conc, len(ok)),
        single(e2e_norm, len(per_tok)),
    ]
    return pd.DataFrame(
        [
            {"quantity": q, "convention": c, **v, "unit": u, "source": s}
            for (q, c, u, s), v in zip(CONVENTIONS, values, strict=True)
        ]
    )
