"""The tour's measured lessons: prefill vs decode, KV-cache length, concurrency (the in-process engine,
:func:`kit.measure.engine.run_point`) and "is the stack sane" (:func:`kit.check.harness.check_op`). Each takes a
:class:`kit.tour.context.TourContext` and its controls' values and returns :func:`kit.tour.context.result`."""

from __future__ import annotations

from kit.errors import UserError
from kit.tour.context import TourContext, finite, fmt, int_setting, ladder, result

#: timed decode steps, warm-up steps and repeats of every measured point: each number is a median (TTFT of
#: REPEATS prefills, ITL/TPOT of REPEATS × DECODE_STEPS steps), so one descheduled step does not make a trend
DECODE_STEPS, WARMUP_STEPS, REPEATS = 8, 2, 3


def point(concurrency: int, context: int, kv_fill: str = "synthetic"):
    """The lessons' :class:`kit.measure.engine.PointConfig`: ``concurrency`` sequences at ``context`` tokens."""
    from kit.measure.engine import PointConfig

    return PointConfig(concurrency, context, DECODE_STEPS, WARMUP_STEPS, REPEATS, kv_fill)


def longest_context(model: str) -> int:
    """The longest context (tokens) a lesson can measure on ``model`` (a preset or checkpoint directory): its
    positions less the steps after the context, the limit :meth:`kit.measure.engine.PointConfig.validate` checks.
    The sliders' maximum comes from here.

    Raises:
        UserError: an unknown model (:func:`kit.models.get_config`).
    """
    from kit.models import get_config, max_positions

    return max_positions(get_config(model)) - (point(1, 1).cache_len - 1)


def _context_setting(name: str, v, lo: int, model: str) -> int:
    """``v`` as a context length in ``lo``..:func:`longest_context` (the message names the limit and why)."""
    top = longest_context(model)
    i = int_setting(name, v, lo, 131072)
    if i > top:
        raise UserError(
            f"{name}={i}: at most {top} tokens on {model} ({top + point(1, 1).cache_len - 1} positions less "
            f"{point(1, 1).cache_len - 1} decode steps)"
        )
    return i


def noise(recs: list[dict]) -> str | None:
    """The kit's noise verdict on these points (:func:`kit.measure.sweep.noise_warning`: TPOT p50 far above the
    fastest step), None on a quiet machine."""
    import pandas as pd

    from kit.measure.sweep import noise_warning

    return noise_warning(pd.DataFrame(recs))


def _noisy(numbers: dict, recs: list[dict]) -> dict:
    """``numbers`` with the noise verdict and the sample sizes beside them."""
    verdict = noise(recs)
    pre = f"{REPEATS} prefills, " if recs[0].get("ttft_ms") is not None else ""
    numbers["samples"] = f"medians of {pre}{recs[0]['tpot_n']} decode steps per point"
    if verdict:
        numbers["noise"] = verdict
    return numbers


# ------------------------------------------------------------------------------------------------ lessons 2-4
def prefill_vs_decode(
    ctx: TourContext, prompt_len: int = 512, model: str | None = None, dtype: str | None = None
) -> dict:
    """TTFT and ITL at prompt lengths up to ``prompt_len`` tokens (batch 1): ``prompt_len``/8, /4, /2 and itself,
    each the median of :data:`REPEATS` prefills (TTFT, ms) and of :data:`REPEATS` × :data:`DECODE_STEPS` timed decode
    steps (ITL = TPOT p50, ms) by :func:`kit.measure.engine.time_point`; ``noise``: the kit's noise verdict
    (:func:`noise`) or None.

    Raises:
        UserError: ``prompt_len`` not in 8..:func:`longest_context`; an unknown model.
    """
    from kit.measure.engine import run_point

    model, dtype = model or ctx.model, dtype or ctx.dtype
    L = _context_setting("prompt_len", prompt_len, 8, model)
    m = ctx.models.get(model, dtype, ctx.device).model
    rows, problems, recs = [], [], []
    for n in ladder(L, lo=8):
        rec = run_point(m, point(1, n, "prefill"), ctx.device)
        recs.append(rec)
        rows.append((n, rec["ttft_ms"], rec["tpot_ms_p50"]))
        if not finite(rec["ttft_ms"], rec["tpot_ms_p50"]) or rec.get("error"):
            problems.append(f"prompt {n}: {rec.get('error') or 'non-finite TTFT/ITL'}")
    (n0, t0, i0), (n1, t1, i1) = rows[0], rows[-1]
    line = (
        f"prompt {n0} → {n1} tokens: TTFT {fmt(t0, 'ms')} → {fmt(t1, 'ms')} ({fmt(t1 / t0, '', 1)}×), "
        f"ITL {fmt(i0, 'ms')} → {fmt(i1, 'ms')} ({fmt(i1 / i0, '', 1)}×)"
        if finite(t0, t1, i0, i1) and t0 > 0 and i0 > 0
        else "no finite timings"
    )
    return result(
        "prefill",
        line,
        problems,
        numbers=_noisy({"TTFT at the longest prompt": fmt(t1, "ms"), "ITL at the longest prompt": fmt(i1, "ms")}, recs),
        noise=noise(recs),
        chart={
            "kind": "line",
            "x": "prompt length (tokens)",
            "y": "ms",
            "series": [
                {"name": "TTFT (prefill)", "points": [[n, t] for n, t, _ in rows]},
                {"name": "ITL (one decode step)", "points": [[n, i] for n, _, i in rows]},
            ],
        },
        table={"columns": ["prompt tokens", "TTFT ms", "ITL ms"], "rows": [list(r) for r in rows]},
    )


def kv_length(ctx: TourContext, context: int = 2048, model: str | None = None, dtype: str | None = None) -> dict:
    """Measured TPOT (ms, median of :data:`REPEATS` × :data:`DECODE_STEPS` steps, batch 1) at contexts
    ``context``/8, /4, /2 and ``context`` tokens (KV filled synthetically, :class:`kit.measure.engine.PointConfig`
    ``kv_fill="synthetic"``) and the planner's TPOT at the same contexts on this machine
    (:func:`kit.plan.roofline.predict_point`, ``accelerator="local"``); ``noise``: the kit's noise verdict.

    Raises:
        UserError: ``context`` not in 16..:func:`longest_context`; an unknown model.
    """
    from kit.measure.engine import run_point
    from kit.plan.config import PredictConfig
    from kit.plan.roofline import predict_point

    model, dtype = model or ctx.model, dtype or ctx.dtype
    C = _context_setting("context", context, 16, model)
    m = ctx.models.get(model, dtype, ctx.device).model
    meas, pred, problems, recs = [], [], [], []
    cfg = PredictConfig(accelerator="local", dtype=dtype)
    for c in ladder(C, lo=16):
        rec = run_point(m, point(1, c), ctx.device)
        recs.append(rec)
        meas.append([c, rec["tpot_ms_p50"]])
        if not finite(rec["tpot_ms_p50"]) or rec.get("error"):
            problems.append(f"context {c}: {rec.get('error') or 'non-finite TPOT'}")
        p = predict_point(model, 1, c, cfg)
        pred.append([c, p.get("tpot_ms_p50")])
        assumptions = p.get("assumptions", "")
    line = f"TPOT at {meas[0][0]} tokens {fmt(meas[0][1], 'ms')}, at {meas[-1][0]} tokens {fmt(meas[-1][1], 'ms')}"
    line += f"; the planner says {fmt(pred[0][1], 'ms')} → {fmt(pred[-1][1], 'ms')}"
    return result(
        "kv",
        line,
        problems,
        numbers=_noisy(
            {f"measured TPOT at {C} tokens": fmt(meas[-1][1], "ms"), "predicted": fmt(pred[-1][1], "ms")}, recs
        ),
        noise=noise(recs),
        chart={
            "kind": "line",
            "x": "context (KV-cache length, tokens)",
            "y": "TPOT ms",
            "series": [
                {"name": "measured TPOT", "points": meas},
                {"name": "planner (this machine)", "points": pred, "dash": True},
            ],
        },
        table={
            "columns": ["context tokens", "measured TPOT ms", "predicted TPOT ms"],
            "rows": [[a[0], a[1], b[1]] for a, b in zip(meas, pred)],
        },
        assumptions=f"planner: {assumptions}",
    )


def concurrency(
    ctx: TourContext, users: int = 16, context: int = 256, model: str | None = None, dtype: str | None = None
) -> dict:
    """Measured decode at 1, 2, 4, ... up to ``users`` sequences in one batch (``context`` tokens each, KV filled
    synthetically, 8 timed steps): per-user tok/s (``tok_s_per_stream``) and total tok/s (``decode_tok_s``); the
    knee (where total tok/s stops scaling, :func:`kit.view.analysis.concurrency_knee`).

    Raises:
        UserError: ``users`` not in 1..256, ``context`` not in 16..:func:`longest_context`; an unknown model.
    """
    import pandas as pd

    from kit.measure.engine import run_point
    from kit.view.analysis import concurrency_knee

    U = int_setting("users", users, 1, 256)
    model, dtype = model or ctx.model, dtype or ctx.dtype
    C = _context_setting("context", context, 16, model)
    m = ctx.models.get(model, dtype, ctx.device).model
    sizes = sorted({2**k for k in range(U.bit_length()) if 2**k <= U} | {U})
    recs, problems = [], []
    for b in sizes:
        rec = run_point(m, point(b, C), ctx.device)
        recs.append(rec)
        if not finite(rec["decode_tok_s"], rec["tok_s_per_stream"]) or rec.get("error"):
            problems.append(f"{b} users: {rec.get('error') or 'non-finite tok/s'}")
    df = pd.DataFrame(recs)
    knee = concurrency_knee(df) if len(sizes) > 1 else pd.DataFrame()
    k = knee.iloc[0] if len(knee) else None
    reached = k is not None and bool(k["reached"])
    kx = int(k["knee"]) if reached else None
    last = recs[-1]
    line = (
        f"1 → {sizes[-1]} users: per-user {fmt(recs[0]['tok_s_per_stream'], 'tok/s', 1)} → "
        f"{fmt(last['tok_s_per_stream'], 'tok/s', 1)}, total {fmt(recs[0]['decode_tok_s'], 'tok/s', 1)} → "
        f"{fmt(last['decode_tok_s'], 'tok/s', 1)}; "
        + (f"knee at {kx} users" if reached else "no knee inside this range (total still scaling)")
    )
    return result(
        "concurrency",
        line,
        problems,
        numbers=_noisy(
            {
                "total tok/s": fmt(last["decode_tok_s"], "tok/s", 1),
                "per-user tok/s": fmt(last["tok_s_per_stream"], "tok/s", 1),
                "knee": f"{kx} users" if reached else "not reached",
            },
            recs,
        ),
        noise=noise(recs),
        chart={
            "kind": "line",
            "x": "users (concurrency)",
            "y": "tok/s",
            "log_x": True,
            "series": [
                {"name": "total tok/s", "points": [[r["concurrency"], r["decode_tok_s"]] for r in recs]},
                {"name": "per-user tok/s", "points": [[r["concurrency"], r["tok_s_per_stream"]] for r in recs]},
            ],
            "marks": [{"x": kx, "label": f"knee ({kx})"}] if reached else [],
        },
        table={
            "columns": ["users", "TPOT ms", "per-user tok/s", "total tok/s"],
            "rows": [[r["concurrency"], r["tpot_ms_p50"], r["tok_s_per_stream"], r["decode_tok_s"]] for r in recs],
        },
    )


# ------------------------------------------------------------------------------------------------ lesson 7
def sanity(ctx: TourContext, op: str = "top_k_renorm_prob", dtypes: str = "float32,bfloat16") -> dict:
    """One sampling op checked against the kit's float64 reference, eager and compiled, per dtype
    (:func:`kit.check.harness.check_op`; the implementation is ``ctx.op_impls[op]`` when set, else the kit's pick;
    compiled with :meth:`kit.tour.context.TourContext.backend`). One row per dtype × mode: pass / fail / error /
    skipped.

    Raises:
        UserError: an unknown op or dtype.
    """
    import pandas as pd

    from kit.check.harness import check_op

    names = [d.strip() for d in str(dtypes).split(",") if d.strip()]
    impl = ctx.op_impls.get(op)
    eager = check_op(op, impl, dtypes=names, modes=("eager",), device=ctx.device)
    comp = check_op(op, impl, dtypes=names, modes=("compile",), device=ctx.device,
                    compile_options={"backend": ctx.backend()})  # fmt: skip
    df = pd.concat([eager.df, comp.df], ignore_index=True)
    rows = []
    for (dt, mode), g in df.groupby(["dtype", "mode"], sort=False):
        statuses = set(g["status"])
        status = next((s for s in ("error", "fail", "skipped") if s in statuses), "pass")
        bad = g[~g["passed"]]
        detail = (
            "" if bad.empty else str(bad.iloc[0]["error"] or f"input {bad.iloc[0]['input']}: got {bad.iloc[0]['got']}")
        )
        rows.append([dt, mode, status, detail[:200]])
    failed = [r for r in rows if r[2] in ("fail", "error")]
    problems = [f"{op} {r[0]} {r[1]}: {r[2]} {r[3]}".strip() for r in failed]
    line = f"{op} ({eager.impl}): " + ", ".join(f"{r[0]} {r[1]} {r[2].upper()}" for r in rows)
    return result(
        "sanity",
        line,
        problems,
        numbers={f"{r[0]} {r[1]}": r[2] for r in rows},
        table={"columns": ["dtype", "mode", "status", "first failure"], "rows": rows},
        impl=eager.impl,
        backend=ctx.backend(),
    )
