"""Bad input a new user tried (each once crashed with a traceback or was accepted): now one line, exit 2."""

import json
import sqlite3
import time

import duckdb
import numpy as np
import pytest

from kit import cli


def _one_line_exit_2(argv, capsys, match):
    with pytest.raises(SystemExit) as e:  # argparse errors exit through SystemExit
        cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and match in err[0], err


@pytest.mark.parametrize("argv,match", [
    (["sweep", "--kv", "abc"], "argument --kv: 'abc' is not an integer"),
    (["sweep", "--kv", "1,,2"], "has an empty item"),
    (["serve-bench", "--url", "http://127.0.0.1:1", "--concurrency", "0"], "argument --concurrency"),
    (["plan", "--model", "llama-3.1-8b", "--context", "0"], "argument --context"),
    # numbers: NaN/inf and out-of-range values are refused by the option itself, naming it
    (["dashboard", "--ready-timeout", "nan", "--print-command"], "argument --ready-timeout: 'nan' is not a finite"),
    (["plan", "--model", "kimi-k3", "--overhead-ms", "nan"], "argument --overhead-ms: 'nan' is not a number"),
    (["comm", "--timeout-s", "nan"], "argument --timeout-s: 'nan' is not a number"),
    (["sweep", "--decode-steps", "1.5"], "argument --decode-steps: '1.5' is not an integer"),
    (["comm", "--min-bytes", "1x"], "argument --min-bytes: size '1x' must be a number of bytes"),  # not "parse_bytes"
    (["history", "compare", "a", "b", "--fdr", "0"], "argument --fdr: '0' must be in (0, 1)"),
    (["history", "compare", "a", "b", "--confidence", "nan"], "argument --confidence: 'nan' must be in (0, 1)"),
    (["history", "add", "r", "--commit", "x", "--usd-per-gpu-hr", "-1"], "'-1' must be > 0 ($/GPU-hour)"),
    (["history", "add", "r", "--commit", "x", "--basis", "nosuch"], "argument --basis: invalid choice: 'nosuch'"),
])  # fmt: skip
def test_option_errors_are_one_line_not_the_usage_block(argv, match, capsys):
    _one_line_exit_2(argv, capsys, match)


def _rc_and_err(argv, capsys):
    rc = cli.main(argv)
    return rc, capsys.readouterr().err.strip().splitlines()


def test_files_that_are_not_what_they_claim_are_user_errors(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("not json")
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "plain").write_text("x")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"model_type": "llama"}))
    sqlite3.connect(tmp_path / "s.db").execute("create table a(x)")
    duckdb.connect(str(tmp_path / "empty.duckdb")).close()
    cases = [
        (["plan", "--model", str(tmp_path / "bad.json")], "is not readable JSON"),
        (["plan", "--model", str(tmp_path / "list.json")], "holds a JSON list"),
        (["sweep", "--model", str(ck), "--out", str(tmp_path / "o")], "no *.safetensors"),
        (["history", "add", str(tmp_path / "plain"), "--commit", "x", "--db", str(tmp_path / "h.duckdb")],
         "not a readable results Parquet file"),
        (["history", "list", "--db", str(tmp_path / "s.db")], "is not a DuckDB history database"),
        (["history", "list", "--db", str(tmp_path / "empty.duckdb")], "not a kit history"),
        (["dashboard", "--port", "70000", "--print-command", "--out", str(tmp_path / "d")], "--port 70000"),
    ]  # fmt: skip
    for argv, match in cases:
        rc, err = _rc_and_err(argv, capsys)
        assert rc == 2 and len(err) == 1 and match in err[0], (argv, err)
    assert not (tmp_path / "o").exists()


def test_values_the_library_refuses_name_themselves(tmp_path, capsys):
    cases = [
        (["plan", "--model", "kimi-k3", "--accelerator", "B300", "--overhead-ms", "-1"], "--overhead-ms -1.0 must be"),
        (["plan", "--model", "kimi-k3", "--accelerator", "B300", "--gpus", "1000000"], "more than kimi-k3's 93 layers"),
        (["plan", "--model", "kimi-k3", "--accelerator", "B300", "--spec-accept", "2"], "--spec-accept 2.0 needs"),
        (["comm", "--timeout-s", "0", "--out", str(tmp_path / "c")], "--timeout-s 0.0 must be a number of seconds > 0"),
        (["comm", "--timeout-s", "inf", "--out", str(tmp_path / "c")], "--timeout-s inf must be a number of seconds"),
        (["plan", "--model", "kimi-k3", "--accelerator", "B300", "--overhead-ms", "inf"], "--overhead-ms inf must be"),
        (["comm", "--accelerator", "nosuch", "--out", str(tmp_path / "c")], "unknown accelerator 'nosuch'; known:"),
        (["comm", "--nproc", "99", "--out", str(tmp_path / "c")], "--nproc 99: at most"),  # not 99 processes at once
        (["comm", "--save-links", str(tmp_path), "--out", str(tmp_path / "c")], "--save-links"),  # before measuring
        (["comm", "--nnodes", "2", "--rdzv-endpoint", "h:99999", "--out", str(tmp_path / "c")], "port in 1-65535"),
        (["serve-bench", "--url", "http://127.0.0.1:0", "--out", str(tmp_path / "s")], "port must be an integer"),
        (["plan", "--model", "kimi-k3", "--price", "inf"], "--price inf must be > 0"),
        (["history", "list", "--db", str(tmp_path)], "is a directory; give a file path"),
        (["serve-bench", "--url", "http://127.0.0.1:1", "--accelerator", "nosuch", "--out", str(tmp_path / "s")],
         "unknown accelerator 'nosuch'"),
        (["serve-bench", "--url", "http://127.0.0.1:1", "--turns", "0", "--out", str(tmp_path / "s")],
         "--turns 0 must be an integer >= 1"),  # alone, and before the model listing (no 30 s wait)
        (["serve-bench", "--url", "http://127.0.0.1:99999", "--out", str(tmp_path / "s")],
         "its port must be an integer in 1-65535"),
    ]  # fmt: skip
    t = time.perf_counter()
    for argv, match in cases:
        rc, err = _rc_and_err(argv, capsys)
        assert rc == 2 and len(err) == 1 and match in err[0], (argv, err)
    assert not (tmp_path / "c" / "results.parquet").exists()
    assert time.perf_counter() - t < 25  # no case waited for a model listing (30 s each)


def test_wrong_tables_and_disjoint_runs_in_the_history_are_user_errors(tmp_path, capsys):
    import pandas as pd

    pd.DataFrame({"a": [1, 2]}).to_parquet(tmp_path / "other.parquet")
    db = str(tmp_path / "h.duckdb")
    rc, err = _rc_and_err(["history", "add", str(tmp_path / "other.parquet"), "--commit", "x", "--db", db], capsys)
    assert rc == 2 and len(err) == 1 and "not a kit results file (no point_id, status or backend column)" in err[0], err
    from simulated_runs import write_simulated_run

    from kit.track.db import Provenance, add_run
    from kit.track.simulate import simulated_records

    rng = np.random.default_rng(0)
    a = simulated_records(rng, run_id="2025-01-01T00:00:00+00:00", runs=1, points=[(64, 1)])
    b = simulated_records(rng, run_id="2025-01-02T00:00:00+00:00", runs=1, points=[(128, 4)])
    add_run(db, write_simulated_run(tmp_path / "a", a), Provenance("aaaa1"))
    add_run(db, write_simulated_run(tmp_path / "b", b), Provenance("bbbb2"))
    rc, err = _rc_and_err(["history", "compare", "aaaa1", "bbbb2", "--db", db], capsys)
    assert rc == 2 and "no point in common" in err[0], err  # not "no regression"


def test_a_library_warning_is_one_line_naming_the_command(capsys):
    assert cli.main(["plan", "--model", "llama-3.1-8b", "--accelerator", "h100", "--gpus", "3"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[0].startswith("kit plan: warning: llama-3.1-8b: 32 attention heads are not divisible by tp=3")
    assert not any(".py:" in line for line in err), err  # no file:line, no source excerpt
