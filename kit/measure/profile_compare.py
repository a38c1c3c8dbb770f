"""``kit profile compare A B``: two profiled points side by side, operator by operator.

A and B are each a profiled point (:mod:`kit.measure.profile`): a point's profile folder (holding
``profile.json`` and ``ops.csv``), or a run directory with one profiled point, or ``RUN_DIR:kv=4096,B=1`` (a
selection as ``--profile`` takes it) for a run with several. Eager vs compiled, dtype vs dtype, 4k vs 32k, this
commit vs the last, ROCm vs CUDA: whatever two profiles were taken.

Per operator: self time per decode step in A and in B (ms; the median over each profile's steps, see
:func:`kit.measure.profile.operator_table`), the difference B − A, and ``share_of_change``: the difference over
the sum of every operator's *absolute* difference, with the difference's sign (the magnitudes add up to 100 %; a
shrinking operator has a negative share). The net gap is the sum of the differences (operators and the Python/
framework time outside them). The operators that *explain the gap* are the largest contributions in the net gap's
direction, taken until they add up to :data:`EXPLAINED_FRACTION` of it (each with its share of the net gap). Also
side by side: the plain TPOT (the unprofiled pass), the profiled step, its spread over the profiled steps, the
profiler's overhead ratio, operators and dispatches (CPU) or kernels and launches (GPU) per step, the launch share.

**Noise.** A profile taken on a busy machine attributes the machine's stalls to whatever operator was running.
The comparison warns (``warnings`` in the JSON, the text, the figure's subtitle) and calls the attribution
unreliable when a side's overhead ratio (profiled step ÷ plain TPOT) is above :data:`OVERHEAD_NOISY` or below
:data:`OVERHEAD_LOW`, when a side's step spread ((max − min) ÷ median profiled step) is above
:data:`SPREAD_NOISY`, or when the profiled gap (B − A median profiled step) disagrees with the plain TPOT gap by
more than :data:`GAP_TOLERANCE` of the plain gap (and more than :data:`GAP_FLOOR` of the plain TPOT).

Without ``--out`` the files go to ``./results/profile-compare`` under the current directory.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from kit._io import atomic_write_text, check_out_dir
from kit.errors import InputNotFoundError, OutputPathError, UserError
from kit.measure.profile import NO_KERNELS, OUTSIDE_OPS, PROFILE_DIR, STEP_RANGE
from kit.measure.profile_select import parse_profile_points

#: the operators named as explaining a gap add up to at least this share of it
EXPLAINED_FRACTION = 0.8
#: a profiled step more than this many times the plain TPOT: the profiler (or the machine) perturbed the step
OVERHEAD_NOISY = 1.5
#: a profiled step less than this share of the plain TPOT: the plain pass itself was disturbed
OVERHEAD_LOW = 0.67
#: profiled steps whose range ((max − min) ÷ median) exceeds this: a noisy pass
SPREAD_NOISY = 1.0
#: the profiled gap may differ from the plain TPOT gap by this share of the plain gap ...
GAP_TOLERANCE = 0.5
#: ... or by this share of the larger plain TPOT (a floor, for two points of nearly equal TPOT)
GAP_FLOOR = 0.05
#: what the comparison advises when it warns
ADVICE = "treat the attribution as unreliable; re-run on a quiet machine or with --threads 1"
#: per-step figures compared besides the operators (profile.json keys)
FIGURES = ("plain_step_ms", "x_prof_step_ms", "x_prof_step_ms_min", "x_prof_step_ms_max", "x_prof_step_spread",
           "x_prof_overhead_ratio", "x_prof_ops_per_step", "x_prof_top_ops_per_step", "x_prof_kernels_per_step",
           "x_prof_launches_per_step", "x_prof_launch_share")  # fmt: skip


def resolve_profile(spec: str | Path) -> dict:
    """The profile ``spec`` names: ``{"dir", "label", "summary" (profile.json), "ops" (DataFrame)}``.

    ``spec``: a point's profile folder; a run directory with exactly one profiled point; ``RUN_DIR:SELECTION``
    (``kv=4096,B=1``: one match of :func:`kit.measure.profile_select.parse_profile_points`).

    Raises:
        InputNotFoundError: nothing at the path, or no profiled point in a run directory.
        UserError: a selection that matches no profiled point or several (the run's profiled points listed with
            their selections).
    """
    text = str(spec)
    path, selection = Path(text), None
    if not path.exists() and ":" in text:
        head, _, sel = text.rpartition(":")
        path, selection = Path(head), parse_profile_points(sel)
    if not path.exists():
        raise InputNotFoundError(f"profile {text!r}: no such folder (give a profile folder or a run directory)")
    if (path / "profile.json").exists():
        return _load(path)
    root = path / PROFILE_DIR
    found = [_load(d) for d in sorted(root.iterdir()) if (d / "profile.json").exists()] if root.is_dir() else []
    if not found:
        raise InputNotFoundError(f"profile {text!r}: no profiled point in {path} (run `kit sweep --profile ...`)")
    every = found
    if selection is not None:
        found = [f for f in found if selection.selects(f["summary"]["context_len"], f["summary"]["concurrency"],
                                                       f["summary"].get("dtype"))]  # fmt: skip
    if len(found) != 1:
        listed = every if not found else found
        which = "; ".join(f"{path}:kv={f['summary']['context_len']},B={f['summary']['concurrency']}" for f in listed)
        what = "no profiled point matches" if not found else f"{len(found)} profiled points match"
        have = "the profiled points there are" if not found else "they are"
        raise UserError(f"profile {text!r}: {what}; name one as RUN_DIR:kv=N,B=N ({have}: {which})")
    return found[0]


def _load(folder: Path) -> dict:
    try:
        summary = json.loads((folder / "profile.json").read_text())
        ops = pd.read_csv(folder / "ops.csv")
    except (OSError, ValueError) as e:
        raise UserError(f"profile {folder}: profile.json / ops.csv cannot be read ({e})") from None
    mode = summary.get("x_prof_engine_mode", "eager")
    dtype = f" {summary['dtype']}" if summary.get("dtype") else ""
    label = f"kv={summary['context_len']} B={summary['concurrency']}{dtype} {mode}"
    return {"dir": folder, "label": label, "summary": summary, "ops": ops}


def compare_profiles(a: dict, b: dict) -> dict:
    """Operator-by-operator comparison of two resolved profiles (:func:`resolve_profile`).

    Returns:
        ``{"a", "b" (labels and folders), "table" (DataFrame: op, a_ms_per_step, b_ms_per_step, diff_ms_per_step,
        share_of_change, a_calls_per_step, b_calls_per_step; sorted by |diff|), "gap_ms_per_step" (the net gap:
        sum of the differences, ms), "explains" (the operators that make up :data:`EXPLAINED_FRACTION` of the net
        gap, in order, each with ``share_of_gap``: its share of the net gap, > 0), "figures" ({figure: [A, B]}:
        plain TPOT, profiled step and its min/max/spread, overhead ratio, ops/kernels/launches per step, launch
        share), "launch_notes" ([A, B]), "device_kernels" (False when neither side ran device kernels: the CPU),
        "profiled_gap_ms" and "plain_gap_ms" (B − A of the median profiled step and of the plain TPOT p50; None
        when unknown), "warnings" (sentences, empty when the profiles look trustworthy: :func:`noise_warnings`),
        "reliable" (no warnings)}``.
    """
    cols = ["op", "self_ms_per_step", "calls_per_step"]
    ta = a["ops"][cols].rename(columns={"self_ms_per_step": "a_ms_per_step", "calls_per_step": "a_calls_per_step"})
    tb = b["ops"][cols].rename(columns={"self_ms_per_step": "b_ms_per_step", "calls_per_step": "b_calls_per_step"})
    t = ta.merge(tb, on="op", how="outer").fillna(0.0)
    t["op"] = t["op"].replace({STEP_RANGE: OUTSIDE_OPS})
    t["diff_ms_per_step"] = t["b_ms_per_step"] - t["a_ms_per_step"]
    gap = float(t["diff_ms_per_step"].sum())
    moved = float(t["diff_ms_per_step"].abs().sum())
    t["share_of_change"] = t["diff_ms_per_step"] / moved if moved else math.nan
    t = t.reindex(t["diff_ms_per_step"].abs().sort_values(ascending=False, kind="stable").index).reset_index(drop=True)
    t = t[["op", "a_ms_per_step", "b_ms_per_step", "diff_ms_per_step", "share_of_change", "a_calls_per_step",
           "b_calls_per_step"]]  # fmt: skip
    explains, total = [], 0.0
    if gap:
        of_gap = t["diff_ms_per_step"] / gap  # > 0: in the net gap's direction
        for i in of_gap.sort_values(ascending=False, kind="stable").index:
            if total >= EXPLAINED_FRACTION or of_gap[i] <= 0:
                break
            explains.append({"op": t.at[i, "op"], "diff_ms_per_step": float(t.at[i, "diff_ms_per_step"]),
                             "share_of_gap": float(of_gap[i])})  # fmt: skip
            total += float(of_gap[i])
    figures = {k: [a["summary"].get(k), b["summary"].get(k)] for k in FIGURES}
    for k, col in (("x_prof_overhead_ratio", "x_prof_step_ms"),):  # profiles from before the ratio was stored
        figures[k] = [v if v is not None else _ratio(s["summary"].get(col), s["summary"].get("plain_step_ms"))
                      for v, s in zip(figures[k], (a, b), strict=True)]  # fmt: skip
    notes = [a["summary"].get("x_prof_launch_note"), b["summary"].get("x_prof_launch_note")]
    prof_gap = _diff(figures["x_prof_step_ms"])
    plain_gap = _diff(figures["plain_step_ms"])
    warnings = noise_warnings(figures, prof_gap, plain_gap)
    return {
        "a": {"label": a["label"], "dir": str(a["dir"])},
        "b": {"label": b["label"], "dir": str(b["dir"])},
        "table": t,
        "gap_ms_per_step": gap,
        "explains": explains,
        "explained_fraction": total,
        "figures": figures,
        "launch_notes": notes,
        "device_kernels": any(v is not None for v in figures["x_prof_kernels_per_step"]),
        "profiled_gap_ms": prof_gap,
        "plain_gap_ms": plain_gap,
        "warnings": warnings,
        "reliable": not warnings,
    }


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _ratio(x, y) -> float | None:
    x, y = _num(x), _num(y)
    return x / y if x is not None and y else None


def _diff(pair) -> float | None:
    a, b = (_num(v) for v in pair)
    return b - a if a is not None and b is not None else None


def noise_warnings(figures: dict, profiled_gap_ms: float | None, plain_gap_ms: float | None) -> list[str]:
    """Why a comparison's attribution cannot be trusted, as sentences (empty: no sign of noise).

    Args:
        figures: ``{profile.json key: [A, B]}`` with ``x_prof_overhead_ratio``, ``x_prof_step_spread``,
            ``x_prof_step_ms_min``, ``x_prof_step_ms_max``, ``plain_step_ms`` (None where unknown).
        profiled_gap_ms, plain_gap_ms: B − A of the median profiled step and of the plain TPOT p50, ms.

    A side warns when its overhead ratio is above :data:`OVERHEAD_NOISY` or below :data:`OVERHEAD_LOW`, or its
    step spread is above :data:`SPREAD_NOISY`; the pair warns when the gaps differ by more than
    :data:`GAP_TOLERANCE` × the absolute plain gap and more than :data:`GAP_FLOOR` × the larger plain TPOT. The
    last sentence is :data:`ADVICE`.
    """
    out = []
    for i, side in enumerate("AB"):
        ratio = _num(figures.get("x_prof_overhead_ratio", [None, None])[i])
        if ratio is not None and not OVERHEAD_LOW <= ratio <= OVERHEAD_NOISY:
            out.append(f"{side}'s profiled step is {ratio:.2f}x its plain TPOT (outside {OVERHEAD_LOW:g}-"
                       f"{OVERHEAD_NOISY:g}x)")  # fmt: skip
        spread = _num(figures.get("x_prof_step_spread", [None, None])[i])
        if spread is not None and spread > SPREAD_NOISY:
            lo, hi = (_num(figures.get(k, [None, None])[i]) for k in ("x_prof_step_ms_min", "x_prof_step_ms_max"))
            rng = f" ({lo:.1f}-{hi:.1f} ms)" if lo is not None and hi is not None else ""
            out.append(f"{side}'s profiled steps ranged{rng}, {spread:.1f}x their median (above {SPREAD_NOISY:g}x)")
    plain = [v for v in map(_num, figures.get("plain_step_ms", [])) if v is not None]
    if profiled_gap_ms is not None and plain_gap_ms is not None and plain:
        allowed = max(GAP_TOLERANCE * abs(plain_gap_ms), GAP_FLOOR * max(plain))
        if abs(profiled_gap_ms - plain_gap_ms) > allowed:
            out.append(f"the profiled gap B - A {profiled_gap_ms:+.3f} ms disagrees with the plain TPOT gap "
                       f"{plain_gap_ms:+.3f} ms")  # fmt: skip
    return [*out, ADVICE] if out else []


def compare_text(c: dict, top: int = 12) -> str:
    """The comparison in words: the two points, their per-step figures (with the profiler's overhead and the steps'
    spread), the operator table (top ``top``), the operators that explain the gap, and any noise warning."""

    def f(v, spec=".3f"):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)

    fig = c["figures"]
    lines = [f"A = {c['a']['label']}  ({c['a']['dir']})", f"B = {c['b']['label']}  ({c['b']['dir']})", ""]
    names = {"plain_step_ms": ("plain TPOT p50, ms", ".3f"), "x_prof_step_ms": ("profiled step p50, ms", ".3f"),
             "x_prof_step_ms_min": ("  fastest profiled step, ms", ".3f"),
             "x_prof_step_ms_max": ("  slowest profiled step, ms", ".3f"),
             "x_prof_step_spread": ("  spread (max-min)/median", ".2f"),
             "x_prof_overhead_ratio": ("profiled / plain (overhead)", ".2f"),
             "x_prof_ops_per_step": ("operators per step", ".0f"),
             "x_prof_top_ops_per_step": ("  of them called from Python", ".0f")}  # fmt: skip
    if c.get("device_kernels", True):
        names |= {"x_prof_kernels_per_step": ("kernels per step", ".0f"),
                  "x_prof_launches_per_step": ("launches per step", ".0f")}  # fmt: skip
    else:
        names |= {"x_prof_launches_per_step": (f"{NO_KERNELS}: dispatches per step", ".0f")}
    names |= {"x_prof_launch_share": ("launch/dispatch share", ".1%")}
    for k, (name, spec) in names.items():
        va, vb = fig.get(k, [None, None])
        if va is None and vb is None:
            if k == "x_prof_launch_share":
                lines.append(f"  {name:<46} {c['launch_notes'][0]}")
            continue
        lines.append(f"  {name:<46} A {f(va, spec):>10}   B {f(vb, spec):>10}")
    t = c["table"].head(top).copy()
    for col in ("a_ms_per_step", "b_ms_per_step", "diff_ms_per_step"):
        t[col] = t[col].map("{:+.4f}".format if col == "diff_ms_per_step" else "{:.4f}".format)
    t["share_of_change"] = t["share_of_change"].map(lambda v: "-" if v != v else f"{v:+.0%}")
    lines += [
        "",
        f"self time per decode step (ms, median over the profiled steps), top {len(t)} by |B - A|; share_of_change ="
        " B - A over the sum of every |B - A|, signed:",
        t.to_string(index=False),
        "",
    ]
    gap = c["gap_ms_per_step"]
    if c["explains"]:
        parts = ", ".join(
            f"{e['op']} {e['diff_ms_per_step']:+.3f} ms ({e['share_of_gap']:.0%} of the net gap)" for e in c["explains"]
        )
        lines.append(f"B - A = {gap:+.3f} ms per step (net); {c['explained_fraction']:.0%} of it is: {parts}")
    else:
        lines.append(f"B - A = {gap:+.3f} ms per step (net); no operator grows in the gap's direction")
    if c.get("plain_gap_ms") is not None:
        lines.append(f"plain TPOT gap B - A = {c['plain_gap_ms']:+.3f} ms; profiled step gap "
                     f"{f(c.get('profiled_gap_ms'), '+.3f')} ms")  # fmt: skip
    if c.get("warnings"):
        lines += ["", "WARNING: the profiles look noisy:"] + [f"  - {w}" for w in c["warnings"]]
    return "\n".join(lines)


def add_cli(sub) -> None:
    """``kit profile compare A B``."""
    p = sub.add_parser("profile", description="Read profiles taken by `kit sweep --profile` (and kv-stress, bench).")
    psub = p.add_subparsers(dest="profile_command", metavar="SUBCOMMAND")
    psub.required = True
    c = psub.add_parser(
        "compare",
        description=__doc__.split("\n\n")[1] + " Writes OUT/compare.json, OUT/compare.csv and OUT/profile_compare.png.",
    )
    c.add_argument("a", help="profile A: a profile folder, a run directory, or RUN_DIR:kv=N,B=N")
    c.add_argument("b", help="profile B (as A)")
    c.add_argument("--top", type=int, default=12, help="operators shown in the table and the figure (default 12)")
    c.add_argument(
        "--out",
        default="results/profile-compare",
        help="folder for compare.json, compare.csv and profile_compare.png (created; default: "
        "./results/profile-compare under the current directory)",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    c.set_defaults(func=_cli_compare)


def _cli_compare(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise UserError(f"--top {args.top}: must be an integer >= 1")
    out = check_out_dir(args.out, "--out", "results/profile-compare")
    a, b = resolve_profile(args.a), resolve_profile(args.b)
    c = compare_profiles(a, b)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = e.strerror or e
        raise OutputPathError(f"--out {str(out)!r} cannot be created ({why}); give a writable folder") from None
    import matplotlib

    matplotlib.use("Agg")
    from kit.view.files import save_figure
    from kit.view.profile_plots import operator_differences

    note = "noisy profiles: " + "; ".join(c["warnings"]) if c["warnings"] else None
    png = save_figure(
        operator_differences(c["table"], a["label"], b["label"], args.top, subtitle=note), out / "profile_compare.png"
    )
    atomic_write_text(out / "compare.csv", c["table"].to_csv(index=False), "--out", "compare.csv")
    doc = {k: v for k, v in c.items() if k != "table"} | {"table": c["table"].to_dict("records"), "plot": str(png)}
    atomic_write_text(out / "compare.json", json.dumps(doc, indent=2, default=str), "--out", "compare.json")
    if args.json:
        for w in c["warnings"]:  # the JSON has them; stderr too, where a person running the script sees them
            print(f"kit profile compare: warning: {w}", file=sys.stderr)
        print(json.dumps(doc, default=str))
        return 0
    print(compare_text(c, args.top))
    print(f"\nplot: {png}\ntable: {out / 'compare.csv'}", file=sys.stdout)
    return 0
