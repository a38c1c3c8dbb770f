"""Servers the kit starts itself (kit.serve.launched): ``kit serve-bench --launch`` with a ``--server-grid``, each
configuration a real ``transformers serve`` process on CPU (the tiny checkpoint; ~5 s to start), resumed without a
launch, a configuration that fails to start recorded with the reason from its log, and the grid's parsing."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from kit.errors import UserError
from kit.serve import launched as LD
from kit.serve.checkpoint import build_tiny_checkpoint
from kit.serve.recipes import LaunchSpec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny")


def kit(*args, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "kit", *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False
    )


def live_servers(marker: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [ln for ln in ps.splitlines() if marker in ln and "serve" in ln and "ps -eo" not in ln]


def test_a_server_grid_launches_each_configuration_and_resumes_without_launching(ckpt, tmp_path):
    out = tmp_path / "grid"
    args = ["serve-bench", "--launch", "transformers", "--model", ckpt, "--out", out, "--concurrency", "1,2"]
    args += ["--server-grid", "max_num_seqs=2,4;max_model_len=256", "--isl", 16, "--osl", 4, "--num-requests", 4]
    first = kit(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "2 server configurations: max_num_seqs=2,max_model_len=256; max_num_seqs=4,max_model_len=256" in first.stderr
    assert first.stdout.count("[max_num_seqs=2,max_model_len=256] c=") == 2
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 4 and set(df["x_server_max_num_seqs"]) == {2, 4} and set(df["x_server_max_model_len"]) == {256}
    assert (df["completed"] == 4).all() and df["x_engine_version"].str.startswith("transformers ").all()
    assert df["point_id"].nunique() == 4  # the configuration is part of each point's id, the port is not
    for label in ("max_num_seqs=2,max_model_len=256", "max_num_seqs=4,max_model_len=256"):
        where = out / "servers" / label
        record = json.loads((where / "launch.json").read_text())
        assert record["outcome"] == "ready" and record["settings"]["max_model_len"] == 256
        assert (where / "server.log").read_text().startswith("$ ")  # the exact command first
        assert "--cb-num-blocks" in record["command"]
    assert live_servers(str(ckpt)) == []  # every server stopped
    from kit.results import ok_mask
    from kit.view.plots import plot_served

    # one line per configuration on shared axes (flagged rows are not drawn: a configuration whose rows were all
    # flagged on a busy machine has no line)
    lines = plot_served(df).axes[0].get_lines()
    drawn = sorted(df.loc[ok_mask(df), "x_server_config"].unique())
    assert sorted(ln.get_label().split("[")[1].rstrip("]") for ln in lines) == drawn
    # a re-run launches only the configurations with a point left to measure: a flagged point (e.g. client-bound on
    # a busy machine) is measured again, by design, so count the configurations whose points were all clean
    clean = sum(bool(ok_mask(g).all()) for _, g in df.groupby("x_server_config"))
    again = kit(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.count("every point measured earlier; not launched") == clean
    assert again.stderr.count(": starting transformers") == 2 - clean


def test_a_configuration_that_fails_to_start_is_recorded_and_the_grid_goes_on(ckpt, tmp_path):
    out = tmp_path / "bad"
    grid = tmp_path / "grid.json"
    # an impossible KV cache (one block for 4 x 256 tokens) starts fine; a bad flag does not: list both
    grid.write_text(json.dumps([{"max_num_seqs": 2, "max_model_len": 256}, {"continuous_batching": False}]))
    args = ["serve-bench", "--launch", "transformers", "--model", ckpt, "--out", out, "--concurrency", 1]
    args += ["--server-grid", grid, "--isl", 16, "--osl", 4, "--num-requests", 2, "--server-arg=--bogus-flag"]
    done = kit(*args)
    assert done.stderr.count("failed to start") == 2, done.stderr[-2000:]
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 2 and (df["status"] == "error").all() and (df["completed"] == 0).all()
    # the reason from the server's own log, not its help text
    assert df["error"].str.contains("No such option '--bogus-flag'", regex=False).all(), df["error"].iloc[0]
    record = json.loads((out / "servers" / "continuous_batching=false" / "launch.json").read_text())
    assert record["outcome"] == "failed to start" and "--bogus-flag" in record["error"]
    assert done.returncode == 1  # no request completed
    assert live_servers(str(ckpt)) == []


def test_server_grid_parsing_types_names_and_errors(tmp_path):
    grid = LD.parse_server_grid("max_num_seqs=2,8;enable_prefix_caching=true,false")
    assert grid == [
        {"max_num_seqs": 2, "prefix_caching": True},
        {"max_num_seqs": 2, "prefix_caching": False},
        {"max_num_seqs": 8, "prefix_caching": True},
        {"max_num_seqs": 8, "prefix_caching": False},
    ]
    assert LD.parse_server_grid(None) == [{}] and LD.parse_server_grid("dtype=bfloat16") == [{"dtype": "bfloat16"}]
    f = tmp_path / "g.json"
    f.write_text(json.dumps({"max_num_batched_tokens": [256, 512], "cpu_kv_cache_gb": 2}))
    assert LD.parse_server_grid(str(f)) == [
        {"max_batch_tokens": 256, "cpu_kv_cache_gb": 2.0},
        {"max_batch_tokens": 512, "cpu_kv_cache_gb": 2.0},
    ]
    for bad, match in (
        ("max_num_seqs=two", "max_num_seqs='two': not a whole number >= 0"),
        ("block_sizes=16", "server setting 'block_sizes'; allowed: dtype"),
        ("max_num_seqs", "write setting=v1,v2"),
        ("prefix_caching=maybe", "not true or false"),
        (str(tmp_path / "missing.json"), "cannot read it as JSON"),
    ):
        with pytest.raises(UserError, match=match):
            LD.parse_server_grid(bad)
    with pytest.raises(UserError, match="server configuration {'dtype': 'fp8'}: dtype='fp8'"):
        LD.server_configs(LaunchSpec("vllm", "m", "CPU"), [{"dtype": "fp8"}])
    a, b = LD.server_configs(LaunchSpec("vllm", "m", "CPU"), LD.parse_server_grid("max_num_seqs=2,8"))
    assert a.key != b.key and a.key == LD.server_configs(LaunchSpec("vllm", "m", "CPU", port=1), [a.settings])[0].key
    assert a.columns() == {"x_server_config": "max_num_seqs=2", "x_server_engine": "vllm", "x_server_max_num_seqs": 2}


def test_the_reason_a_server_did_not_start_is_picked_from_its_log():
    log = "$ vllm ...\nINFO loading\nTraceback (most recent call last):\n  File x\nValueError: max_model_len too big\n"
    assert LD.start_failure(log) == "ValueError: max_model_len too big"
    assert LD.start_failure("$ x\none\ntwo\nthree\nfour\n") == "two | three | four"


def test_launch_options_are_checked_before_anything_starts(ckpt, tmp_path, capsys):
    from kit.cli import main as kit_main

    for args, match in (
        (["--launch", "vllm"], "--launch vllm needs --model"),
        (["--launch", "vllm", "--model", ckpt, "--url", "http://127.0.0.1:1"], "give --url URL"),
        ([], "give --url URL"),
        (["--url", "http://127.0.0.1:1", "--server-grid", "max_num_seqs=2"], "--server-grid configure a"),
        (["--url", "http://127.0.0.1:1", "--launch", "vllm", "--model", ckpt], "— not both"),
        (["--launch", "vllm", "--model", ckpt, "--server-python", tmp_path / "nope"], "is not a file"),
        (["--launch", "vllm", "--model", ckpt, "--server-grid", "tp=0"], "tp=0; must be >= 1"),
        (["--launch", "vllm", "--model", ckpt, "--ready-timeout-s", "0"], "--ready-timeout-s"),
        (["--launch", "transformers", "--model", tmp_path / "no-such-ckpt"], "looks like a checkpoint path but it"),
    ):
        rc = kit_main(["serve-bench", "--out", str(tmp_path / "o"), *map(str, args)])  # in-process: no server starts
        err = capsys.readouterr().err
        assert rc == 2 and match in err, (args, err)


def test_the_library_call_launches_sweeps_and_stops(ckpt, tmp_path):
    spec = LaunchSpec("transformers", str(ckpt), max_model_len=256, max_num_seqs=4)
    df = LD.launch_bench(spec, [2], tmp_path / "lib", isl=16, osl=4, num_requests=4, progress=False)
    assert len(df) == 1 and df["completed"].iloc[0] == 4 and df["x_server_config"].iloc[0] == "default"
    assert df["model"].iloc[0] == str(ckpt) and live_servers(str(ckpt)) == []
    with pytest.raises(UserError, match="ready_timeout_s=0"):
        LD.launch_bench(spec, [1], tmp_path / "x", ready_timeout_s=0)
    with pytest.raises(UserError, match=r"unknown option\(s\) \['bogus'\]"):
        LD.launch_bench(spec, [1], tmp_path / "x", bogus=1)
    with pytest.raises(UserError, match="server setting 'blocks'"):
        LD.launch_bench(spec, [1], tmp_path / "x", server_grid=[{"blocks": 2}])
