"""Run-directory torture: three concurrent writers on one --out, then kill -9 at random moments of a sweep.

Checks after each fault that the directory is consistent: the log parses (a torn tail is set aside), no point is
recorded twice, ``results.parquet`` holds exactly the log's rows once the directory is reopened, and a re-run
finishes every point. Prints one line per trial and a summary; exit 1 if any check failed.

    .venv/bin/python benchmarks/store_torture.py [--kills 20] [--points 40] [--seed 0]

The sweep here is the real grid runner with a backend that takes 20-80 ms per point (no model), so a kill lands at
any moment of the append / Parquet rewrite cycle, which is what is under test.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITER = r"""
import contextlib, random, sys, time
from kit.grid import GridPoint, run_grid
from kit.store import run_metadata

class Slow:
    kind, description = "planner", "torture"
    def __init__(self, n): self.n = n
    def points(self):
        return [GridPoint(f"p{i:03d}", {"concurrency": i + 1, "model": "torture"}, f"p{i}", i) for i in range(self.n)]
    def metadata(self): return run_metadata(model="torture")
    def session(self): return contextlib.nullcontext()
    def measure(self, p):
        time.sleep(random.uniform(0.02, 0.08))
        return {"status": "ok", "tpot_ms_p50": float(p.config)}
    def after_failure(self): return {}

run_grid(Slow(int(sys.argv[2])), sys.argv[1], progress=False)
print("DONE", flush=True)
"""


def check(out: Path, n: int) -> list[str]:
    """Problems of a run directory after a fault (empty list = consistent)."""
    from kit.store import ResultStore, load_results, read_log

    problems = []
    store = ResultStore(out)  # reopening sets a torn tail aside
    recs = read_log(out / "points.jsonl")
    ids = [r["point_id"] for r in recs if r.get("status") == "ok"]
    if len(ids) != len(set(ids)):
        problems.append(f"duplicate ok points: {len(ids) - len(set(ids))}")
    store.flush()
    df = load_results(out / "results.parquet")
    if len(df) != len(recs):
        problems.append(f"parquet has {len(df)} rows, log {len(recs)}")
    if (out / "points.jsonl").read_bytes()[-1:] not in (b"", b"\n"):
        problems.append("log does not end with a newline after reopening")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--points", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        # 1. three concurrent writers on one directory: one writes, the others are refused with the holder named
        out = Path(tmp) / "concurrent"
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(out), str(args.points)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(3)]  # fmt: skip
        res = [p.communicate(timeout=600) for p in procs]
        done = sum("DONE" in o for o, _ in res)
        refused = sum("being written by another kit run" in e for _, e in res)
        problems = check(out, args.points)
        ok = done == 1 and refused == 2 and not problems
        failed += not ok
        print(
            f"concurrent writers: {done} finished, {refused} refused naming the holder; problems: {problems or 'none'}"
        )
        # 2. kill -9 at random moments; after each, the directory is consistent; a final run finishes every point
        out = Path(tmp) / "killed"
        for k in range(args.kills):
            p = subprocess.Popen([sys.executable, "-c", WRITER, str(out), str(args.points)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)  # fmt: skip
            time.sleep(rng.uniform(0.5, 2.5))  # imports take ~1 s: some kills land before the first point
            p.send_signal(signal.SIGKILL)
            p.wait()
            problems = check(out, args.points)
            failed += bool(problems)
            print(f"kill {k + 1:2d}: problems: {problems or 'none'}")
        final = subprocess.run([sys.executable, "-c", WRITER, str(out), str(args.points)], capture_output=True,
                               text=True, timeout=600)  # fmt: skip
        from kit.store import load_results

        df = load_results(out)
        latest = df.drop_duplicates("point_id", keep="last")
        complete = "DONE" in final.stdout and latest["point_id"].nunique() == args.points
        failed += not complete
        counts = latest["status"].value_counts().to_dict()
        print(f"after {args.kills} kills a re-run finished: {complete}; statuses {counts}")
    print(f"{'FAILED' if failed else 'ok'}: {failed} problem trials")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
