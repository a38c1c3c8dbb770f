"""The validity verdict of a row: can its figures be trusted, and if not, why.

:func:`validity` looks at the columns a point already carries — the client's counts and self-check, the server's
``x_server_*`` columns (:mod:`kit.serve.server_metrics`), the power sampler's throttling verdict
(:mod:`kit.measure.power`), the in-process logits check — and returns ``x_valid`` and ``x_invalid_reasons``. A
row with ``x_valid = False`` is a problem row for :func:`kit.results.ok_mask` (``kit.results.PROBLEM_FLAGS``), so
every summary, panel, export and compare shows it flagged and never counts it ok.

The checks (``docs/metrics.md``, "Validity"): no request failed; no preemption during the
point; no prefix-cache hit where the workload promised unique prompts (a cache serving the prompts inflates
throughput and shrinks TTFT); server- and client-counted output tokens agree within :data:`TOKEN_TOLERANCE`; the
client was not the bottleneck; every request returned the requested output length; (in-process) the logits stayed
finite; the GPU was not throttling. A check whose inputs are missing is not applied (a server without
``/metrics`` cannot show preemptions); ``x_validity_checks`` lists the checks that were.
"""

from __future__ import annotations

import math

import pandas as pd

#: largest abs(server − client) / client output-token difference a valid row may have (1 %)
TOKEN_TOLERANCE = 0.01


def _val(row, key):
    v = row.get(key) if hasattr(row, "get") else getattr(row, key, None)
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def validity(row, unique_prompts: bool = True, token_tolerance: float = TOKEN_TOLERANCE) -> dict:
    """``{"x_valid", "x_invalid_reasons", "x_validity_checks"}`` for one row (a dict or a DataFrame row).

    Args:
        unique_prompts: the workload promised distinct prompts (the kit's random workloads do), so any
            prefix-cache hit means the server reused work; False for a workload that shares prefixes on purpose.
        token_tolerance: largest relative server/client output-token difference (default 1 %).

    Returns: ``x_valid`` (bool), ``x_invalid_reasons`` ("; "-joined text, None when valid) and
    ``x_validity_checks`` (the checks applied, comma-joined).
    """
    reasons, checks = [], []

    def check(name, bad, why):
        checks.append(name)
        if bad:
            reasons.append(why)

    failed = _val(row, "failed")
    if failed is not None:
        check("failed", failed > 0, f"{failed} request(s) failed")
    pre = _val(row, "x_server_preemptions")
    pre_now = _val(row, "x_server_preempted_requests_max")
    if pre is not None or pre_now is not None:
        n = max(pre or 0, pre_now or 0)
        check("preemptions", n > 0, f"{n:g} preemption(s) during the point (KV cache full: requests recomputed)")
    hits = _val(row, "x_server_prefix_cache_hits")
    if unique_prompts and hits is not None:
        check("prefix_cache", hits > 0, f"{hits:g} prefix-cache hit tokens although every prompt was unique")
    diff = _val(row, "x_server_output_tokens_diff_frac")
    if diff is not None:
        server, client = _val(row, "x_server_generation_tokens"), _val(row, "x_server_client_output_tokens")
        check(
            "server_tokens",
            diff > token_tolerance,
            f"server counted {server:g} output tokens, client {client:g} ({100 * diff:.1f} % apart, > "
            f"{100 * token_tolerance:g} %)",
        )
    bound = _val(row, "x_client_bound")
    if bound is not None:
        check("client_bound", bool(bound), f"client-bound: {_val(row, 'x_client_warning') or 'the client was busy'}")
    osl = _val(row, "x_osl_mismatch")
    if osl is not None:
        check("osl", osl > 0, f"{osl} request(s) returned another output length than requested (OSL mismatch)")
    finite = _val(row, "x_logits_finite")
    if finite is not None:
        check("logits", not bool(finite), "non-finite logits")
    thr = _val(row, "x_throttled")
    if thr is not None:
        frac = _val(row, "x_throttle_fraction") or 0.0
        check("throttling", bool(thr), f"GPU throttled (clock low at the power limit) in {100 * frac:.0f} % of samples")
    return {
        "x_valid": not reasons,
        "x_invalid_reasons": "; ".join(reasons) or None,
        "x_validity_checks": ",".join(checks),
    }


def invalid_note(row) -> str:
    """``"INVALID: <reasons>"`` for a row whose ``x_valid`` is False, else ``""`` (for printed summaries)."""
    return f"INVALID: {_val(row, 'x_invalid_reasons')}" if _val(row, "x_valid") is False else ""
