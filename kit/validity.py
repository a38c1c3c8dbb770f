"""The validity verdict of a row: can its figures be trusted, and if not, why.

:func:`validity` looks at the columns a point already carries — the client's counts and self-check, the server's
``x_server_*`` columns (:mod:`kit.serve.server_metrics`), the power sampler's throttling verdict
(:mod:`kit.measure.power`), the in-process logits check — and returns ``x_valid`` and ``x_invalid_reasons``. A
row with ``x_valid = False`` is a problem row for :func:`kit.results.ok_mask` (``kit.results.PROBLEM_FLAGS``), so
every summary, panel, export and compare shows it flagged and never counts it ok.

The checks (``docs/metrics.md``, "Validity"): no request failed; no preemption during the
point; no prefix-cache hit where the workload promised unique prompts (a cache serving the prompts inflates
throughput and shrinks TTFT), read from the server's ``/metrics`` and from the per-request usage (cached tokens
beyond the intended share, :data:`HIT_RATE_TOLERANCE`); server- and client-counted output tokens agree within
:data:`TOKEN_TOLERANCE`; the client was not the bottleneck, and sent requests due at a time (open loop, ramp,
trace) on time (p99 within :data:`SEND_LATE_LIMIT_MS`); every request returned the requested output length;
(in-process) the logits stayed finite; the GPU was not throttling. A check whose inputs are missing is not
applied (a server without ``/metrics`` cannot show preemptions); ``x_validity_checks`` lists the checks that were.
"""

from __future__ import annotations

import math

import pandas as pd

#: largest abs(server − client) / client output-token difference a valid row may have (1 %)
TOKEN_TOLERANCE = 0.01
#: how far the prompt tokens a server reports as served from its prefix cache (per-request usage) may exceed the
#: share the workload intended (fraction of prompt tokens; a chat template's fixed first block is a few %)
HIT_RATE_TOLERANCE = 0.05
#: p99 of how late the client sent requests due at a time (ms) above which the offered load was not the one asked
#: for (the client self-check's event-loop lag limit, kit.serve.selfcheck.LOOP_LAG_LIMIT_MS)
SEND_LATE_LIMIT_MS = 10.0


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
    ``x_validity_checks`` (the checks applied, comma-joined; :data:`CHECKS` in order).
    """
    opts = {"unique_prompts": unique_prompts, "token_tolerance": token_tolerance}
    reasons, checks = [], []
    for name, judge in CHECKS:
        verdict = judge(row, opts)
        if verdict is None:  # its inputs are missing: not applied
            continue
        checks.append(name)
        bad, why = verdict
        if bad:
            reasons.append(why)
    return {
        "x_valid": not reasons,
        "x_invalid_reasons": "; ".join(reasons) or None,
        "x_validity_checks": ",".join(checks),
    }


def _failed(row, opts):
    n = _val(row, "failed")
    return None if n is None else (n > 0, f"{n} request(s) failed")


def _preemptions(row, opts):
    pre, pre_now = _val(row, "x_server_preemptions"), _val(row, "x_server_preempted_requests_max")
    if pre is None and pre_now is None:
        return None
    n = max(pre or 0, pre_now or 0)
    return n > 0, f"{n:g} preemption(s) during the point (KV cache full: requests recomputed)"


def _prefix_cache(row, opts):
    hits = _val(row, "x_server_prefix_cache_hits")
    if not opts["unique_prompts"] or hits is None:
        return None
    return hits > 0, f"{hits:g} prefix-cache hit tokens although every prompt was unique"


def _prefix_cache_usage(row, opts):
    achieved, intended = _val(row, "x_prefix_hit_rate_achieved"), _val(row, "x_prefix_hit_rate_intended")
    if achieved is None or intended is None:
        return None
    return achieved > intended + HIT_RATE_TOLERANCE, (
        f"the server answered {100 * achieved:.0f} % of prompt tokens from its prefix cache (per-request usage), "
        f"the workload intended {100 * intended:.0f} %: prompts an earlier run sent? (leave --seed unset for new "
        "prompts per run)"
    )


def _server_tokens(row, opts):
    diff, tol = _val(row, "x_server_output_tokens_diff_frac"), opts["token_tolerance"]
    if diff is None:
        return None
    server, client = _val(row, "x_server_generation_tokens"), _val(row, "x_server_client_output_tokens")
    return diff > tol, (
        f"server counted {server:g} output tokens, client {client:g} ({100 * diff:.1f} % apart, > {100 * tol:g} %)"
    )


def _send_lateness(row, opts):
    late = _val(row, "x_send_late_ms_p99")
    if late is None:
        return None
    worst = _val(row, "x_send_late_ms_max") or late
    return late > SEND_LATE_LIMIT_MS, (
        f"the client sent requests late (p99 {late:.1f} ms, max {worst:.0f} ms after their due time, > "
        f"{SEND_LATE_LIMIT_MS:g} ms): the offered load was not the one asked for"
    )


def _spec_acceptance(row, opts):
    over = _val(row, "x_server_spec_overcount_frac")
    if over is None:
        return None
    return over > opts["token_tolerance"], (
        f"the server's speculative-decoding counters imply {100 * over:.0f} % more emitted tokens than the client "
        "received (drafts accepted past the end of a sequence?): its acceptance figures are overstated; "
        "x_spec_tokens_per_step_client is what the client saw"
    )


def _client_bound(row, opts):
    bound = _val(row, "x_client_bound")
    if bound is None:
        return None
    return bool(bound), f"client-bound: {_val(row, 'x_client_warning') or 'the client was busy'}"


def _buffered(row, opts):
    n = _val(row, "x_buffered_requests")
    if n is None:
        return None
    return n > 0, (
        f"{n} request(s) arrived whole in one network read (a buffering proxy between the kit and the server?): "
        "their per-token timing (TPOT, ITL) is unknown"
    )


def _osl(row, opts):
    n = _val(row, "x_osl_mismatch")
    return (
        None if n is None else (n > 0, f"{n} request(s) returned another output length than requested (OSL mismatch)")
    )


def _logits(row, opts):
    finite = _val(row, "x_logits_finite")
    return None if finite is None else (not bool(finite), "non-finite logits")


def _throttling(row, opts):
    thr = _val(row, "x_throttled")
    if thr is None:
        return None
    frac = _val(row, "x_throttle_fraction") or 0.0
    return bool(thr), f"GPU throttled (clock low at the power limit) in {100 * frac:.0f} % of samples"


#: every check, in the order applied: (name in ``x_validity_checks``, judge(row, options) -> None when its inputs
#: are missing, else (bad?, reason))
CHECKS = (
    ("failed", _failed),
    ("preemptions", _preemptions),
    ("prefix_cache", _prefix_cache),
    ("prefix_cache_usage", _prefix_cache_usage),
    ("server_tokens", _server_tokens),
    ("send_lateness", _send_lateness),
    ("spec_acceptance", _spec_acceptance),
    ("client_bound", _client_bound),
    ("buffered", _buffered),
    ("osl", _osl),
    ("logits", _logits),
    ("throttling", _throttling),
)


#: share of the kit's mean TTFT that the server's mean queue time must reach for :func:`queueing_note` to speak
QUEUE_SHARE_NOTE = 0.2


def queueing_note(row) -> str | None:
    """Why a row's TTFT is mostly waiting, when it is: requests queued in the server (its ``x_server_queue_ms_mean``
    is at least :data:`QUEUE_SHARE_NOTE` of the client's mean TTFT, or its waiting-requests gauge was above 0
    while the point ran). Not a validity failure: the figures are right, but they measure the server's admission
    limit (vLLM ``--max-num-seqs``, SGLang ``--max-running-requests``, a full KV cache), not prefill. None otherwise,
    or when the server exported neither."""
    queue, ttft = _val(row, "x_server_queue_ms_mean"), _val(row, "x_ttft_ms_mean")
    waiting, running = _val(row, "x_server_waiting_requests_max"), _val(row, "x_server_running_requests_max")
    share = queue / ttft if queue is not None and ttft else None
    if not ((share is not None and share >= QUEUE_SHARE_NOTE) or (waiting is not None and waiting > 0)):
        return None
    parts = [f"{queue:.1f} ms of the mean TTFT {ttft:.1f} ms is server queue time"] if share is not None else []
    if waiting is not None:
        parts.append(f"up to {waiting:g} request(s) waiting" + (f", {running:g} running" if running else ""))
    return "queueing: " + ", ".join(parts) + " (the server admits fewer sequences than the offered concurrency)"


def invalid_note(row) -> str:
    """``"INVALID: <reasons>"`` for a row whose ``x_valid`` is False, else ``""`` (for printed summaries)."""
    return f"INVALID: {_val(row, 'x_invalid_reasons')}" if _val(row, "x_valid") is False else ""
