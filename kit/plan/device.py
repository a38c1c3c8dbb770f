"""The accelerator model the roofline uses (:class:`DeviceModel`): peaks and efficiencies of one accelerator.

Not the detected device (that is :class:`kit.hardware.DeviceInfo`): a :class:`DeviceModel` is what the planner
*assumes* of an accelerator, built by :func:`get_device_model` from one of three sources:

- the **catalog** (``kit/data/accelerators.csv``; ``"MI355X"``, ``"B300"``, ...): datasheet peaks, used at
  :data:`DEFAULT_EFF_BW` / :data:`DEFAULT_EFF_FLOPS` of peak;
- a **calibration** (``kit calibrate``, :mod:`kit.measure.calibrate`): measured achievable bandwidth, matmul and
  decode-attention TFLOPS (efficiencies 1.0) and a measured per-step overhead (fixed + per layer) that dominates
  small batches in eager PyTorch;
- the **local device** (``"local"``): this machine's calibration, else its catalog row (a detected GPU) or the
  catalog's CPU placeholder (uncalibrated; flagged UNSURE).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import pandas as pd

from kit import dtypes
from kit.errors import InputNotFoundError, UserError

#: Default efficiencies for catalog (peak) figures: the fraction of datasheet HBM bandwidth and dense TFLOPS a
#: well-tuned decode/prefill reaches. Assumptions, printed with every prediction; override per call.
DEFAULT_EFF_BW = 0.7
DEFAULT_EFF_FLOPS = 0.6
#: step overhead (fixed ms, ms per layer) and decode-attention TFLOPS for an uncalibrated CPU: what `kit calibrate`
#: measured on the kit's 2-core CI machine (Xeon, 2 threads, quiet). Replace with your own calibration.
UNCALIBRATED_CPU_OVERHEAD_MS = (0.4, 0.35)
UNCALIBRATED_CPU_ATTN_TFLOPS = 0.010
#: per-layer launch/engine overhead of a catalog GPU decode step, ms: ~20 kernels per decoder layer (norms, QKV
#: and output projections, RoPE + cache write, attention, router, top-k, expert GEMMs, activation, residual adds;
#: an assumption) × 0.5 µs, the gap between back-to-back short kernels replayed from a CUDA graph (3.4 µs per
#: kernel vs 2.9 µs of execution, NVIDIA Technical Blog "Getting Started with CUDA Graphs", A. Gray, 2019). UNSURE.
DEFAULT_GPU_OVERHEAD_MS_PER_LAYER = 20 * 0.5e-3


@dataclass
class DeviceModel:
    """What the roofline needs of one accelerator. ``mem_bw_gb_s`` (GB/s) and ``tflops`` (per dtype key of
    :func:`kit.dtypes.peak_key`) are peaks (catalog) or measured achievable values (calibration, then
    ``eff_bw = eff_flops = 1``); ``mem_gb`` is GB per accelerator; overheads are ms per decode step."""

    name: str
    device: str  # cpu | cuda | rocm
    mem_gb: float
    mem_bw_gb_s: float
    tflops: dict
    eff_bw: float = DEFAULT_EFF_BW
    eff_flops: float = DEFAULT_EFF_FLOPS
    overhead_ms_fixed: float = 0.0
    overhead_ms_per_layer: float = 0.0
    attn_tflops: float | None = None  # measured decode-attention throughput (calibration); None: matmul peak
    scaleup_gb_s: float | None = None
    #: communication links (kit.plan.comm): per-call latency α (µs) and nccl-tests bus bandwidth (GB/s) within a
    #: node (scale-up) and between nodes (scale-out); None: unknown (that link costs nothing in the model)
    scaleup_alpha_us: float | None = None
    scaleup_busbw_gb_s: float | None = None
    scaleout_alpha_us: float | None = None
    scaleout_busbw_gb_s: float | None = None
    link_source: str = ""
    gpus_per_node: int = 8
    #: GPUs one scale-up fabric joins (NVLink/Infinity Fabric domain): 8 in an HGX/OAM node, 72 in an NVL72 rack
    #: whose compute trays hold 4; None: the node (``gpus_per_node``)
    scaleup_domain_gpus: int | None = None
    full_name: str = ""
    source: str = "catalog"
    #: a calibration's local stack profile (kit.plan.stack; a dict as `kit calibrate` wrote it), None otherwise
    stack_profile: dict | None = None

    def scaleup_size(self) -> int:
        """GPUs reachable over the scale-up links (``scaleup_domain_gpus``, else ``gpus_per_node``; at least 1)."""
        return max(1, int(self.scaleup_domain_gpus or self.gpus_per_node))

    def peak_tflops(self, dtype) -> float:
        """TFLOPS for compute in ``dtype`` (fp4 falls back to the fp8 figure when the device has no fp4 one).

        Raises:
            UserError: the device has no figure for that dtype (names the ones it has).
        """
        key = dtypes.peak_key(dtype)
        v = self.tflops.get(key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            if key == "fp4" and self.tflops.get("fp8"):
                return float(self.tflops["fp8"])
            have = {k: v for k, v in self.tflops.items() if v and not (isinstance(v, float) and math.isnan(v))}
            raise UserError(f"{self.name} has no {key} TFLOPS figure; it has {sorted(have)} (set compute_dtype)")
        return float(v)


def check_eff(name: str, v) -> float:
    """An efficiency (fraction of a peak) as a float in (0, 1].

    Raises:
        UserError: not a number, or outside (0, 1] (names the value and the range).
    """
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise UserError(f"{name}={v!r} must be a number in (0, 1]") from None
    if not 0 < f <= 1:
        raise UserError(
            f"{name}={v!r} is outside the allowed range (0, 1]: an efficiency is a fraction of the "
            "peak figure (e.g. 0.7)"
        )
    return f


def from_calibration(cal: dict) -> DeviceModel:
    """A :class:`DeviceModel` from a calibration dict (:func:`kit.measure.calibrate.calibrate`): measured figures,
    efficiencies 1.0, the measured per-step overhead. Warns (UserWarning) when a CPU calibration was measured with
    another thread count than torch uses now."""
    if cal.get("device", "cpu") == "cpu" and cal.get("threads"):
        import torch

        if int(cal["threads"]) != torch.get_num_threads():
            warnings.warn(
                f"calibration was measured with {cal['threads']} CPU threads but torch now uses "
                f"{torch.get_num_threads()}: predictions for this process may be off "
                "(rerun `kit calibrate --threads N`)",
                stacklevel=3,
            )
    return DeviceModel(
        name=cal.get("catalog_name") or ("CPU" if cal.get("device", "cpu") == "cpu" else "local"),
        device=cal.get("device", "cpu"),
        mem_gb=float(cal.get("memory_gb") or 0) or 1.0,
        mem_bw_gb_s=float(cal["mem_bw_gb_s"]),
        tflops=dict(cal["matmul_tflops"]),
        eff_bw=1.0,
        eff_flops=1.0,
        overhead_ms_fixed=float(cal.get("overhead_ms_fixed", 0.0)),
        overhead_ms_per_layer=float(cal.get("overhead_ms_per_layer", 0.0)),
        attn_tflops=float(cal["attn_tflops"]) if cal.get("attn_tflops") else None,
        scaleup_gb_s=None,
        gpus_per_node=1,
        full_name=cal.get("device_name", ""),
        source=f"calibration {cal.get('path', '')} ({cal.get('created_utc', '')})".strip(),
        stack_profile=cal.get("stack_profile") if isinstance(cal.get("stack_profile"), dict) else None,
    )


def from_catalog(accelerator: str, catalog=None) -> DeviceModel:
    """A :class:`DeviceModel` from the catalog row of ``accelerator`` (datasheet peaks at the default efficiencies,
    the per-layer GPU overhead :data:`DEFAULT_GPU_OVERHEAD_MS_PER_LAYER`, the catalog's link α and busbw).
    The catalog's CPU row holds figures measured on the kit's 2-core CI machine, not peaks: it is used as achievable
    (efficiency 1) with that machine's step overhead and decode-attention rate (``kit calibrate``, 2 threads), and
    flagged UNSURE.

    Raises:
        UnknownNameError: unknown accelerator (lists the catalog).
    """
    from kit.catalog import load_catalog

    row = (catalog or load_catalog()).get(accelerator)
    tfl = {
        "float32": row.get("fp32_tflops"),
        "bfloat16": row.get("bf16_tflops"),
        "float16": row.get("fp16_tflops"),
        "fp8": row.get("fp8_tflops"),
        "fp4": row.get("fp4_tflops"),
    }
    tfl = {k: float(v) for k, v in tfl.items() if v is not None and pd.notna(v)}
    vendor = str(row.get("vendor", "")).upper()
    kind = "rocm" if vendor == "AMD" else "cpu" if row.name == "CPU" else "cuda"
    su = row.get("scaleup_gb_s")
    flags = row.get("flags")

    def num(col):
        v = row.get(col)
        return float(v) if v is not None and pd.notna(v) else None

    dev = DeviceModel(
        name=str(row.name),
        device=kind,
        mem_gb=float(row["hbm_gb"]),
        mem_bw_gb_s=float(row["hbm_tb_s"]) * 1e3,
        tflops=tfl,
        scaleup_gb_s=float(su) if su is not None and pd.notna(su) else None,
        gpus_per_node=int(row["gpus_per_node"]),
        scaleup_domain_gpus=int(num("scaleup_domain_gpus")) if num("scaleup_domain_gpus") else None,
        full_name=str(row.get("full_name", row.name)),
        source="catalog" + (f" [{flags}]" if isinstance(flags, str) and flags else ""),
        overhead_ms_per_layer=0.0 if row.name == "CPU" else DEFAULT_GPU_OVERHEAD_MS_PER_LAYER,
        scaleup_alpha_us=num("scaleup_alpha_us"),
        scaleup_busbw_gb_s=num("scaleup_busbw_gb_s"),
        scaleout_alpha_us=num("scaleout_alpha_us"),
        scaleout_busbw_gb_s=num("scaleout_busbw_gb_s"),
        link_source=str(row.get("link_source")) if isinstance(row.get("link_source"), str) else "",
    )
    if dev.name == "CPU":
        dev.eff_bw = dev.eff_flops = 1.0
        dev.overhead_ms_fixed, dev.overhead_ms_per_layer = UNCALIBRATED_CPU_OVERHEAD_MS
        dev.attn_tflops = UNCALIBRATED_CPU_ATTN_TFLOPS
        dev.source = "catalog CPU placeholder, uncalibrated (run `kit calibrate`) [UNSURE]"
    return dev


def local_device_model(accelerator: str = "local", catalog=None) -> DeviceModel:
    """This machine (``"local"``) or the CPU (``"cpu"``): its calibration file when one exists; else, for
    ``"local"``, the catalog row of the detected GPU, and otherwise the catalog's CPU placeholder.

    Raises:
        InputNotFoundError: ``"local"`` on a GPU never calibrated and with no catalog row.
    """
    from kit.measure.calibrate import load_calibration

    cpu = accelerator.lower() == "cpu"
    try:
        return from_calibration(load_calibration(device="cpu" if cpu else None))
    except FileNotFoundError:
        pass
    if not cpu:
        from kit.hardware import detect

        info = detect()
        if info.platform != "cpu":
            if not info.catalog_name:
                raise InputNotFoundError(
                    f"{info.name} has no calibration and no catalog row: run `kit calibrate` "
                    "or name a catalog accelerator"
                )
            return from_catalog(info.catalog_name, catalog)
    return from_catalog("CPU", catalog)


def apply_overrides(dev: DeviceModel, **overrides) -> DeviceModel:
    """Set fields of ``dev`` (``eff_bw=0.8``, ``mem_gb=...``; None values are skipped); returns ``dev``.

    Raises:
        UserError: an unknown field, a non-positive size, a negative overhead, or an efficiency outside (0, 1].
    """
    for k, v in overrides.items():
        if v is None:
            continue
        if not hasattr(dev, k):
            raise UserError(f"unknown device field {k!r}; allowed: {sorted(asdict(dev))}")
        if k in ("eff_bw", "eff_flops"):
            v = check_eff(k, v)
        overhead = k in ("overhead_ms_fixed", "overhead_ms_per_layer")
        if isinstance(v, (int, float)) and not overhead and v <= 0:
            raise UserError(f"{k}={v!r} must be > 0")
        if overhead and v < 0:
            raise UserError(f"{k}={v!r} must be >= 0")
        setattr(dev, k, v)
    return dev


def get_device_model(accelerator: str = "local", catalog=None, calibration=None, **overrides) -> DeviceModel:
    """A :class:`DeviceModel` from the catalog (``"MI355X"``, ``"b300"``, ...), a calibration, or this machine.

    ``calibration`` (a dict or a JSON path from ``kit calibrate``) wins over ``accelerator``. ``"local"`` means this
    machine (:func:`local_device_model`): its calibration file (the figures are measured, so efficiencies are 1.0
    and the measured per-step overhead applies), else its catalog row. ``"cpu"`` uses the CPU calibration when one
    exists, else the catalog's CPU placeholder. ``overrides`` set fields (:func:`apply_overrides`).

    Raises:
        UnknownNameError: unknown accelerator (lists the catalog).
        InputNotFoundError: a calibration path that does not exist; ``"local"`` on a GPU never calibrated and
            with no catalog row.
        UserError: a bad override (see :func:`apply_overrides`).
    """
    acc = str(accelerator).strip()
    if isinstance(calibration, dict):
        dev = from_calibration(calibration)
    elif calibration is not None:
        from kit.measure.calibrate import load_calibration

        dev = from_calibration(load_calibration(calibration))
    elif acc.lower() in ("local", "cpu"):
        dev = local_device_model(acc, catalog)
    else:
        dev = from_catalog(acc, catalog)
    return apply_overrides(dev, **overrides)
