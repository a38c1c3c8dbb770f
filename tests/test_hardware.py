"""Device detection (ROCm and CUDA simulated by patching torch; no GPU here), dtype parsing, memory helpers."""

from types import SimpleNamespace

import pytest
import torch

from kit import dtypes, hardware
from kit.errors import UserError


def test_cpu_detection():
    info = hardware.detect("cpu")
    assert info.platform == "cpu" and info.device == "cpu" and info.count == 1
    assert info.memory_gb > 0 and info.catalog_name == "CPU" and info.name


def _fake_gpu(monkeypatch, *, hip, name, arch=None, mem=288e9, count=8):
    props = SimpleNamespace(name=name, total_memory=int(mem))
    if arch is not None:
        props.gcnArchName = arch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.version, "cuda", None if hip else "13.0", raising=False)


def _fake_gpu_cus(monkeypatch, cus, **kw):
    _fake_gpu(monkeypatch, **kw)
    props = torch.cuda.get_device_properties(0)
    props.multi_processor_count = cus


@pytest.mark.parametrize(
    "arch,name,family,catalog",
    [
        ("gfx942:sramecc+:xnack-", "AMD Instinct MI300X", "MI300X/MI325X/MI300A", "MI300X"),
        ("gfx942", "AMD Instinct MI325X", "MI300X/MI325X/MI300A", "MI325X"),
        ("gfx950", "AMD Instinct MI355X", "MI350X/MI355X", "MI355X"),
    ],
)
def test_rocm_detection_a_real_name_maps_directly(monkeypatch, arch, name, family, catalog):
    _fake_gpu(monkeypatch, hip="7.0.1", name=name, arch=arch)
    info = hardware.detect()
    assert info.platform == "rocm" and info.device == "cuda"
    assert info.gfx_arch == arch.split(":")[0]
    assert info.family == family
    assert info.catalog_name == catalog and "device name" in info.identity
    assert info.hip_version == "7.0.1" and info.count == 8


@pytest.mark.parametrize("name", ["", "AMD Radeon Graphics"])
@pytest.mark.parametrize(
    "cus,mem_mib,catalog,says",
    [
        (304, 196_592, "MI300X", "MI300X from gfx942, 304 CUs"),  # case D1 (a)
        (304, 256 * 1024, "MI325X", "MI325X from gfx942, 304 CUs, 256 GiB"),  # case D1 (b)
        (228, 128 * 1024, None, "MI300A (gfx942, 228 CUs, 128 GiB) is not in the accelerator catalog"),  # D1 (c)
        (200, 96 * 1024, None, "unknown gfx942 part (gfx942, 200 CUs, 96 GiB"),  # the same kind: no part fits
    ],
)
def test_rocm_parts_of_one_arch_are_told_apart_by_cus_and_memory(monkeypatch, name, cus, mem_mib, catalog, says):
    _fake_gpu_cus(monkeypatch, cus, hip="7.0.1", name=name, arch="gfx942:sramecc+:xnack-", mem=mem_mib * 2**20)
    info = hardware.detect()
    assert info.catalog_name == catalog and says in info.identity, info.identity
    assert info.compute_units == cus and info.name.strip() and "gfx942" in info.name  # never empty
    assert info.memory_gb == pytest.approx(mem_mib * 2**20 / 1e9)  # the measured memory, always


def test_parts_that_cannot_be_told_apart_are_not_guessed(monkeypatch):
    _fake_gpu_cus(monkeypatch, 256, hip="7.0.1", name="", arch="gfx950", mem=288 * 2**30)
    info = hardware.detect()
    assert info.catalog_name is None and "cannot tell MI350X from MI355X apart" in info.identity
    assert "--accelerator" in info.identity
    _fake_gpu_cus(monkeypatch, 80, hip="7.0.1", name="", arch="gfx1100", mem=24e9)
    info = hardware.detect()
    assert info.catalog_name is None and "unknown gfx arch 'gfx1100'" in info.identity


def test_cuda_detection(monkeypatch):
    _fake_gpu(monkeypatch, hip=None, name="NVIDIA B300 SXM6 AC", mem=275e9)
    info = hardware.detect("auto")
    assert info.platform == "cuda" and info.gfx_arch is None and info.catalog_name == "B300"
    with pytest.raises(ValueError, match="rocm"):
        hardware.detect("rocm")


def test_bad_device_names_the_value():
    with pytest.raises(ValueError, match="'tpu'.*allowed"):
        hardware.detect("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no GPU"):
            hardware.detect("cuda")


def test_model_dtypes():
    assert dtypes.to_torch("bf16") is torch.bfloat16
    assert dtypes.to_torch("float32") is torch.float32
    with pytest.raises(ValueError, match="'float8'.*allowed"):
        dtypes.to_torch("float8")


def test_dtype_the_device_cannot_do(monkeypatch):
    real_ones = torch.ones

    def broken(*a, dtype=None, **k):
        if dtype is torch.float16:
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")
        return real_ones(*a, dtype=dtype, **k)

    monkeypatch.setattr(torch, "ones", broken)
    with pytest.raises(ValueError, match="float16 does not work on device cpu"):
        hardware.check_dtype_supported(torch.float16, "cpu")


def test_memory_helpers_on_cpu():
    gb, method = hardware.peak_memory_gb("cpu")
    assert gb > 0 and method == "cpu_rss_highwater"
    hardware.synchronize("cpu")
    hardware.reset_peak_memory("cpu")
    hardware.free_memory("cpu")


def test_conflicting_visibility_is_an_error_at_detection(monkeypatch):
    _fake_gpu(monkeypatch, hip="7.0.1", name="AMD Instinct MI300X", arch="gfx942")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(ValueError, match="disagree on this ROCm machine"):
        hardware.detect()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert "HIP_VISIBLE_DEVICES='0'" in hardware.detect().visibility


def test_rocm_lists_resolve_to_physical_devices_at_detection(monkeypatch):
    """Issue 22: ROCR=2,3 then HIP=1 is physical GPU 3 (said in the visibility text); ROCR=1 HIP=1 leaves no device:
    an error naming both variables, even though HIP then reports no GPU (torch.cuda.is_available() False)."""
    _fake_gpu(monkeypatch, hip="7.0.1", name="AMD Instinct MI300X", arch="gfx942")
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    assert "physical devices [3]" in hardware.detect().visibility
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="HIP_VISIBLE_DEVICES='1' selects device 1, but ROCR_VISIBLE_DEVICES='1'"):
        hardware.detect()


def test_no_gpu_error_names_the_hiding_variable(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match="sees no GPU.*CUDA_VISIBLE_DEVICES"):
        hardware.detect("cuda")


def test_cpu_threads_follow_the_free_cores(monkeypatch):
    import psutil

    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval, percpu: [98.0, 3.0])  # another job owns core 0
    n, why, busy = hardware.cpu_threads_for_timing(0.0)
    assert n == 1 and busy == pytest.approx(1.01) and "1 of 2 cores free" in why
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval, percpu: [2.0, 1.0])
    assert hardware.cpu_threads_for_timing(0.0)[:2] == (2, "2 cores, all free at the start")
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval, percpu: [100.0, 100.0])
    assert hardware.cpu_threads_for_timing(0.0)[0] == 1  # never zero
