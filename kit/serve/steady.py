"""The steady-state window of a served point: statistics over the requests that ran while the in-flight count was
at the target, beside the whole-run figures, each with the number of requests (or tokens) it used.

Whole-run figures include the ramp-up (the first requests find an idle server) and the drain (the last ones run
with fewer peers), both of which flatter latency. Here the in-flight count over time comes from every request's
``sent_s`` / ``end_s`` (warm-up ones included: they occupy slots too). With a concurrency cap and all requests
offered at once, the window runs from the first moment ``max_concurrency`` requests are in flight to the last
moment they are; with a finite request rate (an open loop) it runs from the first measured send to the last send.
A request counts when it ran entirely inside the window; :func:`steady_columns` are the row's figures (beside
:func:`kit.serve.aggregate.aggregate`'s whole-run ones). :func:`run_handover` runs warm-up and measured requests
as one closed loop, so warm-up requests hand over to measured ones without the server draining in between.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from kit import metrics as M
from kit.serve.load import LoadConfig, run_coro, run_load_async
from kit.serve.workload import RequestInput


def run_handover(
    cfg: LoadConfig,
    workload: Sequence[RequestInput],
    tokenizer=None,
    on_progress: Callable[[int, bool], None] | None = None,
) -> tuple[list[dict], dict]:
    """One closed loop of ``warmup_requests + num_requests`` requests (:func:`kit.serve.load.run_load_async` with
    no separate warm-up phase); the first ``warmup_requests`` sent are flagged ``warmup`` afterwards and the
    run's ``duration_s`` spans the measured ones. Returns ``(records, run_info)``.

    Raises:
        UserError: an invalid ``cfg`` or an empty workload.
    """
    w = int(cfg.warmup_requests)
    n = None if cfg.num_requests is None else int(cfg.num_requests) + w
    records, info = run_coro(
        run_load_async(replace(cfg, warmup_requests=0, num_requests=n), workload, tokenizer, on_progress)
    )
    for r in sorted(records, key=lambda r: (r.get("sent_s", 0.0), r["request_id"]))[:w]:
        r["warmup"] = True
    meas = [r for r in records if not r["warmup"]]
    if meas:
        info = {**info, "duration_s": max(r["end_s"] for r in meas) - min(r["sent_s"] for r in meas)}
    return records, info


def timed(records: Sequence[dict]) -> list[dict]:
    """The records that were sent and have both time stamps (``sent_s``, ``end_s``)."""
    return [r for r in records if not r.get("not_sent") and r.get("sent_s") is not None and r.get("end_s") is not None]


def inflight_steps(records: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """``(times_s, counts)``: the in-flight count after each send/end event (requests never sent excluded)."""
    rs = timed(records)
    ev = sorted([(r["sent_s"], 1) for r in rs] + [(r["end_s"], -1) for r in rs], key=lambda e: (e[0], e[1]))
    if not ev:
        return np.zeros(0), np.zeros(0, dtype=int)
    t, d = zip(*ev)
    return np.asarray(t, dtype=float), np.cumsum(d)


def steady_window(records: Sequence[dict], target: int | None, request_rate: float = math.inf):
    """``(start_s, end_s)`` of the steady window (see the module text), or None when the count never reached
    ``target`` (or, for an open loop, fewer than two measured sends)."""
    if math.isfinite(request_rate) or not target:
        sends = sorted(r["sent_s"] for r in timed(records) if not r.get("warmup"))
        return (sends[0], sends[-1]) if len(sends) > 1 else None
    t, n = inflight_steps(records)
    at = np.nonzero(n >= int(target))[0]
    if not at.size:
        return None
    return float(t[at[0]]), float(t[at[-1] + 1]) if at[-1] + 1 < len(t) else float(t[at[-1]])


def steady_columns(records: Sequence[dict], cfg: LoadConfig) -> dict:
    """The row's steady-state columns (``x_steady_*``): window start/end/length (s), target, requests used
    (``x_steady_n``), TTFT / TPOT / E2EL percentiles with their n, token-pooled ITL p50 with its n, output tok/s
    (tokens whose chunk arrived inside the window / window length; a chunk's tokens are the request's output
    tokens spread evenly over its chunks) and request throughput (completions inside / window length).
    Every figure is None when there is no window (``x_steady_note`` says why)."""
    target = cfg.max_concurrency if math.isinf(cfg.request_rate) else None
    win = steady_window(records, target, cfg.request_rate)
    out: dict = {"x_steady_target": target, "x_steady_note": None}
    if win is None or win[1] <= win[0]:
        out["x_steady_note"] = f"in-flight count never reached the target {target}" if target else "too few sends"
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
