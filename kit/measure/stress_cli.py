"""``kit kv-stress``: the largest context a model decodes at a batch on this device (:mod:`kit.measure.stress`);
prints the probes' table and writes the figures next to the results."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from kit.cli import DefaultsHelpFormatter, add_config_args, add_run_dir_args, config_from_args
from kit.results import verdict


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
    add_run_dir_args(p, "results/kv-stress")
    p.set_defaults(func=_cli)


def write_figures(df: pd.DataFrame, out: Path) -> list[Path]:
    """``memory_vs_context.png`` and ``tpot_vs_context.png`` in ``out`` (:mod:`kit.view.stress_plots`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kit.view.stress_plots import memory_vs_context, tpot_vs_context_fit

    paths = []
    for name, fn in (("memory_vs_context.png", memory_vs_context), ("tpot_vs_context.png", tpot_vs_context_fit)):
        fig = fn(df)
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)
    return paths


def _cli(args: argparse.Namespace) -> int:
    from kit.measure.stress import StressConfig, run_kv_stress, stress_summary
    from kit.view.stress_plots import fit_tpot_per_token

    cfg = config_from_args(StressConfig, args)
    df = run_kv_stress(cfg, args.out, resume=not args.no_resume, retry_killed=args.retry_killed)
    out = Path(args.out)
    with pd.option_context("display.width", 200):
        print(stress_table(df))
    print(stress_summary(df))
    fit = fit_tpot_per_token(df)
    if fit is not None:
        print(
            f"TPOT fit over {fit['n']} ok probes: {fit['intercept_ms']:.3g} ms + "
            f"{fit['slope_ns_per_token']:.3g} ns per token of context"
            + (
                " (a negative intercept: the probes' TPOT is noise-dominated; read the figure, not the fit)"
                if fit["intercept_ms"] < 0
                else ""
            )  # fmt: skip
        )
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
