"""The qualification's device items: collectives (:func:`kit.measure.comm.run_comm`), the calibration the planner
uses (:func:`kit.measure.calibrate.calibrate`) and the planner's prediction beside what was measured
(:func:`kit.plan.roofline.predict_like`)."""

from __future__ import annotations

import contextlib
import math

from kit.qualification.context import THIS_RUN, ItemContext, ItemResult, headline, skipped
from kit.qualification.items_load import seed_rows
from kit.qualification.verdicts import Verdict, calibrate_verdict, comm_verdict, planner_verdict

#: on a CPU the collectives run as 2 gloo ranks only when the item's share is at least this long (s): each
#: torchrun rank imports torch (several CPU-seconds each on a small machine)
COMM_CPU_MIN_SHARE_S = 20.0


def _catalog_row(name: str | None):
    """The catalog row of a GPU of this node, or None (no row, or the CPU placeholder row)."""
    from kit.catalog import load_catalog

    if not name or name == "CPU":
        return None
    try:
        return load_catalog().get(name)
    except KeyError:
        return None


def _finite(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def comm_setup(ctx: ItemContext) -> tuple[int, str | None]:
    """``(local ranks, why skipped or None)``: one rank per local GPU; on a CPU 2 gloo ranks when the share allows
    (:data:`COMM_CPU_MIN_SHARE_S`); a single device on one node is skipped."""
    p, cfg = ctx.plan, ctx.config
    cross = cfg.nnodes > 1 and cfg.rdzv_endpoint
    if p.platform != "cpu":
        if p.n_devices >= 2 or cross:
            return p.n_devices, None
        return 0, f"1 local {p.device_name}: collectives need 2 or more devices (or --nodes with --rdzv-endpoint)"
    if cross:
        return 1, None
    if ctx.share_s >= COMM_CPU_MIN_SHARE_S:
        return 2, None
    return 0, (
        f"CPU, no accelerator: 2 gloo ranks would cost more than this item's {ctx.share_s:.0f} s share (each torchrun "
        f"rank imports torch; they run from a {COMM_CPU_MIN_SHARE_S:.0f} s share, e.g. --budget 5m)"
    )


def run_comm_item(ctx: ItemContext) -> ItemResult:
    """all_reduce and all_gather over the local ranks (and the nodes, with ``--rdzv-endpoint``), plus one decode
    step's messages of the plan's model; fails when the best all_reduce busbw is below its fraction of the
    catalog's link figure."""
    from kit.measure.comm import CommConfig, decode_summary, run_comm
    from kit.view.comm_plots import save_comm_plots

    p, cfg = ctx.plan, ctx.config
    nproc, why = comm_setup(ctx)
    if why:
        return skipped(why)
    gpu = p.platform != "cpu"
    cc = CommConfig(
        ops=["all_reduce", "all_gather"], max_bytes=(256 << 20) if gpu else (64 << 10), warmup=3 if gpu else 1,
        iters=20 if gpu else 3, nproc=nproc, nnodes=cfg.nnodes, node_rank=cfg.node_rank,
        rdzv_endpoint=cfg.rdzv_endpoint, model=p.model, batch=max(p.concurrencies), out=str(ctx.dir),
        resume=cfg.resume, timeout_s=max(120.0, 2 * ctx.share_s),
    )  # fmt: skip
    df = run_comm(cc)
    if not len(df) and cfg.nnodes > 1:  # global rank 0 (whichever node it landed on) stores the rows
        why = f"took part in the {cc.world}-rank probe over {cfg.nnodes} nodes; the node holding rank 0 has the figures"
        return ItemResult(Verdict("pass", why, "the cross-node probe finishes on every node"), {"ranks": cc.world})
    probes = df[df["x_decode_term"].isna() & (df["x_op"] == "all_reduce")] if len(df) else df
    row = _catalog_row(p.catalog_name)
    link = "scaleup_busbw_gb_s" if cfg.nnodes == 1 else "scaleout_busbw_gb_s"
    fig = {
        "busbw_gb_s": float(probes["x_busbw_gb_s"].max()) if len(probes) else 0.0,
        "catalog_busbw_gb_s": _finite(row.get(link)) if row is not None else None,
        "ranks": nproc * cfg.nnodes,
        "backend": cc.dist_backend(),
        "decode_step": decode_summary(df) if len(df) else [],
        "lat_us_smallest": float(probes.sort_values("x_size_bytes")["x_lat_us_p50"].iloc[0]) if len(probes) else None,
    }
    plots = dict(zip(("collective latency", "collective busbw"), map(str, save_comm_plots(df, ctx.dir)))) if len(
        df) else {}  # fmt: skip
    return ItemResult(comm_verdict(fig, cfg.thresholds), fig, str(ctx.dir), plots,
                      headline("all_reduce busbw", fig["busbw_gb_s"], "GB/s"))  # fmt: skip


def calibration_path(ctx: ItemContext):
    """The calibration this qualification wrote (``OUT/calibrate/calibration-*.json``), or None."""
    found = sorted((ctx.out / "calibrate").glob("calibration-*.json"))
    return found[-1] if found else None


def run_calibrate_item(ctx: ItemContext) -> ItemResult:
    """``kit calibrate`` (quick on a CPU or a short share), written to ``OUT/calibrate/``; on a GPU of the catalog
    its bandwidth and matmul TFLOPS are judged against the catalog's figures."""
    from kit.measure.calibrate import calibrate, save_calibration

    p = ctx.plan
    quick = p.platform == "cpu" or ctx.share_s < 60
    with _seed_threads(ctx):
        cal = calibrate(p.device, quick=quick)
    path = save_calibration(cal, ctx.dir / f"calibration-{cal['device_key']}.json")
    row = _catalog_row(p.catalog_name) if p.platform != "cpu" else None
    tf = {k: v for k, v in cal["matmul_tflops"].items() if v}
    fig = {
        "copy_gb_s": cal["mem_bw_gb_s"], "read_gb_s": cal["mem_read_gb_s"], "dtype": p.dtype, "tflops": tf.get(p.dtype),
        "matmul_tflops": tf, "overhead_ms_fixed": cal["overhead_ms_fixed"],
        "overhead_ms_per_layer": cal["overhead_ms_per_layer"], "attn_tflops": cal["attn_tflops"], "quick": quick,
        "path": str(path), "catalog_gb_s": _finite(row.get("hbm_tb_s")) * 1000 if row is not None else None,
        "catalog_tflops": _peak(p.catalog_name, p.dtype) if row is not None else None,
    }  # fmt: skip
    return ItemResult(calibrate_verdict(fig, ctx.config.thresholds), fig, str(ctx.dir), {},
                      headline("memory copy bandwidth", fig["copy_gb_s"], "GB/s"))  # fmt: skip


@contextlib.contextmanager
def _seed_threads(ctx: ItemContext):
    """On a CPU: the torch threads the seed workload was measured with (its rows' ``x_threads``, else
    ``--threads``, else the sweep's policy, :func:`kit.hardware.cpu_threads_for_timing`), so the planner's
    calibration describes the same machine the measurement ran on; restored after."""
    import torch

    from kit import hardware

    before = torch.get_num_threads()
    if ctx.plan.platform == "cpu":
        rows = seed_rows(ctx)
        known = rows["x_threads"].dropna() if "x_threads" in rows else []
        n = int(known.iloc[0]) if len(known) else ctx.config.threads or hardware.cpu_threads_for_timing()[0]
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _peak(name: str, dtype: str) -> float | None:
    from kit.catalog import load_catalog
    from kit.errors import UserError

    try:
        return load_catalog().peak_tflops(name, dtype)
    except (KeyError, UserError):
        return None


def machine_noise(rows) -> str | None:
    """Why the seed workload's timings are not steady (seed rows, one per point), or None: the sweep's noise check
    (:func:`kit.measure.sweep.noise_warning`: TPOT p50 far above the fastest step) or other work on the cores
    when it started (``x_threads_reason`` read by :func:`kit.track.noise.busy_cores`)."""
    from kit.measure.sweep import noise_warning
    from kit.track.noise import busy_cores

    noisy = noise_warning(rows) if "tpot_ms_min" in rows and "tpot_ms_p50" in rows else None
    if noisy:
        return noisy
    reasons = rows["x_threads_reason"].dropna() if "x_threads_reason" in rows else []
    busy = [r for r in reasons if (busy_cores(r) or 0.0) > 0]
    return f"busy machine: {busy[0]}" if busy else None


def mixed_runs(ctx: ItemContext, rows) -> str | None:
    """Why the seed points and the calibration are not figures of one run, or None: after a resume the seed
    item's verdict and the calibration's can come from different qualification runs (the ``origins`` of
    :class:`kit.qualification.context.ItemContext`), and the seed points themselves from more than one sweep run
    (their ``run_id``)."""
    o = ctx.origins
    seed, cal = o.get("seed"), o.get("calibrate")
    if seed and cal and seed != cal:
        where = lambda x: x if x == THIS_RUN else f"the earlier run {x}"  # noqa: E731
        return f"the seed workload is from {where(seed)}, the calibration from {where(cal)}"
    runs = rows["run_id"].dropna().unique() if "run_id" in rows else []
    if len(runs) > 1:
        return f"the seed points come from {len(runs)} runs ({', '.join(map(str, runs))})"
    return None


def run_planner_item(ctx: ItemContext) -> ItemResult:
    """The planner's prediction of every ok seed-workload point on this device (its calibration from the
    ``calibrate`` item when there is one) beside the measurement; judged on measured / predicted decode tok/s
    (:func:`kit.qualification.verdicts.planner_verdict`: two-sided, at most a warn on a noisy machine, not judged
    when the figures come from different runs)."""
    from kit.plan.config import PredictConfig
    from kit.plan.roofline import predict_like
    from kit.results import ok_mask
    from kit.view.plan_plots import overlay_figure

    rows = seed_rows(ctx)
    rows = rows[ok_mask(rows)] if len(rows) else rows
    if rows.empty:
        return skipped("no ok seed-workload point to compare with (item seed did not run or failed)")
    cal = calibration_path(ctx)
    with _seed_threads(ctx):  # the threads the calibration was measured with
        pred = predict_like(rows, PredictConfig(accelerator="local", calibration=str(cal) if cal else None))
    keys = ["model", "dtype", "concurrency", "context_len"]
    j = rows[keys + ["decode_tok_s"]].merge(pred[keys + ["decode_tok_s", "x_bound"]], on=keys, suffixes=("_m", "_p"))
    j["ratio"] = j["decode_tok_s_m"] / j["decode_tok_s_p"]
    j.to_csv(ctx.dir / "planner_vs_measured.csv", index=False)
    worst, best = j.loc[j["ratio"].idxmin()], j.loc[j["ratio"].idxmax()]
    fig = {
        "worst_ratio": float(worst["ratio"]), "worst_label": f"c={int(worst['concurrency'])}", "points": len(j),
        "best_ratio": float(best["ratio"]), "best_label": f"c={int(best['concurrency'])}",
        "noisy": machine_noise(rows), "mixed": mixed_runs(ctx, rows),
        "calibration": str(cal) if cal else "none (catalog figures of the local device)",
        "per_point": [{"concurrency": int(r["concurrency"]), "measured_tok_s": float(r["decode_tok_s_m"]),
                       "predicted_tok_s": float(r["decode_tok_s_p"]), "bound": r["x_bound"]} for _, r in j.iterrows()],
    }  # fmt: skip
    from kit.view.files import save_figure

    png = save_figure(overlay_figure(rows, pred, x="concurrency", y="decode_tok_s", hue="context_len"),
                      ctx.dir / "planner_vs_measured.png")  # fmt: skip
    return ItemResult(planner_verdict(fig, ctx.config.thresholds), fig, str(ctx.dir), {"planner vs measured": str(png)},
                      headline("measured / predicted decode tok/s (worst)", fig["worst_ratio"], "x"))  # fmt: skip
