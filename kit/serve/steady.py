"""The steady-state window of a served point: statistics over the requests that ran while the load was at its
target, beside the whole-run figures, each with the number of requests (or tokens) it used; and the concurrency
the client really kept.

Whole-run figures include the ramp-up (the first requests find an idle server) and the drain (the last ones run
with fewer peers), both of which flatter latency. Here the in-flight count over time comes from every request's
``sent_s`` / ``end_s`` (warm-up ones included: they occupy slots too). How the window is found is the schedule's
(:class:`kit.serve.schedule.Steady`): with a target (a closed loop's concurrency) it runs from the first moment
``target`` requests are in flight to the last moment they are; for multi-turn sessions the count is of
conversations in progress (first send of a conversation to the end of its last turn), so think time does not
break it; with no target (an open loop, a trace) it runs from the first measured send to the last send; a ramp
has none (the load changes with every request) and says so. A request counts when it ran entirely inside the
window; :func:`steady_columns` are the row's figures (beside :func:`kit.serve.aggregate.aggregate`'s whole-run
ones). :func:`measured_concurrency` is the in-flight count the client kept, time-weighted over the measured span.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kit import metrics as M
from kit.serve.schedule import Steady


def timed(records: Sequence[dict]) -> list[dict]:
    """The records that were sent and have both time stamps (``sent_s``, ``end_s``)."""
    return [r for r in records if not r.get("not_sent") and r.get("sent_s") is not None and r.get("end_s") is not None]


def inflight_steps(records: Sequence[dict], unit: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(times_s, counts)``: the in-flight count after each send/end event (requests never sent excluded). With
    ``unit`` (a record field such as ``session_id``), the count is of units in progress: from a unit's first send
    to its last end."""
    rs = timed(records)
    if unit is not None:
        spans: dict = {}
        for r in rs:
            a, b = spans.get(r.get(unit), (r["sent_s"], r["end_s"]))
            spans[r.get(unit)] = (min(a, r["sent_s"]), max(b, r["end_s"]))
        pairs = list(spans.values())
    else:
        pairs = [(r["sent_s"], r["end_s"]) for r in rs]
    ev = sorted([(a, 1) for a, _ in pairs] + [(b, -1) for _, b in pairs], key=lambda e: (e[0], e[1]))
    if not ev:
        return np.zeros(0), np.zeros(0, dtype=int)
    t, d = zip(*ev)
    return np.asarray(t, dtype=float), np.cumsum(d)


def steady_window(records: Sequence[dict], target: int | None, unit: str | None = None):
    """``(start_s, end_s)`` of the steady window (see the module text), or None when the count never reached
    ``target`` (or, with no target, fewer than two measured sends)."""
    if not target:
        sends = sorted(r["sent_s"] for r in timed(records) if not r.get("warmup"))
        return (sends[0], sends[-1]) if len(sends) > 1 else None
    t, n = inflight_steps(records, unit)
    at = np.nonzero(n >= int(target))[0]
    if not at.size:
        return None
    return float(t[at[0]]), float(t[at[-1] + 1]) if at[-1] + 1 < len(t) else float(t[at[-1]])


def measured_concurrency(records: Sequence[dict]) -> dict:
    """The client's in-flight requests, measured: ``x_inflight_mean`` (time-weighted mean from the first measured
    send to the last measured end, warm-up requests counted while they run) and ``x_inflight_max``; None when
    nothing measured was sent."""
    meas = [r for r in timed(records) if not r.get("warmup")]
    if not meas:
        return {"x_inflight_mean": None, "x_inflight_max": None}
    t0, t1 = min(r["sent_s"] for r in meas), max(r["end_s"] for r in meas)
    t, n = inflight_steps(records)
    inside = (t >= t0) & (t < t1)
    if t1 <= t0 or not inside.any():
        return {"x_inflight_mean": None, "x_inflight_max": int(n.max()) if n.size else None}
    edges = np.clip(np.append(t, t1), t0, t1)
    weights = np.diff(edges)
    return {"x_inflight_mean": float(np.sum(n * weights) / (t1 - t0)), "x_inflight_max": int(n[inside].max())}


def steady_columns(records: Sequence[dict], steady: Steady) -> dict:
    """The row's steady-state columns (``x_steady_*``): window start/end/length (s), target, requests used
    (``x_steady_n``), TTFT / TPOT / E2EL percentiles with their n, token-pooled ITL p50 with its n, output tok/s
    (tokens whose chunk arrived inside the window / window length; a chunk's tokens are the request's output
    tokens spread evenly over its chunks) and request throughput (completions inside / window length).
    Every figure is None when there is no window (``x_steady_note`` says why)."""
    out: dict = {"x_steady_target": steady.target, "x_steady_note": steady.note}
    if steady.note:
        return out
    win = steady_window(records, steady.target, steady.unit)
    if win is None or win[1] <= win[0]:
        what = "conversations in progress" if steady.unit == "session_id" else "in-flight count"
        out["x_steady_note"] = f"{what} never reached the target {steady.target}" if steady.target else "too few sends"
        return out
    t0, t1 = win
    records = timed(records)
    ok = [r for r in records if r.get("ok") and not r.get("warmup")]
    inside = [r for r in ok if r["sent_s"] >= t0 and r["end_s"] <= t1]
    toks = 0.0
    for r in (r for r in records if r.get("ok")):
        ct = [r["sent_s"] + x / 1000.0 for x in r.get("chunk_times_ms") or []]
        per = int(r.get("output_tokens") or 0) / len(ct) if ct else 0.0
        toks += per * sum(t0 <= x <= t1 for x in ct)
    p = {k: M.percentiles([r.get(f"{k}_ms") for r in inside]) for k in ("ttft", "tpot", "e2el")}
    itl = M.percentiles([x for r in inside for x in r.get("itl_ms") or []], (50,))
    out |= {"x_steady_start_s": t0, "x_steady_end_s": t1, "x_steady_window_s": t1 - t0, "x_steady_n": len(inside)}
    for k, v in p.items():
        out |= {f"x_steady_{k}_ms_p50": v["p50"], f"x_steady_{k}_ms_p90": v["p90"], f"x_steady_{k}_ms_p99": v["p99"]}
        out[f"x_steady_{k}_n"] = v["n"]
    out |= {"x_steady_itl_ms_p50": itl["p50"], "x_steady_itl_n": itl["n"], "x_steady_output_tok_s": toks / (t1 - t0)}
    out["x_steady_request_throughput"] = sum(t0 <= r["end_s"] <= t1 for r in ok) / (t1 - t0)
    return out
