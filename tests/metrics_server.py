"""The scripted SSE server (tests/sse_server.py) with a Prometheus ``/metrics`` route in vLLM's or SGLang's
naming whose counters advance with the requests it serves.

Per generation request of T output tokens (``max_tokens``) and P prompt characters: generation tokens += T,
prompt tokens and prefix-cache queries += P, prefix-cache hits += P // 2 with ``prefix_hits``, preemptions += 1
with ``preempt``; speculative decoding: drafts += T // 4, draft tokens += 3 x drafts, accepted += 2 x drafts
(acceptance rate 2/3, mean acceptance length 3; SGLang exports the two as gauges). Gauges: requests running (in
flight), waiting 0, KV-cache usage 0.1 x running.

Run in-process with :func:`start`, or ``python tests/metrics_server.py --naming vllm --port N`` (prints
``READY <port>``; used by the energy-per-token how-to notebook in CI).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sse_server import make_app  # noqa: E402

NAMES = {
    "vllm": {
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv": "vllm:kv_cache_usage_perc",
        "queries": "vllm:prefix_cache_queries",
        "hits": "vllm:prefix_cache_hits",
        "preempt": "vllm:num_preemptions",
        "prompt": "vllm:prompt_tokens",
        "gen": "vllm:generation_tokens",
        "drafts": "vllm:spec_decode_num_drafts",
        "draft_tokens": "vllm:spec_decode_num_draft_tokens",
        "accepted": "vllm:spec_decode_num_accepted_tokens",
    },
    "sglang": {
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
        "kv": "sglang:token_usage",
        "hits": "sglang:cached_tokens",
        "preempt": "sglang:num_retracted_requests",
        "prompt": "sglang:prompt_tokens",
        "gen": "sglang:generation_tokens",
    },
}


def add_metrics(app: web.Application, naming: str, prefix_hits=False, preempt=False, spec=True, labels=None):
    """Count what ``app`` serves and expose it at ``/metrics`` in ``naming`` (``vllm`` | ``sglang``)."""
    c = dict.fromkeys(("queries", "hits", "preempt", "prompt", "gen", "drafts", "draft_tokens", "accepted"), 0)
    state = {"running": 0}
    lab = labels or '{model_name="normal"}'

    @web.middleware
    async def count(request, handler):
        if not request.path.endswith("completions"):
            return await handler(request)
        body = json.loads(await request.read())
        t = int(body.get("max_tokens", 16))
        p = len(str(body.get("prompt") or body.get("messages") or ""))
        state["running"] += 1
        try:
            return await handler(request)
        finally:
            state["running"] -= 1
            c["gen"] += t
            c["prompt"] += p
            c["queries"] += p
            c["hits"] += p // 2 if prefix_hits else 0
            c["preempt"] += 1 if preempt else 0
            if spec:
                c["drafts"] += t // 4
                c["draft_tokens"] += 3 * (t // 4)
                c["accepted"] += 2 * (t // 4)

    async def metrics(_req):
        n = NAMES[naming]
        lines = []
        for key in ("running", "waiting", "kv"):
            v = {"running": state["running"], "waiting": 0, "kv": 0.1 * state["running"]}[key]
            lines += [f"# HELP {n[key]} scripted", f"# TYPE {n[key]} gauge", f"{n[key]}{lab} {v}"]
        for key, v in c.items():
            if key in n:
                lines += [f"# HELP {n[key]} scripted", f"# TYPE {n[key]} counter", f"{n[key]}_total{lab} {float(v)}"]
        if naming == "sglang" and spec:
            lines += ["# TYPE sglang:spec_accept_rate gauge", f"sglang:spec_accept_rate{lab} 0.6666666666666666"]
            lines += ["# TYPE sglang:spec_accept_length gauge", f"sglang:spec_accept_length{lab} 3.0"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app.middlewares.append(count)
    app.router.add_get("/metrics", metrics)
    return app


class MetricsServer:
    """The scripted server with ``/metrics`` on 127.0.0.1 in a background thread; ``url``, ``stop()``."""

    def __init__(self, naming: str, port: int = 0, gap_ms: float = 2.0, **opts):
        self._ready = threading.Event()
        self._args = (naming, port, gap_ms, opts)
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("scripted metrics server did not start within 10 s")

    def _main(self):
        naming, port, gap_ms, opts = self._args
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        app = add_metrics(make_app(gap_ms), naming, **opts)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", port)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())
        self.loop.close()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def start(naming: str, **opts) -> MetricsServer:
    return MetricsServer(naming, **opts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--naming", choices=sorted(NAMES), default="vllm")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--preempt", action="store_true")
    ap.add_argument("--prefix-hits", action="store_true")
    a = ap.parse_args(argv)
    srv = MetricsServer(a.naming, a.port, preempt=a.preempt, prefix_hits=a.prefix_hits)
    print(f"READY {srv.url.rsplit(':', 1)[1]}", flush=True)
    try:
        srv._thread.join()
    except KeyboardInterrupt:
        srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
