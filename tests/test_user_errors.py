"""Bad input a new user tried (each once crashed with a traceback or was accepted): now one line, exit 2."""

import json
import sqlite3

import duckdb
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
        (["dashboard", "--ready-timeout", "nan", "--print-command", "--out", str(tmp_path / "d")], "--ready-timeout"),
    ]  # fmt: skip
    for argv, match in cases:
        rc, err = _rc_and_err(argv, capsys)
        assert rc == 2 and len(err) == 1 and match in err[0], (argv, err)
    assert not (tmp_path / "o").exists()
