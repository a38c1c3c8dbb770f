"""The tour's HTTP server in-process, without a browser: Ctrl-C and Stop (generations, launches under way), strict
JSON for 1-token answers, the endpoint's model, and requests refused before any work. The "launched" engine is a
Python process that never becomes ready (a launch that would take minutes), started through the real launcher."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from sse_server import start_in_thread

from kit import cli
from kit.tour.context import TourContext
from kit.tour.server import TourServer

pytestmark = pytest.mark.slow

SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"non-JSON number {name} sent to the page")

    return json.loads(text, parse_constant=refuse)


def post(tour, path: str, body, events: list | None = None, timeout: float = 60) -> tuple[int, object]:
    """POST ``body`` (a dict, or bytes as sent); returns (status, the JSON answer or the list of events). With
    ``events``, each event is appended as it arrives (a caller in another thread watches it)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Cookie": f"{tour.cookie}={tour.token}", "Content-Type": "application/json"}
    req = urllib.request.Request(tour.url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if r.headers.get("Content-Type", "").startswith("text/event-stream"):
                out = events if events is not None else []
                for line in r:
                    if line.startswith(b"data: "):
                        out.append(_strict(line[6:].decode()))
                return r.status, out
            return r.status, _strict(r.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def in_thread(fn, *args) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def wait_for(cond, timeout: float = 30.0, what: str = "") -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def ctx(tiny_model):
    c = TourContext()
    c.models.put("tiny-llama", "float32", "cpu", tiny_model)
    return c


@pytest.fixture(scope="module")
def scripted():
    srv = start_in_thread()
    yield srv.url
    srv.stop()


@pytest.fixture()
def sleeper(tmp_path, monkeypatch):
    """A checkpoint directory and a launch that never becomes ready; returns (checkpoint, pid file)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    pid_file = tmp_path / "server.pid"
    monkeypatch.setattr(
        "kit.serve.launch.build_command", lambda spec: ([sys.executable, "-c", SLEEPER, str(pid_file)], {})
    )
    return ckpt, pid_file


def test_ctrl_c_stops_a_long_generation_at_once_and_exits_130(ctx, monkeypatch, capsys):
    events: list = []
    seen: dict = {}

    def wait(self):  # the tour's wait, interrupted by Ctrl-C while a 4096-token generation streams
        body = {"prompt": "a long one", "source": "in-process", "max_tokens": 4096}
        seen["stream"] = in_thread(post, self, "/api/generate", body, events)
        wait_for(lambda: sum(e["type"] == "token" for e in events) >= 3, what="tokens")
        seen["tour"], seen["t0"] = self, time.monotonic()
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()  # a real Ctrl-C
        real_wait(self)

    real_wait = TourServer.wait
    monkeypatch.setattr("kit.tour.cli._context", lambda args: ctx)
    monkeypatch.setattr(TourServer, "wait", wait)
    rc = cli.main(["tour", "--port", "0"])
    took = time.monotonic() - seen["t0"]
    seen["stream"].join(10)
    assert rc == 130 and took < 5, (rc, took)
    assert "interrupted" in capsys.readouterr().err
    kinds = [e["type"] for e in events]
    assert kinds.count("token") < 4096 and kinds[-1] in ("token", "stopped"), kinds[-3:]
    # no torch thread left running: a daemon thread inside torch at interpreter exit aborts the process (134)
    assert "kit-tour-torch" not in [t.name for t in threading.enumerate()]


def test_stop_and_ctrl_c_cancel_a_launch_under_way_and_kill_its_process_group(ctx, sleeper, tmp_path):
    ckpt, pid_file = sleeper
    body = {"prompt": "hi", "source": "launch", "server": "transformers", "model": str(ckpt), "max_tokens": 4}
    with TourServer(ctx=ctx, out_dir=tmp_path / "out") as tour:
        # Stop on the page before the first token: the launch is cancelled, the page told "stopped"
        events: list = []
        t = in_thread(post, tour, "/api/generate", body, events)
        wait_for(pid_file.exists, what="the server process")
        pid = int(pid_file.read_text())
        job = next(e["id"] for e in events if e["type"] == "job")
        t0 = time.monotonic()
        assert post(tour, "/api/stop", {"id": job})[1] == {"stopped": True}
        t.join(15)
        assert not t.is_alive() and time.monotonic() - t0 < 10
        assert events[-1]["type"] == "stopped" and "launch was cancelled" in events[-1]["message"], events[-1]
        assert gone(pid) and tour.status()["servers"] == []
        # the tour stopping (Ctrl-C) while a launch waits: it returns promptly and the server is gone
        pid_file.unlink()
        events = []
        t = in_thread(post, tour, "/api/generate", body, events)
        wait_for(pid_file.exists, what="the second server process")
        pid = int(pid_file.read_text())
        t0 = time.monotonic()
    took = time.monotonic() - t0  # __exit__: tour.stop()
    t.join(10)
    assert took < 10 and gone(pid), took


def test_a_launch_refuses_a_hub_name_and_names_the_interpreter_option(ctx, tmp_path):
    with TourServer(ctx=ctx, out_dir=tmp_path) as tour:
        hub = {"prompt": "hi", "source": "launch", "server": "transformers", "model": "tiny-llama", "max_tokens": 2}
        assert "not a local checkpoint directory" in post(tour, "/api/generate", hub)[1][-1]["message"]
        ckpt = tmp_path / "c"
        ckpt.mkdir()
        (ckpt / "config.json").write_text("{}")
        vllm = {**hub, "server": "vllm", "model": str(ckpt)}
        last = post(tour, "/api/generate", vllm)[1][-1]
        if last["type"] == "error":  # vLLM is not in this environment (the usual case here)
            assert "--server-python" in last["message"] and "vllm is not installed" in last["message"]


def test_one_token_answers_are_strict_json_and_say_why_timings_are_missing(ctx, scripted, tmp_path):
    with TourServer(ctx=ctx, out_dir=tmp_path) as tour:
        for extra in ({"source": "in-process"}, {"source": "url", "url": scripted, "model": "normal"}):
            status, events = post(tour, "/api/generate", {"prompt": "hi there", "max_tokens": 1, **extra})
            summ = next(e for e in events if e["type"] == "summary")
            assert status == 200 and not [e for e in events if e["type"] == "error"], events
            assert summ["summary"]["itl_ms_p50"] is None and summ["summary"]["tpot_ms"] is None
            assert "TPOT n/a (1 token)" in summ["line"] and "1 output token ·" in summ["line"]


def test_malformed_requests_are_refused_with_400_and_one_line(ctx, tmp_path, caplog):
    with TourServer(ctx=ctx, out_dir=tmp_path) as tour:
        for body, says in (
            (b"{not json", "the request body is not JSON"),
            ({"prompt": "hi", "stall_s": 0}, "stall_s=0: give a number of seconds from 1 to 600"),
            ({"prompt": "hi", "stall_s": 601}, "stall_s=601"),
            ({"prompt": "hi", "max_tokens": 4097}, "max_tokens=4097"),
            ({"prompt": "hi", "source": "ftp"}, "source 'ftp'"),
            ({"prompt": "hi", "server": "nginx"}, "server 'nginx'"),
            ({"prompt": "hi", "colour": 1}, "unknown field(s) ['colour']"),
            ({"prompt": 5}, "prompt=5: give text"),
            ([1, 2], "a JSON object"),
        ):
            status, text = post(tour, "/api/generate", body)
            err = json.loads(text)["error"]
            assert status == 400 and says in err and "\n" not in err, (body, status, text)
        status, text = post(tour, "/api/lesson/kv", b"nope")
        assert status == 400 and "not JSON" in json.loads(text)["error"]
    assert "Traceback" not in caplog.text


def test_the_endpoint_model_is_the_one_asked_for_the_first_listed_by_default(ctx, scripted, tmp_path):
    with TourServer(ctx=ctx, out_dir=tmp_path, url=scripted, served_model="slow") as tour:
        req = urllib.request.Request(tour.page_url.replace("/?", "/api/lessons?"))
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.loads(r.read())["defaults"]["served_model"] == "slow"  # --served-model reaches the page
        ask = {"prompt": "hi", "source": "url", "url": scripted, "max_tokens": 2}
        events = post(tour, "/api/generate", {**ask, "model": "nope-model"})[1]
        assert events[-1]["type"] == "error" and "does not serve model 'nope-model'" in events[-1]["message"]
        assert "it serves: normal" in events[-1]["message"]
        events = post(tour, "/api/generate", {**ask, "model": "fast"})[1]
        assert next(e for e in events if e["type"] == "start")["model"] == "fast"
        events = post(tour, "/api/generate", ask)[1]
        note = next(e for e in events if e["type"] == "note")["message"]
        assert (
            "model: normal (the first" in note and next(e for e in events if e["type"] == "start")["model"] == "normal"
        )
