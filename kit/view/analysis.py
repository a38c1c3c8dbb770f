"""Small analyses the how-to notebooks run on sweep results: the concurrency knee, a dtype comparison that refuses to
report the speed of broken numerics, and an export bundle for CI.

All functions take and return DataFrames in the :mod:`kit.results` schema; none measures anything.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from kit.errors import UserError
from kit.results import HEADLINE_COLUMNS, ok_mask, row_problems, verdict

#: x_ columns holding per-step lists; dropped from flat exports (CSV, Markdown)
LIST_COLUMNS = ("x_step_ms", "x_prefill_ms")


def export_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The rows as every export writes them (CI bundle, panel export): ``status`` is the row's verdict
    (:func:`kit.results.verdict`: ``ok`` | ``flagged`` | ``oom`` | ``error`` | ``killed`` ...), so a flagged row (status
    ok with a problem flag, e.g. overflowing float16 logits) never reads ``ok`` in a file, and ``ok`` in a file means
    ok by :func:`kit.results.ok_mask`. Every other column is kept. A frame without ``status`` is returned as is."""
    if df.empty or "status" not in df.columns:
        return df
    return df.assign(status=verdict(df).astype("string"))


def scaling_exponents(df: pd.DataFrame, y: str = "decode_tok_s", x: str = "concurrency") -> pd.DataFrame:
    """Per KV length, the scaling exponent between consecutive concurrencies:
    ``k = log(y2 / y1) / log(x2 / x1)`` (1 = throughput grows in proportion to concurrency, 0 = flat).

    Returns: DataFrame context_len, from, to, y_from, y_to, exponent (ok rows only, :func:`kit.results.ok_mask`:
    a flagged row is left out; sorted).
    Raises: ValueError when a needed column is missing.
    """
    for c in (y, x, "context_len", "status"):
        if c not in df.columns:
            raise UserError(f"column {c!r} missing; need {y}, {x}, context_len and status")
    ok = df[ok_mask(df) & df[y].notna()]  # a flagged row (non-finite logits ...) is no speed
    rows = []
    for ctx, g in ok.groupby("context_len", sort=True):
        g = g.groupby(x, sort=True)[y].median()
        xs, ys = list(g.index), list(g.values)
        for (x1, y1), (x2, y2) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            k = math.log(y2 / y1) / math.log(x2 / x1) if y1 > 0 and y2 > 0 else float("nan")
            rows.append(
                {
                    "context_len": int(ctx),
                    "from": int(x1),
                    "to": int(x2),
                    "y_from": float(y1),
                    "y_to": float(y2),
                    "exponent": k,
                }
            )
    return pd.DataFrame(rows, columns=["context_len", "from", "to", "y_from", "y_to", "exponent"])


def concurrency_knee(df: pd.DataFrame, y: str = "decode_tok_s", min_exponent: float = 0.5) -> pd.DataFrame:
    """Where ``y`` (decode tok/s) stops scaling with concurrency, per KV length.

    The knee is the largest concurrency still reached by a scaling step: every step past it has a scaling
    exponent (see :func:`scaling_exponents`) below ``min_exponent``, i.e. doubling the batch there buys less than
    2**min_exponent times the throughput (default 0.5: less than 1.41x per doubling). Taking the *last* scaling
    step, not the first flat one, keeps one noisy dip in the middle of a curve from being called the knee. When the
    last step still scales, the knee is not reached inside the grid (``knee`` is NA, ``reached`` False): extend it.

    Returns: DataFrame context_len, knee (Int64), reached, y_at_knee, max_y, max_at, min_exponent.
    Raises: ValueError for ``min_exponent`` outside (0, 1] or a missing column.
    """
    if not 0 < min_exponent <= 1:
        raise UserError(f"min_exponent={min_exponent!r} must be in (0, 1]")
    steps = scaling_exponents(df, y)
    ok = df[ok_mask(df) & df[y].notna()]
    rows = []
    for ctx, g in ok.groupby("context_len", sort=True):
        s = steps[steps["context_len"] == ctx].reset_index(drop=True)
        med = g.groupby("concurrency")[y].median()
        scaling = s.index[s["exponent"] >= min_exponent]
        if len(s) == 0:
            knee = None
        elif len(scaling) == 0:
            knee = int(s.iloc[0]["from"])  # flat from the first step on
        elif scaling[-1] == len(s) - 1:
            knee = None  # still scaling at the largest concurrency
        else:
            knee = int(s.iloc[scaling[-1]]["to"])
        rows.append(
            {
                "context_len": int(ctx),
                "knee": knee,
                "reached": knee is not None,
                "y_at_knee": float(med.loc[knee]) if knee is not None else float("nan"),
                "max_y": float(med.max()),
                "max_at": int(med.idxmax()),
                "min_exponent": min_exponent,
            }
        )
    out = pd.DataFrame(rows, columns=["context_len", "knee", "reached", "y_at_knee", "max_y", "max_at", "min_exponent"])
    out["knee"] = out["knee"].astype("Int64")
    return out


def dtype_comparison(df: pd.DataFrame, baseline: str = "float32") -> pd.DataFrame:
    """Speed of each dtype relative to ``baseline`` at the same (KV length, concurrency), numerics first.

    A point with a problem flag (:func:`kit.results.row_problems`; e.g. non-finite logits, ``x_logits_finite``
    False: it measured garbage arithmetic) has its speed not reported (NaN) and ``flag`` says why. OOM/error points
    are flagged with their status.

    Returns: DataFrame dtype, context_len, concurrency, status (the verdict, :func:`export_frame`: ``flagged``, never
    ``ok``, for a row with a problem flag), logits_finite, decode_tok_s, tpot_ms_p50, speedup_vs_<baseline>, flag.
    """
    need = ["dtype", "context_len", "concurrency", "status", "decode_tok_s", "tpot_ms_p50"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise UserError(f"column(s) {missing} missing from the results")
    d = df.copy()
    d["status"] = verdict(d)
    fin = d["x_logits_finite"] if "x_logits_finite" in d else pd.Series(True, index=d.index)
    d["logits_finite"] = fin.map(lambda v: bool(v) if v is not None and not pd.isna(v) else None)
    flags = []
    for _, r in d.iterrows():
        if r["status"] not in ("ok", "flagged"):
            flags.append(f"{r['status']}: not measured")
        elif problems := row_problems(r):
            flags.append("; ".join(problems) + "; speed not reported")
        else:
            flags.append("")
    d["flag"] = flags
    bad = d["flag"] != ""
    d.loc[bad, ["decode_tok_s", "tpot_ms_p50"]] = np.nan
    base = d[d["dtype"] == baseline].set_index(["context_len", "concurrency"])["decode_tok_s"]
    key = list(zip(d["context_len"], d["concurrency"]))
    d[f"speedup_vs_{baseline}"] = [
        r / base.get(k, np.nan) if k in base.index else np.nan for r, k in zip(d["decode_tok_s"], key)
    ]
    cols = [
        "dtype",
        "context_len",
        "concurrency",
        "status",
        "logits_finite",
        "decode_tok_s",
        "tpot_ms_p50",
        f"speedup_vs_{baseline}",
        "flag",
    ]
    return d[cols].sort_values(["context_len", "concurrency", "dtype"]).reset_index(drop=True)


def ci_summary(df: pd.DataFrame) -> list[dict]:
    """One JSON-ready dict per point: identity, ``status`` and ``verdict`` (both :func:`kit.results.verdict`:
    ``flagged`` for status ok with a problem flag, see :func:`export_frame`), TTFT/TPOT/throughput with sample count
    (no per-step lists; null for a row that is not ok, so a flagged row carries no speed figure)."""
    keep = [
        "model",
        "dtype",
        "device",
        "device_name",
        "context_len",
        "concurrency",
        "decode_steps",
        "repeats",
        "status",
        "error",
        *HEADLINE_COLUMNS,
    ]
    out = []
    verdicts = verdict(df) if len(df) else pd.Series([], dtype=object)
    for i, r in export_frame(df).iterrows():
        rec = {"verdict": verdicts.loc[i]}
        for c in keep:
            if c in df.columns:
                v = None if rec["verdict"] != "ok" and c in HEADLINE_COLUMNS else r[c]
                rec[c] = (
                    None
                    if v is None or (not isinstance(v, str) and pd.isna(v))
                    else (v.item() if hasattr(v, "item") else v)
                )
        out.append(rec)
    return out


def export_for_ci(df: pd.DataFrame, out_dir: str | Path, metadata: dict | None = None) -> dict[str, Path]:
    """Write a results bundle a CI job can archive and read:

    - ``results.parquet`` + ``results.json`` (full rows + run metadata, :func:`kit.store.save_results`),
    - ``results.csv`` (flat: per-step list columns dropped),
    - ``summary.json`` (``{"n_points", "n_ok", "n_flagged", "statuses", "points": [...]}``, see :func:`ci_summary`;
      ``n_ok`` counts :func:`kit.results.ok_mask` rows, so a flagged row is not ok),
    - ``summary.md`` (a Markdown table, e.g. for ``$GITHUB_STEP_SUMMARY``).

    Every file is written atomically (no truncated file or ``.tmp`` is left behind).

    Returns: name → path.
    Raises: OutputPathError (one line naming the path) when ``out_dir`` is not a writable directory or a file
    cannot be written.
    """
    from kit._io import atomic_write_text, atomic_write_with, check_out_dir
    from kit.store import save_results

    out = check_out_dir(out_dir, "CI export directory", "results/ci")
    meta = metadata if metadata is not None else df.attrs.get("metadata", {})
    rows = export_frame(df)
    paths = {"parquet": save_results(rows, out / "results.parquet", meta)}
    flat = rows.drop(columns=[c for c in LIST_COLUMNS if c in rows.columns])
    paths["csv"] = atomic_write_with(out / "results.csv", lambda tmp: flat.to_csv(tmp, index=False))
    points = ci_summary(df)
    statuses = {s: int(n) for s, n in rows["status"].value_counts().items()} if len(rows) else {}
    summary = {
        "n_points": len(df),
        "n_ok": statuses.get("ok", 0),
        "n_flagged": statuses.get("flagged", 0),
        "statuses": statuses,
        "points": points,
    }
    paths["summary_json"] = atomic_write_text(
        out / "summary.json", json.dumps(summary, indent=2, default=str), "CI export file", "summary.json"
    )
    cols = ["dtype", "context_len", "concurrency", "verdict", "ttft_ms", "tpot_ms_p50", "tpot_n", "decode_tok_s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for p in points:
        cells = []
        for c in cols:
            v = p.get(c)
            cells.append("-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    md = f"{summary['n_ok']}/{summary['n_points']} points ok\n\n" + "\n".join(lines) + "\n"
    paths["summary_md"] = atomic_write_text(out / "summary.md", md, "CI export file", "summary.md")
    return paths


__all__ = ["scaling_exponents", "concurrency_knee", "dtype_comparison", "ci_summary", "export_for_ci"]
