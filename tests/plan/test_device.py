"""kit.plan.device: the accelerator model from the catalog, a calibration or this machine; efficiencies."""

from __future__ import annotations

import pytest

from kit.plan.config import PredictConfig
from kit.plan.device import DeviceModel, get_device_model
from kit.plan.roofline import predict_point
from kit.plan.spec import get_spec


def test_local_calibration_drives_prediction():
    cal = {
        "device": "cpu",
        "device_name": "test cpu",
        "memory_gb": 16.0,
        "mem_bw_gb_s": 10.0,
        "matmul_tflops": {"float32": 0.1, "bfloat16": 0.2},
        "overhead_ms_fixed": 1.0,
        "overhead_ms_per_layer": 0.5,
    }
    dev = get_device_model("local", calibration=cal)
    assert dev.eff_bw == 1.0 and dev.mem_bw_gb_s == 10.0
    r = predict_point("tiny-llama", 1, 128, PredictConfig("local", dtype="float32", calibration=cal))
    s = get_spec("tiny-llama")
    assert r["x_overhead_ms"] == pytest.approx(1.0 + 0.5 * s.num_layers)
    assert r["tpot_ms_p50"] == pytest.approx(r["x_t_linear_ms"] + r["x_t_attn_ms"] + r["x_overhead_ms"])
    with pytest.raises(ValueError, match="float16"):
        predict_point("tiny-llama", 1, 128, PredictConfig("local", dtype="float16", calibration=cal))


@pytest.mark.parametrize("v", [1.5, 0, -0.2, 1.0001])
def test_efficiency_outside_unit_interval_rejected(v, capsys):
    from kit.cli import main

    for kw in ("eff_bw", "eff_flops"):
        with pytest.raises(ValueError, match=rf"{kw}={v!r} is outside the allowed range \(0, 1\]"):
            predict_point("llama-3.1-8b", 1, 1024, PredictConfig("H100", **{kw: v}))
        with pytest.raises(ValueError, match=rf"{kw}={v!r} is outside the allowed range \(0, 1\]"):
            get_device_model("H100", **{kw: v})
    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "H100", "--eff-bw", str(v)]) == 2
    assert "(0, 1]" in capsys.readouterr().err
    assert predict_point("llama-3.1-8b", 1, 1024, PredictConfig("H100", eff_bw=1.0))["eff_bw"] == 1.0


def test_catalog_device_model_and_overrides():
    from kit.errors import UnknownNameError, UserError
    from kit.plan.device import DEFAULT_EFF_BW, DEFAULT_EFF_FLOPS, UNCALIBRATED_CPU_OVERHEAD_MS

    d = get_device_model("mi355x")
    assert isinstance(d, DeviceModel) and d.name == "MI355X" and d.device == "rocm"
    assert (d.eff_bw, d.eff_flops) == (DEFAULT_EFF_BW, DEFAULT_EFF_FLOPS) and d.source.startswith("catalog")
    assert d.mem_bw_gb_s == 8000 and d.peak_tflops("bf16") > 0
    assert get_device_model("B300", mem_gb=100.0, overhead_ms_fixed=0.0).mem_gb == 100.0
    with pytest.raises(UserError, match="unknown device field 'hbm'"):
        get_device_model("B300", hbm=1)
    with pytest.raises(UserError, match="mem_gb=-1"):
        get_device_model("B300", mem_gb=-1)
    with pytest.raises(UserError, match="overhead_ms_fixed=-1"):
        get_device_model("B300", overhead_ms_fixed=-1)
    with pytest.raises(UnknownNameError, match="Z100"):
        get_device_model("Z100")
    cpu = get_device_model("CPU")  # the catalog's placeholder: measured figures used as achievable, flagged
    assert (cpu.eff_bw, cpu.eff_flops) == (1.0, 1.0) and "UNSURE" in cpu.source
    assert (cpu.overhead_ms_fixed, cpu.overhead_ms_per_layer) == UNCALIBRATED_CPU_OVERHEAD_MS


def test_peak_tflops_fp4_falls_back_to_fp8_and_missing_is_named():
    from kit.errors import UserError

    d = DeviceModel("X", "cuda", 80.0, 3000.0, {"bfloat16": 900.0, "fp8": 1800.0})
    assert d.peak_tflops("mxfp4") == 1800.0 and d.peak_tflops("bfloat16") == 900.0
    with pytest.raises(UserError, match="no float32 TFLOPS figure; it has \\['bfloat16', 'fp8'\\]"):
        d.peak_tflops("float32")
