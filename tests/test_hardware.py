"""Device detection (ROCm and CUDA simulated by patching torch; no GPU here), dtype parsing, memory helpers."""
from types import SimpleNamespace

import pytest
import torch

from kit import dtypes
from kit import hardware


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


@pytest.mark.parametrize("arch,name,family,catalog", [
    ("gfx950:sramecc+:xnack-", "", "MI350X/MI355X", "MI355X"),
    ("gfx942:sramecc+:xnack-", "AMD Instinct MI300X", "MI300X/MI325X", "MI300X"),
    ("gfx942", "AMD Instinct MI325X", "MI300X/MI325X", "MI325X"),
    ("gfx950", "AMD Radeon Graphics", "MI350X/MI355X", "MI355X"),
])
def test_rocm_detection_maps_gfx_arch_to_family(monkeypatch, arch, name, family, catalog):
    _fake_gpu(monkeypatch, hip="7.0.1", name=name, arch=arch)
    info = hardware.detect()
    assert info.platform == "rocm" and info.device == "cuda"
    assert info.gfx_arch == arch.split(":")[0]
    assert info.family == family
    assert info.catalog_name == catalog
    assert info.name.strip()  # never empty, even when the marketing name is
    assert info.hip_version == "7.0.1" and info.count == 8


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
            raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')
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
