"""Load-generator benchmark: how many streamed chunks the kit.serve client handles per client-CPU-second, and how
late its time stamps are, against a local server. Not a test: it prints figures.

The scripted SSE server (tests/sse_server.py ``--raw-fast``: a minimal asyncio HTTP server, one chunked-encoding
frame per SSE event) runs as a separate process pinned to one core; every client run is its own process pinned to
another core. Two regimes, each at several stream counts (``--concurrency``, default 1,16,64):

- ``flood``: the server writes one-token chunks back to back, ``--frames-per-write`` frames (default 16) per
  socket write, so several events arrive per network read, as from a fast server under load, and the client,
  not the server, is the bottleneck (``srv CPU`` stays well below 1). The client's capacity is
  ``chunks/CPU-s``. With one frame per write (``--frames-per-write 1``) this server's own per-send cost caps it
  at 200–300k frames/s on one core (a 2-core KVM guest): a client that keeps up then reads one or two frames
  per wake-up and its chunks/CPU-s measures the server's rate and the cost of waking, not the client (the
  ``srv CPU`` column shows such a cell: near 0.9).
- ``paced``: every stream gets one chunk every ``--gap-ms`` (default 5 ms: 64 streams = 12.8k chunks/s), each
  frame its own write; what matters is how late the client's event loop wakes (``lag p50/p99``, the self-check
  probe of kit.serve.selfcheck): a late loop time-stamps chunks late.

A run has ``--requests-per-conc`` x streams requests, and flood runs at least ``--flood-min-chunks`` chunks
(default 200k), so a run's fixed costs (event loop, connections, records) do not dominate a 10 ms run. Runs are
interleaved (each repeat goes through every regime and stream count once, in a rotated order), so a machine
that gets busier mid-benchmark spreads over every cell instead of biasing one. With ``--compare DIR`` (a
directory holding another ``kit`` package, e.g. ``git archive HEAD kit | tar -x -C DIR``) each cell is also run
with that tree, alternating which goes first, and the table shows both side by side with the ratio.

With ``--vllm-python PATH`` (the interpreter of an environment with vLLM) every cell is also run with vLLM's own
client, ``vllm bench serve`` (``--backend openai``, ``/v1/completions``, ``--ignore-eos``; it draws its prompts
with a tokenizer: ``--tokenizer DIR``, a local checkpoint directory; the scripted server ignores the prompt), as its
own process on the same core, interleaved with the kit's runs, and the table adds the ratio of the two clients' CPU
per chunk. Both clients time themselves the same way (:func:`vs_vllm_bench.vllm_client_worker`): process CPU time
from just before the first request to the end of the last one, over the chunks the server streamed to the
successful requests (requests x chunks per request); imports and start-up are not in it. With ``--floor`` every
cell also runs a minimal client (:func:`floor_worker`: it stamps each read and parses nothing), the operating
system's share of a chunk's cost on this machine; the ratio above it compares the two clients' own work.

Columns (medians over ``--repeats`` runs, n = runs): ``chunks/s`` (token-bearing chunks / wall time), ``CPU``
(client CPU time / wall time; 1.0 = its core was saturated), ``srv CPU`` (the server process's CPU / wall time,
from /proc; NaN elsewhere, for runs under 0.2 s, which /proc's 10 ms ticks cannot resolve, and for vLLM's client),
``chunks/CPU-s`` (chunks / client CPU seconds, the kit's records and vLLM's statistics included), ``µs/chunk``
(client CPU µs per streamed chunk while streaming: first request sent to last request ended), ``µs/chunk all``
(the same to the end of the client's own statistics: the kit's records, vLLM's ``calculate_metrics``), ``lag
p50`` / ``lag p99`` (ms, the kit's event-loop lag during the run; vLLM's client has no such probe), ``RSS MB`` (the
client process's peak resident memory), ``fail`` (failed requests, summed).

Usage: ``python benchmarks/loadgen_bench.py [--concurrency 1,16,64] [--regimes flood,paced] [--repeats 3]
[--compare /tmp/kit_before] [--vllm-python /path/to/vllm-env/bin/python --tokenizer /path/to/checkpoint]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_server(core: int | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, str(ROOT / "tests" / "sse_server.py"), "--port", "0", "--raw-fast"]
    pre = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=pre)
    line = p.stdout.readline()
    if not line.startswith("READY"):
        p.kill()
        raise RuntimeError(f"scripted server did not start: {line!r}")
    return p, f"http://127.0.0.1:{int(line.split()[1])}"


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, from /proc (NaN where there is none)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def worker(spec: dict) -> dict:
    """One client run in this process (the kit imported from ``spec["root"]``): the figures as a dict."""
    sys.path.insert(0, spec["root"])
    from kit.serve.load import LoadConfig
    from kit.serve.workload import RequestInput

    marks: dict = {}

    def on_progress(done: int, ok: bool) -> None:  # the latest is the end of the last request
        marks["cpu_stream"] = time.process_time()

    try:  # the one request loop
        from kit.serve.loop import run_coro, run_schedule
        from kit.serve.schedule import Arrivals

        def run(cfg, wl):
            return run_coro(run_schedule(cfg, Arrivals.from_config(cfg, wl), on_progress=on_progress))

    except ImportError:  # a tree from before it (a --compare baseline)
        from kit.serve.load import run_coro, run_load_async

        def run(cfg, wl):
            return run_coro(run_load_async(cfg, wl, tokenizer=None))

    extra = {"gap_ms": spec["gap_ms"]} if spec["gap_ms"] else {"frames_per_write": spec["frames_per_write"]}
    cfg = LoadConfig(
        url=spec["url"],
        model="fast",
        num_requests=spec["requests"],
        max_concurrency=spec["conc"],
        warmup_requests=0,
        isl=1,
        osl=spec["chunks"],
        timeout_s=120,
        stall_timeout_s=30,
        extra_body=extra,
    )
    wl = [RequestInput("x", 1, spec["chunks"])]
    run(cfg.__class__(**{**cfg.__dict__, "num_requests": 2}), wl)  # warm-up (imports, pool)
    srv0, cpu0, t0 = process_cpu_s(spec["server_pid"]), time.process_time(), time.perf_counter()
    marks.clear()
    recs, info = run(cfg, wl)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    # /proc counts CPU in clock ticks (10 ms): a run shorter than 0.2 s has no meaningful server CPU
    srv = (process_cpu_s(spec["server_pid"]) - srv0) / wall if wall >= 0.2 else float("nan")
    n_chunks = sum(r.get("n_chunks") or 0 for r in recs)
    ok = sum(1 for r in recs if r.get("ok"))
    sent = ok * spec["chunks"]  # what the server streamed to the successful requests: both clients' denominator
    return {
        "chunks_s": n_chunks / wall,
        "cpu_frac": cpu / wall,
        "srv_frac": srv,
        "chunks_per_cpu_s": n_chunks / cpu if cpu else float("nan"),
        "us_chunk": 1e6 * (marks.get("cpu_stream", float("nan")) - cpu0) / sent if sent else float("nan"),
        "us_chunk_all": 1e6 * cpu / sent if sent else float("nan"),
        "lag_p50": info["x_loop_lag_ms_p50"],
        "lag_p99": info["x_loop_lag_ms_p99"],
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "failed": sum(not r.get("ok") for r in recs),
    }


def vllm_run(spec: dict, vllm_python: str, tokenizer: str, core: int) -> dict:
    """One run of vLLM's client (``vllm bench serve``, its own process pinned to ``core``) on the cell of ``spec``;
    the figures of :func:`worker` it has (the same CPU brackets: :func:`vs_vllm_bench.vllm_client_worker`)."""
    from vs_vllm_bench import run_worker, vllm_bench_args, vllm_command

    extra = {"gap_ms": spec["gap_ms"]} if spec["gap_ms"] else {"frames_per_write": spec["frames_per_write"]}
    cell = (spec["chunks"], spec["requests"], spec["conc"])
    args = vllm_bench_args(spec["url"], "completions", "fast", tokenizer, 1, *cell, seed=0, extra_body=extra)
    r = run_worker(vllm_command(vllm_python, args), core)
    wall = r["wall_stream_s"]
    sent = r["completed"] * spec["chunks"]
    nan = float("nan")
    return {
        "chunks_s": sent / wall,
        "cpu_frac": r["cpu_stream_s"] / wall,
        "srv_frac": nan,  # /proc's figure would span the client's start-up too
        "chunks_per_cpu_s": sent / r["cpu_all_s"] if r["cpu_all_s"] else nan,
        "us_chunk": 1e6 * r["cpu_stream_s"] / sent if sent else nan,
        "us_chunk_all": 1e6 * r["cpu_all_s"] / sent if sent else nan,
        "lag_p50": nan,
        "lag_p99": nan,
        "rss_mb": r["maxrss_mb"],
        "failed": r["failed"] + (spec["requests"] - r["requests"]),
    }


def floor_worker(spec: dict) -> dict:
    """The least any streaming client does per chunk, as a reference: one uvloop protocol per stream that stamps
    every network read (``time.perf_counter`` into a list) and watches for the end of the chunked body, nothing
    parsed or recorded; the same requests and CPU bracket as :func:`worker`. Its CPU per chunk is mostly the
    operating system's (waking the process, the read); what a client spends above it is its own work."""
    import asyncio
    from urllib.parse import urlsplit

    import uvloop

    u = urlsplit(spec["url"])
    extra = {"gap_ms": spec["gap_ms"]} if spec["gap_ms"] else {"frames_per_write": spec["frames_per_write"]}
    body = json.dumps({"model": "fast", "max_tokens": spec["chunks"], "stream": True, **extra}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
    request = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    stamps: list[float] = []
    left = [spec["requests"]]

    class Stream(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            stamps.append(time.perf_counter())
            if data.endswith(b"0\r\n\r\n"):  # the chunked body's last frame
                self.done.set_result(None)

    async def stream():
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(Stream, u.hostname, u.port)
        while left[0] > 0:
            left[0] -= 1
            proto.done = loop.create_future()
            proto.transport.write(request)
            await proto.done
        proto.transport.close()

    async def run():
        await asyncio.gather(*(stream() for _ in range(spec["conc"])))

    cpu0, t0 = time.process_time(), time.perf_counter()
    uvloop.run(run())
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    sent, nan = spec["requests"] * spec["chunks"], float("nan")
    return {
        "chunks_s": sent / wall,
        "cpu_frac": cpu / wall,
        "srv_frac": nan,
        "chunks_per_cpu_s": sent / cpu,
        "us_chunk": 1e6 * cpu / sent,
        "us_chunk_all": 1e6 * cpu / sent,
        "lag_p50": nan,
        "lag_p99": nan,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "failed": 0,
    }


def run_in_process(spec: dict, core: int, mode: str = "--worker") -> dict:
    cmd = [sys.executable, __file__, mode, json.dumps(spec)]
    out = subprocess.run(
        cmd, capture_output=True, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {core}), timeout=600
    )
    if out.returncode != 0:
        raise RuntimeError(f"client run failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:  # a client run: imports the kit of the tree it was given, so before any other
        print(json.dumps(worker(json.loads(argv[1]))))
        return 0
    if argv[:1] == ["--floor-worker"]:
        print(json.dumps(floor_worker(json.loads(argv[1]))))
        return 0
    sys.path.insert(0, str(ROOT))
    from kit.cli import int_list_arg, number_arg

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    count = number_arg(int, minimum=1)
    ap.add_argument("--concurrency", type=int_list_arg(1, "1,16,64"), default="1,16,64", help="stream counts")
    ap.add_argument("--chunks", type=count, default=512, help="chunks per request, flood regime")
    ap.add_argument("--paced-chunks", type=count, default=200, help="chunks per request, paced regime")
    ap.add_argument(
        "--gap-ms", type=number_arg(float, above=0, unit="ms"), default=5.0, help="gap between chunks, paced regime"
    )
    ap.add_argument("--requests-per-conc", type=count, default=4, help="requests per run = this x concurrency")
    ap.add_argument(
        "--flood-min-chunks", type=number_arg(int, minimum=0), default=200_000, help="chunks per flood run, at least"
    )
    ap.add_argument("--frames-per-write", type=count, default=16, help="frames per server socket write, flood regime")
    ap.add_argument("--repeats", type=count, default=3)
    ap.add_argument("--compare", default=None, help="a directory holding another kit package (e.g. before)")
    ap.add_argument("--regimes", default="flood,paced", help="comma-separated: flood, paced")
    ap.add_argument(
        "--vllm-python", default=None, help="also run vLLM's client (vllm bench serve) in every cell, with this Python"
    )
    ap.add_argument("--tokenizer", default=None, help="a local checkpoint directory: vllm bench serve's tokenizer")
    ap.add_argument(
        "--floor", action="store_true", help="also run a minimal client (stamps reads, parses nothing) as a reference"
    )
    a = ap.parse_args(argv)
    regimes = [r.strip() for r in a.regimes.split(",") if r.strip()]
    if not regimes or set(regimes) - {"flood", "paced"}:
        raise SystemExit(f"--regimes {a.regimes!r}: choose from flood, paced")
    if a.vllm_python and not a.tokenizer:
        raise SystemExit("--vllm-python needs --tokenizer DIR (vllm bench serve draws its prompts with a tokenizer)")
    cores = sorted(os.sched_getaffinity(0))
    client_core, server_core = (cores[0], cores[1]) if len(cores) > 1 else (cores[0], None)
    trees = {"now": str(ROOT)}
    if a.compare:
        if not (Path(a.compare) / "kit" / "serve" / "client.py").is_file():
            raise SystemExit(f"--compare {a.compare!r}: no kit/serve/client.py there")
        trees = {"before": str(Path(a.compare).resolve()), "now": str(ROOT)}
    concs = a.concurrency
    cells = [(reg, c) for reg in regimes for c in concs]
    clients = list(trees) + (["vllm"] if a.vllm_python else []) + (["floor"] if a.floor else [])
    proc, url = start_server(server_core)
    print(
        f"client runs on core {client_core}, scripted server on core {server_core}; flood {a.chunks} chunks/request, "
        f"{a.frames_per_write} frames per write, at least {a.flood_min_chunks} chunks per run; paced "
        f"{a.paced_chunks} chunks/request every {a.gap_ms:g} ms; {a.requests_per_conc} x streams requests per "
        f"run; {a.repeats} interleaved repeats; trees: {', '.join(f'{k}={v}' for k, v in trees.items())}",
        flush=True,
    )
    res: dict = {}
    try:
        for rep in range(a.repeats):
            order = cells[rep % len(cells) :] + cells[: rep % len(cells)]
            for reg, c in order:
                names = clients if rep % 2 == 0 else clients[::-1]
                for name in names:
                    spec = {
                        "root": trees.get(name, ""),
                        "url": url,
                        "conc": c,
                        "requests": a.requests_per_conc * c
                        if reg == "paced"
                        else max(a.requests_per_conc * c, math.ceil(a.flood_min_chunks / a.chunks)),
                        "frames_per_write": a.frames_per_write,
                        "server_pid": proc.pid,
                        "chunks": a.chunks if reg == "flood" else a.paced_chunks,
                        "gap_ms": 0.0 if reg == "flood" else a.gap_ms,
                    }
                    if name == "vllm":
                        r = vllm_run(spec, a.vllm_python, a.tokenizer, client_core)
                    elif name == "floor":
                        r = run_in_process(spec, client_core, "--floor-worker")
                    else:
                        r = run_in_process(spec, client_core)
                    res.setdefault((reg, c, name), []).append(r)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)
    keys = ("chunks_s", "cpu_frac", "srv_frac", "chunks_per_cpu_s", "us_chunk", "us_chunk_all", "lag_p50", "lag_p99")
    keys += ("rss_mb",)
    print(
        f"{'regime':>6} {'streams':>7} {'client':>6} {'chunks/s':>9} {'CPU':>5} {'srv CPU':>7} {'chunks/CPU-s':>12} "
        f"{'µs/chunk':>8} {'µs/chunk all':>12} {'lag p50':>8} {'lag p99':>8} {'RSS MB':>6} {'fail':>4} {'n':>2}"
    )
    for reg, c in cells:
        med = {}
        for name in clients:
            runs = res[(reg, c, name)]
            med[name] = {k: statistics.median(r[k] for r in runs) for k in keys}
            m = med[name]
            print(
                f"{reg:>6} {c:>7} {name:>6} {m['chunks_s']:>9.0f} {m['cpu_frac']:>5.2f} {m['srv_frac']:>7.2f} "
                f"{m['chunks_per_cpu_s']:>12.0f} {m['us_chunk']:>8.2f} {m['us_chunk_all']:>12.2f} "
                f"{m['lag_p50']:>8.2f} {m['lag_p99']:>8.2f} {m['rss_mb']:>6.0f} "
                f"{sum(r['failed'] for r in runs):>4} {len(runs):>2}"
            )
        if len(trees) == 2:
            ratio = med["now"]["chunks_per_cpu_s"] / med["before"]["chunks_per_cpu_s"]
            print(f"{'':>6} {'':>7} {'ratio':>6} {'':>9} {'':>5} {'':>7} {ratio:>11.2f}x   (now / before)")
        if a.vllm_python:
            ratio = med["vllm"]["us_chunk"] / med["now"]["us_chunk"]
            ratio_all = med["vllm"]["us_chunk_all"] / med["now"]["us_chunk_all"]
            print(f"{'':>6} {'':>7} {'ratio':>6} {'':>46} {ratio:>7.2f}x {ratio_all:>11.2f}x  (vllm / kit)")
        if a.vllm_python and a.floor:
            f = med["floor"]["us_chunk"]
            own_kit, own_vllm = med["now"]["us_chunk"] - f, med["vllm"]["us_chunk"] - f
            ratio = f"{own_vllm / own_kit:>7.2f}x" if own_kit > 0 and own_vllm > 0 else f"{'n/a':>8}"  # noisy floor
            print(f"{'':>6} {'':>7} {'ratio':>6} {'':>46} {ratio} {'':>12}  (vllm / kit, above the floor)")
    print("lag in ms; chunks/CPU-s is the client's capacity on one core whoever was the bottleneck")
    return 0


if __name__ == "__main__":
    sys.exit(main())
