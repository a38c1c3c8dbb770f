"""kit doctor: JSON validates against the documented schema; --strict exits non-zero naming a missing symbol
(fake kernel library lacking top_k_renorm_prob); compile check failure and timeout paths; CLI errors; the CLI's
options derive from DoctorConfig; kit.check.probes."""

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from kit import cli
from kit.check import doctor as D
from kit.check import probes as P
from kit.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
FAKES = str(Path(__file__).parents[1] / "fake_backends")


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.syspath_prepend(FAKES)


def validate(report):
    jsonschema.Draft202012Validator.check_schema(D.SCHEMA)
    jsonschema.validate(report, D.SCHEMA, cls=jsonschema.Draft202012Validator)


@pytest.mark.slow
def test_cli_json_full_run_validates_against_schema(tmp_path):
    """The real command, as CI would run it (torch.compile check included)."""
    out = tmp_path / "doctor.json"
    proc = subprocess.run(
        [sys.executable, "-m", "kit.cli", "doctor", "--json", "--strict", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(proc.stdout)
    validate(report)
    assert json.loads(out.read_text())["schema_version"] == D.REPORT_SCHEMA_VERSION
    assert report["ok"] and report["problems"] == []
    assert report["device"]["platform"] in ("cpu", "cuda", "rocm")
    assert {d["dtype"]: d["works"] for d in report["dtypes"]} == {"float32": True, "float16": True, "bfloat16": True}
    assert all(d["n"] == 5 and d["matmul_ms_p50"] > 0 for d in report["dtypes"])
    assert report["compile"]["checked"] and (report["compile"]["ok"] or report["compile"]["timed_out"])
    fp8 = {f["format"]: f for f in report["fp8"]["formats"]}
    assert fp8["e4m3fn"]["max"] == 448 and fp8["e4m3fnuz"]["max"] == 240
    assert fp8["e4m3fn"]["cast_ok"] and fp8["e4m3fnuz"]["cast_ok"]
    assert {b["name"] for b in report["libraries"]} == {"flashinfer", "sgl_kernel", "aiter"}


def test_strict_with_fake_library_missing_top_k_renorm_prob(fakes, capsys):
    rc = cli.main(["doctor", "--quick", "--strict", "--library", "sgl_kernel=fake_rocm_sgl_kernel"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "lacks top_k_renorm_prob" in err and "fake_rocm_sgl_kernel" in err
    assert "MISSING top_k_renorm_prob" in out and "verdict: NOT READY (1 problem(s))" in out
    # the same as JSON, valid against the schema
    rc = cli.main(["doctor", "--quick", "--json", "--library", "sgl_kernel=fake_rocm_sgl_kernel"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0  # without --strict the exit code stays 0
    validate(report)
    sgl = next(b for b in report["libraries"] if b["name"] == "sgl_kernel")
    assert sgl["importable"] and sgl["version"] == "0.0-fake-rocm" and sgl["missing"] == ["top_k_renorm_prob"]
    assert sgl["ops"]["top_p_renorm_prob"] == "fake_rocm_sgl_kernel.top_p_renorm_prob"
    assert not report["ok"] and any("top_k_renorm_prob" in p for p in report["problems"])


def test_strict_passes_here_and_with_a_complete_library(fakes, capsys):
    assert cli.main(["doctor", "--quick", "--strict"]) == 0
    assert "verdict: ready" in capsys.readouterr().out
    assert cli.main(["doctor", "--quick", "--strict", "--library", "flashinfer=fake_full_kernels"]) == 0
    out = capsys.readouterr().out
    assert "flashinfer  9.9-fake (fake_full_kernels): has top_k_renorm_prob" in out


def test_guarded_none_symbol_is_a_problem(fakes):
    r = D.run_doctor(libraries=["sgl_kernel=fake_guarded_kernels"], compile_check=False, timing=False)
    assert any("lacks top_k_renorm_prob" in p and "attribute is None" in p for p in r["problems"])
    validate(r)


def test_require_missing_library_is_a_problem(capsys):
    rc = cli.main(["doctor", "--quick", "--strict", "--require", "flashinfer"])
    assert rc == 1
    assert "required library flashinfer (flashinfer.sampling) is not importable" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,pattern",
    [
        (["--library", "sglang=x"], r"--library 'sglang=x': use NAME=MODULE with NAME one of"),
        (["--library", "sgl_kernel"], r"use NAME=MODULE"),
        (["--require", "vllm"], r"--require 'vllm': unknown library; known"),
        (["--device", "tpu"], r"--device 'tpu' is not allowed"),
        (["--compile-timeout", "0"], r"--compile-timeout 0.0 must be a finite number of seconds > 0"),
        (["--compile-timeout", "inf"], r"--compile-timeout inf must be a finite number of seconds > 0"),
    ],
)
def test_cli_bad_arguments_exit_2_with_message(argv, pattern, capsys):
    import re

    assert cli.main(["doctor", "--quick", *argv]) == 2
    assert re.search(pattern, capsys.readouterr().err)


def test_schema_flag_prints_a_valid_schema(capsys):
    assert cli.main(["doctor", "--schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema == json.loads(json.dumps(D.SCHEMA))


@pytest.mark.parametrize(
    "code,kind,needle",
    [
        (
            'import json; print(json.dumps({"ok": False, "error": "InductorError: no C++ compiler", "seconds": 0.1}))',
            "problem",
            "torch.compile (inductor) does not work on cpu: InductorError: no C++ compiler",
        ),
        ("import os; os.abort()", "problem", "compile check process failed"),
        ("import time; time.sleep(30)", "warning", "did not finish within 0.5 s"),
    ],
)
def test_compile_failure_is_a_problem_crash_too_timeout_a_warning(monkeypatch, code, kind, needle):
    """The compile check runs in a subprocess: a failure, a crash (a compiler segfault on a new device) and a hang
    are all reported, and none takes the doctor down."""
    monkeypatch.setattr(P, "_COMPILE_CODE", code)
    r = D.run_doctor(timing=False, compile_timeout_s=0.5 if "sleep" in code else 25)
    validate(r)
    assert any(needle in x for x in r["problems" if kind == "problem" else "warnings"]), r
    assert r["ok"] == (kind == "warning") and r["compile"]["timed_out"] == (kind == "warning")


def test_format_report_names_everything():
    r = D.run_doctor(compile_check=False, timing=False)
    text = D.format_report(r)
    for needle in (
        "kit doctor — torch",
        "device ",
        "dtypes ",
        "float16",
        "bfloat16",
        "fp8            native e4m3fn",
        "e4m3fnuz",
        "torch.compile  not checked",
        "kernel libs",
        "sgl_kernel",
        "verdict: ready",
    ):
        assert needle in text, needle


def test_out_is_validated_before_the_probes(tmp_path, capsys, monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("probed before validating --out")

    monkeypatch.setattr(D, "run_doctor", must_not_run)
    assert cli.main(["doctor", "--quick", "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} is a directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / (tmp_path.name + ".tmp")).exists()
    monkeypatch.undo()
    out = tmp_path / "sub" / "doctor.json"
    assert cli.main(["doctor", "--quick", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["schema_version"] == D.REPORT_SCHEMA_VERSION
    assert [p.name for p in out.parent.iterdir()] == ["doctor.json"]


def test_noisy_and_implausible_timings_are_flagged_not_failed(monkeypatch):
    import torch

    fake = {torch.float32: (7.85, 0.0043, 5.05), torch.float16: (7.9, 0.0042, 1.1), torch.bfloat16: (0.069, 0.487, 1.2)}
    monkeypatch.setattr(P, "_time_matmul", lambda dt, device, n: fake[dt])
    r = D.run_doctor(device="cpu", compile_check=False, timing=True)
    validate(r)
    assert r["ok"] and r["problems"] == []
    noisy = [w for w in r["warnings"] if w.startswith("noisy: ")]
    assert len(noisy) == 1 and "float32 matmul timings vary 5.05×" in noisy[0]
    assert any(w.startswith("implausible: bfloat16 matmul measured 113.3× float32") for w in r["warnings"])
    text = D.format_report(r)
    assert "(noisy: repeats vary 5.05×)" in text and "warning: implausible: bfloat16" in text
    # quiet, plausible timings: no caveat
    assert (
        P.timing_caveats(
            [
                {"dtype": "float32", "works": True, "spread": 1.1, "n": 5, "vs_float32": None},
                {"dtype": "bfloat16", "works": True, "spread": 1.3, "n": 5, "vs_float32": 3.0},
            ]
        )
        == []
    )


def test_cli_options_derive_from_doctor_config(capsys):
    """Flags, defaults and help text come from DoctorConfig (one source); --no-compile and --quick keep working."""
    import dataclasses

    parser = cli.build_parser("doctor")
    args = parser.parse_args(["doctor"])
    cfg = cli.config_from_args(D.DoctorConfig, args)
    assert cfg == D.DoctorConfig()
    args = parser.parse_args(
        [
            "doctor",
            "--no-compile",
            "--compile-timeout",
            "3",
            "--library",
            "aiter=m",
            "--require",
            "aiter",
            "--device",
            "cpu",
        ]
    )
    cfg = cli.config_from_args(D.DoctorConfig, args)
    assert cfg == D.DoctorConfig(
        device="cpu", libraries=("aiter=m",), require=("aiter",), compile_check=False, compile_timeout_s=3.0
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["doctor", "--help"])
    text = capsys.readouterr().out
    for f in dataclasses.fields(D.DoctorConfig):
        assert f.metadata["help"].split(" (")[0] in " ".join(text.split()), f.name
    assert "(default: 25.0)" in text and "--backend" not in text


def test_run_doctor_rejects_bad_config():
    with pytest.raises(UserError, match="compile_timeout_s=0 must be a finite number of seconds > 0"):
        D.run_doctor(compile_timeout_s=0)
    with pytest.raises(TypeError):
        D.run_doctor(backend_overrides=["x=y"])  # the old keyword is gone, not silently ignored


def test_probe_fp8_and_compile_sections_here():
    fp8 = P.probe_fp8("cpu", "rocm", "gfx942")
    assert fp8["native_format"] == "e4m3fnuz"
    assert [f["format"] for f in fp8["formats"]] == ["e4m3fn", "e4m3fnuz", "e5m2", "e5m2fnuz"]
    assert P.compile_not_checked("eager") == {
        "checked": False,
        "ok": None,
        "backend": "eager",
        "seconds": None,
        "timed_out": False,
        "error": None,
    }
    assert set(P.installed_versions()) == set(P.PROBED_PACKAGES)


def test_report_names_the_part_and_which_devices_are_visible(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    report = D.run_doctor(device="cpu", compile_check=False, timing=False)
    validate(report)
    dev = report["device"]
    assert dev["identity"] == "the host CPU" and "CUDA_VISIBLE_DEVICES" in dev["visibility"]
    text = D.format_report(report)
    assert "identity       the host CPU" in text and "visibility     CUDA_VISIBLE_DEVICES" in text
