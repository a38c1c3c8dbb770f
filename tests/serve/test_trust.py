"""What the served client can be trusted with: secrets never reach a file or a printed line, redirects are not
followed, a second server never overwrites the first's detail, a silent server ends quickly with progress shown,
an endless line fails one request with bounded memory, and bad numbers are one-line errors (issue 11: items 1,
2, 8, 10, 11, 12; issue 10 item 8: messages)."""

import json
import time
from pathlib import Path

import pytest
from sse_server import chars, dead_url, start_in_thread

from kit.serve import loop as loop_mod
from kit.serve.cli import summary_line
from kit.serve.client import get_model_id, load_tokenizer
from kit.serve.load import LoadConfig
from kit.serve.loop import run_coro
from kit.serve.point import measure_point, served_point_id
from kit.serve.redact import redact_url, scrub, secrets_of
from kit.serve.sweep import run_served_sweep

PASSWORD, TOKEN, KEY = "Pa55w0rdXYZ", "tok3nSECRET99", "sk-kit-secret-777"


def _cli(argv, capsys):
    from kit.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _with_credentials(url: str) -> str:
    return url.replace("http://", f"http://kituser:{PASSWORD}@") + f"/?token={TOKEN}&gap_ms=1"


def test_redact_url_and_scrub():
    url = f"http://kituser:{PASSWORD}@h:8000/v1?api_key={TOKEN}&x=1"
    assert redact_url(url) == "http://***@h:8000/v1?api_key=***&x=1"
    assert redact_url("http://h:1/v1") == "http://h:1/v1" and redact_url("http://u:p@[::1") == "http://***"
    secrets = secrets_of(url)
    assert PASSWORD in secrets and TOKEN in secrets
    assert scrub(f"failed: {url} said {PASSWORD}", secrets).count("***") >= 2
    assert PASSWORD not in scrub(f"{url}", secrets) and TOKEN not in scrub(url, secrets)


@pytest.mark.slow
def test_no_secret_reaches_a_file_or_a_printed_line(scripted, tmp_path, capsys, monkeypatch, caplog):
    monkeypatch.setenv("KIT_TEST_API_KEY", KEY)
    url = _with_credentials(scripted.url)
    common = ["--api-key-env", "KIT_TEST_API_KEY", "--num-requests", "4", "--warmup", "1", "--osl", "4"]
    printed = []
    with caplog.at_level("DEBUG", logger="kit"):
        for model, out in (("normal", "ok"), ("flaky", "flaky"), ("nosuch", "bad")):  # succeeding and failing
            args = ["serve-bench", "--url", url, "--model", model, "--concurrency", "1,2", "--tokenizer", ""]
            rc, o, e = _cli([*args, *common, "--out", str(tmp_path / out)], capsys)
            printed += [o, e]
            assert rc == (1 if model == "nosuch" else 0), e
        # no model: the listing fails against a dead port with credentials; then --json
        dead = _with_credentials(dead_url())
        rc, o, e = _cli(["serve-bench", "--url", dead, *common, "--json", "--out", str(tmp_path / "dead")], capsys)
        printed += [o, e]
        assert rc == 1 and "cannot list models at http://***@127.0.0.1" in e
    printed.append(caplog.text)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"points.jsonl", "results.parquet", "results.json"}
    assert sum(p.name.startswith("requests-") for p in files) == 3 * 2 + 3  # the dead run: default 1,4,16
    for secret in (PASSWORD, TOKEN, KEY):
        for p in files:
            assert secret.encode() not in p.read_bytes(), (secret, p)
        for text in printed:
            assert secret not in text
    meta = json.loads((tmp_path / "ok" / "results.json").read_text())
    assert "***@127.0.0.1" in json.dumps(meta) and "token=***" in json.dumps(meta)
    assert "HTTP 500" in printed[2]  # the failing run said why, without the secrets


@pytest.mark.slow
def test_redirects_are_failed_requests_never_followed(scripted, tmp_path):
    base = scripted.url + "/redirect"
    n0 = len(scripted.requests)
    row = measure_point(
        LoadConfig(url=base, model="normal", num_requests=2, warmup_requests=0, osl=2), out_dir=tmp_path
    )
    assert row["completed"] == 0 and row["failed"] == 2
    assert "HTTP 307 redirect to /v1/completions not followed" in row["error"]
    assert len(scripted.requests) == n0  # nothing was re-sent to where the redirect pointed
    with pytest.raises(ValueError, match="HTTP 302 redirect to /v1/models not followed"):
        run_coro(get_model_id(base, timeout_s=5))


@pytest.mark.slow
def test_a_second_server_in_the_same_out_keeps_the_first_detail_file(scripted, tmp_path):
    other = start_in_thread()
    try:
        cfg = LoadConfig(url=scripted.url, model="normal", num_requests=2, warmup_requests=0, osl=2)
        a = run_served_sweep(cfg, [1], tmp_path, tokenizer=chars, progress=False)
        b = run_served_sweep(LoadConfig(**{**cfg.__dict__, "url": other.url}), [1], tmp_path, progress=False)
    finally:
        other.stop()
    assert a["point_id"][0] != b["point_id"][0]  # the server is part of the point's identity: measured again
    files = sorted(tmp_path.glob("requests-*.jsonl"))
    assert len(files) == 2 and a["x_detail_file"][0] != b["x_detail_file"][0]
    assert all(Path(f).exists() for f in (a["x_detail_file"][0], b["x_detail_file"][0]))
    # the same point measured again (its every request failed, so a resume retries it): a new file, not over
    dead = LoadConfig(url=dead_url(), model="m", num_requests=1, warmup_requests=0)
    first = run_served_sweep(dead, [1], tmp_path / "d", progress=False)
    second = run_served_sweep(dead, [1], tmp_path / "d", progress=False)
    assert first["x_detail_file"][0].endswith(".jsonl") and second["x_detail_file"][0].endswith(".2.jsonl")
    assert len(list((tmp_path / "d").glob("requests-*.jsonl"))) == 2


def test_point_identity_includes_the_server_but_not_its_credentials():
    a = LoadConfig(url="http://a:1", model="m")
    assert served_point_id(a) != served_point_id(LoadConfig(url="http://b:1", model="m"))
    assert served_point_id(a) != served_point_id(LoadConfig(url="http://a:2", model="m"))
    assert served_point_id(a) != served_point_id(LoadConfig(url="http://a:1", model="n"))
    assert served_point_id(LoadConfig(url="http://u:pw@a:1/v1", model="m")) == served_point_id(
        LoadConfig(url="http://u:other@a:1", model="m", timeout_s=5, first_byte_timeout_s=3)
    )


@pytest.mark.slow
def test_silent_server_ends_quickly_with_progress_and_an_early_stop(silent_server, tmp_path, monkeypatch):
    monkeypatch.setattr(loop_mod, "STATUS_INTERVAL_S", 0.1)
    t = time.perf_counter()
    row = measure_point(
        LoadConfig(url=silent_server.url, num_requests=2, warmup_requests=0, models_timeout_s=0.5),
        out_dir=tmp_path / "a",
    )
    assert time.perf_counter() - t < 3 and "within the 0.5 s --models-timeout-s" in row["error"]
    lines = []
    cfg = LoadConfig(
        url=silent_server.url,
        model="m",
        num_requests=40,
        max_concurrency=2,
        warmup_requests=1,
        first_byte_timeout_s=0.3,
    )
    t = time.perf_counter()
    row = measure_point(cfg, out_dir=tmp_path / "b", on_status=lambda s: lines.append(s.line()))
    assert time.perf_counter() - t < 5  # not 41 timeouts one after another
    assert row["failed"] == 40 and row["completed"] == 0
    assert "stopped early: the first 3 requests all timed out" in row["x_stopped_early"]
    assert "stopped early" in row["error"] and "first-byte timeout" in row["error"]
    assert "stopped early" in summary_line(row)
    assert any("in flight" in x and "0/41 done" in x for x in lines)  # progress while nothing finished
    assert lines[-1].startswith("c=2: 41/41 done, 41 failed, 0 in flight")


def test_the_early_stop_applies_only_while_requests_are_left():
    from kit.serve.progress import TIMEOUT_PREFIX, PointProgress

    p = PointProgress(3, "c=3")
    for _ in range(3):
        p.waiting += 1
        p.sent()
    for _ in range(3):  # every planned request timed out: nothing is left to stop
        p.finished(False, f"{TIMEOUT_PREFIX} no data")
    assert p.stopped is None
    p = PointProgress(4, "c=3")
    for _ in range(3):
        p.waiting += 1
        p.sent()
        p.finished(False, f"{TIMEOUT_PREFIX} no data")
    assert p.stopped.startswith("stopped early: the first 3 requests all timed out (none completed)")


@pytest.mark.slow
def test_an_endless_line_fails_the_request_and_the_run_ends(scripted, tmp_path):
    cfg = LoadConfig(url=scripted.url, model="endless", num_requests=2, warmup_requests=0, max_event_bytes=2**20)
    t = time.perf_counter()
    row = measure_point(cfg, out_dir=tmp_path)
    assert time.perf_counter() - t < 20 and row["failed"] == 2
    assert "exceeded 1048576 bytes (max_event_bytes)" in row["error"]


def test_cli_numbers_out_of_range_are_one_line_errors(capsys):
    base = ["serve-bench", "--url", "http://127.0.0.1:1", "--model", "m"]
    for extra, word in (
        (["--isl", "2000000"], "isl=2000000"),
        (["--n-gpus", "-2"], "--n-gpus"),
        (["--n-gpus", "0"], "--n-gpus"),
        (["--burstiness", "nan"], "--burstiness"),
        (["--request-rate", "-1"], "--request-rate -1"),
        (["--timeout-s", "inf"], "--timeout-s inf"),
        (["--max-event-bytes", "5"], "--max-event-bytes 5"),
        (["--concurrency", "100000"], "--concurrency"),
    ):
        rc, out, err = _cli([*base, *extra], capsys)
        assert rc == 2 and word in err and "Traceback" not in err, (extra, err)
        # argparse's usage block, then one error line (ours: one line)
        assert len([x for x in err.splitlines() if x.strip() and not x.startswith(("usage", " "))]) == 1, err


def test_tokenizer_not_on_this_machine_is_the_kits_own_line():
    with pytest.raises(ValueError) as ei:
        load_tokenizer("no-such-org/no-such-tokenizer-xyz")
    msg = str(ei.value)
    assert "no tokenizer 'no-such-org/no-such-tokenizer-xyz' on this machine" in msg and "never downloads" in msg
    assert "couldn't connect" not in msg.lower() and "huggingface.co" not in msg and "\n" not in msg


@pytest.mark.slow
def test_empty_but_successful_completions_are_not_called_failures(scripted, tmp_path):
    row = measure_point(LoadConfig(url=scripted.url, model="e2b", num_requests=3, warmup_requests=0), out_dir=tmp_path)
    assert row["completed"] == 3 and row["failed"] == 0
    assert "failures only" not in row["x_client_check"]
    assert "successful requests streamed no text" in row["x_client_check"]


def test_an_unparseable_url_is_shown_unless_it_has_room_for_a_secret():
    assert redact_url("http://[::1") == "http://[::1"  # a typo stays visible
    assert redact_url("http://u:pw@[::1") == "http://***"
    assert redact_url("http://[::1?token=abc") == "http://***"
