"""Planner accuracy: predicted vs measured decode step time (TPOT) on sweep grids of this machine.

Steps: (1) calibrate this device (as ``kit calibrate`` does: bandwidth, matmul TFLOPS, decode-attention rate,
per-step overhead, launch per op and the per-layer floor, and the local stack profile built from them; stored in
the output directory) unless a calibration file is given; (2) run a sweep per model (default: tiny-llama on the
kit's default CPU grid — float32, KV 128/512/2048 × concurrency 1/4/16 — and llama-3.2-1b on a small grid, KV
128/512 × concurrency 1/4 with synthetic KV, since one float32 step reads ~5 GB); (3) predict every point with the
planner from the calibration alone, with its local stack profile and, for contrast, without (no fitting to the
sweep); (4) print the error per point and the median absolute error per model and over all. Goal: ≤ 15 %.

This is a benchmark, not a test: the figure depends on the machine and on what else runs on it (use --threads 1
on a busy 2-core machine).

    .venv/bin/python benchmarks/planner_accuracy.py --threads 1     # calibrate, sweep both models, compare
    .venv/bin/python benchmarks/planner_accuracy.py --calibration ~/.cache/kit/calibration-cpu.json \
        --sweep results/quickstart --models tiny-llama              # reuse both
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

#: per-model sweep settings of the default run (llama-3.2-1b: ~5 GB per float32 step, so a small grid, synthetic KV)
SMALL_GRIDS = {
    "llama-3.2-1b": {"kv_lens": [128, 512], "concurrencies": [1, 4], "decode_steps": 8, "repeats": 2,
                     "kv_fill": "synthetic"},
}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", default=None, help="calibration JSON (default: measure now and store it)")
    ap.add_argument("--sweep", default=None, help="existing sweep directory to compare against (default: run one)")
    ap.add_argument(
        "--models", default="tiny-llama,llama-3.2-1b", help="presets to sweep, comma list (with --sweep: ignored)"
    )
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kv-lens", default=None, help="comma list for every model (default: per model, see above)")
    ap.add_argument("--concurrencies", default=None, help="comma list for every model (default: per model)")
    ap.add_argument("--out", default=None, help="directory for the sweep, the table and the overlay PNG")
    ap.add_argument("--goal", type=float, default=15.0, help="median |error| goal, %%")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads for calibration and sweep (default: torch's); 1 is steadier on a busy "
        "machine, where threads spin-wait on each other",
    )
    args = ap.parse_args(argv)
    import os

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"torch threads {torch.get_num_threads()}, cores {os.cpu_count()}, load average {load:.2f}"
        + (
            "  (busy machine: timings will scatter; try --threads 1 or a quiet moment)"
            if load > (os.cpu_count() or 1)
            else ""
        )
    )

    from kit.measure import calibrate
    from kit.measure.sweep import SweepConfig, run_sweep
    from kit.plan.config import PredictConfig
    from kit.plan.roofline import predict_like, prediction_error
    from kit.store import load_results, save_results
    from kit.view.plan_plots import overlay_figure

    out = Path(args.out or tempfile.mkdtemp(prefix="planner-accuracy-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.calibration:
        cal = calibrate.load_calibration(args.calibration)
    else:
        cal = calibrate.calibrate(args.device)  # stored beside the results, not over the user's `kit calibrate`
        cal["path"] = str(calibrate.save_calibration(cal, out / "calibration.json"))
    sp = cal.get("stack_profile") or {}
    la = cal.get("details", {}).get("launch", {})
    print(
        f"local stack profile {sp.get('name')}: floors µs/layer "
        + ", ".join(f"{c} {v:.0f}" for c, v in (sp.get("floors_us") or {}).items())
        + f" ({sp.get('floor_mode')}), host {sp.get('host_us', 0):.0f} µs/step, decode-kernel bandwidth "
        f"{sp.get('mem_bw_gb_s') or 0:.1f} GB/s (GEMV); launch eager "
        f"{cal.get('launch_us_fixed') or 0:.2f} µs + {cal.get('launch_us_per_op') or 0:.2f} µs/op; graphs: "
        + (
            f"{cal['graph_launch_us_per_op']:.2f} µs/op"
            if cal.get("graph_launch_us_per_op")
            else la.get("graph_note", "n/a")
        )
    )
    print(
        f"calibration: copy {cal['mem_bw_gb_s']:.1f} GB/s, matmul "
        + ", ".join(f"{k} {v * 1e3:.0f} GFLOP/s" for k, v in cal["matmul_tflops"].items() if v)
        + f", overhead {cal['overhead_ms_fixed']:.3f} ms + {cal['overhead_ms_per_layer']:.3f} ms/layer "
        f"({cal.get('path', '')})"
    )
    if args.sweep:
        measured = load_results(args.sweep)
    else:
        import time as _time

        import pandas as pd

        frames = []
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            kw = {"model": model, "dtypes": [args.dtype], "device": args.device, **SMALL_GRIDS.get(model, {})}
            if args.device == "cpu":
                kw["threads"] = torch.get_num_threads()  # the calibration's thread count
            if args.kv_lens:
                kw["kv_lens"] = [int(x) for x in args.kv_lens.split(",")]
            if args.concurrencies:
                kw["concurrencies"] = [int(x) for x in args.concurrencies.split(",")]
            sweep_dir = out / f"sweep-{model}-{_time.strftime('%Y%m%d-%H%M%S')}"  # a fresh run directory every time
            frames.append(run_sweep(SweepConfig(**kw), sweep_dir, resume=False, progress=False))
        measured = pd.concat(frames, ignore_index=True)
    predicted = predict_like(measured, PredictConfig("local", calibration=cal))
    plain = predict_like(measured, PredictConfig("local", calibration=cal, stack="none"))
    save_results(predicted, out / "planner.parquet")
    err = prediction_error(measured, predicted, "tpot_ms_p50")
    e0 = prediction_error(measured, plain, "tpot_ms_p50")[["model", "dtype", "concurrency", "context_len", "error_pct"]]
    err = err.merge(
        e0.rename(columns={"error_pct": "error_no_stack_pct"}),
        on=["model", "dtype", "concurrency", "context_len"],
        how="left",
    )
    if "tpot_ms_min" in measured.columns:  # the fastest step: the least disturbed by other load on the machine
        fast = measured[["model", "dtype", "concurrency", "context_len", "tpot_ms_min", "tpot_ms_p90", "tpot_n"]]
        err = err.merge(fast, on=["model", "dtype", "concurrency", "context_len"], how="left")
        err["error_vs_min_pct"] = 100.0 * (err["predicted"] - err["tpot_ms_min"]) / err["tpot_ms_min"]
        # a point whose p90 step is > 1.5x its median was disturbed (other load, frequency changes): flag it
        err["disturbed"] = err["tpot_ms_p90"] > 1.5 * err["measured"]
    err.to_csv(out / "planner_vs_measured.csv", index=False)
    pngs = []
    for model in sorted(set(measured["model"])):  # one overlay per model: its own axes
        fig = overlay_figure(measured[measured.model == model], predicted[predicted.model == model])
        pngs.append(out / f"planner_vs_measured_{model}.png")
        fig.savefig(pngs[-1], dpi=110)
    print(
        f"\n{'model':12s} {'dtype':8s} {'B':>4s} {'C':>6s} {'p50 ms':>8s} {'p90 ms':>8s} {'min ms':>8s} {'n':>4s} "
        f"{'predicted':>9s} {'err p50':>8s} {'err min':>8s} {'no stack':>8s}  bound"
    )
    for _, r in err.iterrows():
        print(
            f"{r['model']:12s} {r['dtype']:8s} {r['concurrency']:>4d} {r['context_len']:>6d} {r['measured']:>8.3f} "
            f"{r.get('tpot_ms_p90', float('nan')):>8.3f} {r.get('tpot_ms_min', float('nan')):>8.3f} "
            f"{r.get('tpot_n', 0):>4d} {r['predicted']:>9.3f} {r['error_pct']:>+7.1f}% "
            f"{r.get('error_vs_min_pct', float('nan')):>+7.1f}% {r['error_no_stack_pct']:>+7.1f}%  "
            f"{r.get('x_bound', '')}" + ("  DISTURBED (p90 > 1.5 x p50)" if r.get("disturbed") else "")
        )
    for model, g in err.groupby("model"):
        print(
            f"{model}: median |error| {g['error_pct'].abs().median():.1f}% with the local stack profile, "
            f"{g['error_no_stack_pct'].abs().median():.1f}% without (n={len(g)})"
        )
    med = float(err["error_pct"].abs().median())
    print(
        f"\nmedian |error| vs measured p50 TPOT = {med:.1f}% over n={len(err)} points (goal <= {args.goal:g}%): "
        f"{'MET' if med <= args.goal else 'NOT MET'}"
    )
    if "error_vs_min_pct" in err.columns:
        print(f"median |error| vs fastest step (min TPOT) = {err['error_vs_min_pct'].abs().median():.1f}%")
        calm = err[~err["disturbed"]]
        print(
            "median |error| over undisturbed points = "
            + (f"{calm['error_pct'].abs().median():.1f}% (n={len(calm)} of {len(err)})" if len(calm) else "n/a (none)")
        )
    if measured["prefill_ms"].notna().any():
        pe = prediction_error(measured, predicted, "prefill_ms")
        print(
            f"(secondary) prefill: median |error| {pe['error_pct'].abs().median():.1f}%, median signed error "
            f"{pe['error_pct'].median():+.1f}% (n={len(pe)}; the planner counts matmul and attention FLOPs and "
            "weight/KV bytes, not the activation traffic of norms, rotary and activations)"
        )
    print(f"files: {out}/planner_vs_measured.csv, " + ", ".join(str(p) for p in pngs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
