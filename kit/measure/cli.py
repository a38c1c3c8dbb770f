"""``kit sweep``: the command-line front end of the in-process sweep (:mod:`kit.measure.sweep`).

Options derive from :class:`kit.measure.sweep.SweepConfig` (one source of defaults and help). Prints a summary
table (or, with ``--json``, one JSON object), writes PNG plots, and exits 0 when at least one point is ok, 1 when
none is (or, with ``--strict``, when any point is not ok), 2 for a user error, 130 when interrupted.

``--runs N`` repeats the whole grid N times, interleaved (:class:`kit.track.repeat.RepeatedBackend`), storing
every replicate as its own row, so ``kit history compare`` has independent samples; the summary then prints the
median over the runs with a 95 % interval.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import pandas as pd

from kit._io import check_out_dir
from kit.cli import DefaultsHelpFormatter, add_config_args, add_run_dir_args, config_from_args, number_arg
from kit.measure.profile import profile_summary_lines
from kit.measure.profile_select import add_profile_arg
from kit.measure.sweep import SweepConfig, noise_warning, summary_table
from kit.results import ok_mask, verdict
from kit.track.repeat import current_run_rows, median_replicates, replicate_summary, run_sweep_runs

#: the most whole-grid repeats ``--runs`` takes (a compare needs a handful; 10^8 would never end)
MAX_RUNS = 1000


def add_cli(sub) -> None:
    """``kit sweep``: run a sweep, write results + plots, print a summary."""
    p = sub.add_parser(
        "sweep",
        description="Measure prefill and decode of a model on this machine over a grid of KV-cache "
        "lengths and concurrencies. Writes OUT/results.parquet (+ .json metadata), "
        "OUT/points.jsonl (append log; a re-run resumes) and OUT/*.png plots.",
        formatter_class=DefaultsHelpFormatter,
    )
    add_config_args(p, SweepConfig)
    add_profile_arg(p)
    p.add_argument(
        "--runs",
        type=number_arg(int, minimum=1, maximum=MAX_RUNS),
        default=1,
        metavar="N",
        help=f"repeat the whole grid N times (1 to {MAX_RUNS}), interleaved, one row per point and run (independent "
        "samples for `kit history compare`; the summary shows medians with 95%% intervals)",
    )
    p.add_argument("--no-plots", action="store_true", help="skip writing PNG plots")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (summary and every row of this sweep) instead of the text table",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when any point is not ok (default: only when none is)")
    add_run_dir_args(p, "results/sweep")
    p.set_defaults(func=_cli_sweep)


def _json_rows(df: pd.DataFrame) -> list[dict]:
    """Rows as JSON-safe dicts (NaN → null)."""
    return json.loads(df.to_json(orient="records", date_format="iso"))


def _cli_sweep(args: argparse.Namespace) -> int:
    out = check_out_dir(args.out, "--out", "results/my-sweep")
    cfg = config_from_args(SweepConfig, args)
    runs = args.runs
    t0 = time.perf_counter()
    try:
        df = run_sweep_runs(
            cfg, out, runs, resume=not args.no_resume, progress=not args.json, retry_killed=args.retry_killed
        )
    except KeyboardInterrupt:
        _print_interrupted(cfg, out, runs)
        return 130
    wall = time.perf_counter() - t0
    cur = current_run_rows(df, cfg, runs)
    others = df["point_id"].nunique() - cur["point_id"].nunique()
    ok = ok_mask(cur)
    n_ok = int(ok.sum())
    bad = cur[~ok].assign(verdict=verdict(cur[~ok]))
    plots = [] if args.no_plots else _save_plots(df, cur, cfg, out, runs)
    rc = 1 if n_ok == 0 or (args.strict and len(bad)) else 0
    if args.json:
        summary = replicate_summary(cur).to_dict(orient="records") if runs > 1 else None
        print(
            json.dumps(
                {
                    "out": str(out),
                    "results": str(out / "results.parquet"),
                    "points": len(cur),
                    "ok": n_ok,
                    "not_ok": len(bad),
                    "wall_s": round(wall, 3),
                    "plots": [str(p) for p in plots],
                    "noise_warning": noise_warning(cur),
                    "profiles": profile_summary_lines(cur),
                    "exit_code": rc,
                    "runs": runs,
                    "summary": summary,
                    "rows": _json_rows(cur),
                }
            )
        )
        return rc
    _print_text(cur, bad, plots, out, wall, runs, others, rc)
    return rc


def _print_profiles(cur: pd.DataFrame, top: int = 8) -> None:
    """Each profiled point's summary line and its top operators (``ops.csv``)."""
    from kit.measure.profile import profile_summary_lines, top_table

    lines = profile_summary_lines(cur)
    if not lines:
        return
    prof = cur[cur["x_profiled"].fillna(False).astype(bool)]
    for line, (_, r) in zip(lines, prof.iterrows(), strict=True):
        print(f"\n{line}")
        print(top_table(pd.read_csv(r["x_prof_ops_csv"]), top))


def _print_interrupted(cfg: SweepConfig, out, runs: int) -> None:
    """Say how many points of this sweep are saved and how to resume."""
    from kit.store import load_results

    try:
        n = len(current_run_rows(load_results(out), cfg, runs))
    except FileNotFoundError:
        n = 0
    print(
        f"\ninterrupted: {n} of {len(cfg.points()) * runs} points of this sweep are saved in {out}; "
        "re-run the same command to resume",
        file=sys.stderr,
    )


def _save_plots(df: pd.DataFrame, cur: pd.DataFrame, cfg: SweepConfig, out, runs: int) -> list:
    """The standard PNGs of this sweep's rows ``cur`` (medians over runs); the model as a file-name prefix when
    another model's rows share ``out`` (its plots are kept)."""
    from kit.view.files import prefix_for
    from kit.view.plots import save_standard_plots

    shown = median_replicates(cur) if runs > 1 else cur
    other_models = set(df.loc[~df["point_id"].isin(cur["point_id"]), "model"].dropna()) - {cfg.model}
    return save_standard_plots(shown, out, prefix=prefix_for(cfg.model) if other_models else "")


def _print_text(
    cur: pd.DataFrame, bad: pd.DataFrame, plots: list, out, wall: float, runs: int, others: int, rc: int
) -> None:
    """The text summary: the table (medians with intervals over runs), plots, counts, the points not ok, the
    noise warning and why the exit code is not 0."""
    if runs > 1:
        print(f"median of {runs} runs per point (95% interval of the run-to-run spread):")
        print(replicate_summary(cur).to_string(index=False))
    else:
        print(summary_table(cur))
    for path in plots:
        print(f"plot: {path}")
    reps = f" ({runs} runs of {len(cur) // runs})" if runs > 1 else ""
    n_ok = len(cur) - len(bad)
    print(
        f"\n{len(cur)} points{reps} ({n_ok} ok, {len(bad)} not ok) in {wall:.1f} s; "
        f"results: {out / 'results.parquet'} (+ results.json metadata, points.jsonl log)"
    )
    if others > 0:
        print(
            f"note: {out} also holds {others} points of other settings (earlier runs); the table and plots above "
            "show this sweep only"
        )
    for _, r in bad.iterrows():
        print(f"  {r['verdict']}: kv={r['context_len']} B={r['concurrency']} {r['dtype']}: {r['error']}")
    _print_profiles(cur)
    warn = noise_warning(cur)
    if warn:
        print(f"warning: {warn}")
    if rc:
        why = "no point is ok" if n_ok == 0 else f"{len(bad)} points are not ok (--strict)"
        print(f"kit sweep: exit {rc}: {why}", file=sys.stderr)
