"""The streamed requests' HTTP/1.1 client (kit.serve.http1) against a raw asyncio server that writes exactly the
bytes a test gives it: every framing (chunked split at every byte, Content-Length, close-delimited, interim 1xx,
trailers), bad framing, keep-alive reuse and a kept-alive connection the server dropped."""

from __future__ import annotations

import asyncio
import json

import pytest

from kit.serve.client import StreamLimits, stream_request
from kit.serve.http1 import StreamConnection, StreamError, StreamPool, build_request

HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def events(*texts, usage=True) -> bytes:
    out = b""
    for t in texts:
        out += b"data: " + json.dumps({"id": "c", "choices": [{"index": 0, "text": t}]}).encode() + b"\n\n"
    if usage:
        u = {"id": "c", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": len(texts)}}
        out += b"data: " + json.dumps(u).encode() + b"\n\ndata: [DONE]\n\n"
    return out


def chunked(body: bytes, size: int = 7) -> bytes:
    frames = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"


class Collect:
    def __init__(self):
        self.data, self.stamps = b"", []

    def __call__(self, raw: bytes, now: float) -> None:
        self.data += raw
        self.stamps.append(now)


def run(coro):
    return asyncio.run(coro)


async def serve(responses: list, *, close_after: bool = False):
    """A server answering each request on a connection with the next item of ``responses`` (bytes, or a list
    of bytes pieces written one by one); ``close_after`` closes each connection after its one response."""
    seen = {"conns": 0, "requests": []}

    async def handle(reader, writer):
        seen["conns"] += 1
        try:
            while responses:
                head = await reader.readuntil(b"\r\n\r\n")
                n = int([ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0][15:])
                seen["requests"].append(head + await reader.readexactly(n))
                resp = responses.pop(0)
                for piece in resp if isinstance(resp, list) else [resp]:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1/completions", seen


async def one(pool, url, **kw):
    limits = StreamLimits(5, 2, **kw)
    return await stream_request(pool, url, {"model": "m", "stream": True}, {"Accept": "text/event-stream"}, limits)


@pytest.mark.parametrize("size", [1, 3, 64, 4096])
def test_chunked_split_at_every_boundary_gives_the_same_events(size):
    body = events("a", "b", "c")
    raw = HEAD_CHUNKED + chunked(body, size)

    async def main():
        pieces = [raw[i : i + 5] for i in range(0, len(raw), 5)]  # reads cut through sizes, CRLFs and data
        srv, url, _ = await serve([pieces])
        async with srv, StreamPool() as pool:
            return await one(pool, url)

    cap = run(main())
    assert cap.error is None and cap.chunk_texts == ["a", "b", "c"] and cap.usage["completion_tokens"] == 3


def test_every_body_framing_and_interim_responses():
    body = events("x", "y")
    framings = [
        b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD_CHUNKED + chunked(body),
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
        HEAD_CHUNKED + chunked(body)[:-2] + b"X-Trailer: 1\r\n\r\n",
    ]
    for raw in framings:

        async def main(raw=raw):
            srv, url, _ = await serve([raw])
            async with srv, StreamPool() as pool:
                return await one(pool, url)

        cap = run(main())
        assert cap.error is None and cap.chunk_texts == ["x", "y"], (raw[:40], cap.error)

    async def until_close():  # no length, no chunking: the body ends when the server closes
        srv, url, _ = await serve([b"HTTP/1.1 200 OK\r\n\r\n" + body], close_after=True)
        async with srv, StreamPool() as pool:
            return await one(pool, url)

    cap = run(until_close())
    assert cap.error is None and cap.chunk_texts == ["x", "y"]


def test_broken_framing_and_cut_streams_are_failed_requests():
    cases = [
        (HEAD_CHUNKED + b"zz\r\nabc\r\n", "broken stream: bad chunked encoding"),
        (HEAD_CHUNKED + b"3\r\nabcXY", "broken stream: bad chunked encoding (no CRLF"),
        (HEAD_CHUNKED + chunked(events("a"))[:30], "broken stream: the connection closed before the end"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\ndata: x", "broken stream"),
        (b"SPDY/3 200 OK\r\n\r\n", "not an HTTP/1.x response"),
        (b"", "server disconnected: the server closed the connection before a response"),
    ]
    for raw, match in cases:

        async def main(raw=raw):
            srv, url, _ = await serve([raw], close_after=True)
            async with srv, StreamPool() as pool:
                return await one(pool, url)

        cap = run(main())
        assert cap.error is not None and match in cap.error, (raw[:40], cap.error)


def test_error_status_keeps_its_body_and_redirects_are_not_followed():
    async def main():
        srv, url, _ = await serve([
            b"HTTP/1.1 422 Unprocessable\r\nContent-Length: 19\r\n\r\n{\"detail\":\"no eos\"}",
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://elsewhere/v1\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 14\r\n\r\n404: Not Found",
        ])  # fmt: skip
        async with srv, StreamPool() as pool:
            return await one(pool, url), await one(pool, url), await one(pool, url), url

    err, redirect, missing, url = run(main())
    assert err.http_status == 422 and err.error == 'HTTP 422: {"detail":"no eos"}'
    assert "HTTP 307 redirect to http://elsewhere/v1 not followed" in redirect.error
    assert missing.error == f"HTTP 404 (POST {url}): 404: Not Found"  # a wrong path names what was posted to


def test_keep_alive_reuses_one_connection_and_replaces_a_dropped_one():
    body = HEAD_CHUNKED + chunked(events("k"))

    async def reuse():
        srv, url, seen = await serve([body, body, body])
        async with srv, StreamPool() as pool:
            caps = [await one(pool, url) for _ in range(3)]
        return caps, seen

    caps, seen = run(reuse())
    assert all(c.error is None for c in caps) and seen["conns"] == 1 and len(seen["requests"]) == 3
    assert b"Host: 127.0.0.1:" in seen["requests"][0] and b"Content-Length:" in seen["requests"][0]

    async def dropped():  # the server closes each connection after one response: the idle one is dead
        srv, url, seen = await serve([body, body], close_after=True)
        async with srv, StreamPool() as pool:
            first = await one(pool, url)
            await asyncio.sleep(0.05)  # the close reaches the pool's idle connection
            return first, await one(pool, url), seen

    first, second, seen = run(dropped())
    assert first.error is None and second.error is None and seen["conns"] == 2


def test_a_stalled_body_times_out_and_its_connection_is_not_reused():
    async def main():
        srv, url, seen = await serve([[HEAD_CHUNKED + chunked(events("s"))[:20]], HEAD_CHUNKED + chunked(events("t"))])
        async with srv, StreamPool() as pool:
            stalled = await stream_request(pool, url, {}, {}, StreamLimits(5, 0.3))
            return stalled, await one(pool, url), seen

    stalled, after, seen = run(main())
    assert "stalled (no data for 0.3 s)" in stalled.error, stalled.error
    assert after.error is None and seen["conns"] == 2  # a fresh connection, not the half-read one


def test_user_info_becomes_basic_auth_and_bad_urls_are_refused():
    key, req = build_request("https://ann:pw@example.com:8443/v1/x?a=1", b"{}", {"Accept": "text/event-stream"})
    assert key == ("https", "example.com", 8443)
    assert req.startswith(b"POST /v1/x?a=1 HTTP/1.1\r\nHost: example.com:8443\r\n")
    assert b"Authorization: Basic YW5uOnB3\r\n" in req and b"ann" not in req.split(b"\r\n")[1]
    _, req = build_request("http://ann:pw@h/v1", b"", {"Authorization": "Bearer k"})
    assert b"Basic" not in req and b"Bearer k" in req
    with pytest.raises(ValueError, match="not an http"):
        build_request("ftp://h/x", b"", {})


def test_a_refused_connection_is_a_connect_error():
    async def main():
        srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        srv.close()
        await srv.wait_closed()
        async with StreamPool() as pool:
            with pytest.raises(StreamError) as e:
                await pool.connect(("http", "127.0.0.1", port), 2)
            return e.value

    err = run(main())
    assert err.kind == "connect" and "cannot connect to 127.0.0.1" in str(err)
    assert issubclass(StreamConnection, asyncio.Protocol)


class _Transport:
    def __init__(self):
        self.aborted = False

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


def _fed(reads: list[bytes]):
    """A StreamConnection given ``reads`` (after a chunked 200 head) directly, one data_received each: what its
    sink got per read, and the connection."""

    async def go():
        conn = StreamConnection(("http", "x", 80))
        conn.connection_made(_Transport())
        sink = Collect()
        conn.start(b"", sink)
        conn.data_received(HEAD_CHUNKED)
        for r in reads:
            conn.data_received(r)
        return sink, conn

    return asyncio.run(go())


def test_whole_frame_reads_decode_exactly_as_the_general_path():
    """Reads made of whole frames take the split-once path; every grouping of the frames, whatever their data
    holds (CRLF inside a frame's data, a lone CR or LF, upper-case hex, a chunk extension, the last frame), gives
    the same body as the byte-by-byte general path."""
    datas = [b"data: a\n\n", b"x\r\ny", b"\r\n", b"\r", b"\n", b"p" * 300, b"data: b\n\n"]
    frames = [b"%x\r\n%s\r\n" % (len(d), d) for d in datas]
    frames.insert(2, b"%X;ext=1\r\n%s\r\n" % (len(b"Z" * 171), b"Z" * 171))  # upper-case hex and an extension
    frames.append(b"0\r\n\r\n")
    whole = b"".join(frames)
    want = b"".join(datas[:2]) + b"Z" * 171 + b"".join(datas[2:])
    ref, conn = _fed([whole[i : i + 1] for i in range(len(whole))])
    assert ref.data == want and conn.done.done() and conn.reusable
    for group in (1, 2, 3, len(frames)):
        reads = [b"".join(frames[i : i + group]) for i in range(0, len(frames), group)]
        sink, conn = _fed(reads)
        assert sink.data == want and conn.done.done() and conn.reusable, group
        assert len(sink.stamps) <= len(reads)  # one sink call per read at most


def test_a_whole_frame_read_with_a_wrong_size_is_broken_framing():
    sink, conn = _fed([b"5\r\nabcdefg\r\n"])  # the size says 5, the data runs on
    assert conn.done.done() and isinstance(conn.done.exception(), StreamError)
    assert conn.transport.aborted and b"fg" not in sink.data


def test_a_plain_json_answer_to_a_streaming_request_says_it_is_not_a_stream():
    body = json.dumps({"id": "c", "choices": [{"index": 0, "text": "whole answer", "finish_reason": "stop"}]})
    resp = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body.encode(),
    )

    async def go():
        srv, url, _ = await serve([resp])
        async with srv, StreamPool() as pool:
            return await one(pool, url)

    cap = run(go())
    assert "Content-Type 'application/json'" in cap.error and "not a stream" in cap.error
    assert cap.http_status == 200 and not cap.chunk_times
