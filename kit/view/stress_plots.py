"""Figures of a KV-cache stress (``kit kv-stress``): memory against context with the guard's prediction, and TPOT
against context with the fitted cost of one more token of context.

Each function takes the stress's rows (:func:`kit.measure.stress.run_kv_stress`) and returns a matplotlib Figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kit.results import ok_mask
from kit.view.plots import label_of, require_columns


def fit_tpot_per_token(df: pd.DataFrame, x: str = "context_len", y: str = "tpot_ms_p50") -> dict | None:
    """Line ``tpot = intercept + slope × context`` through the ok rows (:func:`kit.results.ok_mask`), least squares
    on relative residuals (weights 1/tpot), so short contexts count as much as long ones on the log axes.

    Returns:
        ``{"intercept_ms", "slope_ms_per_token", "slope_ns_per_token", "n"}``, or None with fewer than two ok
        rows at distinct contexts. The slope is what one more token of context adds to a decode step.
    """
    ok = df[ok_mask(df)].dropna(subset=[x, y]) if len(df) else df
    if len(ok) < 2 or ok[x].nunique() < 2:
        return None
    ys = ok[y].astype(float).to_numpy()
    slope, intercept = np.polyfit(ok[x].astype(float), ys, 1, w=1.0 / ys)  # relative residuals: fits every decade
    return {
        "intercept_ms": float(intercept),
        "slope_ms_per_token": float(slope),
        "slope_ns_per_token": float(slope) * 1e6,
        "n": int(len(ok)),
    }


def memory_vs_context(df: pd.DataFrame, title: str | None = None) -> plt.Figure:
    """Peak memory (GB) against context (tokens, log axis): the guard's predicted peak through every probe (line),
    the measured peaks of the probes that ran (dots; oom/error as red crosses at their predicted height), the
    memory limit the guard used (free + resident − margin, dashed) and the refused region (shaded, from the
    smallest refused probe).

    Raises:
        UserError: a needed column is missing.
    """
    need = ["context_len", "status", "peak_mem_gb", "x_pred_peak_gb", "x_limit_gb"]
    require_columns(df, need)
    d = df.sort_values("context_len")
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ax.plot(d["context_len"], d["x_pred_peak_gb"], "-", color="tab:blue", lw=1.5, label="predicted peak (guard)")
    ok = d[ok_mask(d)]
    if len(ok):
        ax.plot(ok["context_len"], ok["peak_mem_gb"], "o", color="tab:green", label="measured peak (ok)")
    bad = d[d["status"].isin(["oom", "error", "killed"])]
    if len(bad):
        ax.plot(bad["context_len"], bad["x_pred_peak_gb"], "x", color="red", ms=9, mew=2, label="oom / error")
    limit = d["x_limit_gb"].dropna()
    if len(limit):
        ax.axhline(float(limit.median()), ls="--", color="black", lw=1, label=f"limit {limit.median():.1f} GB")
    refused = d[d["status"] == "refused"]
    if len(refused):
        x0 = float(refused["context_len"].min())
        ax.axvspan(x0, float(d["context_len"].max()) * 1.5, color="tab:red", alpha=0.12, label="refused (no fit)")
        ax.plot(refused["context_len"], refused["x_pred_peak_gb"], "s", mfc="none", color="tab:red")
    return _finish(fig, ax, "peak memory (GB)", title or _title(d, "memory vs context"))


def tpot_vs_context_fit(df: pd.DataFrame, title: str | None = None) -> plt.Figure:
    """TPOT p50 (ms, log) against context (tokens, log) for the ok probes, bars to p90, and the fitted line
    ``intercept + slope × context`` (:func:`fit_tpot_per_token`) with its slope in ns per token of context.

    Raises:
        UserError: a needed column is missing.
    """
    require_columns(df, ["context_len", "status", "tpot_ms_p50", "tpot_ms_p90"])
    ok = df[ok_mask(df)].sort_values("context_len") if len(df) else df
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    if len(ok):
        yerr = np.vstack([np.zeros(len(ok)), (ok["tpot_ms_p90"] - ok["tpot_ms_p50"]).clip(lower=0).to_numpy()])
        ax.errorbar(ok["context_len"], ok["tpot_ms_p50"], yerr=yerr, fmt="o", capsize=3, label="TPOT p50 (bar: p90)")
    fit = fit_tpot_per_token(df)
    if fit is not None:
        xs = np.geomspace(float(ok["context_len"].min()), float(ok["context_len"].max()), 100)
        ys = fit["intercept_ms"] + fit["slope_ms_per_token"] * xs
        label = f"fit: {fit['intercept_ms']:.3g} ms + {fit['slope_ns_per_token']:.3g} ns/token x context"
        ax.plot(xs[ys > 0], ys[ys > 0], "-", color="tab:orange", label=label)
    return _finish(fig, ax, label_of("tpot_ms_p50"), title or _title(df, "TPOT vs context"))


def _title(df: pd.DataFrame, what: str) -> str:
    if not len(df):
        return what
    r = df.iloc[0]
    return f"{what}: {r.get('model')} {r.get('dtype')} B={r.get('concurrency')} on {r.get('device')}"


def _finish(fig: plt.Figure, ax, ylabel: str, title: str) -> plt.Figure:
    """Log-log axes (context in powers of two), labels, grid, legend, title."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(label_of("context_len"))
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left")
    else:
        ax.text(0.5, 0.5, "no ok probe", transform=ax.transAxes, ha="center", va="center", color="gray")
    ax.set_title(title)
    fig.tight_layout()
    return fig
