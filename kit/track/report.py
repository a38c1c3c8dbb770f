"""``kit history report``: one self-contained static HTML page of performance per commit.

The page (``OUT/index.html``; the PNGs are embedded as data URIs and also written beside it) shows, per point
group, decode tok/s, TPOT p50 and tok/s per dollar vs commit with 95 % interval bands over each commit's
independent runs, the points ``kit history compare`` flagged against the previous commit ringed in red, the
latest compare table, and the provenance of every commit (branch, dirty flag, tag, device, driver, versions,
price).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from kit._io import atomic_write_bytes, atomic_write_text, check_out_dir
from kit.track.compare import compare
from kit.track.db import commit_order, list_runs, load_rows
from kit.track.noise import ADVICE
from kit.track.repeat import log_interval

#: metrics drawn per commit: history-table column → compare metric whose regression ring it shows
PLOTTED = {"tok_s": "tok_s", "tpot_ms": "tpot_ms", "tok_s_per_usd": "usd_per_mtok"}


def history_frame(db: str | Path, flags: dict | None = None) -> pd.DataFrame:
    """One row per (commit, point group): median and 95 % interval (:func:`kit.track.repeat.log_interval` over
    the commit's ok rows, each an independent run) of tok/s, TPOT p50 and tok/s per $/hour, and
    ``regression_<metric>`` from ``flags`` = ``{commit: {(point_key, compare metric), ...}}``."""
    rows = load_rows(db)
    rows = rows[rows["ok"]]
    out = []
    for (commit, pkey), g in rows.groupby(["commit", "point_key"], sort=False):
        rec = {"commit": commit, "point_key": pkey, "label": g["label"].iloc[0], "runs": len(g)}
        for col, metric in PLOTTED.items():
            med, lo, hi = log_interval(g[col].astype(float))
            rec.update({col: med, f"{col}_lo": lo, f"{col}_hi": hi})
            rec[f"regression_{col}"] = (pkey, metric) in (flags or {}).get(commit, set())
        out.append(rec)
    return pd.DataFrame(out)


def _table(df: pd.DataFrame, cls: str) -> str:
    return df.to_html(index=False, classes=cls, na_rep="—", escape=True, border=0, float_format=lambda v: f"{v:.4g}")


_CSS = """body{font-family:system-ui,sans-serif;margin:24px;max-width:1200px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}img.kit-plot{max-width:100%;border:1px solid #ddd}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px}
tr.regression td,td.regression{background:#fdd}.verdict-bad{color:#b00;font-weight:bold}"""


def _compare_html(cmp) -> str:
    t = cmp.table
    if t.empty:
        return "<p>no common points</p>"
    show = t[["point", "metric_label", "base", "head", "change", "ci_low", "ci_high", "n_base", "n_head", "unit"]]
    show = show.assign(
        change=t["change"].map(lambda v: f"{v:+.1%}" if pd.notna(v) else "—"),
        interval=[f"[{a:+.1%}, {b:+.1%}]" if pd.notna(a) else "—" for a, b in zip(t["ci_low"], t["ci_high"])],
        verdict=t["verdict"],
    ).drop(columns=["ci_low", "ci_high"])
    body = _table(show, "kit-compare")
    for v in ("regression", "failed on head"):
        body = body.replace(f"<td>{v}</td>", f'<td class="regression verdict-bad">{v}</td>')
    n = len(cmp.regressed_points)
    head = f"<p><b>{n} point(s) regressed</b> beyond ±{cmp.tolerance:.0%}</p>" if n else "<p>no regression</p>"
    if cmp.inconclusive and not n:
        head = f"<p><b>inconclusive</b>: {html.escape(cmp.inconclusive)}. What to do: {html.escape(ADVICE)}</p>"
    return head + body


def write_report(db: str | Path, out_dir: str | Path, base: str | None = None, head: str | None = None) -> Path:
    """Write ``out_dir/index.html`` (self-contained) and the PNGs beside it; return the HTML path.

    Args:
        base, head: refs of the compare table (default: the commit before the latest and the latest).

    Raises:
        InputNotFoundError: no database. UserError: the history holds no run, or a bad ref.
    """
    from kit.errors import UserError
    from kit.view.history_plots import metric_vs_commit
    from kit.view.render import figure_png, png_data_uri

    out = check_out_dir(out_dir, "--out", "history-report")
    runs = list_runs(db)
    if runs.empty:
        raise UserError(f"the history {db} holds no runs (kit history add RUN_DIR first)")
    commits = commit_order(runs)
    flags, cmps = {}, {}
    for prev, cur in zip(commits, commits[1:]):
        c = compare(db, prev, cur)
        cmps[cur] = c
        bad = c.table[c.table["verdict"] == "regression"] if not c.table.empty else c.table
        flags[cur] = set(zip(bad.get("point_key", []), bad.get("metric", [])))
    hist = history_frame(db, flags)
    latest = compare(db, base, head) if base and head else cmps.get(commits[-1])
    parts = [
        f"<h1>Performance per commit</h1><p>{len(commits)} commits, {len(runs)} runs, "
        f"database {html.escape(str(db))}</p>"
    ]
    for col, title in (
        ("tok_s_per_usd", "tok/s per dollar (tokens per $) vs commit"),
        ("tok_s", "decode tok/s vs commit"),
        ("tpot_ms", "TPOT p50 vs commit"),
    ):
        data = hist.dropna(subset=[col]) if col in hist else hist.iloc[:0]
        if data.empty:
            parts.append(f"<h2>{title}</h2><p>no data (no price recorded: kit history add --usd-per-gpu-hr)</p>")
            continue
        png = figure_png(metric_vs_commit(data, col, commits, title=title.replace("$", r"\$")), dpi=100)
        atomic_write_bytes(out / f"history_{col}.png", png)
        uri = png_data_uri(png)
        parts.append(f'<h2>{title}</h2><img class="kit-plot" id="plot-{col}" alt="{title}" src="{uri}">')
    if latest is not None:
        parts.append(f"<h2>Latest compare: {html.escape(latest.base)} → {html.escape(latest.head)}</h2>")
        parts.append(_compare_html(latest))
    prov = runs[["commit", "branch", "dirty", "tag", "run_key", "created_utc", "device_name", "driver", "rows"]].copy()
    prov["versions"] = [", ".join(f"{k} {v}" for k, v in json.loads(x or "{}").items()) for x in runs["versions"]]
    prov["price"] = [
        f"${p:.3g}/h ({b})" if pd.notna(p) else "—" for p, b in zip(runs["usd_per_gpu_hr"], runs["price_basis"])
    ]
    parts.append("<h2>Provenance per commit</h2>" + _table(prov, "kit-provenance"))
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>kit history</title><style>{_CSS}</style></head>"
    page += "<body>" + "\n".join(parts) + "</body></html>\n"
    return atomic_write_text(out / "index.html", page, "--out", "history-report")
