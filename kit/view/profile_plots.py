"""Figures of profiles (``kit sweep --profile``, ``kit profile compare``): the operators whose time per decode step
differs most between two profiled points, as horizontal bars. Each function returns a matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from kit.view.plots import require_columns


def operator_differences(
    table: pd.DataFrame, label_a: str, label_b: str, n: int = 12, title: str | None = None, subtitle: str | None = None
):
    """Bars of the ``n`` operators with the largest ``|diff_ms_per_step|`` (B − A self time per decode step, ms),
    longest on top: red where B spends more, blue where it spends less; each bar labelled with A → B ms.

    Args:
        table: :func:`kit.measure.profile_compare.compare_profiles`'s ``table`` (``op``, ``a_ms_per_step``,
            ``b_ms_per_step``, ``diff_ms_per_step``).
        label_a, label_b: what A and B are (shown in the title and axis).
        subtitle: a warning shown in red under the title (the comparison's noise warning), or None.

    Raises:
        UserError: a column is missing.
    """
    require_columns(table, ["op", "a_ms_per_step", "b_ms_per_step", "diff_ms_per_step"])
    t = table.reindex(table["diff_ms_per_step"].abs().sort_values(ascending=False).index).head(n).iloc[::-1]
    import textwrap

    lines = textwrap.wrap(subtitle or "", 120, break_on_hyphens=False)
    height = 0.45 * max(len(t), 3) + 1.6 + 0.16 * len(lines)
    fig, ax = plt.subplots(figsize=(10, height))
    colors = ["#c0392b" if d > 0 else "#2e6fb5" for d in t["diff_ms_per_step"]]
    names = [op if len(op) <= 56 else op[:53] + "..." for op in t["op"]]
    ax.barh(range(len(t)), t["diff_ms_per_step"], color=colors)
    ax.set_yticks(range(len(t)), names, fontsize=8)
    ax.axvline(0, color="black", lw=0.8)
    span = float(t["diff_ms_per_step"].abs().max() or 1.0) if len(t) else 1.0
    for i, (_, r) in enumerate(t.iterrows()):
        d = r["diff_ms_per_step"]
        ax.text(
            d + (0.01 if d >= 0 else -0.01) * span,
            i,
            f"{r['a_ms_per_step']:.3f} → {r['b_ms_per_step']:.3f}",
            va="center",
            ha="left" if d >= 0 else "right",
            fontsize=7,
        )
    ax.set_xlim(
        min(0, float(t["diff_ms_per_step"].min())) - 0.3 * span, max(0, float(t["diff_ms_per_step"].max())) + 0.3 * span
    )
    ax.set_xlabel(f"self time per decode step, B − A (ms)\nA = {label_a}    B = {label_b}")
    ax.set_title(title or "Where the decode step differs: top operators by |B − A| (median ms per step)", fontsize=10)
    if lines:
        fig.suptitle("\n".join(lines), color="#b03a2e", fontsize=8, y=0.995, va="top")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()  # leaves room for the suptitle
    return fig
