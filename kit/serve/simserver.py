"""A simulated OpenAI-compatible streaming server with a known latency model and a prefix cache, for learning the
served tools without a GPU and for tests whose answer must be known in advance.

Latency model (ms), evaluated while the request runs, ``n`` = requests in flight at that moment (this one included):

    TTFT       = ttft_base_ms + prefill_ms_per_token × (prompt tokens not in the prefix cache)
    each gap   = tpot_base_ms + tpot_per_request_ms × (n − 1)     (one token per chunk, on a fixed timeline)

so a closed loop of ``c`` concurrent requests sees TPOT = tpot_base_ms + tpot_per_request_ms × (c − 1). Tokens
are words ``" w<k>"``; a chunk carries ``tokens_per_chunk`` of them (sent when its last one is due: with
``tokens_per_chunk`` = k > 1 the first chunk arrives k − 1 gaps after TTFT, so a client measures that much more
TTFT and TPOT = gap × (OSL − k) / (OSL − 1), e.g. 3.7 ms for a 4 ms gap, k = 3, OSL 32). A prompt
is split into tokens (token ids as given; text: whitespace-separated words); the prefix cache holds blocks of
``block_tokens`` tokens keyed by the hash of the whole prefix up to that block (as vLLM's automatic prefix cache
does), and the final usage reports ``prompt_tokens_details.cached_tokens`` (the OpenAI field). Every request is
logged in :attr:`SimServer.log` (arrival time ``time.perf_counter()``, prompt, cached tokens) so a test can check
what a client sent and when.

With ``profile_dir`` set the server also answers ``POST /start_profile`` and ``POST /stop_profile`` as vLLM and
SGLang do when started with profiling enabled: stop writes a small Chrome trace (``sim-trace-<n>.json``: one
``sim.request`` event per generation request received while profiling) into ``profile_dir``. Without it those paths
answer HTTP 404, as a vLLM server started without a profiler configuration does.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

from kit.errors import UserError


@dataclass
class SimModel:
    """The simulated server's latency model (ms) and prefix-cache block size (tokens); see the module text."""

    ttft_base_ms: float = 20.0
    prefill_ms_per_token: float = 0.0
    tpot_base_ms: float = 4.0
    tpot_per_request_ms: float = 0.0
    block_tokens: int = 16
    tokens_per_chunk: int = 1
    model_id: str = "sim"

    def __post_init__(self):
        for name in ("ttft_base_ms", "prefill_ms_per_token", "tpot_base_ms", "tpot_per_request_ms"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 <= v < float("inf")):
                raise UserError(f"{name}={v!r} must be a finite number of ms >= 0")
        for name in ("block_tokens", "tokens_per_chunk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{name}={v!r} must be an integer >= 1")


def prompt_tokens(body: dict) -> list:
    """The tokens of a request body's prompt: token ids as given, else the words of the text (chat messages
    joined in order)."""
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
    else:
        text = body.get("prompt", "")
    return list(text) if isinstance(text, list) else str(text).split()


@dataclass
class SimServer:
    """The simulated server on 127.0.0.1 in a background thread: ``start()`` (or ``with SimServer() as s``),
    ``url``, ``log`` (one dict per generation request: ``t``, ``prompt``, ``tokens``, ``cached``, ``max_tokens``),
    ``stop()``."""

    model: SimModel = field(default_factory=SimModel)
    log: list = field(default_factory=list)
    url: str = ""
    #: where ``/stop_profile`` writes its trace; None: no profile endpoints (HTTP 404)
    profile_dir: str | None = None

    def __post_init__(self):
        self._inflight = 0
        self._cache: set = set()
        self._ready = threading.Event()
        self._profile_from: int | None = None  # index into log where the running profile began
        #: the traces ``/stop_profile`` wrote, in order
        self.traces: list[str] = []

    # ---------------------------------------------------------------- profile endpoints
    async def _start_profile(self, _req):
        from aiohttp import web

        if self._profile_from is not None:
            return web.Response(status=400, text="profiling is already running")
        self._profile_from = len(self.log)
        return web.Response(text="Start profiling")

    async def _stop_profile(self, _req):
        from pathlib import Path

        from aiohttp import web

        if self._profile_from is None:
            return web.Response(status=400, text="profiling is not running")
        reqs, self._profile_from = self.log[self._profile_from :], None
        m, t0 = self.model, reqs[0]["t"] if reqs else time.perf_counter()
        events = [
            {"name": "sim.request", "ph": "X", "pid": 1, "tid": 1, "ts": (r["t"] - t0) * 1e6,
             "dur": (m.ttft_base_ms + m.tpot_base_ms * r["max_tokens"]) * 1000, "args": {"tokens": r["tokens"]}}
            for r in reqs
        ]  # fmt: skip
        path = Path(self.profile_dir) / f"sim-trace-{len(self.traces) + 1}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        self.traces.append(str(path))
        return web.Response(text="Stop profiling. This will take some time.")

    # ---------------------------------------------------------------- request handling
    def _cached_tokens(self, toks: list) -> int:
        b = int(self.model.block_tokens)
        keys = [hash(tuple(toks[: (k + 1) * b])) for k in range(len(toks) // b)]
        hit = 0
        for key in keys:
            if key not in self._cache:
                break
            hit += b
        self._cache.update(keys)
        return hit

    async def _generate(self, req):
        from aiohttp import web

        body = await req.json()
        chat = req.path.endswith("/chat/completions")
        toks = prompt_tokens(body)
        cached = self._cached_tokens(toks)
        n_out = int(body.get("max_tokens", 16))
        self.log.append(
            {"t": time.perf_counter(), "prompt": body.get("prompt", body.get("messages")), "tokens": len(toks)}
            | {"cached": cached, "max_tokens": n_out, "path": req.path}
        )
        m = self.model
        self._inflight += 1
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(req)
            t_next = time.perf_counter() + (m.ttft_base_ms + m.prefill_ms_per_token * (len(toks) - cached)) / 1000
            text = ""
            for k in range(n_out):
                text += f" w{k}"
                if (k + 1) % max(1, int(m.tokens_per_chunk)) == 0 or k == n_out - 1:
                    await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
                    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                    choice["finish_reason"] = "length" if k == n_out - 1 else None
                    await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                    text = ""
                t_next += (m.tpot_base_ms + m.tpot_per_request_ms * (self._inflight - 1)) / 1000
            usage = {"prompt_tokens": len(toks), "completion_tokens": n_out, "total_tokens": len(toks) + n_out}
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
            await resp.write_eof()
            return resp
        finally:
            self._inflight -= 1

    # ---------------------------------------------------------------- lifecycle
    def _main(self, port: int) -> None:
        from aiohttp import web

        async def models(_req):
            return web.json_response({"object": "list", "data": [{"id": self.model.model_id, "object": "model"}]})

        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        if self.profile_dir is not None:
            app.router.add_post("/start_profile", self._start_profile)
            app.router.add_post("/stop_profile", self._stop_profile)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", port)
        try:
            self._loop.run_until_complete(site.start())
        except OSError as e:  # the port is taken, or not ours to bind: start() says so
            self._error = f"cannot listen on 127.0.0.1:{port}: {e.strerror or e}"
            self._loop.run_until_complete(runner.cleanup())
            self._loop.close()
            self._ready.set()
            return
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def start(self, port: int = 0) -> SimServer:
        """Start listening on 127.0.0.1:``port`` (0: a free port) in a daemon thread; returns self.

        Raises:
            UserError: the port cannot be listened on (taken, or privileged).
            RuntimeError: not listening within 10 s.
        """
        self._error = None
        self._thread = threading.Thread(target=self._main, args=(port,), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("simulated server did not start within 10 s")
        if self._error:
            self._thread.join(10)
            raise UserError(f"{self._error} (--port 0 picks a free one)")
        return self

    def stop(self) -> None:
        """Stop the server and its thread."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv=None) -> int:
    """``python -m kit.serve.simserver [--port N] [--tpot-base-ms X ...]``: serve until interrupted; prints
    ``READY <url>`` once listening."""
    import argparse
    from dataclasses import fields

    from kit.cli import number_arg

    ap = argparse.ArgumentParser(description="simulated OpenAI-compatible server (known latency model)")
    ap.add_argument("--port", type=number_arg(int, minimum=0, maximum=65535), default=0, help="0: any free port")
    ap.add_argument("--profile-dir", default=None, help="serve /start_profile and /stop_profile, traces written here")
    for f in fields(SimModel):
        typ = number_arg(type(f.default), minimum=0) if isinstance(f.default, (int, float)) else type(f.default)
        ap.add_argument("--" + f.name.replace("_", "-"), type=typ, default=f.default)
    a = vars(ap.parse_args(argv))
    try:
        model = SimModel(**{f.name: a[f.name] for f in fields(SimModel)})
    except UserError as e:
        ap.error(str(e))
    try:
        srv = SimServer(model, profile_dir=a["profile_dir"]).start(a["port"])
    except UserError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    print(f"READY {srv.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
