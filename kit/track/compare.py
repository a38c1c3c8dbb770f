"""Is HEAD slower than BASE beyond the noise? A point-by-point compare of two sets of runs in the history.

For each point configuration measured ok on both sides, and each metric — decode tok/s (served: output tok/s),
TPOT p50, TTFT and $ per million tokens — the change ``head / base - 1`` gets a confidence interval from
*independent units*, never from single decode steps (consecutive steps of one run are correlated):

- both sides hold >= 2 replicates of the point (runs, or repeats of the whole grid: ``kit sweep --runs N``): the
  unit is a replicate, its value the replicate's figure (median of its steps);
- otherwise the unit is a block inside the runs: a repeat of an in-process point (median of its timed steps;
  TTFT its prefill), a request of a served one (its TPOT, TTFT, output tokens / E2E latency). This covers only
  within-run noise: on a shared machine give each side several replicates.

The interval is Welch's t interval on the log of the unit values (so the change is a ratio and units with few
samples get Student's t, not a normal approximation; Welch 1947, *Biometrika* 34:28), at ``confidence``
(default 95 %). A metric *regresses* when its interval lies entirely beyond the tolerance band (default ±3 %) in
the bad direction **and** its one-sided p-value against "the change is within the band" survives the
Benjamini–Hochberg procedure at false-discovery rate ``fdr`` (default 5 %) over every (point, metric) tested
(Benjamini & Hochberg 1995, *JRSS B* 57:289; :func:`scipy.stats.false_discovery_control`). A point ok on BASE
but failed (oom, error, flagged) on HEAD is a regression too.

The intervals cover the noise *within* each side; a machine whose load shifts between BASE and HEAD moves every
point of one side at once (2 of 5 identical-commit pairs read "+146 % TPOT regression" on a shared 2-core box).
So the compare also reads the machine noise each side ran under (:mod:`kit.track.noise`: the median step over the
fastest, the torch threads) and, when BASE and HEAD ran under different noise or on a busy machine, answers
**inconclusive** (exit :data:`kit.track.noise.INCONCLUSIVE_EXIT`, 3) with what to do, instead of a regression or a
pass: each metric's regression or improvement reads ``inconclusive``. A point that failed on HEAD still fails.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from kit.errors import UserError
from kit.track.db import list_runs, load_rows, load_samples, resolve
from kit.track.noise import ADVICE, INCONCLUSIVE_EXIT, noise_problem, side_noise

DEFAULT_TOLERANCE = 0.03
DEFAULT_CONFIDENCE = 0.95
DEFAULT_FDR = 0.05
#: metric → (row column, +1 when higher is better / -1 when lower is better, label)
METRICS = {
    "tok_s": ("tok_s", +1, "decode tok/s"),
    "tpot_ms": ("tpot_ms", -1, "TPOT p50 (ms)"),
    "ttft_ms": ("ttft_ms", -1, "TTFT (ms)"),
    "usd_per_mtok": ("usd_per_mtok", -1, "$/Mtok"),
}


def interval(base: np.ndarray, head: np.ndarray, confidence: float = DEFAULT_CONFIDENCE, sign: int = -1, tol=0.03):
    """Welch's t interval of the ratio ``head / base - 1`` from independent unit values (> 0, any units).

    Args:
        base, head: 1-D arrays of unit values (at least 2 each for an interval).
        sign: +1 when higher is better (tok/s), -1 when lower is better (ms, $).
        tol: the tolerance band (fraction) of the one-sided p-value.

    Returns:
        ``(change, low, high, p)``: the change and its interval as fractions, and the one-sided p-value of
        "the change in the bad direction is at most ``tol``" (NaN interval and p = 1 with too few units).
    """
    b, h = np.log(np.asarray(base, float)), np.log(np.asarray(head, float))
    d = float(h.mean() - b.mean()) if len(b) and len(h) else math.nan
    if len(b) < 2 or len(h) < 2:
        return math.exp(d) - 1 if d == d else d, math.nan, math.nan, 1.0
    vb, vh = b.var(ddof=1) / len(b), h.var(ddof=1) / len(h)
    se = math.sqrt(vb + vh)
    bad = -sign * d - math.log1p(tol)  # > 0: beyond the band in the bad direction
    if se == 0:
        return math.exp(d) - 1, math.exp(d) - 1, math.exp(d) - 1, 0.0 if bad > 0 else 1.0
    df = (vb + vh) ** 2 / (vb**2 / (len(b) - 1) + vh**2 / (len(h) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    return math.exp(d) - 1, math.exp(d - half) - 1, math.exp(d + half) - 1, float(stats.t.sf(bad / se, df))


def _block_units(rows: pd.DataFrame, smp: pd.DataFrame, metric: str) -> tuple[np.ndarray, str]:
    """Unit values of one side from blocks inside its rows (repeats or requests)."""
    vals, unit = [], "repeat"
    for _, r in rows.iterrows():
        s = smp[smp.row_key == r.row_key]
        served = r.backend == "openai"
        unit = "request" if served else "repeat"
        if metric in ("tpot_ms", "ttft_ms"):
            v = s[s.metric == metric].groupby("block")["value"].median()
        elif served:
            v = s[s.metric == "tok_s"].set_index("block")["value"]
        else:  # decode tok/s of a repeat = B / its median step time (kit.metrics.decode_tok_s)
            v = r.concurrency * 1000.0 / s[s.metric == "tpot_ms"].groupby("block")["value"].median()
        if metric == "usd_per_mtok":
            price = r.usd_per_gpu_hr if pd.notna(r.usd_per_gpu_hr) else math.nan
            v = price * r.n_gpus / (v * 3600.0) * 1e6  # kit.metrics.usd_per_mtok
        vals += [float(x) for x in v if np.isfinite(x) and x > 0]
    return np.asarray(vals), unit


def _units(rows: pd.DataFrame, smp: pd.DataFrame, metric: str, by_replicate: bool) -> tuple[np.ndarray, str]:
    if by_replicate:
        v = rows[METRICS[metric][0]].astype(float)
        return v[np.isfinite(v) & (v > 0)].to_numpy(), "run"
    return _block_units(rows, smp, metric)


@dataclass
class Comparison:
    """The result of :func:`compare`: ``table`` has one row per (point, metric); ``regressed_points`` names the
    points that regressed; ``noise`` each side's machine noise (:class:`kit.track.noise.SideNoise` as a dict);
    ``inconclusive`` why BASE and HEAD cannot be compared for speed (:func:`kit.track.noise.noise_problem`), or
    None."""

    base: str
    head: str
    table: pd.DataFrame
    tolerance: float = DEFAULT_TOLERANCE
    confidence: float = DEFAULT_CONFIDENCE
    fdr: float = DEFAULT_FDR
    notes: list = field(default_factory=list)
    noise: dict = field(default_factory=dict)
    inconclusive: str | None = None

    @property
    def regressed_points(self) -> list[str]:
        t = self.table
        return sorted(t.loc[t.verdict.isin(["regression", "failed on head"]), "point"].unique())

    @property
    def exit_code(self) -> int:
        """The CI gate: 1 when a point regressed (or failed on HEAD, whatever the noise), 3
        (:data:`kit.track.noise.INCONCLUSIVE_EXIT`) when BASE and HEAD ran under different machine noise, else 0."""
        if self.regressed_points:
            return 1
        return INCONCLUSIVE_EXIT if self.inconclusive else 0

    def to_json(self) -> str:
        """The whole compare as one JSON object (settings, regressed points, every table row; NaN → null)."""
        rows = json.loads(self.table.to_json(orient="records"))
        doc = {
            "base": self.base,
            "head": self.head,
            "tolerance": self.tolerance,
            "confidence": self.confidence,
            "fdr": self.fdr,
            "regressed_points": self.regressed_points,
            "exit_code": self.exit_code,
            "inconclusive": self.inconclusive,
            "advice": ADVICE if self.inconclusive else None,
            "noise": self.noise,
            "notes": self.notes,
            "rows": rows,
        }
        return json.dumps(doc, indent=1)

    def to_markdown(self) -> str:
        """A Markdown summary (for ``$GITHUB_STEP_SUMMARY``): the verdict line and the table of changes."""
        n = len(self.regressed_points)
        head = f"### kit history compare `{self.base}` → `{self.head}`\n\n"
        verdict = (
            f"**{n} point(s) regressed** beyond ±{self.tolerance:.0%}" if n else "**no regression** beyond the noise"
        )
        if self.inconclusive and not n:
            verdict = f"**inconclusive**: {self.inconclusive}. What to do: {ADVICE}"
        lines = [
            head + verdict + f" ({self.confidence:.0%} intervals, FDR {self.fdr:.0%}).\n",
            "| point | metric | base | head | change | interval | n (unit) | verdict |",
            "|---|---|---:|---:|---:|---|---|---|",
        ]
        for _, r in self.table.iterrows():
            ci = f"[{r.ci_low:+.1%}, {r.ci_high:+.1%}]" if pd.notna(r.ci_low) else "—"
            chg = f"{r.change:+.1%}" if pd.notna(r.change) else "—"
            fmt = lambda v: f"{v:.4g}" if pd.notna(v) else "—"  # noqa: E731
            mark = {"regression": "🔴 ", "failed on head": "🔴 ", "inconclusive": "⚪ "}.get(r.verdict, "")
            lines.append(
                f"| {r.point} | {r.metric_label} | {fmt(r['base'])} | {fmt(r['head'])} | {chg} | {ci} | "
                f"{r.n_base}/{r.n_head} ({r.unit}) | {mark}{r.verdict} |"
            )
        notes = self.notes + ([f"machine noise: {self.inconclusive}"] if self.inconclusive and n else [])
        return "\n".join(lines + [""] + [f"- {x}" for x in notes]) + "\n"

    def write_markdown(self, path: str | Path) -> Path:
        from kit._io import atomic_write_text

        return atomic_write_text(path, self.to_markdown(), "--markdown", "summary.md")


def compare(
    db: str | Path,
    base: str,
    head: str,
    tolerance: float = DEFAULT_TOLERANCE,
    confidence: float = DEFAULT_CONFIDENCE,
    fdr: float = DEFAULT_FDR,
) -> Comparison:
    """Compare the runs ``head`` names with those ``base`` names (commits, tags or run ids), point by point.

    Args:
        tolerance: half-width of the band of changes that are never a regression (fraction; 0.03 = ±3 %).
        confidence: level of each interval (0.95). fdr: false-discovery rate over every (point, metric) tested.

    Returns:
        a :class:`Comparison`; ``.exit_code`` is 1 when a point regressed.

    Raises:
        UserError: a setting out of range, BASE and HEAD name the same runs, or they share no point.
        UnknownNameError: a bad ref.
    """
    for name, v, lo, hi in (("tolerance", tolerance, 0, 1), ("confidence", confidence, 0.5, 1), ("fdr", fdr, 0, 1)):
        if not (isinstance(v, (int, float)) and lo <= v < hi):
            raise UserError(f"{name}={v!r} must be in [{lo}, {hi})")
    runs = list_runs(db)
    bk, hk = resolve(runs, base), resolve(runs, head)
    if set(bk) & set(hk):
        raise UserError(f"BASE {base!r} and HEAD {head!r} name the same run(s) {sorted(set(bk) & set(hk))}")
    rows = load_rows(db, bk + hk)
    rows["side"] = np.where(rows.run_key.isin(bk), "base", "head")
    common = set(rows.point_key[rows.side == "base"]) & set(rows.point_key[rows.side == "head"])
    if not common:
        raise UserError(
            f"BASE {base!r} and HEAD {head!r} have no point in common (different models, grids or backends): "
            "nothing to compare"
        )
    return compare_frames(rows, load_samples(db, list(rows.row_key)), base, head, tolerance, confidence, fdr)


def compare_frames(
    rows: pd.DataFrame,
    smp: pd.DataFrame,
    base: str = "base",
    head: str = "head",
    tolerance: float = DEFAULT_TOLERANCE,
    confidence: float = DEFAULT_CONFIDENCE,
    fdr: float = DEFAULT_FDR,
) -> Comparison:
    """:func:`compare` on frames in the history's shape: ``rows`` (the ``rows`` table plus ``side`` = ``base`` |
    ``head``) and ``smp`` (the ``samples`` table); what the benchmark of the statistics calls directly.

    Machine noise is read twice: per side (every ok row of it) and per point (the point's rows on each side, so a
    load that hit some points' replicates only is seen too); a regression reads ``inconclusive`` when HEAD ran
    under more noise than BASE (at the point or as a whole), an improvement when BASE did
    (:func:`kit.track.noise.noise_problem`); the compare is inconclusive when the sides differ at all."""
    out, notes, point_noise = [], [], {}
    for pkey, grp in rows.groupby("point_key", sort=False):
        label = grp.label.iloc[0]
        b, h = grp[(grp.side == "base") & grp.ok], grp[(grp.side == "head") & grp.ok]
        failed = grp[(grp.side == "head") & ~grp.ok]
        if b.empty or h.empty:
            why = (
                "failed on head"
                if len(b) and len(failed)
                else ("missing on head" if len(b) else ("new on head" if len(h) else "not ok on either side"))
            )
            out.append(
                {"point": label, "point_key": pkey, "metric": "status", "metric_label": "status", "verdict": why}
            )
            continue
        by_rep = min(len(b), len(h)) >= 2  # one row per replicate of a point
        out += _metric_rows(label, pkey, b, h, smp, by_rep, tolerance, confidence)
        point_noise[pkey] = side_noise(b, smp), side_noise(h, smp)
        if not by_rep:
            notes.append(f"{label}: one replicate per side; the interval covers within-run noise only (--runs 3)")
    table = _decide(pd.DataFrame(out), tolerance, fdr)
    noise, problem = _noise_verdicts(table, rows, smp, point_noise)
    return Comparison(
        base, head, table, tolerance, confidence, fdr, sorted(set(notes)), noise=noise, inconclusive=problem
    )


def _noise_verdicts(table: pd.DataFrame, rows: pd.DataFrame, smp: pd.DataFrame, point_noise: dict):
    """Each side's machine noise (:class:`kit.track.noise.SideNoise` as dicts) and why the compare is inconclusive
    (or None); relabels, in ``table``, a regression or improvement the noise may explain (at its point, or of
    the sides as a whole) as ``inconclusive``. ``point_noise``: point key → (BASE, HEAD) SideNoise."""
    sides = {s: side_noise(rows[(rows.side == s) & rows.ok], smp) for s in ("base", "head")}
    problem = noise_problem(sides["base"], sides["head"])
    reasons = {}
    moved = table[table.verdict.isin(["regression", "improvement"])] if len(table) else table
    for i, r in moved.iterrows():
        way = "worse" if r.verdict == "regression" else "better"
        why = noise_problem(sides["base"], sides["head"], way) or noise_problem(*point_noise[r.point_key], way)
        if why:
            reasons[i] = why
    if reasons:
        table.loc[list(reasons), "verdict"] = "inconclusive"
        n = table.loc[list(reasons), "point_key"].nunique()
        first = reasons[min(reasons)]
        problem = problem or f"{n} point(s) ran under more machine noise on the side that looks slower ({first})"
    return {s: n.as_dict() for s, n in sides.items()}, problem


def _metric_rows(label, pkey, b, h, smp, by_rep: bool, tolerance: float, confidence: float) -> list[dict]:
    """The table rows of one point measured ok on both sides: per metric of :data:`METRICS`, the change of HEAD
    over BASE with its interval and one-sided p-value (:func:`interval`) from independent units (:func:`_units`)."""
    out = []
    for metric, (_col, sign, mlabel) in METRICS.items():
        ub, unit = _units(b, smp, metric, by_rep)
        uh, _ = _units(h, smp, metric, by_rep)
        if not len(ub) or not len(uh):
            continue
        chg, lo, hi, p = interval(ub, uh, confidence, sign, tolerance)
        out.append(
            {
                "point": label,
                "point_key": pkey,
                "metric": metric,
                "metric_label": mlabel,
                "base": float(np.median(ub)),
                "head": float(np.median(uh)),
                "change": chg,
                "ci_low": lo,
                "ci_high": hi,
                "n_base": len(ub),
                "n_head": len(uh),
                "unit": unit,
                "p": p,
                "sign": sign,
            }
        )
    return out


def _decide(t: pd.DataFrame, tol: float, fdr: float) -> pd.DataFrame:
    """Verdict per (point, metric): Benjamini–Hochberg over the tested p-values, then the band check."""
    if t.empty:
        return t.assign(verdict=pd.Series(dtype=str))
    for c in ("base", "head", "change", "ci_low", "ci_high", "p", "sign", "n_base", "n_head", "unit"):
        if c not in t.columns:
            t[c] = np.nan
    tested = t.p.notna() & t.ci_low.notna()
    t["q"] = np.nan
    if tested.any():
        t.loc[tested, "q"] = stats.false_discovery_control(t.loc[tested, "p"].to_numpy(), method="bh")
    worse = ((t.sign > 0) & (t.ci_high < -tol)) | ((t.sign < 0) & (t.ci_low > tol))  # beyond the band
    better = ((t.sign > 0) & (t.ci_low > tol)) | ((t.sign < 0) & (t.ci_high < -tol))
    t.loc[tested, "verdict"] = "within noise"
    t.loc[tested & better, "verdict"] = "improvement"
    t.loc[tested & worse & (t.q <= fdr), "verdict"] = "regression"
    t.loc[t.metric.ne("status") & ~tested, "verdict"] = "no interval"
    return t
