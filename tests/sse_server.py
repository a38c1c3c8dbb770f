"""A scripted OpenAI-style SSE server for tests and the load-generator benchmark.

It replays exact chunk timings (cases E1-E3 of docs/metrics.md, "Worked cases") and injects faults. The scenario is
chosen by the request's ``model`` field:

==============  ==========================================================================================
``e1``          role-only chunk at 0.05 s; "A" 0.50; "B" 0.60; "CDE" 0.90; "F" 1.00; usage-only chunk
                (``choices: []``, 6 completion tokens) at 1.00; ``[DONE]``
``e1u``         E1 with continuous usage stats in every chunk (cumulative completion_tokens)
``e2a``         one chunk "A" at 0.30 s, usage 1 token, ``[DONE]``
``e2b``         empty output: a finish chunk with empty text, usage 0 tokens, ``[DONE]``
``e2c``         "A" at 0.10, a whitespace-only chunk " " at 0.15 (0 tokens by continuous usage), "B" at 0.20
``normal``      ``max_tokens`` one-token chunks, ``gap_ms`` apart (query/env), usage, **no** ``[DONE]``
``fast``        ``max_tokens`` one-token chunks as fast as the server can write them (benchmark)
``flaky``       HTTP 500 on every other request (1st ok, 2nd 500, ...), otherwise like ``normal``
``stall``       one chunk, then silence for 120 s (a client must time out)
``truncate``    two chunks, then the connection is cut mid-stream (no chunked-encoding terminator)
``slow``        like ``normal`` with 50 ms between chunks
``html502``     HTTP 502 with a multi-line HTML error page (as a reverse proxy sends), no stream
``e5``          per-chunk usage: "abc" (3 tokens) at 0.5 s, then one token at 0.6, 0.7, 0.8, 0.9 (case E5)
``e6``          "A" at 0.1, then an ``event: error`` frame (``{"message": "engine overloaded", "code": 503}``),
                ``[DONE]`` (case E6); ``e6text``: the error frame's data is plain text; ``e6nodata``: no data;
                ``e6type``: a data line ``{"type": "error", "message": ..}``; ``e6obj``: ``{"error": {..}}``;
                ``e6finish``: a chunk with ``finish_reason: "error"``
``e7``          TTFT 0.2 s, then 10 chunks of 4 tokens every 40 ms (last at 0.56), final usage 40, no per-chunk
                usage (case E7)
``endless``     one ``data:`` line that never ends (64 KiB writes, up to 256 MiB)
==============  ==========================================================================================

Under the path prefix ``/redirect`` (``GET /redirect/v1/models``, ``POST /redirect/v1/completions``) every
request is answered with a redirect (302 and 307) to the same path without the prefix.

Run in-process with :func:`start_in_thread`, or as a separate process: ``python tests/sse_server.py --port N``
(prints ``READY <port>`` when listening).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import sys
import threading
import time

from aiohttp import web

GAP_MS = 5.0
#: ``app[REQUESTS]``: the log of generation requests a server received
REQUESTS = web.AppKey("requests", list)


def _chunk(
    obj_id: str,
    text: str | None = None,
    *,
    chat: bool,
    role: bool = False,
    finish: str | None = None,
    usage: dict | None = None,
    empty_choices: bool = False,
) -> dict:
    if empty_choices:
        choices = []
    elif chat:
        delta = {"role": "assistant"} if role else ({} if text is None else {"content": text})
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text or "", "finish_reason": finish}]
    out = {
        "id": obj_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 0,
        "model": "scripted",
        "choices": choices,
    }
    if usage is not None:
        out["usage"] = usage
    return out


def script(name: str, chat: bool, max_tokens: int, gap_ms: float) -> list[tuple[float, object]]:
    """The (offset s, payload) events of a scripted scenario; a payload is a dict (sent as JSON), a str
    (sent verbatim after ``data: ``) or the sentinel ``"<cut>"`` (abort the connection)."""
    i = "cmpl-1"
    u = lambda n, p=4: {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}  # noqa: E731
    if name in ("e1", "e1u"):
        cont = name == "e1u"
        ev = [(0.05, _chunk(i, chat=True, role=True, usage=u(0) if cont else None))]
        n = 0
        for t, txt in ((0.50, "A"), (0.60, "B"), (0.90, "CDE"), (1.00, "F")):
            n += len(txt)
            ev.append((t, _chunk(i, txt, chat=True, usage=u(n) if cont else None)))
        ev.append((1.00, _chunk(i, chat=True, empty_choices=True, usage=u(6))))
        ev.append((1.00, "[DONE]"))
        return ev
    if name == "e2a":
        return [
            (0.30, _chunk(i, "A", chat=chat, finish="length")),
            (0.30, _chunk(i, chat=chat, empty_choices=True, usage=u(1))),
            (0.30, "[DONE]"),
        ]
    if name == "e2b":
        return [
            (0.05, _chunk(i, "", chat=chat, finish="stop")),
            (0.05, _chunk(i, chat=chat, empty_choices=True, usage=u(0))),
            (0.05, "[DONE]"),
        ]
    if name == "e2c":
        return [
            (0.10, _chunk(i, "A", chat=chat, usage=u(1))),
            (0.15, _chunk(i, " ", chat=chat, usage=u(1))),
            (0.20, _chunk(i, "B", chat=chat, finish="length", usage=u(2))),
            (0.20, "[DONE]"),
        ]
    if name in ("normal", "flaky", "slow", "fast"):
        g = 0.0 if name == "fast" else (0.05 if name == "slow" else gap_ms / 1000.0)
        ev = [(g * (k + 1), _chunk(i, "t", chat=chat)) for k in range(max_tokens)]
        ev.append((g * max_tokens, _chunk(i, "", chat=chat, finish="length", usage=u(max_tokens))))
        return ev  # like transformers serve: no [DONE]
    if name == "stall":
        return [(0.02, _chunk(i, "A", chat=chat)), (120.0, _chunk(i, "B", chat=chat, finish="length"))]
    if name == "e5":
        ev = [(0.50, _chunk(i, "abc", chat=chat, usage=u(3)))]
        ev += [(0.5 + 0.1 * k, _chunk(i, "d", chat=chat, usage=u(3 + k))) for k in range(1, 5)]
        return ev + [(0.9, _chunk(i, chat=chat, empty_choices=True, usage=u(7))), (0.9, "[DONE]")]
    if name.startswith("e6"):
        err = {"message": "engine overloaded", "code": 503}
        frame = {
            "e6": b"event: error\ndata: " + json.dumps(err).encode() + b"\n\n",
            "e6text": b"event: error\ndata: engine overloaded (plain text)\n\n",
            "e6nodata": b"event: error\n\n",
            "e6type": {"type": "error", "message": "engine overloaded"},
            "e6obj": {"error": err},
            "e6finish": _chunk(i, "", chat=chat, finish="error"),
        }[name]
        return [(0.1, _chunk(i, "A", chat=chat)), (0.15, frame), (0.2, "[DONE]")]
    if name == "e7":
        ev = [(0.2 + 0.04 * k, _chunk(i, "abcd", chat=chat)) for k in range(10)]
        return ev + [(0.56, _chunk(i, chat=chat, empty_choices=True, usage=u(40))), (0.56, "[DONE]")]
    if name == "truncate":
        return [(0.02, _chunk(i, "A", chat=chat)), (0.04, _chunk(i, "B", chat=chat)), (0.05, "<cut>")]
    raise KeyError(name)


SCENARIOS = (
    *("e1", "e1u", "e2a", "e2b", "e2c", "e5", "e7", "normal", "fast", "flaky", "stall", "truncate", "slow"),
    *("html502", "endless", "e6", "e6text", "e6nodata", "e6type", "e6obj", "e6finish"),
)
HTML_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
    "</center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n" + "<!-- padding -->\r\n" * 6
)


def prompt_count(body: dict) -> int:
    """The prompt tokens a request's usage reports: token ids as given, else the words of the text (chat: of the
    messages' contents)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return len(prompt)
    text = prompt if prompt is not None else " ".join(str(m.get("content", "")) for m in body.get("messages") or [])
    return len(str(text).split())


def make_app(gap_ms: float = GAP_MS, announce_done: bool = False) -> web.Application:
    """The scripted server's routes; ``app[REQUESTS]`` logs every generation request received (``model``,
    ``max_tokens``, ``path``), so a test can tell which requests a client sent. ``announce_done``: print ``DONE``
    to stdout after each stream it finished (a test can then act after a completed request, however slow the
    machine)."""
    counter = itertools.count()
    received: list[dict] = []

    async def models(_req):
        return web.json_response(
            {"object": "list", "data": [{"id": s, "object": "model"} for s in ("normal",) + SCENARIOS]}
        )

    async def health(_req):
        return web.json_response({"status": "ok"})

    async def generate(req: web.Request):
        chat = req.path.endswith("/chat/completions")
        body = await req.json()
        name = body.get("model", "normal")
        received.append({"model": name, "max_tokens": body.get("max_tokens"), "path": req.path})
        if name not in SCENARIOS:
            return web.json_response({"error": {"message": f"unknown model {name!r}"}}, status=404)
        k = next(counter)
        if name == "flaky" and k % 2 == 1:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        if name == "html502":
            return web.Response(text=HTML_502, status=502, content_type="text/html")
        if name == "endless":
            return await endless(req)
        events = script(name, chat, int(body.get("max_tokens", 16)), float(req.query.get("gap_ms", gap_ms)))
        for _, payload in events:  # usage counts the prompt received, as a server does
            if isinstance(payload, dict) and isinstance(payload.get("usage"), dict):
                u = payload["usage"]
                u["prompt_tokens"] = prompt_count(body)
                u["total_tokens"] = u["prompt_tokens"] + u.get("completion_tokens", 0)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        await resp.prepare(req)
        t0 = time.perf_counter()
        for off, payload in events:
            delay = t0 + off - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if payload == "<cut>":
                req.transport.abort() if req.transport else None
                return resp
            if isinstance(payload, bytes):  # a raw SSE frame (typed events)
                await resp.write(payload)
                continue
            data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
            await resp.write(f"data: {data}\n\n".encode())
        await resp.write_eof()
        if announce_done:
            print("DONE", flush=True)
        return resp

    async def endless(req: web.Request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        await resp.write(b"data: ")
        block = b"x" * 65536
        try:
            for _ in range(4096):
                await resp.write(block)
        except (ConnectionError, RuntimeError):
            pass
        return resp

    async def redirect(req: web.Request):
        target = req.path.removeprefix("/redirect")
        raise (web.HTTPFound if req.method == "GET" else web.HTTPTemporaryRedirect)(location=target)

    app = web.Application()
    app[REQUESTS] = received
    app.router.add_get("/redirect/v1/models", redirect)
    app.router.add_post("/redirect/v1/completions", redirect)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    return app


class ThreadServer:
    """The scripted server on 127.0.0.1 in a background thread (own event loop). ``url`` is its base URL."""

    def __init__(self, port: int = 0, gap_ms: float = GAP_MS):
        self._ready = threading.Event()
        self._port, self._gap = port, gap_ms
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("scripted SSE server did not start within 10 s")

    def _main(self):
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.app = make_app(self._gap)
        self.runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=0.5, handler_cancellation=True)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", self._port)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    @property
    def requests(self) -> list[dict]:
        """Every generation request received so far (see :func:`make_app`)."""
        return list(self.app[REQUESTS])

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def start_in_thread(port: int = 0, gap_ms: float = GAP_MS) -> ThreadServer:
    """Start the scripted server in a background thread; call ``.stop()`` when done."""
    return ThreadServer(port, gap_ms)


def chars(text: str) -> int:
    """Stand-in tokenizer for the scripted cases: one token per non-space character."""
    return len(text.strip())


def dead_url() -> str:
    """The URL of a local port with nothing listening (bound and released a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


class SilentServer:
    """A port that accepts TCP connections (kernel backlog) but never answers; :meth:`pending` says whether a
    client connected. ``close()`` when done."""

    def __init__(self):
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def pending(self) -> bool:
        self._sock.setblocking(False)
        try:
            conn, _ = self._sock.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    def close(self) -> None:
        self._sock.close()


async def _raw_fast(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Minimal HTTP/1.1 keep-alive server for the ``fast`` scenario only (the load-generator benchmark): one
    chunked-encoding frame per SSE event (no aiohttp overhead, so the client, not this server, is the
    bottleneck). A body field ``gap_ms`` paces the chunks (one every ``gap_ms``, on a fixed schedule, each frame
    its own write); without it they are written back to back (flood), ``frames_per_write`` frames per write
    (default 1: one socket send per frame caps this server at its own per-send cost, 200–300k frames/s on one
    core of a small virtual machine, which a fast client keeps up with)."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = json.loads(await reader.readexactly(length)) if length else {}
            n = int(body.get("max_tokens", 16))
            gap_s = float(body.get("gap_ms", 0.0)) / 1000.0  # paced: one chunk every gap_ms (benchmark)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

            def frame(obj) -> bytes:
                data = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
                return b"%x\r\n%s\r\n" % (len(data), data)

            tok = frame(_chunk("cmpl-1", "t", chat=False))
            per_write = 1 if gap_s > 0 else max(1, int(body.get("frames_per_write", 1)))
            t_next = time.perf_counter()
            k = 0
            while k < n:
                if gap_s > 0:
                    t_next += gap_s
                    delay = t_next - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                m = min(per_write, n - k)
                writer.write(tok * m)
                k += m
                if gap_s > 0 or k % 64 < m:
                    await writer.drain()
            writer.write(
                frame(
                    _chunk(
                        "cmpl-1",
                        "",
                        chat=False,
                        finish="length",
                        usage={"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
                    )
                )
            )
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--gap-ms", type=float, default=GAP_MS)
    ap.add_argument(
        "--raw-fast",
        action="store_true",
        help="serve only the 'fast' scenario from a minimal asyncio HTTP server (benchmark)",
    )
    ap.add_argument("--announce-done", action="store_true", help="print DONE after each finished stream")
    a = ap.parse_args(argv)
    if a.raw_fast:

        async def run_raw():
            srv = await asyncio.start_server(_raw_fast, "127.0.0.1", a.port)
            print(f"READY {srv.sockets[0].getsockname()[1]}", flush=True)
            await asyncio.Event().wait()

        return _serve_until_interrupted(run_raw())

    async def run():
        runner = web.AppRunner(make_app(a.gap_ms, a.announce_done), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", a.port)
        await site.start()
        print(f"READY {site._server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()

    return _serve_until_interrupted(run())


def _serve_until_interrupted(coro) -> int:
    try:
        asyncio.run(coro)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
