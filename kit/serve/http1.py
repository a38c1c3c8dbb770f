"""The HTTP/1.1 client of the load generator's streamed requests, on asyncio's Protocol API.

Why its own: the time stamps. Each network read of a streamed response is handled in the event loop's own
callback (:meth:`StreamConnection.data_received`): one clock read, the chunked framing removed (a read of whole
frames split once, every frame's size checked against its data), the bytes handed to the caller's sink (the
SSE parser) — no Future completed and no task woken per read, which is what a
``StreamReader``-based client (aiohttp's) pays on every read. On a paced stream (one event per read) that is the
client's whole per-chunk cost; ``benchmarks/loadgen_bench.py`` prints the figures. aiohttp stays for everything
that is not a streamed request (model listing, metrics scrapes).

Scope: what an OpenAI-compatible server sends back to a POST. ``http://`` and ``https://`` (TLS with ssl's
default context), one request at a time per connection, keep-alive connections reused per (scheme, host, port)
by :class:`StreamPool`; bodies framed by ``Transfer-Encoding: chunked``, ``Content-Length`` or the connection's
close; ``1xx`` interim responses skipped. No redirects are followed (the caller reports them), no proxies, no
compression (``Accept-Encoding: identity``). Framing rules: RFC 9112 §6–7.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections.abc import Callable
from itertools import repeat
from urllib.parse import urlsplit

from kit import __version__

#: the most bytes of a response head (status line + headers) accepted, and of one chunk-size line
MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE = 1024
#: bytes of a non-200 response's body kept for its error text
ERROR_BODY_BYTES = 2000

_HEAD, _CHUNKED, _CRLF, _TRAILER, _LENGTH, _UNTIL_CLOSE, _DONE = range(7)


class StreamError(Exception):
    """A request that could not complete: ``kind`` is ``"connect"`` (no connection), ``"disconnected"`` (closed
    before a response began) or ``"broken"`` (the response broke off or violated HTTP/1.1 framing)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def whole_frames(data: bytes) -> bytes | None:
    """The data of a read made only of whole chunked frames ``size CRLF data CRLF ...`` (split once), or None when
    the read is anything else. Exact, because every size must equal the length of the data after it: a frame whose
    data holds a CRLF fails that check and the read takes the general path, as does a read with the last frame
    (size 0)."""
    parts = data.split(b"\r\n")
    if len(parts) == 3:  # one frame (a paced stream's read)
        try:
            size = int(parts[0], 16)
        except ValueError:
            return None
        return parts[1] if size and size == len(parts[1]) else None
    if not len(parts) & 1:
        return None
    datas = parts[1::2]
    try:
        sizes = list(map(int, parts[0:-1:2], repeat(16)))
    except ValueError:
        return None
    if sizes == list(map(len, datas)) and 0 not in sizes:
        return b"".join(datas) if len(datas) > 1 else datas[0]
    return None


class StreamConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: :meth:`start` sends a request; ``head`` (a Future of ``(status,
    headers)``, header names lower-case) resolves when the response head arrives, ``done`` when its body ends.

    The body of a 200 response goes to the request's sink, called in ``data_received`` as ``sink(raw, now)``
    with ``now`` the ``time.perf_counter()`` of that read (s); other statuses keep up to
    :data:`ERROR_BODY_BYTES` in ``error_body``. An exception from the sink ends the request with it.
    ``last_read`` is the ``perf_counter`` of the latest read (the caller's stall watchdog).
    """

    def __init__(self, key: tuple):
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.uses = 0
        self._state = _DONE
        self.last_read = 0.0

    # ---------------------------------------------------------------- request
    def start(self, request: bytes, sink: Callable[[bytes, float], None]) -> None:
        loop = asyncio.get_running_loop()
        self.head, self.done = loop.create_future(), loop.create_future()
        self._sink = sink
        self._buf, self._left, self._got_bytes = b"", 0, False
        self.error_body, self.keep_alive, self.status = b"", True, 0
        self._state, self.uses = _HEAD, self.uses + 1
        self.last_read = time.perf_counter()
        self.transport.write(request)

    @property
    def reusable(self) -> bool:
        return not self.closed and self._state == _DONE and self.keep_alive and self.done.done()

    # ---------------------------------------------------------------- protocol callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        st = self._state
        if st == _UNTIL_CLOSE:
            self._finish()
        elif st != _DONE:
            why = f": {exc}" if exc else ""
            if st == _HEAD and not self._got_bytes:
                self._fail(StreamError("disconnected", f"the server closed the connection before a response{why}"))
            else:
                self._fail(StreamError("broken", f"the connection closed before the end of the response{why}"))

    def data_received(self, data: bytes) -> None:
        now = self.last_read = time.perf_counter()
        self._got_bytes = True
        try:
            st = self._state
            if st == _CHUNKED or st == _CRLF:
                self._chunked(data, now)
            elif st == _UNTIL_CLOSE:
                self._sink(data, now)
            elif st == _LENGTH:
                self._length(data, now)
            elif st == _HEAD:
                self._head_bytes(data, now)
            elif st == _TRAILER:
                self._trailer(data)
            else:  # bytes after a response ended (or none was asked for): this connection is not reused
                self.keep_alive = False
        except Exception as e:  # noqa: BLE001 - the request fails with it (EventTooLarge, framing errors)
            self._fail(e)
            self.transport.abort()

    # ---------------------------------------------------------------- framing
    def _head_bytes(self, data: bytes, now: float) -> None:
        buf = self._buf + data if self._buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise StreamError("broken", f"response head longer than {MAX_HEAD_BYTES} bytes")
                self._buf = buf
                return
            lines = buf[:end].decode("latin-1").split("\r\n")
            buf = buf[end + 4 :]
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise StreamError("broken", f"not an HTTP/1.x response: {lines[0][:80]!r}")
            status = int(parts[1])
            if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): the real head follows
                continue
            break
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        conn = headers.get("connection", "").lower()
        self.keep_alive = "close" not in conn and (parts[0] != "HTTP/1.0" or "keep-alive" in conn)
        self.status = status
        if status != 200:
            self._sink = self._keep_error_body
        self._buf = b""
        self.head.set_result((status, headers))
        if status in (204, 304):
            self._finish()
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNKED
            if buf:
                self._chunked(buf, now)
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise StreamError("broken", f"bad Content-Length {headers['content-length']!r}") from None
            self._state = _LENGTH
            if self._left <= 0:
                self._finish()
            elif buf:
                self._length(buf, now)
        else:
            self._state, self.keep_alive = _UNTIL_CLOSE, False
            if buf:
                self._sink(buf, now)

    def _chunked(self, data: bytes, now: float) -> None:
        if self._buf:
            data, self._buf = self._buf + data, b""
        elif not self._left and self._state == _CHUNKED and data.endswith(b"\r\n"):
            whole = whole_frames(data)
            if whole is not None:
                self._sink(whole, now)
                return
        self._chunked_general(data, now)

    def _chunked_general(self, data: bytes, now: float) -> None:
        """Any read of a chunked body: frames cut anywhere, extensions, the last frame (size 0) and its trailer."""
        out = []
        pos, n = 0, len(data)
        find = data.find
        while pos < n:
            if self._state == _CHUNKED and not self._left:  # fast path: whole frames "size\r\ndata\r\n" in this read
                j = find(b"\r\n", pos)
                if j > pos and j - pos <= 16:
                    try:
                        size = int(data[pos:j], 16)
                    except ValueError:
                        size = -1
                    end = j + 2 + size
                    if size > 0 and end + 2 <= n and data[end : end + 2] == b"\r\n":
                        out.append(data[j + 2 : end])
                        pos = end + 2
                        continue
            if self._left:  # inside a chunk's data
                take = min(self._left, n - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._state = _CRLF
                continue
            if self._state == _CRLF:  # the CRLF that ends a chunk's data
                if n - pos < 2:
                    self._buf = data[pos:]
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise StreamError("broken", "bad chunked encoding (no CRLF after a chunk)")
                pos += 2
                self._state = _CHUNKED
                continue
            j = data.find(b"\r\n", pos)
            if j < 0:
                if n - pos > MAX_CHUNK_LINE:
                    raise StreamError("broken", "bad chunked encoding (chunk-size line too long)")
                self._buf = data[pos:]
                break
            text = data[pos:j].split(b";", 1)[0].strip()
            try:
                size = int(text, 16)
            except ValueError:
                size = -1
            if size < 0:
                raise StreamError("broken", f"bad chunked encoding (chunk size {text[:20]!r})")
            pos = j + 2
            if size == 0:
                self._state = _TRAILER
                if out:
                    self._sink(b"".join(out) if len(out) > 1 else out[0], now)
                self._trailer(data[pos:])
                return
            self._left = size
        if out:
            self._sink(b"".join(out) if len(out) > 1 else out[0], now)

    def _trailer(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        if buf[:2] == b"\r\n":
            end = 2
        else:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise StreamError("broken", "chunked trailer too long")
                self._buf = buf
                return
            end += 4
        if len(buf) > end:
            self.keep_alive = False  # bytes nobody asked for
        self._buf = b""
        self._finish()

    def _length(self, data: bytes, now: float) -> None:
        if len(data) > self._left:
            data, self.keep_alive = data[: self._left], False
        self._left -= len(data)
        self._sink(data, now)
        if not self._left:
            self._finish()

    def _keep_error_body(self, raw: bytes, now: float) -> None:
        if len(self.error_body) < ERROR_BODY_BYTES:
            self.error_body += raw[: ERROR_BODY_BYTES - len(self.error_body)]

    def _finish(self) -> None:
        self._state = _DONE
        if not self.done.done():
            self.done.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self._state, self.keep_alive = _DONE, False
        for fut in (self.head, self.done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # marked retrieved: the one nobody awaits logs no warning


class StreamPool:
    """Keep-alive :class:`StreamConnection` s per (scheme, host, port), for one load run; ``async with`` closes
    them all. ``ssl_context``: for ``https://`` (default: ssl's default context, certificates verified)."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None):
        self._ssl = ssl_context
        self._idle: dict[tuple, list[StreamConnection]] = {}
        self._open: set[StreamConnection] = set()

    async def __aenter__(self) -> StreamPool:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for c in list(self._open):
            if c.transport is not None:
                c.transport.close()
        self._open.clear()
        self._idle.clear()

    async def connect(self, key: tuple, timeout_s: float) -> StreamConnection:
        """A new connection to ``key`` = (scheme, host, port).

        Raises:
            StreamError: kind ``connect`` (refused, unreachable, unknown host, TLS failure).
            asyncio.TimeoutError: not connected within ``timeout_s`` (s).
        """
        scheme, host, port = key
        ctx = None
        if scheme == "https":
            ctx = self._ssl or ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: StreamConnection(key), host, port, ssl=ctx), timeout_s
            )
        except (OSError, ssl.SSLError) as e:
            raise StreamError("connect", f"cannot connect to {host}:{port}: {e.strerror or e}") from None
        self._open.add(conn)
        return conn

    def take(self, key: tuple) -> StreamConnection | None:
        """An idle kept-alive connection to ``key``, or None."""
        idle = self._idle.get(key)
        while idle:
            c = idle.pop()
            if not c.closed:
                return c
            self._open.discard(c)
        return None

    def release(self, conn: StreamConnection) -> None:
        """Back to the pool if its response ended cleanly and the server keeps it alive, else closed."""
        if conn.reusable:
            self._idle.setdefault(conn.key, []).append(conn)
            return
        self._open.discard(conn)
        if conn.transport is not None and not conn.closed:
            conn.transport.abort()


def build_request(url: str, body: bytes, headers: dict) -> tuple[tuple, bytes]:
    """``((scheme, host, port), request bytes)`` of a POST of ``body`` (JSON bytes) to ``url``. User info in the
    URL (``http://user:pass@host/...``) becomes Basic authorization unless ``headers`` carry one.

    Raises:
        ValueError: not an http(s) URL with a host, or a header holding a line break or NUL.
    """
    p = urlsplit(url)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ValueError(f"not an http(s) URL with a host: {url!r}")
    port = p.port or (443 if p.scheme == "https" else 80)
    hostport = p.netloc.rsplit("@", 1)[-1]
    target = (p.path or "/") + (f"?{p.query}" if p.query else "")
    h = {
        "Host": hostport,
        "User-Agent": f"kit/{__version__}",
        "Accept-Encoding": "identity",
        "Content-Length": str(len(body)),
    }
    if p.username is not None and not any(k.lower() == "authorization" for k in headers):
        cred = f"{p.username}:{p.password or ''}".encode()
        h["Authorization"] = "Basic " + base64.b64encode(cred).decode()
    h.update(headers)
    bad = [k for k, v in h.items() if any(c in f"{k}{v}" for c in "\r\n\0")]
    if bad:  # a line break in a name or value would inject headers (or a second request) of its own
        raise ValueError(f"header {bad[0]!r} holds a line break or NUL: refused")
    lines = [f"POST {target} HTTP/1.1"] + [f"{k}: {v}" for k, v in h.items()]
    return (p.scheme, p.hostname, port), ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
