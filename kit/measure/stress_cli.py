"""``kit kv-stress``: the largest context a model decodes at a batch on this device (:mod:`kit.measure.stress`);
prints the probes' table and writes the figures next to the results."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from kit.cli import DefaultsHelpFormatter, add_config_args, add_run_dir_args, config_from_args
from kit.measure.profile import profile_summary_lines
from kit.measure.profile_select import add_profile_arg
from kit.results import ok_mask, verdict


def _fmt(v, spec: str) -> str:
    if v is None or (isinstance(v, float) and v != v) or v is pd.NA:
        return "-"
    return spec.format(v)


def stress_table(df: pd.DataFrame) -> str:
    """Text table of a stress's probes in probe order: context, verdict, what the guard predicted the probe needs
    and what was available (GB), the predicted and measured peak (GB),
    KV bytes error %, TPOT p50 (ms) and n, prefill tok/s, fragmentation ratio (GPUs; "n/a" on cpu)."""
    if not len(df):
        return "(no probes)"
    rows = []
    for (_, r), v in zip(df.iterrows(), verdict(df), strict=True):
        get = lambda k, r=r: r.get(k)  # noqa: E731
        frag = get("x_frag_ratio")
        rows.append(
            {
                "context": f"{int(r['context_len']):,}",
                "B": int(r["concurrency"]),
                "status": v,
                "need_GB": _fmt(get("x_pred_total_gb"), "{:.2f}"),
                "avail_GB": _fmt(get("x_avail_gb"), "{:.2f}"),
                "pred_peak_GB": _fmt(get("x_pred_peak_gb"), "{:.2f}"),
                "peak_GB": _fmt(get("peak_mem_gb"), "{:.2f}") if v != "refused" else "-",
                "peak_vs_pred": _fmt(get("x_peak_vs_pred_pct"), "{:+.1f}%"),
                "kv_err": _fmt(get("x_kv_error_pct"), "{:+.3f}%"),
                "tpot_p50_ms": _fmt(get("tpot_ms_p50"), "{:.2f}") if v == "ok" else "-",
                "n": _fmt(get("tpot_n"), "{}") if v == "ok" else "-",
                "prefill_tok_s": _fmt(get("prefill_tok_s"), "{:.0f}"),
                "frag": _fmt(frag, "{:.3f}") if frag is not None and frag == frag else "n/a",
            }
        )
    return pd.DataFrame(rows).to_string(index=False)


def add_cli(sub) -> None:
    from kit.measure.stress import StressConfig

    p = sub.add_parser(
        "kv-stress",
        formatter_class=DefaultsHelpFormatter,
        description="Find the largest context a model decodes at a batch on this device: the context doubles "
        "from --start until a probe does not fit or fails, then is bisected to --resolution; never past "
        "--max-context. A probe predicted not to fit in free memory is recorded 'refused' without allocating "
        "(--no-guard tries it). Every probe is stored in OUT (a re-run resumes); the table is printed and "
        "memory_vs_context.png / tpot_vs_context.png are written to OUT.",
    )
    add_config_args(p, StressConfig)
    add_profile_arg(p)
    add_run_dir_args(p, "results/kv-stress")
    p.set_defaults(func=_cli)


def write_figures(df: pd.DataFrame, out: Path) -> list[Path]:
    """``memory_vs_context.png`` and ``tpot_vs_context.png`` in ``out`` (:mod:`kit.view.stress_plots`), each written
    atomically (:func:`kit.view.files.save_figure`).

    Raises:
        OutputPathError: a figure cannot be written (a full disk, a read-only directory): one line naming the file;
            the probes are already stored.
    """
    import matplotlib

    matplotlib.use("Agg")
    from kit.view.files import save_figure
    from kit.view.stress_plots import memory_vs_context, tpot_vs_context_fit

    figures = (("memory_vs_context.png", memory_vs_context), ("tpot_vs_context.png", tpot_vs_context_fit))
    return [save_figure(fn(df), out / name) for name, fn in figures]


def slope_interval_ns(df: pd.DataFrame) -> float | None:
    """Two standard errors of the per-token TPOT slope (ns per token) of :func:`kit.view.stress_plots.
    fit_tpot_per_token` over the same ok rows and weights (``numpy.polyfit(..., cov=True)``: the covariance scaled
    by the residuals' scatter, n − 2 degrees of freedom); None with fewer than three ok probes (no scatter left)."""
    ok = df[ok_mask(df)].dropna(subset=["context_len", "tpot_ms_p50"]) if len(df) else df
    if len(ok) < 3 or ok["context_len"].nunique() < 2:
        return None
    x, y = ok["context_len"].astype(float).to_numpy(), ok["tpot_ms_p50"].astype(float).to_numpy()
    _, cov = np.polyfit(x, y, 1, w=1.0 / y, cov=True)
    return 2.0 * float(np.sqrt(max(cov[0, 0], 0.0))) * 1e6


def fit_line(df: pd.DataFrame) -> str | None:
    """The printed TPOT fit: ``intercept ms + slope ± 2 SE ns per token``, saying when it cannot be read as the cost
    of context: a negative slope is noise (one more token of context never makes a decode step cheaper), a slope
    within two standard errors of 0 is not distinguishable from 0 given the probes' scatter, and a negative
    intercept means the probes' TPOT is noise-dominated. None without a fit (fewer than two ok probes)."""
    from kit.view.stress_plots import fit_tpot_per_token

    fit = fit_tpot_per_token(df)
    if fit is None:
        return None
    slope, band = fit["slope_ns_per_token"], slope_interval_ns(df)
    text = f"TPOT fit over {fit['n']} ok probes: {fit['intercept_ms']:.3g} ms + {slope:.3g}"
    text += (
        f" ± {band:.3g} ns per token of context (2 standard errors)" if band is not None else " ns per token of context"
    )
    notes = []
    if slope < 0:
        notes.append("a negative slope is noise, or the machine's load drifting between probes: a longer context "
                     "never makes a decode step cheaper")  # fmt: skip
    if band is not None and abs(slope) <= band:
        notes.append("the slope is not distinguishable from 0 given the probes' scatter")
    elif band is None:
        notes.append("two probes leave no scatter to judge the slope by")
    if fit["intercept_ms"] < 0:
        notes.append("a negative intercept: the probes' TPOT is noise-dominated")
    if slope < 0 or (band is not None and abs(slope) <= band) or fit["intercept_ms"] < 0:
        notes.append("read the figure, not the fit: longer contexts or more --decode-steps / --repeats resolve it")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _cli(args: argparse.Namespace) -> int:
    from kit.measure.stress import StressConfig, run_kv_stress, stress_summary

    cfg = config_from_args(StressConfig, args)
    df = run_kv_stress(cfg, args.out, resume=not args.no_resume, retry_killed=args.retry_killed)
    out = Path(args.out)
    with pd.option_context("display.width", 200):
        print(stress_table(df))
    print(stress_summary(df))
    line = fit_line(df)
    if line:
        print(line)
    for text in profile_summary_lines(df):
        print(text)
    check = df.attrs.get("check")
    if check:
        print(
            f"cached decode vs uncached forward at {check['context_len']:,} tokens: max |diff| "
            f"{check['max_abs_err']:.3g} ({'within' if check['ok'] else 'OUTSIDE'} {check['dtype']} tolerance)"
        )
    if len(df):
        for path in write_figures(df, out):
            print(f"wrote {path}")
    return 0 if not check or check["ok"] else 1
