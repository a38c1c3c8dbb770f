"""kit plan (kit.plan.cli): text and JSON output, prices, flags, bad values."""

from __future__ import annotations

import json
import math

import pytest

from kit.plan.spec import get_spec


def test_cli_plan_json(capsys):
    from kit.cli import main

    rc = main(
        [
            "plan",
            "--model",
            "kimi-k3",
            "--accelerator",
            "mi355x",
            "--gpus",
            "8",
            "--context",
            "1424",
            "--concurrency",
            "64",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fit"]["fits"] and out["min_gpus"] == 8 and out["fit"]["max_concurrency"] >= 64
    assert {c["price_basis"] for cost in out["cost"] for c in cost} >= {"tco", "assumed-rental"}
    assert all(math.isfinite(p["decode_tok_s"]) for p in out["predictions"])


def test_cli_plan_text_and_bad_accelerator(capsys):
    from kit.cli import main

    assert (
        main(
            [
                "plan",
                "--model",
                "llama-3.1-8b",
                "--accelerator",
                "H100",
                "--gpus",
                "1",
                "--context",
                "2048",
                "--concurrency",
                "8",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "FITS" in out and "tok/s" in out and "$" in out
    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "Z100"]) == 2
    assert "Z100" in capsys.readouterr().err
    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "H100", "--gpus", "0"]) == 2
    assert "--gpus 0" in capsys.readouterr().err


def test_cli_plan_price_table_override(tmp_path, capsys):
    from kit.cli import main

    f = tmp_path / "prices.csv"
    f.write_text("accelerator,usd_per_gpu_hr,basis\nMI355X,1.99,my-contract\n")
    assert (
        main(
            [
                "plan",
                "--model",
                "kimi-k3",
                "--accelerator",
                "MI355X",
                "--gpus",
                "8",
                "--prices",
                str(f),
                "--basis",
                "my-contract",
            ]
        )
        == 0
    )
    assert "[my-contract] $1.99/GPU-h" in capsys.readouterr().out


def test_cli_plan_flags_not_cut_and_no_raw_none(capsys):
    from kit.cli import main

    assert main(["plan", "--model", "kimi-k3", "--accelerator", "cpu"]) == 0
    out = capsys.readouterr().out
    flags = get_spec("kimi-k3").flags
    assert len(flags) > 160
    lines = out.splitlines()
    assert "flags" not in lines[0] and lines[0].startswith("kimi-k3:")
    block = []
    for ln in lines[1:]:
        if not ln.startswith("  flags: ") and not (block and ln.startswith("    ")):
            break
        block.append(ln.strip())
    assert " ".join(block) == "flags: " + " ".join(flags.split())  # every word, none cut
    fewest = next(ln for ln in lines if "fewest CPU" in ln)
    assert "None" not in fewest and "does not fit on one CPU host" in fewest


def test_cli_plan_options_derive_from_plan_config():
    import dataclasses

    from kit.cli import build_parser
    from kit.plan.cli import PlanConfig

    args = build_parser("plan").parse_args(["plan", "--model", "kimi-k3"])
    d = PlanConfig()
    for f in dataclasses.fields(PlanConfig):
        if f.name != "model":
            assert getattr(args, f.name) == getattr(d, f.name), f.name
    assert args.model == "kimi-k3"
    assert args.context == [1424] and args.concurrency == [64] and args.resume is True


def test_cli_plan_grid_stored_and_resumed(tmp_path, capsys):
    from kit.cli import main
    from kit.store import load_results

    cmd = [
        "plan",
        "--model",
        "llama-3.1-8b",
        "--accelerator",
        "H100",
        "--gpus",
        "1",
        "--context",
        "1024,8192",
        "--concurrency",
        "1,16",
        "--out",
        str(tmp_path),
    ]
    assert main(cmd) == 0
    out = capsys.readouterr().out
    assert "context    8192 concurrency    16" in out and str(tmp_path) in out
    df = load_results(tmp_path)
    assert len(df) == 4 and set(df["backend"]) == {"planner"}
    assert sorted(zip(df["context_len"], df["concurrency"])) == [(1024, 1), (1024, 16), (8192, 1), (8192, 16)]
    assert main(cmd + ["--json"]) == 0  # resumed: the same four rows, none predicted again
    js = json.loads(capsys.readouterr().out)
    assert len(js["predictions"]) == 4 and len(load_results(tmp_path)) == 4
    with pytest.raises(SystemExit) as e:  # argparse: usage + one line, exit 2
        main(["plan", "--model", "llama-3.1-8b", "--context", "1024,x"])
    assert e.value.code == 2
    assert "'x' is not an integer" in capsys.readouterr().err


def test_cli_plan_user_errors_are_one_line(capsys):
    from kit.cli import main

    assert main(["plan", "--accelerator", "H100"]) == 2
    err = capsys.readouterr().err
    assert "--model is required" in err and len(err.strip().splitlines()) == 1
    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "H100", "--price", "-1"]) == 2
    assert "--price -1.0 must be > 0" in capsys.readouterr().err
