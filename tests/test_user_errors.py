"""Bad input a new user tried (each once crashed with a traceback or was accepted): now one line, exit 2."""

import contextlib
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
         "--turns=0; must be an integer"),  # alone, and before the model listing (no 30 s wait)
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


# ----------------------------------------------------------------------------------------------- the fault table
# Bad input fed to every subcommand's options: bad numbers, NaN, inf, negative, huge, wrong types, unknown names,
# missing / unwritable paths, a directory where a file is expected (and the reverse), non-UTF-8 files, corrupt
# JSON / CSV / JSONL, broken configs. Each: exit 2, ONE line on stderr `kit <command>: error: ...` naming the value
# (the placeholders {F} bad files, {O} a fresh output root, {RO} an unwritable directory, {RUN} a run directory,
# {DB} a history database holding it), no traceback, nothing measured.
def _opts(cmd: list[str], table: dict[str, list], tail: list[str] = ()) -> list[tuple[list[str], str]]:
    """(argv, text the error must contain) per bad value of each option: the value itself unless given as
    ``(value, text)``."""
    out = []
    for opt, values in table.items():
        for v in values:
            value, named = v if isinstance(v, tuple) else (v, v)
            out.append(([*cmd, *([opt] if opt else []), value, *tail], named))  # opt "": a positional value
    return out


_OUT_PATHS = [("{F}/afile", "{F}/afile"), ("{F}/afile/sub", "{F}/afile"), ("{RO}/out", "{RO}/out"), ("", "empty")]
_CSV_INPUTS = [
    "{F}/missing.csv",
    "{F}/adir",
    "{F}/nonutf8.csv",
    "{F}/corrupt.csv",
    "{F}/wrongcols.csv",
    "{F}/empty.csv",
    "{F}/price_nan.csv",
    "{F}/price_inf.csv",
    "{F}/price_str.csv",
    "{F}/price_nobasis.csv",
]
_CONFIGS = ["{F}/adir", "{F}/nonutf8.json", "{F}/corrupt.json", "{F}/list.json", "{F}/ck_nonutf8"] + [
    (f"{{F}}/cfg_{k}.json", n)
    for k, n in (
        ("huge_layers", "num_hidden_layers"),
        ("huge_vocab", "vocab_size"),
        ("str_hidden", "hidden_size='abc'"),
        ("neg_heads", "num_attention_heads=-4"),
        ("float_layers", "=3.5"),
        ("bool_layers", "=True"),
        ("zero_vocab", "vocab_size=0"),
        ("null_inter", "intermediate_size"),
        ("list_heads", "=[8]"),
        ("nested", "hidden_size={'a': 1}"),
        ("maxpos_neg", "max_position_embeddings=-1"),
        ("nan", "hidden_size=nan"),
        ("inf", "intermediate_size=inf"),
        ("layer_types_num", "layer_types=5"),
        ("experts_str", "num_local_experts='many'"),
        ("moe_topk_nan", "num_experts_per_tok=nan"),
    )
]
_PLAN = ["plan", "--model", "llama-3.1-8b", "--accelerator", "H200"]
_SWEEP = ["sweep", "--kv", "16", "--concurrency", "1"]

FAULTS = [
    *_opts(_SWEEP, {
        "--kv": ["nan", "inf", "-5", "1e30", "99999999999999999999", "x", "12k", ("1,,2", "empty item")],
        "--concurrency": ["nan", "0", "1e9", "-2"],
        "--decode-steps": ["nan", "-1", "0", "1.5", ("10000000000", "--decode-steps 10000000000")],
        "--warmup-steps": ["-1", "inf"], "--repeats": ["0", "1e9", ("1000000000", "--repeats 1000000000")],
        "--prefill-chunk": ["0", "-3"], "--tp": ["0", "-1", ("1000", "--tp 1000")],  # not 1000 torchrun workers
        "--tp-timeout-s": ["nan", "-1", "inf", "1e+300"], "--seed": ["nan", "1e100", "100000000000000000000000", "-1"],
        "--power-period-ms": ["nan", "0", "-1", "inf"], "--usd-per-kwh": ["nan", "-1", "inf"],
        "--threads": ["0", "-1", "100000"], "--runs": ["0", "-1", "nan", ("100000000", "'100000000' must be <= 1000")],
        "--dtype": ["float8", "int4", ("", "empty")],
        "--device": ["tpu"], "--accelerator": ["nosuch"], "--kv-fill": ["x"], "--power-source": ["x"],
        "--model": ["nosuch", "{F}/adir", "{F}/afile", "{F}/ck_nonutf8", "{F}/ck_corrupt", "{F}/no/such/ckpt",
                    ("", "--model '' is empty; give a preset")],
    }, ["--out", "{O}/sweep"]),
    (["sweep", "--model", "{F}/afile", "--out", "{O}/sweep"], "is a file, not a checkpoint directory; give a preset"),
    *_opts(["sweep", "--kv", "16"], {"--out": _OUT_PATHS}),
    *_opts(["devices"], {"--accelerators": _CSV_INPUTS[:6], "--prices": _CSV_INPUTS}),
    *_opts(["bench"], {"--batch": ["0", ("nan", "--batch: 'nan' is not an integer")], "--context": ["-1", "1e12",
                       "99999999999"], "--steps": ["0", "1000000"], "--rounds": ["0", "-1", "100000000"],
                       "--tp": ["0"], "--which": ["x"], "--model": ["nosuch", ("", "''")], "--dtype": ["x"],
                       "--device": ["x"]}),
    (["bench", "--which", "tp", "--tp", "1000"], "--tp 1000"),
    *_opts(["plan"], {"--model": ["nosuch", *_CONFIGS]}),
    *_opts(_PLAN, {
        "--accelerator": ["nosuch", ("", "''")], "--gpus": ["0", "-1", "nan", "1e9"],
        "--context": ["nan", "-1", "1e15", "x", "0"], "--concurrency": ["0", "1e12"], "--kv-dtype": ["x"],
        "--weight-dtypes": ["x", ("default=x", "'x'"), ("nosuch=bf16", "'nosuch'")], "--tp": ["0", "3"],
        "--ep": ["0", "-1"],
        "--eff-bw": ["2", "nan", "-1", "inf"], "--eff-flops": ["0"], "--overhead-ms": ["nan", "-1", "inf"],
        "--spec-k": ["-1", "1e9"], "--spec-accept": ["nan", "0", "2"],
        "--comm-calibration": ["{F}/missing.json", "{F}/adir", "{F}/nonutf8.json", "{F}/corrupt.json",
                               "{F}/list.json", "{F}/links_str.json", "{F}/links_inf.json", "{F}/links_bool.json"],
        "--mem-util": ["0", "2", "nan"], "--basis": ["x"], "--price": ["nan", "-1", "inf", "0"],
        "--prices": _CSV_INPUTS, "--out": _OUT_PATHS[:3],
    }),
    *_opts(["plan", "--model", "llama-3.1-8b", "--accelerator", "local"], {"--calibration": [
        "{F}/missing.json", "{F}/list.json", "{F}/corrupt.json", "{F}/nonutf8.json", "{F}/adir"]}),
    *_opts(["calibrate", "--quick"], {"--device": ["x"], "--out": [("{F}/adir", "{F}/adir"), *_OUT_PATHS[1:]],
                                      "--threads": ["0", "-1", "nan", "100000"]}),  # --out "": not the cache file
    *_opts(["kv-stress"], {
        "--batch": ["0", "nan"], "--start": ["0", "nan", "-1"], "--max-context": ["-1", "1e15"],
        "--resolution": ["0", "1", "nan"], "--margin-gb": ["nan", "-1", "inf", "1000000.0"],
        "--max-probes": ["0", "-1"],
        "--check-context": ["-1"], "--model": ["nosuch", "{F}/ck_corrupt"], "--dtype": ["x"], "--device": ["x"],
        "--decode-steps": ["0"], "--repeats": ["0"], "--threads": ["0"], "--prefill-chunk": ["0"],
    }, ["--out", "{O}/kvs"]),
    *_opts(["kv-stress"], {"--out": _OUT_PATHS[:2]}),
    *_opts(["comm"], {
        "--ops": ["x", ("all_reduce,x", "['x']")], "--min-bytes": ["-1", "nan", "1x", "inf"],
        "--max-bytes": ["0", "inf", "1e30"],
        "--dtype": ["x"],
        "--warmup": ["-1"], "--iters": ["0"], "--nproc": ["0", "99", "1000"], "--nnodes": ["0", "-1"],
        "--rdzv-endpoint": ["nohost", "h:x", ":1", "h:99999"], "--backend": ["x"],
        "--timeout-s": ["nan", "-1", "0", "inf"],
        "--join-timeout-s": ["-1", "nan", "inf"], "--model": ["nosuch"], "--batch": ["0"], "--accelerator": ["x"],
        "--save-links": ["{F}/adir", ("{F}/afile/sub", "{F}/afile")],
    }, ["--out", "{O}/comm"]),
    (["comm", "--min-bytes", "1M", "--max-bytes", "1K", "--out", "{O}/comm"], "--max-bytes 1024"),
    (["comm", "--backend", "gloo", "--max-bytes", "1000G", "--out", "{O}/comm"], "--max-bytes 1073741824000"),
    *_opts(["comm"], {"--out": _OUT_PATHS[:2]}),
    *_opts(["serve-bench", "--out", "{O}/sb", "--url"], {"": ["not-a-url", "ftp://x", "http://", "http://:0",
                                                               "http://h:-1", "http://[::1", "http://h:99999"]}),
    *_opts(["serve-bench", "--url", "http://127.0.0.1:1"], {
        "--concurrency": ["0", "x", "nan"], "--workload": ["x"], "--endpoint": ["x"],
        "--request-rate": ["nan", "-1", "0"], "--burstiness": ["0", "nan"], "--num-requests": ["0", "1e12", "-1"],
        "--duration-s": ["nan", "-1", "inf"], "--warmup": ["-1"], "--isl": ["0", "1e12", "nan"], "--osl": ["0", "-5"],
        "--isl-range": ["x", "2", "-1"], "--osl-range": ["x"], "--timeout-s": ["nan", "0", "inf"],
        "--stall-timeout-s": ["-1"], "--first-byte-timeout-s": ["inf", "nan"], "--models-timeout-s": ["0", "nan"],
        "--max-event-bytes": ["0", "-1", "1e30"], "--power-period-ms": ["0", "nan"], "--usd-per-kwh": ["-1"],
        "--slo-ttft-ms": ["nan", "-1", "inf"], "--slo-tpot-ms": ["0"], "--slo-e2el-ms": ["-1"],
        "--temperature": ["nan", "-1", "inf"], "--extra-body": ["not json", "[1]"], "--search": ["x"],
        "--slo-fraction": ["2", "nan", "0"], "--max-load": ["nan"], "--prefix-fraction": ["2", "nan", "-0.1"],
        "--prefix-group-size": ["0", "-1"], "--turns": ["0", "1000000", "nan"],
        "--think-time-s": ["inf", "nan", "-1", ("1e12", "--think-time-s")],
        "--time-scale": ["inf", "0", "nan", "-1"], "--ramp": ["x"], "--ramp-start": ["-1", "nan"],
        "--ramp-end": ["nan", "inf"], "--ramp-strategy": ["x"],
        "--accelerator": ["nosuch"], "--n-gpus": ["0", "nan"], "--seed": ["-1", "nan"],
    }, ["--out", "{O}/sb"]),
    *_opts(["serve-bench", "--url", "http://127.0.0.1:1", "--model", "m", "--tokenizer", ""], {
        "--trace": ["{F}/missing.jsonl", "{F}/adir", "{F}/nonutf8.jsonl", "{F}/corrupt.jsonl", "{F}/afile"],
    }, ["--out", "{O}/sb"]),  # --model: files are read once the model is known (no listing)
    *_opts(["serve-bench", "--url", "http://127.0.0.1:1", "--model", "m"], {"--tokenizer": ["{F}/adir", "{F}/missing"]},
           ["--out", "{O}/sb"]),
    *_opts(["serve-bench", "--url", "http://127.0.0.1:1"], {"--out": _OUT_PATHS[:3]}),
    *_opts(["dashboard", "--print-command"], {
        "--port": ["70000", "-1", "x", ("nan", "--port: 'nan' is not an integer")],
        "--ready-timeout": ["nan", "-1", "inf"],
        "--cull-idle": [("nan", "--cull-idle: 'nan' is not an integer"), "-1", "99999999999"],
        "--kv": ["nan"], "--model": ["nosuch"],
    }, ["--out", "{O}/dash"]),
    *_opts(["dashboard", "--print-command"], {"--out": _OUT_PATHS[:3]}),
    *_opts(["history", "add", "--commit", "x", "--db", "{O}/h.duckdb"], {
        "": ["{F}/missing", "{F}/adir", "{F}/afile", "{F}/nonutf8.json"]}),
    *_opts(["history", "add", "{RUN}", "--commit", "x"], {
        "--usd-per-gpu-hr": ["nan", "inf", "-1"], "--basis": ["x"],
        "--db": ["{F}/adir", ("/etc/passwd/x", "/etc/passwd"), "{F}/afile", "{F}/random.duckdb", "{F}/nonutf8.json",
                 ("{RO}/h.duckdb", "{RO}")]}),
    *_opts(["history", "list"], {"--db": ["{F}/adir", ("/etc/passwd/x", "/etc/passwd"), "{F}/afile",
                                          "{F}/random.duckdb", "{F}/missing.duckdb", "{F}/nonutf8.json"]}),
    (["history", "compare", "x", "nosuch", "--db", "{DB}"], "'nosuch'"),
    *_opts(["history", "compare", "x", "y", "--db", "{DB}"], {
        "--tolerance": ["nan", "-1", "inf"], "--confidence": ["2", "0"], "--fdr": ["nan", "0"],
        "--markdown": ["{F}/adir", ("{F}/afile/sub", "{F}/afile")]}),
    *_opts(["history", "compare", "aaa", "bbb"], {"--db": ["{F}/random.duckdb", "{F}/missing.duckdb"]}),
    *_opts(["history", "report", "--db", "{DB}"], {"--out": _OUT_PATHS[:3]}),
    *_opts(["history", "report", "--out", "{O}/rep"], {"--db": ["{F}/random.duckdb", "{F}/missing.duckdb"]}),
    *_opts(["doctor", "--no-timing"], {
        "--device": ["x"], "--compile-backend": ["x"], "--compile-timeout": ["nan", "0", "-1", "inf"],
        "--library": ["bad", "nosuch=mod", "=x"], "--require": ["nosuch"],
        "--out": [("{F}/adir", "{F}/adir"), *_OUT_PATHS[1:3]]}),
    *_opts(["plan", "--model", "llama-3.1-8b", "--out"], {"": ["{FULL}/run"]}),  # a full disk: before any work
    *_opts(["sweep", "--kv", "16", "--out"], {"": ["{FULL}/run"]}),
    *_opts(["serve-bench", "--url", "http://127.0.0.1:1", "--out"], {"": ["{FULL}/sb"]}),
    *_opts(["calibrate", "--quick", "--out"], {"": ["{FULL}/c.json"]}),
    *_opts(["doctor", "--quick", "--out"], {"": ["{FULL}/d.json"]}),
    *_opts(["history", "add", "{RUN}", "--commit", "z", "--db"], {"": ["{FULL}/h.duckdb"]}),
    *_opts(["history", "report", "--db", "{DB}", "--out"], {"": ["{FULL}/rep"]}),
    (["history", "add", "{RUN}", "--commit", "a\nb", "--db", "{DB}"], "not a\\nb"),  # a line break stays one line
    (["sweep", "--nosuch-option", "1"], "--nosuch-option"),
    (["history", "add", "x", "--bogus"], "--bogus"),
]  # fmt: skip


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """The files and directories the fault table's placeholders name."""
    with (
        _unwritable_dir(tmp_path_factory.mktemp("ro") / "ro") as ro,
        _full_dir(tmp_path_factory.mktemp("full")) as full,
    ):
        yield {**_fault_files(tmp_path_factory.mktemp("faults")), "RO": ro, "FULL": full}


@contextlib.contextmanager
def _unwritable_dir(path):
    """A directory this process cannot write to: mode 0555, or for root (who writes anywhere) a read-only tmpfs;
    None when neither can be made."""
    import os
    import subprocess

    path.mkdir(mode=0o555)
    if not os.access(path, os.W_OK):
        yield str(path)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], capture_output=True)
    try:
        yield str(path) if mounted.returncode == 0 and not os.access(path, os.W_OK) else None
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def _full_dir(path):
    """A directory on a full file system (a 64 KiB tmpfs filled to the last block; root only), else None."""
    import errno
    import os
    import subprocess

    if os.geteuid() != 0:
        yield None
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True)
    try:
        if mounted.returncode:
            yield None
            return
        with open(path / "filler", "wb", buffering=0) as f:
            with contextlib.suppress(OSError):  # ENOSPC: full
                while f.write(b"\0" * 4096):
                    pass
        assert os.statvfs(path).f_bfree == 0, errno.ENOSPC
        yield str(path)
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _fault_files(root):
    """Bad files of every kind, a run directory and a history database of two commits (x, y) under ``root``."""

    f = root / "files"
    (f / "adir").mkdir(parents=True)
    (f / "afile").write_text("x")
    for ext in ("json", "csv", "jsonl"):
        (f / f"nonutf8.{ext}").write_bytes(b"\xff\xfe\x00bad")
    (f / "corrupt.json").write_text('{"a": \n')
    (f / "corrupt.csv").write_text('a,b\n1,"2\n')
    (f / "corrupt.jsonl").write_text('{"timestamp": 0, "input_length": 5\n')
    (f / "list.json").write_text("[1, 2]")
    (f / "wrongcols.csv").write_text("x,y\n1,2\n")
    (f / "empty.csv").write_text("")
    for name, price, basis in (("nan", "nan", "tco"), ("inf", "1e400", "tco"), ("str", "abc", "tco"),
                               ("nobasis", "2", "")):  # fmt: skip
        (f / f"price_{name}.csv").write_text(f"accelerator,usd_per_gpu_hr,basis\nH200,{price},{basis}\n")
    (f / "random.duckdb").write_bytes(bytes(range(256)) * 16)
    for name, content in (("ck_nonutf8", b"\xff\xfe\x00bad"), ("ck_corrupt", b'{"a": ')):
        (f / name).mkdir()
        (f / name / "config.json").write_bytes(content)
    links = {"str": {"scale-up": 5}, "inf": {"scale-up": {"alpha_us": 1, "busbw_gb_s": 1e400}},
             "bool": {"scale-up": {"alpha_us": True, "busbw_gb_s": 1}}}  # fmt: skip
    for name, link in links.items():
        (f / f"links_{name}.json").write_text(json.dumps({"links": link}))
    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000,
            "max_position_embeddings": 4096}  # fmt: skip
    moe = {**base, "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
    configs = {"huge_layers": {"num_hidden_layers": 10**30}, "huge_vocab": {"vocab_size": 10**300},
               "str_hidden": {"hidden_size": "abc"}, "neg_heads": {"num_attention_heads": -4},
               "float_layers": {"num_hidden_layers": 3.5}, "bool_layers": {"num_hidden_layers": True},
               "zero_vocab": {"vocab_size": 0}, "null_inter": {"intermediate_size": None},
               "list_heads": {"num_key_value_heads": [8]}, "nested": {"hidden_size": {"a": 1}},
               "maxpos_neg": {"max_position_embeddings": -1}, "nan": {"hidden_size": float("nan")},
               "inf": {"intermediate_size": float("inf")}, "layer_types_num": {"layer_types": 5}}  # fmt: skip
    for name, change in configs.items():
        (f / f"cfg_{name}.json").write_text(json.dumps({**base, **change}))
    (f / "cfg_experts_str.json").write_text(json.dumps({**moe, "num_local_experts": "many"}))
    (f / "cfg_moe_topk_nan.json").write_text(json.dumps({**moe, "num_experts_per_tok": float("nan")}))
    from simulated_runs import write_simulated_run

    from kit.track.simulate import simulated_records

    db, rng = root / "h.duckdb", np.random.default_rng(0)
    for day, commit in enumerate(("x", "y"), 1):
        records = simulated_records(rng, run_id=f"2025-01-0{day}T00:00:00+00:00", runs=1, points=[(64, 1)])
        run = write_simulated_run(root / f"run-{commit}", records)
        assert cli.main(["history", "add", str(run), "--commit", commit, "--db", str(db)]) == 0
    return {"F": str(f), "RUN": str(run), "DB": str(db)}


def _place(text: str, places: dict) -> str:
    """``text`` with each ``{NAME}`` of ``places`` filled in (other braces, e.g. a dict's, are left as they are)."""
    for k, v in places.items():
        text = text.replace("{" + k + "}", str(v))
    return text


def _fault_id(case) -> str:
    argv, _ = case
    return " ".join(a or "''" for a in argv)[:90]


@pytest.mark.parametrize("argv,named", FAULTS, ids=[_fault_id(c) for c in FAULTS])
def test_every_bad_input_is_one_line_naming_it(argv, named, faults, tmp_path, monkeypatch, capsys):
    import logging

    for place, what in (("RO", "no directory this user cannot write to"), ("FULL", "no full file system (root)")):
        if faults[place] is None and any("{" + place + "}" in a for a in argv):
            pytest.skip(what)
    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path / "cache"))  # a calibration never lands in the user's cache
    places = {**faults, "O": str(tmp_path / "out")}
    argv, named = [_place(a, places) for a in argv], _place(named, places)
    kit_log = logging.getLogger("kit")
    shown = logging.StreamHandler()  # what the command logs before failing counts as a line on stderr too
    kit_log.addHandler(shown)
    level = kit_log.level
    kit_log.setLevel(logging.INFO)
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's refusal
        rc = e.code
    finally:
        kit_log.removeHandler(shown)
        kit_log.setLevel(level)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    cmd = f"kit {argv[0]}"
    assert rc == 2 and len(err) == 1, (argv, rc, err)
    prefix, sep, message = err[0].partition(": error: ")
    assert sep and prefix in (cmd, f"{cmd} {argv[1]}"), err
    assert named in message, (named, err)
    assert not (tmp_path / "out" / "results.parquet").exists() and not (tmp_path / "cache").exists()
