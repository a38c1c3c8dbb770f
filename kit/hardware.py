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
from kit.visibility import visible_devices

#: what a torch build runs on: the CPU, CUDA (NVIDIA) or ROCm/HIP (AMD; still addressed as torch device "cuda")
PLATFORMS = ("cpu", "cuda", "rocm")

#: gfx architecture → the Instinct parts built on it: (part, compute units, memory GiB). One arch covers several
#: products, so a part is told apart by its compute-unit count and memory, never by the arch alone. Sources: ROCm
#: "GPU hardware specifications" (rocm.docs.amd.com, reference/gpu-arch-specs): MI300X 304 CUs / 192 GiB, MI325X
#: 304 / 256, MI300A 228 / 128 (gfx942); MI350X and MI355X 256 / 288 (gfx950: the two differ only in clocks and
#: power, which torch does not report).
GFX_PARTS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "gfx942": (("MI300X", 304, 192), ("MI325X", 304, 256), ("MI300A", 228, 128)),
    "gfx950": (("MI350X", 256, 288), ("MI355X", 256, 288)),
    "gfx90a": (("MI210", 104, 64), ("MI250X", 220, 128)),
    "gfx908": (("MI100", 120, 32),),
}
#: a part matches when its memory is within this fraction of the detected memory (the driver reserves some)
PART_MEMORY_TOLERANCE = 0.1
#: marketing-name keys that map straight to a catalog accelerator (a real name beats any inference)
NAME_KEYS = ("GB300", "GB200", "B300", "B200", "H200", "H100", "MI355X", "MI350X", "MI325X", "MI300X", "MI300A")


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
    compute_units: int | None = None
    #: how the part was named: from the device name, from arch + compute units + memory, or why it could not be
    identity: str = ""
    #: which devices this process may see, why, and which physical devices they are
    #: (:func:`kit.visibility.visible_devices`)
    visibility: str = ""
    torch_version: str = field(default_factory=lambda: torch.__version__)
    cuda_version: str | None = None
    hip_version: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def platform_of_build() -> str:
    """Backend this torch build targets with a usable device: ``"rocm"``, ``"cuda"`` or ``"cpu"``."""
    if torch.cuda.is_available():
        return gpu_api()
    return "cpu"


def gpu_api() -> str:
    """The GPU API this torch build is compiled for, whether or not a GPU is visible: ``"rocm"`` (HIP),
    ``"cuda"`` or ``"cpu"`` (a CPU-only build). The visibility variables are read by these rules
    (:func:`kit.visibility.resolve_visible_devices`), even when they hide every GPU."""
    if getattr(torch.version, "hip", None):
        return "rocm"
    return "cuda" if getattr(torch.version, "cuda", None) else "cpu"


def gfx_arch(props) -> str | None:
    """gfx arch from device properties (``gcnArchName`` like ``"gfx942:sramecc+:xnack-"`` → ``"gfx942"``)."""
    raw = getattr(props, "gcnArchName", None) or ""
    arch = raw.split(":", 1)[0].strip()
    return arch or None


def _catalog_names() -> set[str]:
    from kit.catalog import load_catalog

    return set(load_catalog().names)


def identify_part(name: str, arch: str | None, compute_units: int | None, memory_gb: float) -> tuple[str | None, str]:
    """Name the accelerator behind a device: ``(catalog name or None, how it was told)``.

    A recognised marketing name ("NVIDIA H200", "AMD Instinct MI300X") maps directly. Otherwise, on ROCm, the gfx
    arch's parts (:data:`GFX_PARTS`) are matched on compute units and memory (within
    :data:`PART_MEMORY_TOLERANCE`). When no part matches, several do, or the part is not in the catalog, the
    catalog name is None and the text says why (callers then use the measured memory and name the arch in any
    error).

    Args:
        memory_gb: detected device memory, GB (1e9 bytes).
    """
    up = name.upper().replace("-", " ").replace(" ", "")
    known = _catalog_names()
    for key in NAME_KEYS:
        if key in up:
            if key in known:
                return key, f"from the device name {name!r}"
            return None, f"the device name {name!r} is a {key}, which is not in the accelerator catalog"
    parts = GFX_PARTS.get(arch or "")
    if not parts:
        return None, (
            f"unknown gfx arch {arch!r} (no catalog part)"
            if arch
            else f"device name {name!r} matches no catalog accelerator"
        )
    mem_gib = memory_gb * 1e9 / 2**30
    fits = [
        p
        for p in parts
        if (compute_units is None or p[1] == compute_units) and abs(mem_gib - p[2]) <= PART_MEMORY_TOLERANCE * p[2]
    ]
    seen = f"{arch}, {compute_units if compute_units is not None else '?'} CUs, {mem_gib:.0f} GiB"
    if not fits:
        return None, (
            f"unknown {arch} part ({seen}; {arch} parts: "
            + ", ".join(f"{p} {c} CUs / {m} GiB" for p, c, m in parts)
            + "); the measured memory is used"
        )
    if len(fits) > 1:
        return None, (
            f"cannot tell {' from '.join(p[0] for p in fits)} apart ({seen}: same compute units and "
            "memory); the measured memory is used; name the part with --accelerator"
        )
    part = fits[0][0]
    if part not in known:
        return None, f"{part} ({seen}) is not in the accelerator catalog; the measured memory is used"
    return part, f"{part} from {seen}"


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
    vis = visible_devices(gpu_api())  # a conflicting or empty selection is an error before any device is used
    if want in ("cuda", "rocm"):
        if have == "cpu":
            why = f"; {vis['explanation']}" if vis["set"] else ""
            raise UserError(
                f"device={device!r} requested but torch {torch.__version__} sees no GPU "
                f"(torch.cuda.is_available() is False{why}); use device='cpu'"
            )
        if want != have:
            raise UserError(
                f"device={device!r} requested but this torch build is {have} "
                f"(torch.version.hip={getattr(torch.version, 'hip', None)!r}); use device={have!r}"
            )
    if want == "cpu":
        mem = _cpu_total_gb()
        return DeviceInfo(
            platform="cpu",
            device="cpu",
            name=cpu_name(),
            count=1,
            memory_gb=mem,
            catalog_name="CPU",
            compute_units=os.cpu_count(),
            identity="the host CPU",
            visibility=vis["explanation"],
            cuda_version=None,
            hip_version=None,
        )
    props = torch.cuda.get_device_properties(0)
    name = getattr(props, "name", "") or ""
    arch = gfx_arch(props) if want == "rocm" else None
    parts = GFX_PARTS.get(arch or "", ())
    family = "/".join(p[0] for p in parts) or None
    cus = getattr(props, "multi_processor_count", None)
    cus = int(cus) if isinstance(cus, int) else None
    mem_gb = props.total_memory / 1e9
    generic = not name.strip() or name.strip() in ("AMD", "Device") or "Radeon" in name
    if want == "rocm" and generic:  # Instinct parts can report an empty or a consumer-style marketing name
        name = f"AMD {arch or 'GPU'} ({family})" if family else f"AMD {arch or 'GPU'}"
        catalog_name, identity = identify_part("", arch, cus, mem_gb)
    else:
        catalog_name, identity = identify_part(name, arch, cus, mem_gb)
    return DeviceInfo(
        platform=want,
        device="cuda",
        name=name,
        count=torch.cuda.device_count(),
        memory_gb=mem_gb,
        gfx_arch=arch,
        family=family,
        catalog_name=catalog_name,
        compute_units=cus,
        identity=identity,
        visibility=vis["explanation"],
        cuda_version=getattr(torch.version, "cuda", None),
        hip_version=getattr(torch.version, "hip", None),
    )


def _cpu_total_gb() -> float:
    try:
        import psutil

        return psutil.virtual_memory().total / 1e9
    except Exception:  # pragma: no cover - psutil is a dependency
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


#: a core counts as busy when other work uses at least this fraction of it (sampled at the start of a sweep)
BUSY_CORE_FRACTION = 0.5


def cpu_threads_for_timing(sample_s: float = 0.3) -> tuple[int, str, float]:
    """How many torch threads a CPU measurement should use: one per core that is free now.

    On a shared CPU, torch's default (one thread per core) makes every step wait for whichever thread the OS has
    descheduled: steps then scatter 10–100× and throughput drops by half with one busy process beside it. This
    samples per-core use for ``sample_s`` seconds (``psutil.cpu_percent``) over the cores this process may run on
    and keeps one thread per core below :data:`BUSY_CORE_FRACTION` busy (at least one).

    Returns:
        ``(threads, reason, busy_cores)``: the count, a one-line reason for the row, and the cores' worth of
        other work seen (e.g. 1.0 when one other process keeps a core busy).
    """
    import psutil

    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = list(range(psutil.cpu_count() or 1))
    use = psutil.cpu_percent(interval=sample_s, percpu=True)
    mine = [use[c] / 100.0 for c in cores if c < len(use)] or [0.0]
    busy = sum(mine)
    free = sum(1 for u in mine if u < BUSY_CORE_FRACTION)
    threads = max(1, free)
    if busy < BUSY_CORE_FRACTION:
        reason = f"{len(cores)} cores, all free at the start"
    elif free:
        reason = f"{free} of {len(cores)} cores free at the start ({busy:.1f} cores busy with other work)"
    else:  # the thread count is the floor of one, not a free core
        reason = f"no core of {len(cores)} free at the start ({busy:.1f} cores busy with other work): 1 thread"
    return threads, reason, busy


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
        raise UserError(f"dtype=bfloat16 is not supported on {torch.cuda.get_device_name(dev)}; use float16 or float32")
    try:
        a = torch.ones(4, 4, dtype=dtype, device=dev)
        (a @ a).sum().item()
    except (RuntimeError, TypeError) as e:
        raise UserError(f"dtype={dtypes.name_of(dtype)} does not work on device {dev}: {e}") from e


def add_cli(sub) -> None:
    """``kit devices``: the detected device and the accelerator catalog."""
    p = sub.add_parser(
        "devices",
        description="Show the device torch sees (cpu | cuda | rocm, name, memory, gfx arch) and the "
        "accelerator catalog with default $/GPU-hour (tco basis).",
    )
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
        print(
            json.dumps({"device": info.as_dict(), "catalog": json.loads(cat.table().to_json(orient="index"))}, indent=2)
        )
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
