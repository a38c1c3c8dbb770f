"""Does ``kit history compare`` gate real runs on this machine: no regression for an unchanged commit, whatever the
machine's load does between BASE and HEAD, and a real 10 % slowdown still caught on a quiet machine?

Every side is a real ``kit sweep --runs N`` of the tiny preset (a subprocess, as CI runs it) added to one history
under its own commit with ``kit history add``; each pair is then ``kit history compare BASE HEAD`` (its exit code,
its TPOT verdicts and changes, and the machine noise of each side: median step / fastest step, torch threads, cores
busy at the start; :mod:`kit.track.noise`). Cases:

1. ``identical``: ``--pairs`` pairs of the same code, BASE then HEAD, on the machine as it is (threads chosen by the
   sweep from the free cores). Must never read "regression" (exit 1): pass (0) or inconclusive (3).
2. ``load shift``: the reported case: a CPU-bound job (a Python busy loop, started and stopped here) shares the
   machine during HEAD only. Must never read "regression".
3. ``slowdown 10%``: HEAD computes 10 % longer in every forward call (``KIT_INJECT_DECODE_SLOWDOWN=0.10``), both
   sides with ``--threads 1`` (what the gate advises on a shared runner), each side started once a 1-s sample shows
   the machine quiet (< 0.5 cores busy; waits up to ``--quiet-wait`` s). A pair counts as run on a quiet machine when
   the other work during each side (the machine's busy CPU time less the sweep's own, over its wall time) stayed
   under :data:`QUIET_CORES`; pairs are tried until ``--slow-pairs`` quiet ones are in (at most 3x as many). Must be
   flagged (exit 1) when run quiet: a neighbour on the other core slows every step alike (shared caches and memory),
   which no per-row figure shows when ``--threads`` is pinned, and then hides or fakes ~5 %.

Every pair prints the other work on the machine during BASE and HEAD (cores), as measured here.

Run: ``.venv/bin/python benchmarks/history_gate.py [--pairs 5] [--runs 3] [--out results/history-gate]``
(about 6 minutes on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import psutil

KIT = [sys.executable, "-m", "kit"]
#: other work (cores) under which a side counts as run on a quiet machine (case 3)
QUIET_CORES = 0.25
GRID = ["--model", "tiny-llama", "--kv", "64,256", "--concurrency", "1,4", "--decode-steps", "16", "--repeats", "3"]


def busy_now(seconds: float = 1.0) -> float:
    """Cores' worth of work on this machine over ``seconds`` (ours included: call it while idle)."""
    return sum(psutil.cpu_percent(interval=seconds, percpu=True)) / 100.0


def wait_quiet(limit_s: float) -> tuple[bool, float]:
    """Wait until a 1-s sample shows < 0.5 cores busy, up to ``limit_s``: (quiet, last sample)."""
    t0 = time.monotonic()
    while True:
        b = busy_now()
        if b < 0.5 or time.monotonic() - t0 > limit_s:
            return b < 0.5, b


def sweep(out: Path, runs: int, env_extra: dict | None = None, extra: list | None = None) -> float:
    """Run one side; returns the other work on the machine meanwhile, in cores (busy CPU time of the whole machine
    less this process's waited-for children's, over the wall time)."""
    env = {**os.environ, **(env_extra or {})}
    cmd = [*KIT, "sweep", *GRID, "--runs", str(runs), "--out", str(out), "--no-resume", *(extra or [])]
    c0, r0, t0 = psutil.cpu_times(), resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    c1, r1, wall = psutil.cpu_times(), resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic() - t0
    busy = sum(getattr(c1, f) - getattr(c0, f) for f in c1._fields if f not in ("idle", "iowait"))
    ours = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return max(0.0, (busy - ours) / wall)


def add(db: Path, out: Path, commit: str) -> None:
    cmd = [*KIT, "history", "add", str(out), "--commit", commit, "--db", str(db)]
    subprocess.run(cmd, check=True, capture_output=True)


def compare(db: Path, base: str, head: str) -> dict:
    r = subprocess.run([*KIT, "history", "compare", base, head, "--db", str(db), "--json"], capture_output=True)
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == r.returncode, (doc["exit_code"], r.returncode)
    return doc


def side_text(n: dict) -> str:
    ratio = f"{n['step_ratio']:.2f}x" if n.get("step_ratio") else "?"
    busy = f", {n['busy_cores']:.1f} busy" if n.get("busy_cores") is not None else ""
    return f"steps {ratio} the fastest, {'/'.join(map(str, n['threads'])) or '?'} thr{busy}"


def report(case: str, i: int, doc: dict, others: tuple) -> dict:
    tpot = [r for r in doc["rows"] if r["metric"] == "tpot_ms"]
    verdicts = {}
    for r in tpot:
        verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + 1
    changes = [r["change"] for r in tpot if r.get("change") is not None]
    span = f"{min(changes):+.1%}..{max(changes):+.1%}" if changes else "-"
    print(
        f"{case:14s} pair {i}: exit {doc['exit_code']}  TPOT change {span:>16s}  verdicts {verdicts}\n"
        f"{'':22s}BASE {side_text(doc['noise']['base'])} | HEAD {side_text(doc['noise']['head'])}\n"
        f"{'':22s}other work on the machine: BASE {others[0]:.2f}, HEAD {others[1]:.2f} cores"
        + (f"\n{'':22s}inconclusive: {doc['inconclusive']}" if doc.get("inconclusive") else ""),
        flush=True,
    )
    return {"case": case, "exit": doc["exit_code"], "regression": verdicts.get("regression", 0)}


def run_pair(root: Path, db: Path, case: str, i: int, runs: int, args) -> dict:
    b, h = f"{case.split()[0]}-{i}-base", f"{case.split()[0]}-{i}-head"
    env_head, extra = None, None
    if case == "slowdown 10%":
        env_head, extra = {"KIT_INJECT_DECODE_SLOWDOWN": "0.10"}, ["--threads", "1"]
        wait_quiet(args.quiet_wait)
    other_b = sweep(root / b, runs, extra=extra)
    if case == "slowdown 10%":
        wait_quiet(args.quiet_wait)
    hog = None
    if case == "load shift":  # a second job for HEAD only: what a CI neighbour does
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
    try:
        other_h = sweep(root / h, runs, env_extra=env_head, extra=extra)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    add(db, root / b, b)
    add(db, root / h, h)
    res = report(case, i, compare(db, b, h), (other_b, other_h))
    res["quiet"] = max(other_b, other_h) < QUIET_CORES
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5, help="identical-commit pairs (case 1)")
    ap.add_argument("--shift-pairs", type=int, default=2, help="pairs with a load shift during HEAD (case 2)")
    ap.add_argument("--slow-pairs", type=int, default=2, help="pairs with HEAD 10 %% slower (case 3)")
    ap.add_argument("--runs", type=int, default=3, help="kit sweep --runs per side")
    ap.add_argument("--quiet-wait", type=float, default=120.0, help="seconds to wait for a quiet machine (case 3)")
    ap.add_argument("--out", default="results/history-gate", help="run directories and history.duckdb")
    args = ap.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    db = root / "history.duckdb"
    db.unlink(missing_ok=True)
    t0 = time.perf_counter()
    print(f"{os.cpu_count()} cores; each side: kit sweep {' '.join(GRID)} --runs {args.runs}", flush=True)
    cases = [("identical", args.pairs), ("load shift", args.shift_pairs), ("slowdown 10%", args.slow_pairs)]
    out = [run_pair(root, db, c, i, args.runs, args) for c, n in cases[:2] for i in range(1, n + 1)]
    for i in range(1, 3 * args.slow_pairs + 1):  # until enough pairs ran on a quiet machine
        out.append(run_pair(root, db, "slowdown 10%", i, args.runs, args))
        if sum(r["quiet"] for r in out if r["case"] == "slowdown 10%") >= args.slow_pairs:
            break
    print()
    for case, _ in cases:
        rs = [r for r in out if r["case"] == case]
        codes = [r["exit"] for r in rs]
        line = f"{case:14s}: {len(rs)} pairs, exit codes {codes}, pairs with a TPOT regression verdict: "
        line += f"{sum(r['regression'] > 0 for r in rs)}"
        if case == "slowdown 10%":
            quiet = [r for r in rs if r["quiet"]]
            line += f"; flagged (exit 1) {sum(r['exit'] == 1 for r in quiet)} of {len(quiet)} run on a quiet machine"
            line += f" (< {QUIET_CORES} cores of other work during each side)"
        print(line)
    print(f"wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
