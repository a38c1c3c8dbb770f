"""Load-generator benchmark: how many streamed chunks/s kit.serve's client sustains on one core, and what
time-stamping and parsing cost per chunk. Not a test: it prints figures.

The scripted SSE server (tests/sse_server.py ``--raw-fast``: a minimal asyncio HTTP server streaming one-token
chunks back to back, one chunked-encoding frame per write) runs as a separate process pinned to another core;
the client is pinned to one core. At these rates several events arrive per network read, as they do from a fast
server under load. For each concurrency, ``--repeats`` runs; the table shows medians with n:

- ``chunks/s``: token-bearing chunks received / wall time of the run (what the client sustained);
- ``client CPU``: client process CPU time / wall time (1.0 = the client's core was saturated, so chunks/s is
  the client's limit; lower means the server was the bottleneck);
- ``chunks/CPU-s``: chunks / client CPU seconds: the client's capacity on one core, whoever was the bottleneck;
- ``loop lag p99``: the event-loop lag probe of the run (the client self-check, kit.serve.selfcheck).

Then micro-benchmarks per chunk: ``time.perf_counter()`` (the time stamp itself) and the client's full
per-chunk work (SSE framing + JSON parse + classify + record).

Usage: ``python benchmarks/loadgen_bench.py [--concurrency 1,16,64] [--chunks 512] [--requests-per-conc 4]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.serve.client import StreamCapture  # noqa: E402
from kit.serve.load import LoadConfig, run_coro, run_load_async  # noqa: E402
from kit.serve.sse import SSEParser  # noqa: E402
from kit.serve.workload import RequestInput  # noqa: E402


def start_server(core: int | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, str(ROOT / "tests" / "sse_server.py"), "--port", "0", "--raw-fast"]
    pre = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=pre)
    line = p.stdout.readline()
    if not line.startswith("READY"):
        p.kill()
        raise RuntimeError(f"scripted server did not start: {line!r}")
    return p, f"http://127.0.0.1:{int(line.split()[1])}"


def one_run(url: str, conc: int, n_req: int, chunks: int) -> dict:
    cfg = LoadConfig(
        url=url,
        model="fast",
        num_requests=n_req,
        max_concurrency=conc,
        warmup_requests=0,
        isl=1,
        osl=chunks,
        timeout_s=120,
        stall_timeout_s=30,
    )
    wl = [RequestInput("x", 1, chunks)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    recs, info = run_coro(run_load_async(cfg, wl, tokenizer=None))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n_chunks = sum(r.get("n_chunks") or 0 for r in recs)
    failed = sum(not r.get("ok") for r in recs)
    return {
        "chunks_s": n_chunks / wall,
        "cpu_frac": cpu / wall,
        "chunks_per_cpu_s": n_chunks / cpu if cpu else float("nan"),
        "lag_p99": info["x_loop_lag_ms_p99"],
        "failed": failed,
        "chunks": n_chunks,
    }


def micro(n: int = 200_000) -> dict:
    pc = time.perf_counter
    t = pc()
    for _ in range(n):
        pc()
    stamp_ns = (pc() - t) / n * 1e9
    ev = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": "fast",
        "choices": [{"index": 0, "text": "t", "finish_reason": None}],
    }
    raw = f"data: {json.dumps(ev, separators=(',', ':'))}\n\n".encode()
    m = n // 4
    cap, parser = StreamCapture(), SSEParser()
    t = time.process_time()  # CPU time: other processes on a shared machine do not inflate it
    for _ in range(m):
        cap.add_events(parser.feed(raw), pc())
    chunk_us = (time.process_time() - t) / m * 1e6
    return {"stamp_ns": stamp_ns, "chunk_us": chunk_us}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--chunks", type=int, default=512, help="chunks per request")
    ap.add_argument("--requests-per-conc", type=int, default=4, help="requests per run = this x concurrency")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    client_core, server_core = (cores[0], cores[1]) if len(cores) > 1 else (cores[0], None)
    os.sched_setaffinity(0, {client_core})
    proc, url = start_server(server_core)
    print(
        f"client on core {client_core}, scripted server on core {server_core}; {a.chunks} chunks/request, "
        f"{a.requests_per_conc} x concurrency requests/run, {a.repeats} runs each (medians)"
    )
    try:
        one_run(url, 4, 4, 64)  # warm-up
        print(f"{'conc':>5} {'chunks/s':>10} {'client CPU':>10} {'chunks/CPU-s':>12} {'lag p99 ms':>10} {'n':>3}")
        best = 0.0
        for c in [int(x) for x in a.concurrency.split(",")]:
            runs = [one_run(url, c, a.requests_per_conc * c, a.chunks) for _ in range(a.repeats)]
            if any(r["failed"] for r in runs):
                print(f"  c={c}: {sum(r['failed'] for r in runs)} failed requests")
            med = {
                k: statistics.median(r[k] for r in runs)
                for k in ("chunks_s", "cpu_frac", "chunks_per_cpu_s", "lag_p99")
            }
            best = max(best, med["chunks_s"])
            print(
                f"{c:>5} {med['chunks_s']:>10.0f} {med['cpu_frac']:>10.2f} {med['chunks_per_cpu_s']:>12.0f} "
                f"{med['lag_p99']:>10.2f} {len(runs):>3}"
            )
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)
    ms = [micro() for _ in range(5)]
    stamp = statistics.median(m["stamp_ns"] for m in ms)
    chunk = statistics.median(m["chunk_us"] for m in ms)
    print(f"highest sustained: {best:.0f} chunks/s on one client core")
    print(f"time stamp (time.perf_counter) per chunk: {stamp:.0f} ns (median of 5 x 200k calls)")
    print(
        f"client work per chunk (SSE framing + JSON + classify + record, no network): {chunk:.2f} us CPU "
        f"(median of 5 x 50k) -> at most {1e6 / chunk:.0f} chunks/s of parsing on one core"
    )
    print(
        "client CPU < ~0.9 means the scripted server, not the client, limited chunks/s; the client's capacity "
        "is then chunks/CPU-s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
