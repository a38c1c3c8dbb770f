"""kit.serve.sweep: served load points and sweeps through the one grid runner against the scripted SSE server
(faults: 500s, stalls, truncated streams, a server killed mid-run, a dead or silent server), resume and
--no-resume, Ctrl-C, and ``kit serve-bench`` (options from LoadConfig, --json, exit codes)."""

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sse_server import chars, dead_url

from kit import results as R
from kit.cli import build_parser
from kit.errors import OutputPathError
from kit.serve import cli as serve_cli
from kit.serve import sweep
from kit.serve.cli import summary_line
from kit.serve.load import LoadConfig
from kit.serve.point import measure_point, served_point_id
from kit.serve.sweep import run_served_sweep
from kit.store import load_results
from kit.view.plots import plot_served

HERE = Path(__file__).parents[1]


def one_point(cfg: LoadConfig, out, **kw) -> dict:
    """One load point through the served sweep (its one concurrency): the row exactly as the runner stored it."""
    rows = []
    run_served_sweep(
        cfg, [cfg.max_concurrency], out, progress=False, on_point=lambda rec, frame: rows.append(rec), **kw
    )
    assert len(rows) == 1
    return rows[0]


def detail_of(row: dict) -> list[dict]:
    return [json.loads(x) for x in Path(row["x_detail_file"]).read_text().splitlines()]


# ---------------------------------------------------------------- faults, one point
def test_fault_500_on_every_other_request(scripted, tmp_path):
    cfg = LoadConfig(url=scripted.url, model="flaky", num_requests=6, max_concurrency=1, warmup_requests=0, osl=8)
    row = one_point(cfg, tmp_path, tokenizer=chars)
    assert row["completed"] == 3 and row["failed"] == 3 and row["status"] == "ok"
    assert "HTTP 500" in row["error"]
    df = load_results(tmp_path)
    assert int(df["failed"].iloc[0]) == 3
    detail = detail_of(row)
    assert len(detail) == 6 and sum(not d["ok"] for d in detail) == 3
    assert all("injected failure" in d["error"] for d in detail if not d["ok"])
    assert Path(row["x_detail_file"]).name == f"requests-{served_point_id(cfg)}.jsonl"


def test_fault_stall_past_the_timeout(scripted, tmp_path):
    cfg = LoadConfig(
        url=scripted.url,
        model="stall",
        num_requests=2,
        max_concurrency=2,
        warmup_requests=0,
        stall_timeout_s=0.4,
        timeout_s=5,
    )
    t = time.perf_counter()
    row = one_point(cfg, tmp_path, tokenizer=chars)
    assert time.perf_counter() - t < 5
    assert row["failed"] == 2 and row["completed"] == 0 and row["status"] == "error"
    assert "stalled" in row["error"]
    assert load_results(tmp_path)["failed"].iloc[0] == 2


def test_fault_truncated_stream_and_total_timeout(scripted, tmp_path):
    cfg = LoadConfig(url=scripted.url, model="truncate", num_requests=2, warmup_requests=0)
    row = measure_point(cfg, out_dir=tmp_path, tokenizer=chars)
    assert row["failed"] == 2 and "broken stream" in row["error"]
    cfg = LoadConfig(
        url=scripted.url, model="slow", num_requests=1, warmup_requests=0, osl=100, timeout_s=0.5, stall_timeout_s=5
    )
    row = measure_point(cfg, out_dir=tmp_path, tokenizer=chars)
    assert row["failed"] == 1 and "exceeded" in row["error"]


def test_dead_server_finishes_with_failures(tmp_path):
    url = dead_url()
    row = one_point(LoadConfig(url=url, model="m", num_requests=3, warmup_requests=1), tmp_path / "a")
    assert row["failed"] == 3 and row["completed"] == 0 and "connection failed" in row["error"]
    row = one_point(LoadConfig(url=url, num_requests=3), tmp_path / "b")  # model lookup fails
    assert row["status"] == "error" and "/v1/models" in row["error"]
    assert load_results(tmp_path / "b")["status"].iloc[0] == "error"


def test_server_killed_mid_run(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "sse_server.py"), "--port", "0", "--gap-ms", "5", "--announce-done"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), line
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        cfg = LoadConfig(
            url=url,
            model="normal",
            num_requests=12,
            max_concurrency=2,
            warmup_requests=0,
            osl=60,
            timeout_s=10,
            stall_timeout_s=2,
        )

        def kill_after_the_first_finished_request():  # not after a fixed time: a slow machine may finish none by then
            for ln in proc.stdout:
                if ln.startswith("DONE"):
                    time.sleep(0.2)  # the client has read it; the next request is mid-stream
                    os.killpg(proc.pid, 9)
                    return

        killer = threading.Thread(target=kill_after_the_first_finished_request, daemon=True)
        killer.start()
        t = time.perf_counter()
        row = one_point(cfg, tmp_path, tokenizer=chars)
        killer.join()
        assert time.perf_counter() - t < 10
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait(5)
    assert row["completed"] >= 1 and row["failed"] >= 1 and row["completed"] + row["failed"] == 12
    df = load_results(tmp_path)
    assert int(df["failed"].iloc[0]) == row["failed"]
    assert len(detail_of(row)) == 12


def test_model_listing_failure_counts_every_planned_request(tmp_path):
    url = dead_url()
    row = one_point(LoadConfig(url=url, num_requests=3, warmup_requests=2), tmp_path / "a")
    assert row["failed"] == 3 and row["completed"] == 0 and row["status"] == "error"
    assert "cannot list models" in row["error"] and "/v1/models" in row["error"]
    detail = detail_of(row)
    assert len(detail) == 5 and sum(d["warmup"] for d in detail) == 2
    assert all(not d["ok"] and "cannot list models" in d["error"] for d in detail)
    assert int(load_results(tmp_path / "a")["failed"].iloc[0]) == 3
    # a sweep lists the models once and records every point the same way
    df = run_served_sweep(
        LoadConfig(url=url, num_requests=4, warmup_requests=0), [1, 2], tmp_path / "b", progress=False
    )
    assert list(df["failed"]) == [4, 4] and list(df["completed"]) == [0, 0]
    # a duration-only run plans no count: one failed request
    row = measure_point(LoadConfig(url=url, num_requests=None, duration_s=1.0, warmup_requests=0))
    assert row["failed"] == 1 and row["x_detail_file"] is None


def test_silent_server_timeouts_name_what_when_and_where(silent_server, tmp_path):
    url = silent_server.url
    # no model given: the listing waits at most models_timeout_s, then every planned request fails with that text
    t = time.perf_counter()
    cfg = LoadConfig(url=url, num_requests=2, warmup_requests=0, models_timeout_s=0.5)
    row = measure_point(cfg, out_dir=tmp_path / "a")
    assert time.perf_counter() - t < 3 and row["failed"] == 2 and "within the 0.5 s --models-timeout-s" in row["error"]
    # requests: silence before any response (first-byte timeout) and the total timeout, each with what/when/where
    row = measure_point(
        LoadConfig(url=url, model="m", num_requests=1, warmup_requests=0, timeout_s=5, first_byte_timeout_s=0.4),
        out_dir=tmp_path / "b",
    )
    assert f"no response from {url}/v1/completions within 0.4 s" in row["error"]
    row = measure_point(
        LoadConfig(url=url, model="m", num_requests=1, warmup_requests=0, timeout_s=0.4, stall_timeout_s=5),
        out_dir=tmp_path / "c",
    )
    assert f"request to {url}/v1/completions exceeded 0.4 s" in row["error"]


def test_html_error_page_is_one_short_line_in_the_summary(scripted, tmp_path):
    cfg = LoadConfig(url=scripted.url, model="html502", num_requests=2, warmup_requests=0)
    row = measure_point(cfg, out_dir=tmp_path, tokenizer=chars)
    assert row["failed"] == 2 and "HTTP 502: 502 Bad Gateway" in row["error"]
    line = summary_line(row)
    for text in (row["error"], line):
        assert "<" not in text and "\n" not in text and "\r" not in text
    assert len(row["error"]) < 300
    assert all("<title>502 Bad Gateway</title>" in d["error"] for d in detail_of(row))  # full text kept there


def test_selfcheck_not_applied_without_successful_streams(tmp_path):
    row = measure_point(
        LoadConfig(url=dead_url(), model="m", num_requests=20, max_concurrency=4, warmup_requests=0), out_dir=tmp_path
    )
    assert row["failed"] == 20
    assert row["x_client_bound"] is False and row["x_client_warning"] is None
    assert row["x_client_check"].startswith("not applied: no successful request")
    line = summary_line(row)
    assert "self-check not applied" in line and "may be the bottleneck" not in line


# ---------------------------------------------------------------- sweeps
def test_api_key_is_sent_but_never_written(scripted, tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_TEST_API_KEY", "sk-very-secret-123")
    cfg = LoadConfig(url=scripted.url, model="e2a", num_requests=2, warmup_requests=1, api_key_env="KIT_TEST_API_KEY")
    assert cfg.request_headers()["Authorization"] == "Bearer sk-very-secret-123"
    df = run_served_sweep(cfg, [1, 2], tmp_path, tokenizer=chars, progress=False)
    assert (df["completed"] == 2).all()
    for f in tmp_path.iterdir():
        assert "sk-very-secret-123" not in f.read_bytes().decode("utf-8", "replace"), f


def test_sweep_rows_concat_with_in_process_rows_and_plot(scripted, tmp_path):
    cfg = LoadConfig(url=scripted.url, model="normal", num_requests=4, osl=16, warmup_requests=1, slo_ttft_ms=1000)
    df = run_served_sweep(cfg, [1, 2], tmp_path, tokenizer=chars, extra={"n_gpus": 1}, progress=False)
    assert list(df["backend"]) == ["openai", "openai"] and list(df["concurrency"]) == [1, 2]
    assert (df["completed"] == 4).all() and (df["x_output_tokens_total"] == 64).all()
    assert df["goodput_rps"].notna().all() and df["tok_s_per_gpu"].notna().all()
    assert df["tpot_n"].iloc[0] == 4 and df["itl_n"].iloc[0] == 4 * 15
    engine = {
        "backend": "engine",
        "status": "ok",
        "model": "tiny",
        "concurrency": 2,
        "decode_tok_s": 500.0,
        "tpot_ms_p50": 4.0,
        "tok_s_per_stream": 250.0,
        "n_gpus": 1,
    }
    both = R.to_frame(load_results(tmp_path).to_dict("records") + [engine])
    assert set(both["backend"]) == {"openai", "engine"} and len(both) == 3
    fig = plot_served(both)
    fig.savefig(tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_interrupted_sweep_resumes_without_measuring_the_finished_point(scripted, tmp_path, caplog):
    """A sweep stopped after its first point, re-run on the same out dir: the finished point is skipped (the
    server sees no request for it, its detail file is untouched) and the runner says so."""
    cfg = LoadConfig(url=scripted.url, model="normal", num_requests=3, osl=4, warmup_requests=1)
    done = []
    first = run_served_sweep(
        cfg,
        [1, 2],
        tmp_path,
        tokenizer=chars,
        progress=False,
        on_point=lambda rec, frame: done.append(rec),
        should_stop=lambda: len(done) >= 1,
    )
    assert list(first["concurrency"]) == [1] and len(load_results(tmp_path)) == 1
    detail1 = Path(done[0]["x_detail_file"])
    before = (detail1.read_bytes(), detail1.stat().st_mtime_ns)
    n_before = len(scripted.requests)
    with caplog.at_level(logging.INFO, logger="kit"):
        df = run_served_sweep(cfg, [1, 2], tmp_path, tokenizer=chars, progress=False)
    assert "resuming: 1 of 2 points already recorded" in caplog.text
    assert len(scripted.requests) - n_before == 3 + 1  # the second point's requests only
    assert (detail1.read_bytes(), detail1.stat().st_mtime_ns) == before
    assert list(df["concurrency"]) == [1, 2] and (df["completed"] == 3).all()
    assert len(load_results(tmp_path)) == 2 and len(list(tmp_path.glob("requests-*.jsonl"))) == 2
    # a point whose requests all failed is measured again on the next run (errors are retried)
    bad = LoadConfig(url=scripted.url, model="html502", num_requests=1, warmup_requests=0)
    run_served_sweep(bad, [1], tmp_path / "err", progress=False)
    n_before = len(scripted.requests)
    run_served_sweep(bad, [1], tmp_path / "err", progress=False)
    assert len(scripted.requests) - n_before == 1


def test_no_resume_measures_again_and_archives(scripted, tmp_path):
    cfg = LoadConfig(url=scripted.url, model="normal", num_requests=2, osl=4, warmup_requests=0)
    run_served_sweep(cfg, [1, 2], tmp_path, tokenizer=chars, progress=False)
    n_before = len(scripted.requests)
    df = run_served_sweep(cfg, [1, 2], tmp_path, tokenizer=chars, progress=False, resume=False)
    assert len(scripted.requests) - n_before == 4 and list(df["concurrency"]) == [1, 2]
    assert len(load_results(tmp_path)) == 2  # a fresh log
    prev = list((tmp_path / "previous").iterdir())
    assert len(prev) == 1 and len((prev[0] / "points.jsonl").read_text().splitlines()) == 2
    assert (prev[0] / "results.parquet").exists() and len(list(prev[0].glob("requests-*.jsonl"))) == 2
    assert len(list(tmp_path.glob("requests-*.jsonl"))) == 2


def test_point_ids_name_the_setting_and_ignore_the_timeouts():
    a = LoadConfig(url="http://a:1", model="m", max_concurrency=4, isl=8, osl=2)
    assert served_point_id(a).startswith("openai-completions-c4-rinf-isl8-osl2-")
    assert served_point_id(a) == served_point_id(
        LoadConfig(url="http://a:1/v1", model="m", max_concurrency=4, isl=8, osl=2, timeout_s=5, stall_timeout_s=1)
    )
    for other in (dict(num_requests=9), dict(model="n"), dict(seed=1), dict(slo_ttft_ms=5.0), dict(temperature=1.0)):
        assert served_point_id(LoadConfig(**{**a.__dict__, **other})) != served_point_id(a), other


def test_ctrl_c_swallowed_by_a_finaliser_stops_the_served_sweep(scripted, tmp_path, monkeypatch):
    """The kind of fault of the engine-sweep case: a SIGINT raised inside a finaliser is not lost."""

    class Finaliser:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)

    real, calls = sweep.measure_point, []

    def measure_point(*a, **k):
        calls.append(1)
        row = real(*a, **k)
        obj = Finaliser()
        del obj
        return row

    monkeypatch.setattr(sweep, "measure_point", measure_point)
    cfg = LoadConfig(url=scripted.url, model="normal", num_requests=2, osl=8, warmup_requests=0)
    with pytest.raises(KeyboardInterrupt):
        run_served_sweep(cfg, [1, 2, 4], tmp_path, tokenizer=chars, progress=False)
    assert len(calls) == 1 and len(load_results(tmp_path)) == 1


def test_bad_input_is_a_user_error_before_any_network(silent_server, tmp_path):
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    with pytest.raises(OutputPathError):
        run_served_sweep(LoadConfig(url=silent_server.url), [1], f / "sub", progress=False)
    with pytest.raises(OutputPathError):
        measure_point(LoadConfig(url=silent_server.url, model="m"), out_dir=f)
    with pytest.raises(ValueError, match="concurrencies"):
        run_served_sweep(LoadConfig(url=silent_server.url), [0], tmp_path, progress=False)
    assert not silent_server.pending()


# ---------------------------------------------------------------- kit serve-bench
def _cli(argv, capsys):
    from kit.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _serve_bench(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "kit", "serve-bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=HERE.parent,
    )


def test_cli_serve_bench(scripted, tmp_path, capsys, caplog):
    """The real command once (a process: exit code, plot); the re-run and the refusal in this process (where the
    resume notice is a log record of the ``kit`` logger)."""
    out = tmp_path / "cli"
    args = [
        "--url",
        scripted.url,
        "--model",
        "normal",
        "--concurrency",
        "1,2",
        "--isl",
        "8",
        "--osl",
        "8",
        "--num-requests",
        "3",
        "--warmup",
        "0",
        "--tokenizer",
        "",
        "--out",
        str(out),
    ]
    p = _serve_bench(*args, "--plot")
    assert p.returncode == 0, p.stderr + p.stdout
    df = load_results(out)
    assert list(df["concurrency"]) == [1, 2] and (df["completed"] == 3).all()
    assert (out / "serve-bench.png").exists()
    assert p.stdout.count("c=") == 2 and "2 measured now, 0 recorded earlier" in p.stdout
    # the same command again: nothing is measured, the rows are reported as recorded earlier
    n_before = len(scripted.requests)
    with caplog.at_level(logging.INFO, logger="kit"):
        rc, stdout, stderr = _cli(["serve-bench", *args], capsys)
    assert rc == 0 and len(scripted.requests) == n_before, stderr
    assert "resuming: 2 of 2 points already recorded" in caplog.text
    assert "0 measured now, 2 recorded earlier" in stdout
    rc, _, stderr = _cli(["serve-bench", "--url", "localhost:1"], capsys)
    assert rc == 2 and "--url 'localhost:1'" in stderr


def test_cli_json_and_exit_code(scripted, tmp_path, capfd):
    """In this process, with its file descriptors captured (what C code or a child would write counts too): stdout
    holds the JSON document alone (the real command's process: test_cli_serve_bench)."""
    common = ["--concurrency", "1", "--num-requests", "2", "--warmup", "0", "--tokenizer", "", "--json"]
    args = ["serve-bench", "--url", scripted.url, "--model", "normal", "--isl", "4", "--osl", "4", *common]
    rc, stdout, stderr = _cli([*args, "--out", str(tmp_path / "a")], capfd)
    assert rc == 0, stderr
    doc = json.loads(stdout)  # stdout is one JSON object and nothing else
    assert doc["results"] == str(tmp_path / "a" / "results.parquet") and doc["exit_code"] == 0
    assert len(doc["rows"]) == 1 and doc["rows"][0]["completed"] == 2 and doc["rows"][0]["backend"] == "openai"
    # no request completed: exit 1, also with --json
    dead = ["serve-bench", "--url", dead_url(), "--model", "m", *common, "--out", str(tmp_path / "b")]
    rc, stdout, stderr = _cli(dead, capfd)
    assert rc == 1 and json.loads(stdout)["rows"][0]["failed"] == 2, stderr


def test_cli_concurrency_is_checked_by_argparse(capsys):
    rc, _, err = _cli(["serve-bench", "--url", "http://127.0.0.1:1", "--concurrency", "1k"], capsys)
    assert rc == 2 and "argument --concurrency: '1k' is not an integer (expected a comma list like 1,4,16)" in err
    rc, _, err = _cli(["serve-bench", "--url", "http://127.0.0.1:1", "--concurrency", "1,,4"], capsys)
    assert rc == 2 and "argument --concurrency" in err and "empty item" in err
    rc, _, err = _cli(["serve-bench", "--url", "http://127.0.0.1:1", "--concurrency", "0"], capsys)
    assert rc == 2 and "argument --concurrency: '0'" in err
    rc, _, err = _cli(["serve-bench", "--url", "http://127.0.0.1:1", "--extra-body", "[1]"], capsys)
    assert rc == 2 and "argument --extra-body" in err and "JSON object" in err
    assert serve_cli.concurrency_list(" 1, 4 ,16") == [1, 4, 16]


def test_cli_out_file_rejected_before_network(silent_server, tmp_path, capsys):
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    t = time.perf_counter()
    rc, _, err = _cli(["serve-bench", "--url", silent_server.url, "--out", str(f)], capsys)
    assert rc == 2 and "exists and is a file" in err and time.perf_counter() - t < 5
    assert not silent_server.pending()  # nothing connected to the server


def test_cli_help_shows_defaults_once(capsys):
    rc, out, _ = _cli(["serve-bench", "--help"], capsys)
    assert rc == 0
    text = " ".join(out.split())
    for s in (
        "comma-separated max concurrency values (default: 1,4,16)",
        "measured requests per concurrency point (default: 64)",
        "(default: 600.0)",
        "longest silence within a stream, s (default: 60.0)",
        "warm-up requests per point (excluded) (default: 2)",
        "(default: OPENAI_API_KEY)",
        "(default: results/serve-bench)",
        "(default: completions)",
        "input tokens per request (default: 1024)",
        "output tokens per request (max_tokens) (default: 400)",
    ):
        assert s in text, s
    assert "default: None" not in text and "default: False" not in text
    assert "(default inf: all at once)" in text and "(default inf: all at once) (default" not in text
    assert "(default: first of /v1/models)" in text and "(default: first of /v1/models) (default" not in text


def test_cli_option_defaults_are_the_load_config_defaults():
    """One source of defaults: every serve-bench option of a LoadConfig field defaults to that field's default."""
    args = vars(build_parser("serve-bench").parse_args(["serve-bench", "--url", "http://x"]))
    d = LoadConfig()
    fields = set(d.__dataclass_fields__)
    assert fields - set(args) == {"max_concurrency"}  # set per point from --concurrency
    for name in fields - {"url", "max_concurrency"}:
        assert args[name] == getattr(d, name), name
    assert args["concurrency"] == list(sweep.DEFAULT_CONCURRENCIES)


def test_cli_serve_bench_ctrl_c_keeps_finished_points(scripted, tmp_path):
    """Ctrl-C during the second point: exit 130, a one-line message naming the output dir, no traceback, and
    the first point's row is on disk."""
    out = tmp_path / "int"
    cmd = [
        sys.executable,
        "-m",
        "kit.cli",
        "serve-bench",
        "--url",
        scripted.url,
        "--model",
        "normal",
        "--concurrency",
        "1,2,3",
        "--isl",
        "8",
        "--osl",
        "64",
        "--num-requests",
        "8",
        "--warmup",
        "0",
        "--tokenizer",
        "",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE.parent)
    deadline = time.time() + 60
    while time.time() < deadline and not ((out / "points.jsonl").exists() and (out / "points.jsonl").read_text()):
        time.sleep(0.05)
    time.sleep(0.3)  # inside the second point's requests
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout + err
    assert "interrupted" in err and str(out) in err and "Traceback" not in err, err
    assert 1 <= len(load_results(out)) < 3
