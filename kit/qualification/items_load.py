"""The qualification's load items: the seed workload in-process (:func:`kit.measure.sweep.run_sweep`) and served
(:func:`kit.serve.modes.serve_bench`, or :func:`kit.serve.launched.launch_bench` with ``--launch``), the KV-cache
stress (:func:`kit.measure.stress.run_kv_stress`) and power per token (the power columns the sweep's sampler
wrote, :class:`kit.measure.power.PowerSampler`)."""

from __future__ import annotations

import pandas as pd

from kit.qualification.config import Plan, QualifyConfig
from kit.qualification.context import ItemContext, ItemResult, headline, skipped
from kit.qualification.verdicts import kv_verdict, points_verdict, power_verdict
from kit.results import row_problems, verdict


def _save(fig, ctx: ItemContext, name: str) -> str:
    from kit.view.files import save_figure

    return str(save_figure(getattr(fig, "figure", fig), ctx.dir / name))


def points_figures(rows: pd.DataFrame, planned: int, label, tok_col: str) -> dict:
    """The figures of a grid of points: ``planned``, ``ran``, ``bad`` (``{label, verdict, reason}`` of every point
    not ok), ``points`` (label, verdict, tok/s, TPOT p50, TTFT) and a ``headline`` text."""
    if rows.empty:
        return {"planned": planned, "ran": 0, "bad": [], "points": [], "headline": "no point ran"}
    v = verdict(rows)
    pts, bad = [], []
    for (_, r), vv in zip(rows.iterrows(), v):
        why = r.get("error") if isinstance(r.get("error"), str) else None
        why = why or r.get("x_invalid_reasons") or "; ".join(row_problems(r)) or None
        pts.append({"label": label(r), "verdict": vv, "tok_s": _num(r.get(tok_col)),
                    "tpot_ms_p50": _num(r.get("tpot_ms_p50")), "ttft_ms": _num(r.get("ttft_ms"))})  # fmt: skip
        if vv != "ok":
            bad.append({"label": label(r), "verdict": vv, "reason": str(why)[:300]})
    ok = [p for p in pts if p["verdict"] == "ok" and p["tok_s"] is not None]
    text = ", ".join(f"{p['label']}: {p['tok_s']:.4g} tok/s" for p in ok) or "no ok point"
    return {"planned": planned, "ran": len(rows), "bad": bad, "points": pts, "headline": text}


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f else None


def _last_ok(fig: dict, name: str) -> dict | None:
    ok = [p for p in fig["points"] if p["verdict"] == "ok" and p["tok_s"] is not None]
    return headline(name, ok[-1]["tok_s"], "tok/s") if ok else None


def seed_sweep_config(config: QualifyConfig, p: Plan):
    """The in-process seed workload of ``config`` under plan ``p``: ``kv_lens=[ISL]``, ``decode_steps=OSL``, a
    real (timed) prefill, every concurrency of the plan, ``--threads`` (:class:`kit.measure.sweep.SweepConfig`)."""
    from kit.measure.sweep import SweepConfig

    return SweepConfig(
        model=p.model, dtypes=[p.dtype], device=config.device, kv_lens=[p.isl], concurrencies=list(p.concurrencies),
        decode_steps=p.osl, warmup_steps=min(3, p.osl), repeats=p.repeats, kv_fill="prefill", threads=config.threads,
    )  # fmt: skip


def check_workload(config: QualifyConfig, p: Plan) -> None:
    """Check the model, dtype, ISL/OSL (against the model's context) and ``--threads`` before any item runs, with
    the sweep's own checks (:meth:`kit.measure.sweep.SweepConfig.validate`: the preset/checkpoint resolver, the
    dtype check of this device, the context limit).

    Raises:
        UserError: naming the bad value and what is allowed (prefixed with the qualification's settings, since
            the sweep's message names its own fields, e.g. ``context_len`` for ``--isl``).
    """
    from kit.errors import UserError

    try:
        seed_sweep_config(config, p).validate()
    except UserError as e:
        what = f"--model {p.model} --dtype {p.dtype} --isl {p.isl} --osl {p.osl}"
        raise UserError(f"the seed workload ({what}): {e}") from None


def seed_rows(ctx: ItemContext) -> pd.DataFrame:
    """The seed workload's latest row per point in ``OUT/seed`` (empty when it has not run)."""
    from kit.measure.sweep import current_rows
    from kit.store import load_results

    if not (ctx.out / "seed" / "points.jsonl").exists():
        return pd.DataFrame()
    return current_rows(load_results(ctx.out / "seed"), seed_sweep_config(ctx.config, ctx.plan)).sort_values(
        "concurrency"
    )


def run_seed_item(ctx: ItemContext) -> ItemResult:
    """The seed workload in-process; fails on any point not ok (oom, error, flagged)."""
    from kit.measure.sweep import run_sweep
    from kit.view.plots import throughput_vs_concurrency

    cfg = seed_sweep_config(ctx.config, ctx.plan)
    run_sweep(cfg, ctx.dir, progress=False, should_stop=ctx.should_stop, resume=ctx.config.resume)
    rows = seed_rows(ctx)
    fig = points_figures(rows, len(cfg.points()), lambda r: f"c={int(r['concurrency'])}", "decode_tok_s")
    plots = {"decode tok/s vs concurrency": _save(throughput_vs_concurrency(rows), ctx, "seed_throughput.png")} if fig[
        "points"] else {}  # fmt: skip
    v = points_verdict(fig, ctx.config.thresholds.seed_max_bad_points, "seed workload")
    return ItemResult(v, fig, str(ctx.dir), plots, _last_ok(fig, "decode tok/s at the largest concurrency"))


def run_served_item(ctx: ItemContext) -> ItemResult:
    """The seed workload against ``--url`` (or a server ``--launch``\\ ed with vLLM / SGLang); fails on any point
    with a failed request or a failed validity check. Skipped without an endpoint."""
    from kit.view.plots import plot_served

    cfg, p = ctx.config, ctx.plan
    if not (cfg.url or cfg.launch):
        return skipped("no endpoint: give --url URL (a running server) or --launch vllm|sglang")
    opts = dict(isl=p.isl, osl=p.osl, num_requests=p.served_requests, warmup_requests=1 if p.platform == "cpu" else 2,
                progress=False, should_stop=ctx.should_stop, resume=cfg.resume, timeout_s=max(30.0, ctx.share_s),
                stall_timeout_s=30.0)  # fmt: skip
    if cfg.served_model:
        opts["model"] = cfg.served_model
    concs = list(p.concurrencies)
    if cfg.launch:
        from kit.serve.launched import launch_bench
        from kit.serve.recipes import LaunchSpec

        spec = LaunchSpec(cfg.launch, cfg.served_model or p.model, p.catalog_name or "CPU", tp=max(1, p.n_devices))
        rows = launch_bench(spec, concs, ctx.dir, **{k: v for k, v in opts.items() if k != "model"})
    else:
        from kit.serve.modes import serve_bench

        rows = serve_bench(cfg.url, concs, ctx.dir, **opts)
    rows = rows.sort_values("concurrency") if len(rows) else rows
    fig = points_figures(rows, len(concs), lambda r: f"c={int(r['concurrency'])}", "output_tok_s")
    drawn = any(p["verdict"] == "ok" for p in fig["points"])  # (a figure of failed points only has no lines)
    plots = {"served throughput": _save(plot_served(rows), ctx, "served.png")} if drawn else {}
    v = points_verdict(fig, cfg.thresholds.served_max_bad_points, "served")
    return ItemResult(v, fig, str(ctx.dir), plots, _last_ok(fig, "served output tok/s at the largest concurrency"))


def kv_target(ctx: ItemContext) -> tuple[int, str]:
    """``(target context, where it comes from)``: the planner's largest context at batch 1 on this device
    (:func:`kit.plan.fit.memory_fit`), capped at the plan's ``kv_cap``."""
    import warnings

    from kit.plan.config import PredictConfig
    from kit.plan.fit import memory_fit

    p = ctx.plan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = memory_fit(p.model, concurrency=1, config=PredictConfig(accelerator="local", dtype=p.dtype))
    cap = fit.max_context or 0
    if cap and cap <= p.kv_cap:
        return int(cap), f"planner capacity at batch 1 on {fit.accelerator} ({fit.kv_budget_gb_per_gpu:.1f} GB for KV)"
    return p.kv_cap, f"the search's cap {p.kv_cap:,} (planner capacity {cap:,} tokens is beyond it)"


def budget_context(model: str, dtype: str, budget_gb: float) -> int:
    """The largest context (tokens, batch 1) whose predicted memory — weights, KV cache and decode workspace
    (:func:`kit.measure.memguard.predict_memory`, the stress's own guard) — fits in ``budget_gb``; 0 when not even
    the weights do."""
    from kit import models
    from kit.measure import memguard
    from kit.plan.spec import get_spec

    spec = get_spec(models.get_config(model), f"default={dtype}")
    fits = lambda c: memguard.predict_memory(spec, dtype, 1, c).total_gb <= budget_gb  # noqa: E731
    lo, hi = 0, 1
    while fits(hi) and hi < 2**31:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def run_kv_item(ctx: ItemContext) -> ItemResult:
    """The KV stress from ``plan.kv_start`` up to the target (:func:`kv_target`). ``--kv-budget-gb`` is the memory
    the stress may use: its search stops at the largest context predicted to fit in it (:func:`budget_context`),
    as on a node whose memory something else holds. Fails when the largest context that decodes falls short of the
    target, or the cached decode differs from an uncached forward."""
    from kit.measure.stress import StressConfig, run_kv_stress
    from kit.measure.stress_cli import write_figures

    p, cfg = ctx.plan, ctx.config
    target, source = kv_target(ctx)
    limit = target
    if cfg.kv_budget_gb is not None:
        limit = min(target, budget_context(p.model, p.dtype, cfg.kv_budget_gb))
        source += f"; memory limited to {cfg.kv_budget_gb:g} GB (--kv-budget-gb): at most {limit:,} tokens"
    if limit < 1:
        fig = {"largest_ok": None, "target": int(target), "target_source": source, "smallest_failed": None,
               "probes": 0, "done": True, "check": None}  # fmt: skip
        return ItemResult(kv_verdict(fig, cfg.thresholds), fig, str(ctx.dir))
    sc = StressConfig(model=p.model, batch=1, dtype=p.dtype, device=cfg.device, start=min(p.kv_start, limit),
                      max_context=limit, decode_steps=2, warmup_steps=1, repeats=1, threads=cfg.threads,
                      check_context=min(1024, limit))  # fmt: skip
    df = run_kv_stress(sc, ctx.dir, should_stop=ctx.should_stop, resume=cfg.resume)
    a = df.attrs
    failed = df[df["context_len"] == a["smallest_failed"]]["status"] if a.get("smallest_failed") and len(df) else None
    fig = {"largest_ok": a.get("largest_ok"), "target": int(target), "target_source": source,
           "smallest_failed": a.get("smallest_failed"), "failed_status": None if failed is None or failed.empty else
           str(failed.iloc[-1]), "probes": len(df), "done": bool(a.get("done")), "check": a.get("check")}  # fmt: skip
    plots = {}
    if len(df):
        paths = write_figures(df, ctx.dir)
        plots = {"memory vs context": str(paths[0]), "TPOT vs context": str(paths[1])}
    return ItemResult(kv_verdict(fig, cfg.thresholds), fig, str(ctx.dir), plots,
                      headline("largest context that decodes", fig["largest_ok"], "tokens"))  # fmt: skip


def run_power_item(ctx: ItemContext) -> ItemResult:
    """Power and energy per output token of the seed workload's points (sampled while they ran); skipped where no
    reader works (the reader's reason) or the seed workload has no row."""
    rows = seed_rows(ctx)
    if rows.empty:
        return skipped("the seed workload has no row to read power from (item seed did not run)")
    status = str(rows["x_power_status"].dropna().iloc[0]) if rows.get("x_power_status") is not None and rows[
        "x_power_status"].notna().any() else "not available: no power columns in the seed rows"  # fmt: skip
    j = [_num(v) for v in rows.get("j_per_output_token", [])]
    j = [v for v in j if v is not None]
    fig = {"status": status, "j_per_output_token": min(j) if j else None,
           "avg_power_w": _num(rows["avg_power_w"].max()) if "avg_power_w" in rows else None,
           "pct_tdp_max": _num(rows["pct_tdp"].max()) if "pct_tdp" in rows else None,
           "throttled": bool(rows["x_throttled"].fillna(False).astype(bool).any()) if "x_throttled" in rows else None,
           "per_point": [{"concurrency": int(r["concurrency"]), "j_per_output_token": _num(r.get("j_per_output_token")),
                          "avg_power_w": _num(r.get("avg_power_w"))} for _, r in rows.iterrows()]}  # fmt: skip
    return ItemResult(power_verdict(fig, ctx.config.thresholds), fig, str(ctx.out / "seed"), {},
                      headline("J per output token (best point)", fig["j_per_output_token"], "J", False))  # fmt: skip
