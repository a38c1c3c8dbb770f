"""kit.measure.calibrate: measurements are positive medians with n, stored as JSON, and drive the planner's local
device."""

from __future__ import annotations

import json

import pytest

from kit.errors import OutputPathError, UserError
from kit.measure import calibrate
from kit.plan.config import PredictConfig
from kit.plan.device import get_device_model
from kit.plan.roofline import predict_point


@pytest.fixture(scope="module")
def quick_cal():
    return calibrate.calibrate("cpu", quick=True, size_mb=8, matmul_n=128)


def test_quick_calibration_figures(quick_cal):
    c = quick_cal
    assert c["device"] == "cpu" and c["mem_bw_gb_s"] > 0 and c["mem_read_gb_s"] > 0
    assert c["matmul_tflops"]["float32"] > 0
    assert c["details"]["bandwidth"]["n"] >= 3 and c["details"]["matmul"]["float32"]["n"] >= 3
    assert c["overhead_ms_fixed"] >= 0 and c["overhead_ms_per_layer"] >= 0
    assert c["overhead_ms_fixed"] + 4 * c["overhead_ms_per_layer"] > 0
    # launch/dispatch per op (eager) fitted over chains of tiny ops; no graphs on a CPU, and it says so
    la = c["details"]["launch"]
    assert c["launch_us_per_op"] > 0 and c["launch_us_fixed"] >= 0 and sorted(la["chain_us"]) == [8, 32, 128]
    assert c["graph_launch_us_per_op"] is None and "not available on cpu" in la["graph_note"]
    fl = c["details"]["floor"]
    assert fl["preset"] == "tiny-llama" and fl["layers"] == 4 and fl["step_ms"] > fl["roofline_ms"] > 0
    assert sum(fl["class_share"].values()) == pytest.approx(1.0)
    sp = c["stack_profile"]
    assert sp["name"] == "local-cpu" and sp["floor_mode"] == "add" and sp["eta_bw"] == 1.0
    assert c["gemv_gb_s"] > 0 and sp["mem_bw_gb_s"] == c["gemv_gb_s"]  # the bandwidth a decode GEMV reaches
    assert sum(sp["floors_us"].values()) == pytest.approx(fl["floor_ms_per_layer"] * 1e3)


def test_save_load_and_planner_uses_it(quick_cal, tmp_path):
    p = calibrate.save_calibration(quick_cal, tmp_path / "cal.json")
    loaded = calibrate.load_calibration(p)
    assert loaded["path"] == str(p) and loaded["mem_bw_gb_s"] == quick_cal["mem_bw_gb_s"]
    dev = get_device_model("local", calibration=p)
    assert dev.mem_bw_gb_s == quick_cal["mem_bw_gb_s"] and dev.eff_bw == 1.0 and dev.eff_flops == 1.0
    r = predict_point("tiny-llama", 1, 64, PredictConfig("local", dtype="float32", calibration=p))
    assert r["status"] == "ok" and r["device"] == "cpu" and "calibration" in r["x_device_source"]
    # the calibration's local stack profile is the default: its floors (added per layer) and fixed host time
    sp = quick_cal["stack_profile"]
    assert r["x_stack"] == "local-cpu" and r["x_t_overhead_ms"] == pytest.approx(sp["host_us"] * 1e-3)
    assert r["x_t_floor_ms"] == pytest.approx(4 * sum(sp["floors_us"].values()) * 1e-3)
    assert r["x_mem_bw_gb_s"] == sp["mem_bw_gb_s"]
    plain = predict_point("tiny-llama", 1, 64, PredictConfig("local", dtype="float32", calibration=p, stack="none"))
    assert plain["x_stack"] is None and plain["x_t_floor_ms"] == 0.0


def test_default_path_under_cache_dir(quick_cal, tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path / "cache"))
    p = calibrate.save_calibration(quick_cal)
    assert p == tmp_path / "cache" / "calibration-cpu.json"
    assert calibrate.load_calibration(device="cpu")["path"] == str(p)
    assert get_device_model("cpu").source.startswith("calibration")


def test_missing_calibration_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="kit calibrate"):
        calibrate.load_calibration(device="cpu")
    # without a calibration the planner falls back to the catalog's CPU placeholder (flagged UNSURE)
    dev = get_device_model("cpu")
    assert dev.name == "CPU" and "UNSURE" in dev.source
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"device": "cpu"}))
    with pytest.raises(ValueError, match="mem_bw_gb_s"):
        calibrate.load_calibration(bad)


GOOD = {"device": "cpu", "threads": 2, "mem_bw_gb_s": 10.6, "matmul_tflops": {"float32": 0.6, "float16": None},
        "overhead_ms_fixed": 6.8, "overhead_ms_per_layer": 0.1, "attn_tflops": None}  # fmt: skip


@pytest.mark.parametrize(
    "content, says",
    [
        (json.dumps(GOOD, indent=2)[:120].encode(), "is not valid JSON (Expecting ',' delimiter, line 7 column"),
        (b"", "is not valid JSON (Expecting value, line 1 column 1)"),
        (b"\xff\xfe{}", "is not UTF-8 text (byte 0)"),
        (b"[1, 2]", "holds a JSON list, not a calibration object"),
        (json.dumps({**GOOD, "mem_bw_gb_s": "fast"}).encode(), "mem_bw_gb_s='fast' is not a number > 0 GB/s"),
        (json.dumps({**GOOD, "mem_bw_gb_s": -3}).encode(), "mem_bw_gb_s=-3 is not a number > 0 GB/s"),
        (json.dumps({**GOOD, "matmul_tflops": [0.6]}).encode(), "matmul_tflops=[0.6] is not {dtype: TFLOPS >= 0}"),
        (json.dumps({**GOOD, "threads": float("nan")}).encode(), "threads=nan is not a finite number >= 0"),
        (json.dumps({**GOOD, "overhead_ms_fixed": "6"}).encode(), "overhead_ms_fixed='6' is not a finite number"),
        (json.dumps({**GOOD, "stack_profile": [1]}).encode(), "stack_profile=[1] is not an object"),
        (
            json.dumps({**GOOD, "stack_profile": {"name": "local-cpu", "platform": "CPU", "eta_bw": 2}}).encode(),
            "stack_profile 'local-cpu': eta_bw=2 is outside the allowed range (0, 1]",
        ),
    ],
)
def test_a_corrupted_calibration_is_one_line_naming_the_file(content, says, tmp_path, monkeypatch, capsys):
    """Issue 28: a `kit calibrate` file corrupted afterwards (truncated, emptied, another type, a wrong value) made
    the planner end in a JSONDecodeError / TypeError traceback. Now a UserError naming the file, what is wrong and
    to rerun `kit calibrate`: from load_calibration, the planner's local device and `kit plan` (exit 2)."""
    from kit.cli import main

    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path))
    path = calibrate.default_path("cpu")
    path.write_bytes(content)
    for load in (lambda: calibrate.load_calibration(path), lambda: get_device_model("cpu")):
        with pytest.raises(UserError, match="rerun `kit calibrate`") as e:
            load()
        assert str(e.value).startswith(f"calibration file {path}") and says in str(e.value)
    assert main(["plan", "--model", "tiny-llama", "--accelerator", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err
    path.write_text(json.dumps(GOOD))  # the same file, intact: read, None and 0 TFLOPS dropped
    assert calibrate.load_calibration(path)["matmul_tflops"] == {"float32": 0.6}


def test_bad_sizes():
    with pytest.raises(ValueError, match="size_mb"):
        calibrate.measure_bandwidth("cpu", size_mb=0)
    with pytest.raises(ValueError, match="dtype"):
        calibrate.measure_matmul("cpu", "fp7")


def test_cli_calibrate(tmp_path, capsys, monkeypatch):
    from kit.cli import main

    monkeypatch.setattr(
        calibrate,
        "calibrate",
        lambda device=None, quick=False: {
            "device": "cpu",
            "device_name": "x",
            "device_key": "cpu",
            "threads": 1,
            "mem_bw_gb_s": 10.0,
            "mem_read_gb_s": 12.0,
            "matmul_tflops": {"float32": 0.1, "bfloat16": None},
            "overhead_ms_fixed": 0.5,
            "overhead_ms_per_layer": 0.2,
            "details": {
                "bandwidth": {
                    "copy_gb_s": 10.0,
                    "copy_p10": 9.0,
                    "copy_p90": 11.0,
                    "n": 3,
                    "size_mb": 8,
                    "read_gb_s": 12.0,
                },
                "matmul": {
                    "float32": {"tflops": 0.1, "n": 3, "size": 128},
                    "bfloat16": {"tflops": None, "error": "no"},
                },
                "overhead": {"step_ms": {1: 0.7, 4: 1.3}},
                "launch": {
                    "launch_us_fixed": 2.0,
                    "launch_us_per_op": 5.0,
                    "graph_launch_us_per_op": None,
                    "graph_note": "CUDA/HIP graphs are not available on cpu",
                },
                "floor": {
                    "floor_ms_per_layer": 0.3,
                    "preset": "tiny-llama",
                    "step_ms": 2.5,
                    "roofline_ms": 0.5,
                    "layers": 4,
                },
            },
            "attn_tflops": 0.01,
            "stack_profile": {
                "name": "local-cpu",
                "floors_us": {"attn": 100.0, "moe": 100.0, "norm": 100.0},
                "floor_mode": "add",
            },
        },  # fmt: skip
    )
    out = tmp_path / "c.json"
    assert main(["calibrate", "--quick", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "GB/s" in text and "GFLOP/s" in text and str(out) in text
    assert "launch eager 2.00 us + 5.000 us/op; graph: not available (CUDA/HIP graphs are not available" in text
    assert "per-layer floor 300.0 us" in text and "stack profile local-cpu" in text
    assert json.loads(out.read_text())["mem_bw_gb_s"] == 10.0


def test_out_path_validated_before_measuring(tmp_path, capsys, monkeypatch):
    from kit.cli import main

    def must_not_run(*a, **k):
        raise AssertionError("measured before validating --out")

    monkeypatch.setattr(calibrate, "calibrate", must_not_run)
    assert main(["calibrate", "--quick", "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} is a directory" in capsys.readouterr().err
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["calibrate", "--quick", "--out", str(afile / "sub" / "c.json")]) == 2
    assert f"{afile} is a file, not a directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing stray (no '<dir>.tmp')
    assert not (tmp_path.parent / (tmp_path.name + ".tmp")).exists()


def test_save_calibration_writes_beside_target_and_cleans_up(tmp_path, monkeypatch):
    cal = {"device": "cpu", "mem_bw_gb_s": 1.0, "matmul_tflops": {"float32": 0.1}}
    p = calibrate.save_calibration(cal, tmp_path / "new" / "deeper" / "c.json")  # missing parents are created
    assert json.loads(p.read_text())["mem_bw_gb_s"] == 1.0
    assert [x.name for x in p.parent.iterdir()] == ["c.json"]
    with pytest.raises(OutputPathError, match="is a directory"):
        calibrate.save_calibration(cal, tmp_path)

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("kit._io.os.replace", boom)  # the one atomic writer (kit._io)
    with pytest.raises(OSError, match="disk full"):
        calibrate.save_calibration({**cal, "mem_bw_gb_s": 2.0}, p)
    assert [x.name for x in p.parent.iterdir()] == ["c.json"]  # temp file removed, target untouched
    assert json.loads(p.read_text())["mem_bw_gb_s"] == 1.0
