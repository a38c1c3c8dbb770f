"""Served profiling (issue 27): `kit serve-bench --server-profile` brackets exactly each measured point with the
server's /start_profile and /stop_profile, records where the trace went, and says so when the server was not started
with profiling enabled; a launched server gets the setting its engine needs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kit.cli import main
from kit.serve.load import LoadConfig
from kit.serve.server_profile import launch_setting
from kit.serve.simserver import SimModel, SimServer
from kit.serve.sweep import run_served_sweep

FAST = SimModel(ttft_base_ms=2.0, tpot_base_ms=1.0)


def load(url: str, **kw) -> LoadConfig:
    return LoadConfig(url=url, model="sim", isl=8, osl=4, num_requests=4, warmup_requests=1, server_metrics=False, **kw)


def test_each_point_is_profiled_exactly_and_the_trace_is_recorded(tmp_path):
    traces = tmp_path / "traces"
    with SimServer(FAST, profile_dir=str(traces)) as srv:
        df = run_served_sweep(load(srv.url), [1, 2], tmp_path / "run", server_profile=True,
                              server_profile_dir=str(traces), progress=False)  # fmt: skip
        assert list(df.completed) == [4, 4] and df.x_server_profiled.all()
        assert len(srv.traces) == 2
        # every request the sweep sent (warm-up included) fell inside one profile, the point's own
        events = [[e for e in json.loads(Path(t).read_text())["traceEvents"] if e["name"] == "sim.request"]
                  for t in srv.traces]  # fmt: skip
        assert [len(e) for e in events] == [5, 5] and sum(map(len, events)) == len(srv.log)
    for (_, row), trace in zip(df.iterrows(), srv.traces, strict=True):
        assert json.loads(row.x_server_profile_files) == [trace]
        assert row.x_server_profile_dir == str(traces) and "trace written by the server to" in row.x_server_profile
    # the profiled points are rows of their own: a plain sweep of the same settings does not resume from them
    with SimServer(FAST) as plain:
        again = run_served_sweep(load(plain.url), [1], tmp_path / "run", progress=False)
    assert again.point_id[0] not in set(df.point_id) and again.completed[0] == 4


def test_a_server_without_the_endpoints_is_said_and_the_point_still_measured(tmp_path, capsys):
    with SimServer(FAST) as srv:
        rc = main(["serve-bench", "--url", srv.url, "--concurrency", "1", "--num-requests", "2", "--isl", "8",
                   "--osl", "4", "--tokenizer", "", "--server-profile", "--out", str(tmp_path), "--json"])  # fmt: skip
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert rc == 0 and row["completed"] == 2 and row["x_server_profiled"] is False
    assert "not started with profiling enabled" in row["x_server_profile"] and "HTTP 404" in row["x_server_profile"]
    assert "--profiler-config" in row["x_server_profile"] and "SGLANG_TORCH_PROFILER_DIR" in row["x_server_profile"]
    rows = pd.read_parquet(tmp_path / "results.parquet")
    assert rows.x_server_profiled.tolist() == [False]


def test_profile_options_are_checked_before_any_request(tmp_path, capsys):
    argv = ["serve-bench", "--url", "http://127.0.0.1:9", "--out", str(tmp_path)]
    assert main([*argv, "--server-profile-dir", str(tmp_path)]) == 2
    assert "give --server-profile too" in capsys.readouterr().err


def test_a_launched_server_gets_the_setting_its_engine_needs(tmp_path):
    d = str((tmp_path / "p").resolve())
    new = launch_setting("vllm", tmp_path / "p", "0.32.0")
    assert new["args"][0] == "--profiler-config" and json.loads(new["args"][1]) == {
        "profiler": "torch",
        "torch_profiler_dir": d,
    }
    assert launch_setting("vllm", tmp_path / "p", None)["args"][0] == "--profiler-config"  # unknown: today's flag
    old = launch_setting("vllm", tmp_path / "p", "0.10.1")
    assert old["env"] == {"VLLM_TORCH_PROFILER_DIR": d} and old["args"] == []
    assert launch_setting("sglang", tmp_path / "p", "0.5.6")["env"] == {"SGLANG_TORCH_PROFILER_DIR": d}
    tf = launch_setting("transformers", tmp_path / "p")
    assert tf["supported"] is False and "no /start_profile" in tf["note"]


@pytest.mark.parametrize("version", ["0.32.0", "0.10.1"])
def test_the_launch_recipe_carries_the_setting(tmp_path, version):
    """The setting lands in the server's command or environment (what kit.serve.launched starts)."""
    from dataclasses import replace

    from kit.serve.recipes import LaunchSpec, build_command

    s = launch_setting("vllm", tmp_path, version)
    spec = LaunchSpec("vllm", "ckpt", "CPU")
    argv, env = build_command(replace(spec, env=s["env"], extra_args=s["args"]))
    assert ("--profiler-config" in argv) == (version == "0.32.0")
    assert ("VLLM_TORCH_PROFILER_DIR" in env) == (version == "0.10.1")


def test_the_row_says_whose_word_the_trace_folder_is(tmp_path):
    """A folder the user named for a server the kit did not start is the user's word: when it is not on this machine
    (or nothing appears there) the row says the kit cannot know the server's folder; a launched server's folder is
    the one the kit told it."""
    from kit.serve.server_profile import ServerProfile

    traces, elsewhere = tmp_path / "traces", tmp_path / "elsewhere"
    elsewhere.mkdir()
    with SimServer(FAST, profile_dir=str(traces)) as srv:
        said = {}
        for name, where, launched in (("missing", "/nonexistent/dir", False), ("empty", elsewhere, False),
                                      ("launched", traces, True)):  # fmt: skip
            p = ServerProfile(srv.url, trace_dir=where, launched=launched)
            assert p.start()
            said[name] = p.stop()["x_server_profile"]
    assert "/nonexistent/dir (--server-profile-dir) does not exist on this machine" in said["missing"]
    assert "cannot know the server's directory unless the server reports it" in said["missing"]
    assert "trace written by the server" not in said["missing"] + said["empty"]
    assert f"no new file appeared in {elsewhere} (--server-profile-dir, where you said" in said["empty"]
    assert f"to {traces} (1 new file), the folder the kit (--launch) told it" in said["launched"]


def test_a_server_profile_dir_not_on_this_machine_is_said_before_the_run(tmp_path, capsys):
    traces = tmp_path / "traces"
    with SimServer(FAST, profile_dir=str(traces)) as srv:
        rc = main(["serve-bench", "--url", srv.url, "--concurrency", "1", "--num-requests", "2", "--isl", "8",
                   "--osl", "4", "--tokenizer", "", "--server-profile", "--server-profile-dir", "/nonexistent/dir",
                   "--out", str(tmp_path / "run"), "--json"])  # fmt: skip
    cap = capsys.readouterr()
    row = json.loads(cap.out)["rows"][0]
    assert rc == 0 and row["x_server_profiled"] is True and len(srv.traces) == 1  # the server wrote its own folder
    assert "'/nonexistent/dir' does not exist on this machine; recorded as given" in cap.err
    assert "does not exist on this machine" in row["x_server_profile"] and "writes there" not in row["x_server_profile"]
