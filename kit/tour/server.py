"""The tour's page and its server: a small aiohttp application on 127.0.0.1.

Why aiohttp and server-sent events rather than Voilà (what ``kit dashboard`` uses): the playground must show
tokens as they arrive, tens per second, and stop them at once. A Voilà page runs a kernel per browser tab, sends
every widget update through the Jupyter message protocol and needs jupyter_server, a kernel process and its
culler; a stream of small JSON events over one HTTP response (``text/event-stream``) needs none of that, starts in
well under a second, costs one coroutine per stream and ends when either side closes it, which is exactly Stop.
aiohttp is already the kit's HTTP library (the simulated server, the model listing); the page is one static HTML
file with its script (``kit/tour/static/``) that draws what the server sends and computes nothing itself.

Guards, as ``kit dashboard``'s: a token made at random for each launch (in the printed URL,
``http://127.0.0.1:PORT/?token=...``; the page then holds it in a cookie of its own for this port, ``HttpOnly``,
``SameSite=Strict``), a request without it refused with 403; only local names as ``Host:``
(:func:`kit.view.guard.host_is_local`) and, on every request that does work (POST), a local ``Origin:`` when one is
sent (:func:`kit.view.guard.origin_is_local`): a page on another site cannot drive it, not even by DNS rebinding.

Work: torch work (a model load, a generation, a lesson's measurement) runs in one worker thread, one at a time,
off the event loop, so the page stays responsive; a generation checks its stop flag before every decode step.
Servers the tour starts (the kit's simulated server, a launched engine) are stopped when the tour stops.

Programmatic use (the browser tests do this)::

    from kit.tour.server import TourServer
    with TourServer().start() as tour:      # a free port
        print(tour.page_url)                 # http://127.0.0.1:PORT/?token=...
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import threading
import traceback
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from kit.errors import UserError
from kit.tour.context import TourContext
from kit.tour.generate import endpoint_tokens, in_process_tokens
from kit.tour.lessons import lessons, run_lesson
from kit.tour.request import DEFAULT_STALL_S, STALL_RANGE, check_generate, dumps, json_response, read_json
from kit.tour.sources import launch_url, served_model
from kit.tour.work import DaemonWorker, in_daemon
from kit.view.guard import host_is_local, origin_is_local

HOST = "127.0.0.1"
DEFAULT_PORT = 8867
#: the files the page is made of (package data under kit/tour/static)
STATIC_FILES = {"tour.js": "application/javascript", "tour.css": "text/css"}
#: seconds ``stop()`` waits for the torch task under way before leaving it (a daemon thread) behind
STOP_WAIT_S = 10.0

log = logging.getLogger("kit.tour")


@dataclass
class Job:
    """A generation under way: its id and the flags Stop sets (one for a worker thread, one for a coroutine)."""

    id: int
    thread_stop: threading.Event = field(default_factory=threading.Event)
    async_stop: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        self.thread_stop.set()
        self.async_stop.set()


class TourServer:
    """The tour on 127.0.0.1:``port`` in a background thread (``start()``, ``stop()``, or ``with``).

    Args:
        port: TCP port (0: a free one).
        ctx: the lessons' :class:`kit.tour.context.TourContext` (default: CPU, tiny-llama, float32).
        url: the endpoint URL the playground starts with.
        out_dir: where a launched engine's log goes.
        lesson_defaults: ``{lesson id: {control: value}}`` the page starts with instead of the lessons' own
            (e.g. each lesson's ``check`` settings, for a quick walk).
        server_python: the interpreter of the environment with the engine a launch starts (vLLM, SGLang live in
            environments of their own; :class:`kit.serve.recipes.LaunchSpec` ``server_python``).
        served_model: the model id the page asks ``url`` for at first (default: the first it lists).
        stall_s: the page's starting stall timeout (s).
    """

    def __init__(
        self,
        port: int = 0,
        ctx: TourContext | None = None,
        url: str = "",
        out_dir: str | Path = "results/tour",
        lesson_defaults: dict | None = None,
        server_python: str | None = None,
        served_model: str | None = None,
        stall_s: float = DEFAULT_STALL_S,
    ):
        self.port = int(port)
        self.ctx = ctx or TourContext()
        self.default_url = url
        self.out_dir = Path(out_dir)
        self.token = secrets.token_urlsafe(32)
        self.lesson_defaults = lesson_defaults or {}
        self.server_python = server_python
        self.served_model = served_model or ""
        self.stall_s = float(stall_s)
        self.url = ""
        self.jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        self._worker = DaemonWorker("kit-tour-torch")
        self._busy = 0  # torch tasks queued or running in the worker
        self._sim = None
        self._launched: dict[tuple, object] = {}
        self._starting: set = set()  # launched servers not ready yet (stopped with the tour)
        self._halt = threading.Event()  # the tour is stopping: no new work, every generation ends
        self._ready = threading.Event()
        self._error: str | None = None

    # ------------------------------------------------------------------------------------ lifecycle
    @property
    def page_url(self) -> str:
        """``http://127.0.0.1:PORT/?token=...``: the page with this launch's token."""
        return f"{self.url}/?token={self.token}"

    @property
    def cookie(self) -> str:
        """The cookie that carries the token after the first page load (one per port)."""
        return f"kit-tour-{self.url.rsplit(':', 1)[-1]}"

    def start(self) -> TourServer:
        """Listen in a daemon thread; returns self once listening.

        Raises:
            UserError: the port cannot be listened on. RuntimeError: not listening within 30 s.
        """
        self._thread = threading.Thread(target=self._main, name="kit-tour", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the tour's server did not start within 30 s")
        if self._error:
            raise UserError(self._error)
        return self

    def stop(self) -> None:
        """Stop every generation (their stop flags set), kill the servers being launched (their process groups),
        let the torch task under way end (it checks its flag; at most :data:`STOP_WAIT_S` s, queued ones are
        dropped), close the web server (open streams included), then its thread and the servers the tour
        started."""
        self._halt.set()
        for srv in list(self._starting):  # a launch under way: its wait ends when the process is gone
            with contextlib.suppress(Exception):
                srv.stop(5.0)
        for job in list(self.jobs.values()):
            job.thread_stop.set()
            if self._thread.is_alive():
                self._loop.call_soon_threadsafe(job.async_stop.set)
        # the torch task under way ends at its next step: wait for it even when the loop thread is gone (a daemon
        # thread still inside torch when the interpreter exits aborts the process)
        self._worker.shutdown(wait=True, cancel_futures=True, timeout=STOP_WAIT_S)
        if self._thread.is_alive():
            done = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            with contextlib.suppress(Exception):
                done.result(15)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._stop_servers()

    def __enter__(self) -> TourServer:
        return self if self._ready.is_set() else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait(self) -> None:
        """Block until the server thread ends (the CLI: until Ctrl-C or SIGTERM)."""
        while self._thread.is_alive():
            self._thread.join(0.5)

    def status(self) -> dict:
        """What is running: generations, queued or running torch tasks, servers the tour started."""
        return {"generations": len(self.jobs), "torch_tasks": self._busy, "servers": self._server_urls()}

    def _server_urls(self) -> list[str]:
        out = [self._sim.url] if self._sim is not None else []
        return out + [s.url for s in self._launched.values()]

    def _stop_servers(self) -> None:
        if self._sim is not None:
            self._sim.stop()
            self._sim = None
        for srv in self._launched.values():
            srv.stop()
        self._launched.clear()

    def _main(self) -> None:
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        app = web.Application(middlewares=[self._guard], client_max_size=8 * 2**20)
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/lessons", self._lessons)
        app.router.add_get("/api/status", self._status)
        app.router.add_post("/api/lesson/{id}", self._lesson)
        app.router.add_post("/api/generate", self._generate)
        app.router.add_post("/api/stop", self._stop)
        runner = self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, HOST, self.port)
        try:
            self._loop.run_until_complete(site.start())
        except OSError as e:
            self._error = f"--port {self.port}: cannot listen on {HOST}:{self.port}: {e.strerror or e} (0: a free one)"
            self._loop.run_until_complete(runner.cleanup())
            self._ready.set()
            return
        self.url = f"http://{HOST}:{runner.addresses[0][1]}"
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            if runner.server is not None:  # not closed by stop()
                self._loop.run_until_complete(runner.cleanup())
            self._loop.close()

    # ------------------------------------------------------------------------------------ guards
    def _authorised(self, request) -> bool:
        given = request.query.get("token") or request.cookies.get(self.cookie) or ""
        return secrets.compare_digest(given.encode(), self.token.encode())

    async def _guard_inner(self, request, handler):
        from aiohttp import web

        if not host_is_local(request.host):
            return web.Response(status=403, text="refused: the tour answers only local names (Host)")
        if request.method != "GET" and not origin_is_local(request.headers.get("Origin")):
            return web.Response(status=403, text="refused: a request from another site (Origin)")
        if not self._authorised(request):
            return web.Response(status=403, text="refused: open the URL kit tour printed (it carries the token)")
        resp = await handler(request)
        if request.query.get("token"):
            resp.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
        resp.headers.setdefault("Cache-Control", "no-store")
        return resp

    @property
    def _guard(self):
        from aiohttp import web

        @web.middleware
        async def guard(request, handler):
            return await self._guard_inner(request, handler)

        return guard

    # ------------------------------------------------------------------------------------ pages
    async def _index(self, request):
        from aiohttp import web

        html = files("kit.tour").joinpath("static/index.html").read_text(encoding="utf-8")
        return web.Response(text=html, content_type="text/html")

    async def _static(self, request):
        from aiohttp import web

        name = request.match_info["name"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound()
        text = files("kit.tour").joinpath(f"static/{name}").read_text(encoding="utf-8")
        return web.Response(text=text, content_type=STATIC_FILES[name])

    async def _lessons(self, request):

        c = self.ctx
        defaults = {
            "model": c.model, "dtype": c.dtype, "device": c.device, "url": self.default_url,
            "served_model": self.served_model, "stall_range": list(STALL_RANGE), "stall_s": self.stall_s,
        }  # fmt: skip
        out = []
        for lesson in await in_daemon(lessons, c.model):
            d = lesson.as_dict()
            over = self.lesson_defaults.get(lesson.id, {})
            for c in d["controls"]:
                c["default"] = over.get(c["name"], c["default"])
            out.append(d)
        return json_response({"lessons": out, "defaults": defaults})

    async def _status(self, request):

        return json_response(self.status())

    async def _torch(self, fn, *args):
        """Run ``fn(*args)`` in the torch worker (one at a time, off the event loop)."""
        self._busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)
        finally:
            self._busy -= 1

    async def _lesson(self, request):

        lesson_id = request.match_info["id"]
        try:
            settings = await read_json(request)
            if not isinstance(settings, dict):
                raise UserError("send the lesson's settings as a JSON object")
            res = await self._torch(run_lesson, self.ctx, lesson_id, settings)
        except (UserError, ValueError) as e:
            return json_response({"lesson": lesson_id, "ok": False, "error": str(e)}, status=400)
        except Exception as e:  # noqa: BLE001 - a bug: its traceback goes to the log, its text to the page
            log.error("lesson %s failed:\n%s", lesson_id, traceback.format_exc())
            return json_response({"lesson": lesson_id, "ok": False, "error": f"internal error: {e!r}"}, status=500)
        return json_response(res)

    async def _stop(self, request):

        try:
            job = self.jobs.get(int((await request.json()).get("id")))
        except (ValueError, TypeError, AttributeError):
            job = None
        if job is not None:
            job.stop()
        return json_response({"stopped": job is not None})

    # ------------------------------------------------------------------------------------ generation
    async def _generate(self, request):
        from aiohttp import web

        try:  # a malformed request is refused before the stream starts: HTTP 400, one line
            req = check_generate(await read_json(request))
            if self._halt.is_set():
                raise UserError("the tour is stopping")
        except UserError as e:
            return json_response({"error": str(e)}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await resp.prepare(request)
        job = Job(next(self._ids))
        self.jobs[job.id] = job

        async def send(ev: dict) -> bool:
            try:
                await resp.write(f"data: {dumps(ev)}\n\n".encode())
                return True
            except (ConnectionError, RuntimeError):  # the page closed the stream: Stop (or gone)
                job.stop()
                return False

        try:
            await send({"type": "job", "id": job.id})
            try:
                await self._run_generation(req, job, send)
            except UserError as e:
                await send({"type": "error", "message": str(e)})
            except Exception as e:  # noqa: BLE001 - a bug: traceback to the log, text to the page
                log.error("generation failed:\n%s", traceback.format_exc())
                await send({"type": "error", "message": f"internal error: {e!r}"})
        finally:
            self.jobs.pop(job.id, None)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await resp.write_eof()
        return resp

    async def _run_generation(self, req: dict, job: Job, send) -> None:
        """One validated request (:func:`check_generate`) streamed to ``send``."""
        prompt, max_tokens, source, stall = req["prompt"], req["max_tokens"], req["source"], req["stall_s"]
        if source == "in-process":
            await self._in_process(req, prompt, max_tokens, job, send)
            return
        if source == "url":
            url = str(req.get("url") or self.default_url).strip()
            if not url.startswith(("http://", "https://")):
                raise UserError(f"endpoint URL {url!r}: give an http:// or https:// URL, e.g. http://127.0.0.1:8000")
            model = await served_model(url, str(req.get("model") or "").strip(), stall, send)
        elif source == "sim":
            url, model = await self._sim_url(), None
        else:
            url, model = await launch_url(self, req, job, send), None
            if url is None:  # Stop during the launch
                await send({"type": "stopped", "tokens": 0, "message": "stopped: the server's launch was cancelled"})
                return
        async with contextlib.aclosing(
            endpoint_tokens(url, model, prompt, max_tokens, job.async_stop, stall_s=stall)
        ) as it:
            async for ev in it:
                if not await send(ev):
                    break

    async def _in_process(self, req, prompt, max_tokens, job: Job, send) -> None:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        model = str(req.get("model") or self.ctx.model).strip()
        dtype = str(req.get("dtype") or self.ctx.dtype)

        def emit(ev):
            loop.call_soon_threadsafe(q.put_nowait, ev)

        def work():
            try:
                if not job.thread_stop.is_set():
                    emit({"type": "note", "message": f"loading {model} ({dtype}) on {self.ctx.device} ..."})
                    loaded = self.ctx.models.get(model, dtype, self.ctx.device)
                if job.thread_stop.is_set():  # Stop (or the tour stopping) before the first token
                    emit({"type": "stopped", "tokens": 0, "message": "stopped before the first token"})
                    return
                emit({"type": "note", "message": f"{model} ({dtype}) on {self.ctx.device}"})
                in_process_tokens(loaded, prompt, max_tokens, job.thread_stop, emit)
            except UserError as e:
                emit({"type": "error", "message": str(e)})
            except Exception as e:  # noqa: BLE001 - a bug: traceback to the log, text to the page
                log.error("in-process generation failed:\n%s", traceback.format_exc())
                emit({"type": "error", "message": f"internal error: {e!r}"})
            finally:
                emit(None)

        if self._halt.is_set():
            job.stop()
        task = asyncio.ensure_future(self._torch(work))
        # work() ends the queue itself; a task that never ran it (the tour stopping: the worker closed) ends it here
        task.add_done_callback(lambda t: q.put_nowait(None) if t.cancelled() or t.exception() else None)
        while (ev := await q.get()) is not None:
            if not await send(ev):
                job.stop()
        await asyncio.wait({task})
        if task.cancelled() or task.exception() is not None:
            await send({"type": "stopped", "tokens": 0, "message": "stopped: the tour is stopping"})

    async def _sim_url(self) -> str:
        """The kit's simulated server (:class:`kit.serve.simserver.SimServer`), started on first use."""
        from kit.serve.simserver import SimModel, SimServer

        if self._sim is None:
            self._sim = SimServer(SimModel(ttft_base_ms=60.0, prefill_ms_per_token=0.05, tpot_base_ms=25.0)).start()
        return self._sim.url
