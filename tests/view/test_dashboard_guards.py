"""kit dashboard cannot be turned against its user (issue 11 item 4): a token per launch, local Host/Origin names
only (DNS rebinding), no unbounded growth after a widget-control client leaves, idle kernels culled, no orphaned
Voilà after SIGTERM or SIGKILL of `kit dashboard`. Real Voilà servers on 127.0.0.1, raw HTTP and websocket clients.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from jupyter_server.services.kernels.connection.base import serialize_binary_message, serialize_msg_to_ws_v1

from kit.view.dashboard import launch, voila_command, voila_server
from kit.view.guard import host_is_local, origin_is_local
from kit.view.voila_app import WS_V1, message_header, scrub_uri

CULL_S = 4


# ------------------------------------------------------------------------------------------ pure parts
def test_local_names_only():
    for h in ("127.0.0.1:8866", "localhost", "LocalHost.:80", "[::1]:8866", "::1", "127.0.0.1"):
        assert host_is_local(h), h
    for h in ("evil.example:8866", "127.0.0.1.evil.example", "127.0.0.2", "0.0.0.0:1", "localhost:x", "", None):
        assert not host_is_local(h), h
    assert origin_is_local(None) and origin_is_local("http://localhost:8866")
    assert not origin_is_local("http://evil.example:8866") and not origin_is_local("null")


def test_message_header_reads_both_protocols_with_bounded_work():
    """Case: Voilà read a legacy binary message as v1; its first 8 bytes became an offset count of ~10^17."""
    msg = {
        "header": {"msg_type": "comm_msg", "msg_id": "1"},
        "parent_header": {},
        "metadata": {},
        "content": {"data": {"method": "update_states"}},
        "buffers": [b"\x89PNG" * 1000],
        "channel": "iopub",
    }
    legacy = serialize_binary_message(msg)
    assert int.from_bytes(legacy[:8], "little") > 10**15  # what Voilà 0.5 iterated over
    assert message_header(legacy, None)["msg_type"] == "comm_msg"
    parts = [json.dumps(msg[k]).encode() for k in ("header", "parent_header", "metadata", "content")]
    v1 = serialize_msg_to_ws_v1(parts, "iopub")
    assert message_header(v1, WS_V1)["msg_type"] == "comm_msg"
    text = json.dumps({k: v for k, v in msg.items() if k != "buffers"})
    assert message_header(text, None)["msg_id"] == "1" and message_header(msg, WS_V1)["msg_id"] == "1"
    t0 = time.perf_counter()
    for bad in (b"", b"\xff" * 16, struct.pack("!I", 2**31) + b"\0" * 12, (2**62).to_bytes(8, "little") + b"\0" * 8):
        assert message_header(bad, None) is None and message_header(bad, WS_V1) is None
    assert message_header(legacy, WS_V1) is None  # the wrong protocol reads as nothing, in bounded time
    assert time.perf_counter() - t0 < 0.5


def test_token_is_never_on_the_command_line_and_is_scrubbed_from_log_lines(tmp_path):
    cmd = voila_command(tmp_path / "d.ipynb", 9999)
    assert cmd[1:3] == ["-m", "kit.view.voila_app"] and "--Voila.auto_token=True" in cmd
    a, b = voila_server(tmp_path / "d.ipynb", 9999, tmp_path / "v.log"), voila_server(tmp_path / "d.ipynb", 9, "v")
    assert a.token != b.token and a.env["JUPYTER_TOKEN"] == a.token and not any(a.token in x for x in a.argv)
    assert scrub_uri("/?token=abc&x=1") == "/?token=[secret]&x=1" and scrub_uri("/a?b=1") == "/a?b=1"


# ------------------------------------------------------------------------------------------ a real server
@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    out = tmp_path_factory.mktemp("dash")
    srv = launch(out_dir=out, port=0, device="cpu", cull_idle_s=CULL_S)
    yield srv, out
    srv.stop()


def _get(srv, path, host=None, headers=None):
    port = int(srv.url.rsplit(":", 1)[1])
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    h = {"Host": host or f"127.0.0.1:{port}", **(headers or {})}
    c.request("GET", path, headers=h)
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body


def _voila_proc(srv) -> psutil.Process:
    return psutil.Process(srv.proc.pid)


@pytest.mark.slow
def test_requests_without_the_token_or_naming_a_foreign_host_are_refused(dashboard):
    srv, _ = dashboard
    port = int(srv.url.rsplit(":", 1)[1])
    assert srv.page_url == f"{srv.url}/?token={srv.token}" and len(srv.token) >= 32
    for path in (
        "/",
        "/?token=wrong",
        "/api/kernels",
        "/api/kernels/x/channels",
        "/voila/files/dashboard.ipynb",
        "/login",
    ):
        assert _get(srv, path)[0] in (401, 403), path
    assert _get(srv, "/voila/static/voila.js")[0] == 200  # the readiness probe: a static asset, no kernel
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"192.168.1.2:{port}"):
        for path in (f"/?token={srv.token}", f"/api/kernels?token={srv.token}", "/voila/static/voila.js"):
            assert _get(srv, path, host=host)[0] == 403, (host, path)
    kernel = f"/api/kernels/{uuid.uuid4()}"  # no such kernel: refused without the token, 404 with it
    assert _get(srv, kernel)[0] == 403 and _get(srv, f"{kernel}?token={srv.token}")[0] == 404


def _msg(session, msg_type, content, metadata=None):
    header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": session, "username": "", "version": "5.3"}
    return json.dumps(
        {"header": header, "parent_header": {}, "metadata": metadata or {}, "channel": "shell", "content": content}
    )


async def _control_client_then_leave(ws_url: str, headers: dict) -> list[str]:
    """Open the widget control channel with the legacy protocol, ask for the widget states, leave."""
    import aiohttp

    session, comm = uuid.uuid4().hex, uuid.uuid4().hex
    seen = []
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url, headers=headers) as ws:
            open_ = {"comm_id": comm, "target_name": "jupyter.widget.control", "data": {}}
            await ws.send_str(_msg(session, "comm_open", open_, metadata={"version": "1.0.0"}))
            await ws.send_str(_msg(session, "comm_msg", {"comm_id": comm, "data": {"method": "request_states"}}))
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20 and not any("update_states" in m for m in seen):
                try:
                    r = await asyncio.wait_for(ws.receive(), 1.0)
                except TimeoutError:
                    continue
                if r.type == aiohttp.WSMsgType.BINARY:
                    seen.append(r.data.decode("utf-8", "replace"))
                elif r.type == aiohttp.WSMsgType.TEXT:
                    seen.append(r.data)
    return seen


async def _handshake_status(ws_url: str, headers: dict) -> int:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        try:
            async with s.ws_connect(ws_url, headers=headers):
                return 101
        except aiohttp.WSServerHandshakeError as e:
            return e.status


@pytest.mark.slow
def test_control_channel_client_that_leaves_leaves_the_server_bounded_and_its_kernel_is_culled(dashboard):
    """Case: a client opened the widget control channel and left; Voilà then grew ~30 MB/s for good."""
    srv, out = dashboard
    port = int(srv.url.rsplit(":", 1)[1])
    status, body = _get(srv, f"/?token={srv.token}")  # renders the panel in a new kernel
    assert status == 200
    kernel_id = re.search(r'"kernelId":\s*"([0-9a-f-]+)"', body.decode()).group(1)
    kernels = [p for p in _voila_proc(srv).children(recursive=True) if "ipykernel" in " ".join(p.cmdline())]
    assert len(kernels) == 1
    ws_url = f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?session_id=s1&token={srv.token}"
    local = {"Origin": f"http://127.0.0.1:{port}"}
    # the kernel websocket refuses a foreign Origin, and a rebinding page (its own name as Host and Origin)
    assert asyncio.run(_handshake_status(ws_url, {"Origin": f"http://evil.example:{port}"})) == 403
    rebind = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    assert asyncio.run(_handshake_status(ws_url, rebind)) == 403
    rss0 = _voila_proc(srv).memory_info().rss
    seen = asyncio.run(_control_client_then_leave(ws_url, local))
    assert any("update_states" in m for m in seen), "the widget states (legacy binary) never came back"
    samples = []
    for _ in range(6):
        time.sleep(1.0)
        t0 = time.monotonic()
        assert _get(srv, "/voila/static/voila.js")[0] == 200  # the event loop still serves
        assert time.monotonic() - t0 < 2.0
        samples.append(_voila_proc(srv).memory_info().rss)
    assert max(samples) - rss0 < 40 * 2**20, [s >> 20 for s in samples]
    assert max(samples) - min(samples) < 10 * 2**20, [s >> 20 for s in samples]  # not growing
    # the gone client's idle kernel is shut down by the culler (CULL_S idle, checked every CULL_S s)
    gone, alive = psutil.wait_procs(kernels, timeout=6 * CULL_S + 10)
    assert not alive, "the idle kernel of a gone client was not culled"
    # the token is in no file the dashboard wrote (log, notebook)
    for f in out.rglob("*"):
        if f.is_file():
            assert srv.token not in f.read_text(errors="replace"), f


def _open_page(srv) -> tuple[str, psutil.Process]:
    """Load the page (a new kernel runs the panel): the kernel's id and its process."""
    before = {p.pid for p in _voila_proc(srv).children(recursive=True)}
    status, body = _get(srv, f"/?token={srv.token}")
    assert status == 200
    kernel_id = re.search(r'"kernelId":\s*"([0-9a-f-]+)"', body.decode()).group(1)
    new = [
        p
        for p in _voila_proc(srv).children(recursive=True)
        if p.pid not in before and "ipykernel" in " ".join(p.cmdline())
    ]
    assert len(new) == 1, new
    return kernel_id, new[0]


async def _send_frames(ws_url: str, headers: dict, frames: list, protocols=()) -> str:
    """Connect, send each frame (bytes: binary, str: text), wait up to 5 s for the server to close; how it ended."""
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url, headers=headers, protocols=protocols) as ws:
            for f in frames:
                await (ws.send_bytes(f) if isinstance(f, bytes) else ws.send_str(f))
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5:
                try:
                    r = await asyncio.wait_for(ws.receive(), 1.0)
                except TimeoutError:
                    continue
                if r.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    return f"closed {ws.close_code}"
            return "open"


def _answers_and_stays_bounded(srv, rss0: int, seconds: int = 6) -> list[int]:
    samples = []
    for _ in range(seconds):
        time.sleep(1.0)
        t0 = time.monotonic()
        assert _get(srv, "/voila/static/voila.js")[0] == 200  # the event loop still serves
        assert time.monotonic() - t0 < 2.0
        samples.append(_voila_proc(srv).memory_info().rss)
    assert max(samples) - rss0 < 40 * 2**20, [s >> 20 for s in [rss0, *samples]]
    assert max(samples) - min(samples) < 10 * 2**20, [s >> 20 for s in samples]  # not growing
    return samples


@pytest.mark.slow
def test_a_frame_with_a_huge_length_field_does_not_wedge_the_server(dashboard):
    """Issue 28 item 2: one 24-byte v1 frame (an offset count of 2^60, then zeros) from a token holder stopped
    Voilà answering and grew it 20-30 MB/s. The same kind in the legacy binary format (a part count of 2^31-1)."""
    srv, _ = dashboard
    port = int(srv.url.rsplit(":", 1)[1])
    kernel_id, _kernel = _open_page(srv)
    url = f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?token={srv.token}&session_id="
    local = {"Origin": f"http://127.0.0.1:{port}"}
    frames = {
        WS_V1: [(2**60).to_bytes(8, "little") + b"\0" * 16, (2**63).to_bytes(8, "little"), b"\x06" + b"\0" * 7],
        None: [struct.pack("!i", 2**31 - 1) + b"\0" * 20, struct.pack("!i", -5) + b"\0" * 8],
    }
    # a well-formed v1 message reaches the kernel: a kernel_info request is answered
    assert "kernel_info_reply" in asyncio.run(_reply_types(url + uuid.uuid4().hex, local, _kernel_info()))
    rss0 = _voila_proc(srv).memory_info().rss
    for protocol, bad in frames.items():  # one after the other (the culler shuts an unconnected kernel down in 4 s)
        for frame in bad:
            ended = asyncio.run(_send_frames(url + uuid.uuid4().hex, local, [frame], (protocol,) if protocol else ()))
            assert ended.startswith("closed"), (protocol, frame[:8], ended)  # refused, not read
    assert "kernel_info_reply" in asyncio.run(_reply_types(url + uuid.uuid4().hex, local, _kernel_info()))
    _answers_and_stays_bounded(srv, rss0)


def _kernel_info() -> bytes:
    """A new kernel_info_request in the v1 format (a new id each time: the kernel refuses a replayed signature)."""
    ids = uuid.uuid4().hex, uuid.uuid4().hex
    header = {"msg_id": ids[0], "msg_type": "kernel_info_request", "session": ids[1], "username": "", "version": "5.3"}
    return serialize_msg_to_ws_v1([json.dumps(x).encode() for x in (header, {}, {}, {})], "shell")


async def _reply_types(ws_url: str, headers: dict, frame: bytes) -> set:
    import aiohttp

    seen = set()
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url, headers=headers, protocols=(WS_V1,)) as ws:
            await ws.send_bytes(frame)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20 and "kernel_info_reply" not in seen:
                try:
                    r = await asyncio.wait_for(ws.receive(), 1.0)
                except TimeoutError:
                    continue
                if r.type == aiohttp.WSMsgType.BINARY:
                    seen.add((message_header(r.data, WS_V1) or {}).get("msg_type"))
                elif r.type != aiohttp.WSMsgType.TEXT:
                    break
    return seen


@pytest.mark.slow
def test_the_token_reaches_no_log_and_no_kernel_environment(dashboard):
    """Issue 28 item 3: the token reached OUT/voila.log through tornado's request repr after an uncaught exception,
    and sat in every page kernel's environment (QUERY_STRING)."""
    srv, out = dashboard
    port = int(srv.url.rsplit(":", 1)[1])
    kernel_id, kernel = _open_page(srv)
    env = kernel.environ()
    assert "QUERY_STRING" in env and "SCRIPT_NAME" in env  # what Voilà gives a page kernel: read, and clean
    assert not [k for k, v in env.items() if srv.token in v or srv.token in k]
    # uncaught exceptions in the kernel websocket handler (a text frame where v1 needs binary, invalid JSON in the
    # legacy protocol): tornado logs each with the request
    ws_url = f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?session_id=s4&token={srv.token}"
    local = {"Origin": f"http://127.0.0.1:{port}"}
    asyncio.run(_send_frames(ws_url, local, ["not a v1 binary message"], (WS_V1,)))
    asyncio.run(_send_frames(ws_url, local, ["{not json"]))
    log = out / "voila.log"
    t0 = time.monotonic()
    while log.read_text(errors="replace").count("Uncaught exception") < 2 and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    text = log.read_text(errors="replace")
    assert text.count("Uncaught exception") >= 2, text[-2000:]  # the path that leaked was taken
    assert "token=[secret]" in text
    for f in out.rglob("*"):
        if f.is_file():
            assert srv.token not in f.read_text(errors="replace"), f


def _start_cli(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "kit", "dashboard", "--port", "0", "--out", str(tmp_path / "d"), "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    line = proc.stdout.readline()
    assert "serving on http://127.0.0.1:" in line and "/?token=" in line, line
    voila = [p for p in psutil.Process(proc.pid).children(recursive=True) if "kit.view.voila_app" in p.cmdline()]
    assert len(voila) == 1
    return proc, voila[0], line


@pytest.mark.slow
def test_sigterm_to_kit_dashboard_stops_voila(tmp_path):
    """Case: SIGTERM to `kit dashboard` left Voilà orphaned and serving."""
    proc, voila, line = _start_cli(tmp_path)
    token = line.split("?token=")[1].split()[0]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    gone, alive = psutil.wait_procs([voila], timeout=20)
    assert not alive, "voila outlived kit dashboard"
    for f in (tmp_path / "d").rglob("*"):
        if f.is_file():
            assert token not in f.read_text(errors="replace"), f
