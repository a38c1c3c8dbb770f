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
trace) on time (p99 within :data:`SEND_LATE_LIMIT_MS`); the machine was not so busy with other processes that
the client's time stamps came late (machine contention, named apart from client-bound); every request returned
the requested output length; the prompts were as long as asked (the server's count within
:data:`PROMPT_TOKEN_TOLERANCE`); (in-process) the logits stayed finite; the GPU was not throttling. A check whose
inputs are missing is not applied (a server without ``/metrics`` cannot show preemptions); ``x_validity_checks``
lists the checks that were.

Two notes describe a row without judging it: :func:`queueing_verdict` (``x_queued``: the TTFT is mostly the
server's queue, from its queue-time histogram and its waiting-requests gauge) and :func:`itl_step_note` (the
kit's per-token ITL beside the server's per-engine-step ITL when steps carry several tokens).
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
#: how far the mean prompt length (the server's count, else the client's) may be from the one asked for: this
#: fraction of it, and never less than kit.serve.aggregate.PROMPT_TOKEN_SLACK tokens
PROMPT_TOKEN_TOLERANCE = 0.02


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


def _contention(row, opts):
    busy = _val(row, "x_machine_contention")
    if busy is None:
        return None
    return bool(busy), _val(row, "x_contention_warning") or "machine contention: other processes held the CPUs"


def _buffered(row, opts):
    n = _val(row, "x_buffered_requests")
    if n is None:
        return None
    cause = (
        "the client was starved of CPU by other processes (machine contention), or a buffering proxy sits between "
        "the kit and the server"
        if _val(row, "x_machine_contention")
        else "a buffering proxy between the kit and the server?"
    )
    return n > 0, f"{n} request(s) arrived whole in one network read ({cause}): their TPOT and ITL are unknown"


def _prompt_tokens(row, opts):
    excess, target = _val(row, "x_prompt_tokens_excess_mean"), _val(row, "x_prompt_tokens_target_mean")
    if excess is None or not target:
        return None
    from kit.serve.aggregate import PROMPT_TOKEN_SLACK

    tol = max(float(PROMPT_TOKEN_SLACK), PROMPT_TOKEN_TOLERANCE * target)
    basis, sent = _val(row, "x_prompt_tokens_basis"), _val(row, "x_prompt_tokens_sent_mean")
    who = "the server counted" if basis == "server" else "the client counted"
    if sent is None:
        hint = "the client had no tokenizer to build them to length (pass --tokenizer)"
    elif basis == "server" and abs(sent - target) <= tol:
        hint = "the client's tokenizer or chat template is not the server's (pass the served model's --tokenizer)"
    else:
        hint = "the tokenizer could not build a prompt of that length (a chat template longer than --isl?)"
    return abs(excess) > tol, (
        f"prompts off their length: {who} {target + excess:.1f} prompt tokens per request on average, "
        f"{target:.1f} asked for ({excess:+.1f}, > ±{tol:.1f}): {hint}"
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
    ("machine_contention", _contention),
    ("buffered", _buffered),
    ("osl", _osl),
    ("prompt_tokens", _prompt_tokens),
    ("logits", _logits),
    ("throttling", _throttling),
)


#: share of the client's mean TTFT that the server's mean queue time must reach for a row to be ``x_queued``
QUEUE_SHARE_LIMIT = 0.5
#: mean of the server's waiting-requests gauge over the point at or above which a row is ``x_queued`` (requests
#: waited for admission through the point, not for one engine step now and then)
WAITING_MEAN_LIMIT = 1.0


def queueing_verdict(row) -> dict:
    """Whether a row's TTFT is mostly waiting in the server's queue: ``x_queued`` (True / False; None when the
    server exported none of the inputs), ``x_queue_share`` (the server's mean queue time / the client's mean TTFT),
    ``x_queue_share_server`` (/ the server's own mean TTFT) and ``x_queueing`` (the note, None unless queued).

    Queued when the server's mean queue time (``x_server_queue_ms_mean``) is at least :data:`QUEUE_SHARE_LIMIT`
    of the client's mean TTFT or of the server's own (``x_server_ttft_ms_mean``: both server-side, so a client
    starved of CPU, whose TTFT then grows, does not hide the queue), or the server's waiting-requests gauge
    averaged at least :data:`WAITING_MEAN_LIMIT` over the scrapes taken while the point ran
    (``x_server_waiting_requests_mean``; its maximum when no mean is known). Not a validity failure: the figures
    are right, but they measure the server's admission limit (vLLM ``--max-num-seqs``, SGLang
    ``--max-running-requests``, a full KV cache), not prefill."""
    queue, ttft, server_ttft = (
        _val(row, k) for k in ("x_server_queue_ms_mean", "x_ttft_ms_mean", "x_server_ttft_ms_mean")
    )
    waiting = _val(row, "x_server_waiting_requests_mean")
    waiting_max, running = _val(row, "x_server_waiting_requests_max"), _val(row, "x_server_running_requests_max")
    share = queue / ttft if queue is not None and ttft else None
    own = queue / server_ttft if queue is not None and server_ttft else None
    out = {"x_queued": None, "x_queue_share": share, "x_queue_share_server": own, "x_queueing": None}
    if share is None and own is None and waiting is None and waiting_max is None:
        return out
    by_share = any(x is not None and x >= QUEUE_SHARE_LIMIT for x in (share, own))
    by_gauge = (waiting if waiting is not None else waiting_max or 0) >= WAITING_MEAN_LIMIT
    out["x_queued"] = by_share or by_gauge
    if not out["x_queued"]:
        return out
    parts = [f"{queue:.1f} ms of the mean TTFT {ttft:.1f} ms is server queue time"] if share is not None else []
    if waiting_max is not None:
        mean = f" ({waiting:.1f} on average)" if waiting is not None else ""
        parts.append(f"up to {waiting_max:g} request(s) waiting{mean}" + (f", {running:g} running" if running else ""))
    if own is not None:
        parts.append(f"{100 * own:.0f} % of the server's own mean TTFT ({server_ttft:.1f} ms)")
    out["x_queueing"] = (
        "queueing: " + ", ".join(parts) + " (the server admits fewer sequences than the offered concurrency)"
    )
    return out


def queueing_note(row) -> str | None:
    """The ``x_queueing`` note of :func:`queueing_verdict`: why a row's TTFT is mostly waiting, or None."""
    return queueing_verdict(row)["x_queueing"]


#: tokens per engine step (client tokens / server ITL observations) above which :func:`itl_step_note` speaks
TOKENS_PER_STEP_NOTE = 1.2


def itl_step_note(row) -> str | None:
    """The kit's ITL per token beside the server's per engine step, when a step carries several tokens
    (speculative decoding, multi-token prediction): vLLM and SGLang observe one ITL per step, so their mean is
    the kit's times the tokens per step. None when the server reports no steps or one token each."""
    step, mine = _val(row, "x_server_itl_ms_mean"), _val(row, "x_itl_ms_mean")
    n_steps, tokens = _val(row, "x_server_itl_n"), _val(row, "x_server_client_output_tokens")
    spec = _val(row, "x_spec_tokens_per_step_client")
    if step is None or mine is None or not n_steps or not tokens:
        return None
    per_step = spec if spec is not None else tokens / n_steps
    if per_step < TOKENS_PER_STEP_NOTE:
        return None
    gap = _val(row, "x_chunk_gap_ms_p50")
    gap_text = f", the client's chunk gap p50 {gap:.2f} ms" if gap is not None else ""
    return (
        f"ITL {mine:.2f} ms per token (the kit's, mean) vs {step:.2f} ms per engine step (the server's mean"
        f"{gap_text}): {per_step:.2f} tokens per step (speculative decoding or multi-token steps)"
    )


def invalid_note(row) -> str:
    """``"INVALID: <reasons>"`` for a row whose ``x_valid`` is False, else ``""`` (for printed summaries)."""
    return f"INVALID: {_val(row, 'x_invalid_reasons')}" if _val(row, "x_valid") is False else ""
