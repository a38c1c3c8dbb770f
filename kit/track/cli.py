"""``kit history add|list|compare|report``: performance per commit (:mod:`kit.track`).

``compare`` exits 1 when a point regressed beyond the noise (a CI gate), 3 when it is inconclusive (BASE and HEAD
ran under different machine noise, :mod:`kit.track.noise`), 0 otherwise, 2 for a user error.
"""

from __future__ import annotations

import argparse

from kit.catalog import load_catalog
from kit.cli import DefaultsHelpFormatter, number_arg
from kit.track.compare import DEFAULT_CONFIDENCE, DEFAULT_FDR, DEFAULT_TOLERANCE
from kit.track.db import DEFAULT_DB
from kit.track.noise import BUSY_SHIFT, INCONCLUSIVE_EXIT, NOISY_RATIO, SHIFT_RATIO


def _db_arg(p) -> None:
    p.add_argument("--db", default=DEFAULT_DB, help="the history database file (DuckDB)")


def _fraction(text: str, *, zero_ok: bool = False) -> float:
    try:
        v = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 0.03 or 3%)") from None
    if not ((0.0 <= v if zero_ok else 0.0 < v) and v < 1.0):  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text!r} must be in {'[0' if zero_ok else '(0'}, 1) (e.g. 0.05 or 5%)")
    return v


def _tolerance(text: str) -> float:
    return _fraction(text, zero_ok=True)


def add_cli(sub) -> None:
    """``kit history``: add runs per commit, list them, compare two commits, render the HTML report."""
    p = sub.add_parser(
        "history",
        description="Performance per commit: a DuckDB history of runs, a noise-aware compare that gates CI "
        f"(exit 1 on a regression, {INCONCLUSIVE_EXIT} when inconclusive) and a static HTML report.",
        formatter_class=DefaultsHelpFormatter,
    )
    hs = p.add_subparsers(dest="history_cmd", required=True, metavar="{add,list,compare,report}")

    a = hs.add_parser("add", help="add a run directory's rows under a commit", formatter_class=DefaultsHelpFormatter)
    a.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (kit sweep / serve-bench / plan --out)")
    a.add_argument("--commit", help="commit of the stack under test (default: read from --git)")
    a.add_argument("--branch", help="its branch (default: read from --git when it is read there)")
    a.add_argument("--dirty", action="store_true", default=None, help="the checkout had uncommitted changes")
    a.add_argument("--tag", help="a tag naming the commit (e.g. v1.2); compare accepts it")
    a.add_argument("--git", default=".", help="git checkout to read commit, branch, dirty flag and tag from")
    a.add_argument(
        "--usd-per-gpu-hr",
        type=number_arg(float, above=0, unit="$/GPU-hour"),
        help="price of the $ columns, $/GPU-hour (basis 'user')",
    )
    a.add_argument(
        "--basis", default="tco", choices=load_catalog().bases, help="catalog price basis when the rows carry no price"
    )
    _db_arg(a)
    a.set_defaults(func=_cli_add)

    ls = hs.add_parser("list", help="list the runs in the history", formatter_class=DefaultsHelpFormatter)
    _db_arg(ls)
    ls.add_argument("--json", action="store_true", help="print JSON records")
    ls.set_defaults(func=_cli_list)

    c = hs.add_parser(
        "compare",
        help=f"compare HEAD with BASE point by point; exit 1 on a regression, {INCONCLUSIVE_EXIT} when inconclusive",
        description="Compare HEAD with BASE point by point (intervals over independent runs, a tolerance band, "
        "false-discovery control). Exit codes: 0 no regression beyond the noise; 1 a point regressed or failed on "
        f"HEAD; {INCONCLUSIVE_EXIT} inconclusive: BASE and HEAD ran under different machine noise (different "
        f"torch thread counts, {BUSY_SHIFT:g}+ more cores busy with other work when one side started, a median "
        f"decode step / fastest step more than {SHIFT_RATIO:g}x apart, or above {NOISY_RATIO:g}x on either side: a "
        "busy machine), so a change cannot be told from the load; re-run both on a quiet runner, or pin --threads, "
        "with more runs (--runs 5); 2 a user error.",
        formatter_class=DefaultsHelpFormatter,
    )
    c.add_argument("base", metavar="BASE", help="commit (or prefix), tag or run id")
    c.add_argument("head", metavar="HEAD", help="commit (or prefix), tag or run id")
    c.add_argument("--tolerance", type=_tolerance, default=DEFAULT_TOLERANCE, help="band of no regression (±)")
    c.add_argument("--confidence", type=_fraction, default=DEFAULT_CONFIDENCE, help="level of each interval")
    c.add_argument("--fdr", type=_fraction, default=DEFAULT_FDR, help="false-discovery rate over all points")
    c.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    c.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary (e.g. $GITHUB_STEP_SUMMARY)")
    _db_arg(c)
    c.set_defaults(func=_cli_compare)

    r = hs.add_parser("report", help="write the static HTML report", formatter_class=DefaultsHelpFormatter)
    r.add_argument("--out", required=True, help="output directory (index.html + PNGs)")
    r.add_argument("--base", help="BASE of the report's compare table (default: the commit before the latest)")
    r.add_argument("--head", help="HEAD of the report's compare table (default: the latest commit)")
    _db_arg(r)
    r.set_defaults(func=_cli_report)


def _cli_add(args) -> int:
    from kit.track.db import Provenance, add_run, git_provenance

    if args.commit:
        prov = Provenance(args.commit, args.branch, args.dirty, args.tag)
    else:
        g = git_provenance(args.git)
        prov = Provenance(g.commit, args.branch or g.branch, g.dirty if args.dirty is None else True, args.tag or g.tag)
    res = add_run(args.db, args.run_dir, prov, usd_per_gpu_hr=args.usd_per_gpu_hr, basis=args.basis)
    print(
        f"added {res['rows_added']} rows ({res['rows_known']} already stored, {res['samples_added']} raw samples) "
        f"of run(s) {', '.join(res['runs'])} under commit {prov.commit} to {args.db}"
    )
    return 0


def _cli_list(args) -> int:
    from kit.track.db import list_runs

    runs = list_runs(args.db)
    if args.json:
        print(runs.to_json(orient="records"))
        return 0
    cols = [
        "run_key",
        "commit",
        "branch",
        "dirty",
        "tag",
        "created_utc",
        "device_name",
        "backends",
        "rows",
        "ok_rows",
        "replicates",
    ]
    show = runs[cols].assign(commit=runs["commit"].astype(str).str.slice(0, 12))
    print(show.to_string(index=False) if len(show) else f"(no runs in {args.db})")
    return 0


def _cli_compare(args) -> int:
    from kit.track.compare import compare

    cmp = compare(args.db, args.base, args.head, args.tolerance, args.confidence, args.fdr)
    if args.markdown:
        cmp.write_markdown(args.markdown)
    if args.json:
        print(cmp.to_json())
        return cmp.exit_code
    print(cmp.to_markdown())
    if cmp.exit_code == 1:
        print(f"kit history compare: exit 1: regression at {', '.join(cmp.regressed_points)}")
    elif cmp.exit_code == INCONCLUSIVE_EXIT:
        print(f"kit history compare: exit {INCONCLUSIVE_EXIT}: inconclusive: {cmp.inconclusive}")
    return cmp.exit_code


def _cli_report(args) -> int:
    from kit.track.report import write_report

    path = write_report(args.db, args.out, base=args.base, head=args.head)
    print(f"report: {path}")
    return 0
