"""Local device detection, synchronisation and memory statistics for cpu, cuda and rocm.

ROCm builds of PyTorch set ``torch.version.hip`` and reuse the ``torch.cuda`` API; they are reported as platform
``"rocm"``. On ROCm the marketing name can be empty or generic, so the gfx architecture (the part of
``gcnArchName`` before the first ``':'``) is mapped to a product family.

Peak memory on CPU is the process's resident-set high-water mark (``ru_maxrss``, via :mod:`resource`), which
only ever grows within a process; :func:`peak_memory_gb` therefore also reports a *tensor accounting* figure where
the caller provides it. On cuda/rocm it is ``torch.cuda.max_memory_allocated`` (the caching allocator's peak of
live tensors), reset per point with :func:`reset_peak_memory`.
"""
from __future__ import annotations

import os
import platform
import resource
import sys
from dataclasses import asdict, dataclass, field

import torch
from kit import dtypes
from kit.errors import UserError

#: what a torch build runs on: the CPU, CUDA (NVIDIA) or ROCm/HIP (AMD; still addressed as torch device "cuda")
PLATFORMS = ("cpu", "cuda", "rocm")

#: gfx architecture → (family, catalog names it covers). Source: ROCm "GPU hardware specifications" table
#: (rocm.docs.amd.com, reference/gpu-arch-specs): gfx942 = MI300A/MI300X/MI325X, gfx950 = MI350X/MI355X.
GFX_FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gfx942": ("MI300X/MI325X", ("MI300X", "MI325X")),
    "gfx950": ("MI350X/MI355X", ("MI355X",)),
    "gfx90a": ("MI200 (MI210/MI250X)", ()),
    "gfx908": ("MI100", ()),
}


@dataclass
class DeviceInfo:
    """What :func:`detect` found. ``memory_gb`` is total device memory in GB (1e9 bytes) of device 0."""

    platform: str  # one of PLATFORMS
    device: str  # torch device string: "cpu" or "cuda" (rocm uses "cuda" too)
    name: str
    count: int
    memory_gb: float
    gfx_arch: str | None = None
    family: str | None = None
    catalog_name: str | None = None
    torch_version: str = field(default_factory=lambda: torch.__version__)
    cuda_version: str | None = None
    hip_version: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def platform_of_build() -> str:
    """Backend this torch build targets with a usable device: ``"rocm"``, ``"cuda"`` or ``"cpu"``."""
    if torch.cuda.is_available():
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return "cpu"


def gfx_arch(props) -> str | None:
    """gfx arch from device properties (``gcnArchName`` like ``"gfx942:sramecc+:xnack-"`` → ``"gfx942"``)."""
    raw = getattr(props, "gcnArchName", None) or ""
    arch = raw.split(":", 1)[0].strip()
    return arch or None


def _match_catalog_name(name: str, family_names: tuple[str, ...] = ()) -> str | None:
    """Best-effort map of a device name to a catalog accelerator name (e.g. 'NVIDIA H200' → 'H200')."""
    up = name.upper().replace("-", " ")
    for key in ("GB300", "GB200", "B300", "B200", "H200", "H100", "MI355X", "MI350X", "MI325X", "MI300X"):
        if key in up.replace(" ", ""):
            return "MI355X" if key == "MI350X" else key
    if len(family_names) == 1:
        return family_names[0]
    return None


def cpu_name() -> str:
    """A readable CPU model name (from /proc/cpuinfo on Linux, else :func:`platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def detect(device: str | None = None) -> DeviceInfo:
    """Detect the device the kit will run on.

    Args:
        device: ``None``/``"auto"`` (the accelerator if any, else cpu), ``"cpu"``, ``"cuda"`` or ``"rocm"``.

    Returns:
        A :class:`DeviceInfo`.

    Raises:
        ValueError: ``device`` is not one of the allowed names, or names a platform this torch build lacks.
    """
    allowed = ("auto", "cpu", "cuda", "rocm")
    want = (device or "auto").lower()
    if want.startswith("cuda:"):
        want = "cuda"
    if want not in allowed:
        raise UserError(f"device={device!r} is not allowed; use one of {allowed}")
    have = platform_of_build()
    if want == "auto":
        want = have
    if want in ("cuda", "rocm"):
        if have == "cpu":
            raise UserError(f"device={device!r} requested but torch {torch.__version__} sees no GPU "
                             f"(torch.cuda.is_available() is False); use device='cpu'")
        if want != have:
            raise UserError(f"device={device!r} requested but this torch build is {have} "
                             f"(torch.version.hip={getattr(torch.version, 'hip', None)!r}); use device={have!r}")
    if want == "cpu":
        mem = _cpu_total_gb()
        return DeviceInfo(platform="cpu", device="cpu", name=cpu_name(), count=1, memory_gb=mem,
                          catalog_name="CPU", cuda_version=None, hip_version=None)
    props = torch.cuda.get_device_properties(0)
    name = getattr(props, "name", "") or ""
    arch = gfx_arch(props) if want == "rocm" else None
    family, fam_names = GFX_FAMILIES.get(arch, (None, ())) if arch else (None, ())
    generic = not name.strip() or name.strip() in ("AMD", "Device") or ("Radeon" in name and family is not None)
    if want == "rocm" and generic:  # Instinct parts can report an empty or a consumer-style marketing name
        name = f"AMD {family}" if family else f"AMD {arch or 'GPU'}"
    return DeviceInfo(
        platform=want, device="cuda", name=name, count=torch.cuda.device_count(),
        memory_gb=props.total_memory / 1e9, gfx_arch=arch, family=family,
        catalog_name=_match_catalog_name(name, fam_names) or (fam_names[0] if fam_names else None),
        cuda_version=getattr(torch.version, "cuda", None), hip_version=getattr(torch.version, "hip", None),
    )


def _cpu_total_gb() -> float:
    try:
        import psutil

        return psutil.virtual_memory().total / 1e9
    except Exception:  # pragma: no cover - psutil is a dependency
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def synchronize(device: str | torch.device = "cpu") -> None:
    """Wait for all queued work on ``device`` (no-op on CPU, whose ops are synchronous)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_peak_memory(device: str | torch.device = "cpu") -> None:
    """Reset the peak-memory counter before a point (cuda/rocm only; CPU RSS peak cannot be reset)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def rss_peak_gb() -> float:
    """Process resident-set high-water mark in GB (Linux reports ``ru_maxrss`` in KiB, macOS in bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    return peak * scale / 1e9


def peak_memory_gb(device: str | torch.device = "cpu") -> tuple[float, str]:
    """Peak memory during the current point, in GB, and how it was measured.

    Returns:
        ``(gb, method)`` with method ``"cuda_max_allocated"`` on cuda/rocm or ``"cpu_rss_highwater"`` on CPU
        (the process RSS high-water mark: includes Python, libraries and earlier points; an upper bound).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 1e9, "cuda_max_allocated"
    return rss_peak_gb(), "cpu_rss_highwater"


def allocated_gb(device: str | torch.device = "cpu") -> float:
    """Currently allocated device memory in GB (cuda/rocm); process RSS on CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.memory_allocated(dev) / 1e9
    try:
        import psutil

        return psutil.Process().memory_info().rss / 1e9
    except Exception:  # pragma: no cover
        return float("nan")


def free_memory(device: str | torch.device = "cpu") -> None:
    """Run the garbage collector and return cached blocks to the device (after an OOM, between points)."""
    import gc

    gc.collect()
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def check_dtype_supported(dtype: torch.dtype, device: str | torch.device) -> None:
    """Run a tiny matmul in ``dtype`` on ``device``; raise ValueError if the device cannot do it.

    Raises:
        ValueError: naming the dtype and device, e.g. bfloat16 on a pre-Ampere CUDA GPU.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise UserError(f"dtype=bfloat16 is not supported on {torch.cuda.get_device_name(dev)}; "
                         "use float16 or float32")
    try:
        a = torch.ones(4, 4, dtype=dtype, device=dev)
        (a @ a).sum().item()
    except (RuntimeError, TypeError) as e:
        raise UserError(f"dtype={dtypes.name_of(dtype)} does not work on device {dev}: {e}") from e


def add_cli(sub) -> None:
    """``kit devices``: the detected device and the accelerator catalog."""
    p = sub.add_parser("devices",
                       description="Show the device torch sees (cpu | cuda | rocm, name, memory, gfx arch) and the "
                                   "accelerator catalog with default $/GPU-hour (tco basis).")
    p.add_argument("--accelerators", default=None, help="extra accelerator CSV merged into the catalog")
    p.add_argument("--prices", default=None, help="extra price CSV (accelerator, usd_per_gpu_hr, basis)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=_cli_devices)


def _cli_devices(args) -> int:
    import json

    import pandas as pd

    from kit.catalog import load_catalog

    info = detect()
    cat = load_catalog(args.accelerators, args.prices)
    if args.json:
        print(json.dumps({"device": info.as_dict(), "catalog": json.loads(cat.table().to_json(orient="index"))},
                         indent=2))
        return 0
    print("Detected device")
    for k, v in info.as_dict().items():
        if v is not None:
            print(f"  {k:14s} {v if not isinstance(v, float) else round(v, 2)}")
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print("\nAccelerator catalog (dense TFLOPS; scale-up GB/s per GPU one direction; $/GPU-hr on 'tco' basis)")
        print(cat.table().to_string())
        print(f"\nPrice bases: {cat.bases} (choose with --basis where costs are computed; override with --prices)")
    return 0
