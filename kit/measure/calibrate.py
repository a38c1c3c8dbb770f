"""``kit calibrate``: measure what this device really does, for the planner.

Three measurements, each warmed up, synchronised, repeated, and summarised by the median with ``n``:

- **memory bandwidth** (GB/s): ``dst.copy_(src)`` of a large float32 buffer; bytes moved = read + write =
  2 × buffer bytes (the STREAM "copy" convention). Also a read-only figure (``src.sum()``: 1 × bytes), reported
  beside it.
- **matmul TFLOPS per dtype** (float32, bfloat16, float16): ``a @ b`` of n × n matrices, 2·n³ FLOPs per product.
  A dtype the device cannot run is recorded as missing, not as zero.
- **decode attention throughput** (TFLOPS): the same toy's step at batch 8 × context 1024 minus batch 1 ×
  context 16, over the attention FLOPs it adds (transformers' SDPA path with its mask runs far below matmul peak on
  CPU); the planner uses it as attention's compute rate.
- **per-step overhead** (ms): the kit's own decode step (:func:`kit.measure.engine.run_point`) on two toy Llama models
  (hidden 64, vocab 256; 1 and 4 layers) whose arithmetic is negligible: the difference gives the per-layer cost
  of an eager PyTorch/transformers layer, the rest the fixed per-step cost (embedding, head, sampling, Python).
  This is what makes small batches *overhead-bound* on CPU; the planner adds it to the roofline time.
- **launch overhead and per-layer floors** (:mod:`kit.measure.floors`): a chain of N tiny ops, eager and from a
  captured graph where the device has CUDA/HIP graphs (``launch_us_fixed`` + ``launch_us_per_op``,
  ``graph_launch_us_per_op``; None without graphs), and the per-layer floor of a small preset's decode step; from
  them a **local stack profile** (``stack_profile``, :mod:`kit.plan.stack`) that the planner uses for this device.

The result is a JSON file, by default ``$KIT_CACHE_DIR`` or ``$XDG_CACHE_HOME/kit`` or ``~/.cache/kit``, named
``calibration-<device>.json``; :func:`kit.plan.device.get_device_model` reads it for ``accelerator="local"`` /
``"cpu"``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
from pathlib import Path

import torch

from kit import dtypes, hardware
from kit._io import atomic_write_text, cache_dir, check_out_file
from kit.cli import number_arg
from kit.errors import InputNotFoundError, UserError
from kit.measure import floors
from kit.measure.timing import timed_repeats
from kit.metrics import achieved_gb_s, percentiles


def device_key(info: hardware.DeviceInfo | None = None) -> str:
    """File-name key of a device: ``cpu``, or ``cuda-nvidia-h200`` / ``rocm-amd-mi350x-mi355x``."""
    info = info or hardware.detect()
    if info.platform == "cpu":
        return "cpu"
    return f"{info.platform}-" + re.sub(r"[^a-z0-9]+", "-", info.name.lower()).strip("-")


def default_path(device: str | None = None) -> Path:
    """Default calibration file for ``device`` ("cpu", "cuda", "rocm", None = detected)."""
    info = hardware.detect(device)
    return cache_dir() / f"calibration-{device_key(info)}.json"


def measure_bandwidth(device: str = "cpu", size_mb: float = 256.0, warmup: int = 2, repeats: int = 10) -> dict:
    """Copy and read bandwidth of ``device`` memory, GB/s (1e9 bytes/s).

    Returns:
        ``{"copy_gb_s": median, "copy_p10": .., "copy_p90": .., "read_gb_s": median, "n": repeats, "size_mb"}``.

    Raises:
        ValueError: size_mb or repeats not positive.
    """
    if not size_mb > 0 or repeats < 1:
        raise UserError(f"size_mb={size_mb!r} and repeats={repeats!r} must be > 0")
    n = int(size_mb * 1e6 // 4)
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    nbytes = n * 4
    t_copy = timed_repeats(lambda: dst.copy_(src), device, warmup, repeats)
    t_read = timed_repeats(lambda: src.sum(), device, warmup, repeats)
    cp = percentiles([achieved_gb_s(2 * nbytes, t) for t in t_copy], (10, 50, 90))  # read + write
    rd = percentiles([achieved_gb_s(nbytes, t) for t in t_read], (50,))
    src = dst = None  # free the buffers before the next measurement
    return {
        "copy_gb_s": cp["p50"],
        "copy_p10": cp["p10"],
        "copy_p90": cp["p90"],
        "read_gb_s": rd["p50"],
        "n": cp["n"],
        "size_mb": nbytes / 1e6,
    }


def measure_matmul(
    device: str = "cpu", dtype: str = "float32", n: int = 1024, warmup: int = 2, repeats: int = 5
) -> dict:
    """Matmul throughput of ``n × n`` by ``n × n`` in ``dtype``, TFLOPS (2·n³ FLOPs per product, median).

    Returns:
        ``{"tflops": median, "p10": .., "p90": .., "n": repeats, "size": n}``; ``{"tflops": None, "error": ...}``
        when the device cannot run the dtype.
    """
    dt = dtypes.to_torch(dtype)
    try:
        a = torch.randn(n, n, device=device).to(dt)
        b = torch.randn(n, n, device=device).to(dt)
        ts = timed_repeats(lambda: a @ b, device, warmup, repeats, warmup_s=0.2)
    except (RuntimeError, TypeError) as e:
        return {"tflops": None, "error": f"{type(e).__name__}: {e}"[:200], "n": 0, "size": n}
    p = percentiles([2 * n**3 / t / 1e12 for t in ts], (10, 50, 90))
    return {"tflops": p["p50"], "p10": p["p10"], "p90": p["p90"], "n": p["n"], "size": n}


def _toy_model(layers: int, device: str, dtype: str):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=256,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtypes.to_torch(dtype), attn_implementation="sdpa")
    return m.eval()


def _interleaved_medians(runs: dict, rounds: int, decode_steps: int, device: str) -> tuple[dict, int]:
    """Median step time (ms) of each ``name -> (model, PointConfig)``, measured in ``rounds`` interleaved rounds
    (A, B, A, B, ...) and pooled, so a burst of other load disturbs every configuration alike and cannot own a whole
    measurement. Returns (medians, steps pooled per configuration)."""
    from kit.measure.engine import run_point

    steps: dict = {k: [] for k in runs}
    for _ in range(rounds):
        for k, (m, pc) in runs.items():
            steps[k].extend(run_point(m, pc, device=device)["x_step_ms"])
    return {k: percentiles(v, (50,))["p50"] for k, v in steps.items()}, rounds * decode_steps


def measure_overhead(
    device: str = "cpu", dtype: str = "float32", layers=(1, 4), decode_steps: int = 16, repeats: int = 3
) -> dict:
    """Per-step overhead of the kit's decode loop, ms: ``fixed + per_layer × layers``, fitted on toy Llama models
    with ``layers`` layers (batch 1, context 16) where arithmetic and memory traffic are negligible. The two models
    are measured in ``repeats`` interleaved rounds and each one's steps pooled (median).

    Returns:
        ``{"overhead_ms_fixed", "overhead_ms_per_layer", "step_ms": {layers: median ms}, "n": steps per model}``.
    """
    from kit.measure.engine import PointConfig

    lo, hi = min(layers), max(layers)
    if lo == hi:
        raise UserError(f"layers={layers!r} needs two different layer counts")
    pc = PointConfig(
        concurrency=1, context_len=16, decode_steps=decode_steps, warmup_steps=3, repeats=1, kv_fill="synthetic"
    )
    runs = {n: (_toy_model(n, device, dtype), pc) for n in (lo, hi)}
    med, n = _interleaved_medians(runs, repeats, decode_steps, device)
    del runs
    per_layer = max(0.0, (med[hi] - med[lo]) / (hi - lo))
    fixed = max(0.0, med[lo] - per_layer * lo)
    return {"overhead_ms_fixed": fixed, "overhead_ms_per_layer": per_layer, "step_ms": med, "n": n}


def measure_attention(
    device: str = "cpu",
    dtype: str = "float32",
    batch: int = 8,
    context_len: int = 1024,
    layers: int = 4,
    decode_steps: int = 16,
    repeats: int = 3,
) -> dict:
    """Decode-attention throughput of the kit's engine path, TFLOPS: the 4-layer toy Llama's decode step at
    ``batch`` × ``context_len`` minus its step at batch 1, context 16 (weights and overhead cancel), divided into
    the attention FLOPs it adds: 4 × head_dim × (query heads × attended positions) per sequence per layer (QKᵀ and
    PV). Includes the mask and cache handling of transformers' SDPA path, which on CPU runs far below matmul peak.
    The two points are measured in ``repeats`` interleaved rounds (pooled medians).

    Returns:
        ``{"attn_tflops": rate or None (when the difference is not positive), "step_ms": {...}, "n": steps}``.
    """
    from kit.measure.engine import PointConfig

    m = _toy_model(layers, device, dtype)
    cfg = m.config
    small_p = PointConfig(1, 16, decode_steps, 3, 1, "synthetic")
    big_p = PointConfig(batch, context_len, decode_steps, 3, 1, "synthetic")
    med, n = _interleaved_medians({"small": (m, small_p), "big": (m, big_p)}, repeats, decode_steps, device)
    del m
    small, big = med["small"], med["big"]
    hd = cfg.head_dim
    added = 4 * hd * cfg.num_attention_heads * layers * (batch * big_p.cache_len - 1 * small_p.cache_len)
    dt = (big - small) / 1e3
    return {
        "attn_tflops": added / dt / 1e12 if dt > 0 else None,
        "step_ms": {"batch1_ctx16": small, f"batch{batch}_ctx{context_len}": big},
        "n": n,
    }


def calibrate(
    device: str | None = None,
    quick: bool = False,
    size_mb: float | None = None,
    matmul_n: int | None = None,
    dtypes=dtypes.MODEL_DTYPES,
) -> dict:
    """Measure bandwidth, matmul TFLOPS per dtype and per-step overhead on ``device`` (default: detected).

    Args:
        quick: smaller buffers and fewer repeats (seconds; for tests and CI).

    Returns:
        the calibration dict (what :func:`save_calibration` writes): ``mem_bw_gb_s`` (copy, median),
        ``mem_read_gb_s``, ``matmul_tflops`` {float32, bfloat16, float16} (median), ``overhead_ms_fixed``,
        ``overhead_ms_per_layer``, ``attn_tflops`` (decode attention, float32), ``launch_us_fixed`` /
        ``launch_us_per_op`` (eager, µs) and ``graph_launch_us_per_op`` (µs; None where the device has no graphs),
        ``stack_profile`` (the local stack profile, :func:`kit.measure.floors.local_stack_profile`), ``details``
        (every summary with n), device, threads, versions, time.

    Raises:
        ValueError: unknown device.
    """
    info = hardware.detect(device)
    dev = info.device
    size_mb = size_mb or (32.0 if quick else 256.0)
    matmul_n = matmul_n or (256 if quick else 1024)
    bw = measure_bandwidth(dev, size_mb, warmup=1 if quick else 2, repeats=3 if quick else 10)
    mm = {dt: measure_matmul(dev, dt, matmul_n, warmup=1 if quick else 2, repeats=3 if quick else 5) for dt in dtypes}
    ov = measure_overhead(dev, "float32", decode_steps=4 if quick else 16, repeats=1 if quick else 5)
    at = measure_attention(
        dev,
        "float32",
        batch=2 if quick else 8,
        context_len=256 if quick else 1024,
        decode_steps=4 if quick else 16,
        repeats=1 if quick else 5,
    )
    la = floors.measure_launch(dev, repeats=5 if quick else 20)
    gv = floors.measure_gemv_bandwidth(dev, size_mb, warmup=1 if quick else 2, repeats=3 if quick else 10)
    dg = floors.measure_decode_gemm(dev, k=512 if quick else 2048, n=512 if quick else 2048, repeats=3 if quick else 7)
    cal = {
        "device": info.platform,
        "device_name": info.name,
        "device_key": device_key(info),
        "memory_gb": info.memory_gb,
        "catalog_name": info.catalog_name,
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "mem_bw_gb_s": bw["copy_gb_s"],
        "mem_read_gb_s": bw["read_gb_s"],
        "matmul_tflops": {dt: r["tflops"] for dt, r in mm.items()},
        "overhead_ms_fixed": ov["overhead_ms_fixed"],
        "overhead_ms_per_layer": ov["overhead_ms_per_layer"],
        "attn_tflops": at["attn_tflops"],
        "gemv_gb_s": gv["gemv_gb_s"],
        "launch_us_fixed": la["launch_us_fixed"],
        "launch_us_per_op": la["launch_us_per_op"],
        "graph_launch_us_per_op": la["graph_launch_us_per_op"],
        "details": {
            "bandwidth": bw,
            "matmul": mm,
            "overhead": ov,
            "attention": at,
            "launch": la,
            "gemv": gv,
            "decode_gemm": dg,
        },
        "method": "median over repeats after warm-up; copy GB/s counts read + write; matmul 2n^3 FLOPs; overhead "
        "fitted on 1- and 4-layer toy Llama decode steps (kit.measure.engine.run_point); attention from the toy's "
        "step at batch x context minus batch 1, context 16; launch from chains of 8/32/128 tiny ops (eager, and a "
        "captured graph where available); per-layer floor from tiny-llama's decode step minus its roofline time",
    }
    cal["details"]["floor"] = floors.measure_layer_floor(
        cal, decode_steps=4 if quick else 16, repeats=1 if quick else 5
    )
    cal["stack_profile"] = floors.local_stack_profile(cal)
    return cal


def save_calibration(cal: dict, path: str | Path | None = None) -> Path:
    """Write ``cal`` as JSON to ``path`` (default :func:`default_path` of its device); returns the path.

    Raises:
        OutputPathError: ``path`` is empty (None is the default), a directory, under a file, or not writable
            (see :func:`kit._io.atomic_write_text`).
    """
    p = path if path is not None else cache_dir() / f"calibration-{cal.get('device_key', 'cpu')}.json"  # "": refused
    return atomic_write_text(p, json.dumps(cal, indent=2, default=str), example="calibration.json")


#: numbers a calibration may carry besides ``mem_bw_gb_s`` and ``matmul_tflops`` (each finite and >= 0 when set)
CALIBRATION_NUMBERS = (
    "memory_gb", "threads", "overhead_ms_fixed", "overhead_ms_per_layer", "attn_tflops", "launch_us_fixed",
    "launch_us_per_op", "graph_launch_us_per_op", "gemv_gb_s",
)  # fmt: skip


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def load_calibration(path: str | Path | None = None, device: str | None = None) -> dict:
    """Read a calibration file (``path``, else the default file of ``device`` / the detected device); the returned
    dict carries ``path``.

    Raises:
        InputNotFoundError: no such file (the message says to run ``kit calibrate``).
        UserError: one line naming the file and what is wrong, and to rerun ``kit calibrate``: unreadable, not
            JSON (a corrupted or truncated file: where the JSON breaks), not an object, ``mem_bw_gb_s`` missing or
            not a number > 0, ``matmul_tflops`` missing or not ``{dtype: TFLOPS}``, or a number of
            :data:`CALIBRATION_NUMBERS` that is not finite and >= 0, or a ``stack_profile`` that is not a valid profile
            (:func:`kit.plan.stack.profile_from_dict`).
    """
    p = Path(path) if path else default_path(device)
    if not p.exists():
        raise InputNotFoundError(f"no calibration at {p}; run `kit calibrate` (or pass --calibration PATH)")
    again = "rerun `kit calibrate` to write it again (or pass --calibration PATH)"
    try:
        cal = json.loads(p.read_bytes().decode("utf-8"))
    except OSError as e:
        raise UserError(f"calibration file {p} cannot be read ({e.strerror or e}); {again}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"calibration file {p} is not UTF-8 text (byte {e.start}); {again}") from None
    except json.JSONDecodeError as e:
        raise UserError(
            f"calibration file {p} is not valid JSON ({e.msg}, line {e.lineno} column {e.colno}); {again}"
        ) from None
    if not isinstance(cal, dict):
        raise UserError(f"calibration file {p} holds a JSON {type(cal).__name__}, not a calibration object; {again}")
    for k in ("mem_bw_gb_s", "matmul_tflops"):
        if k not in cal:
            raise UserError(f"calibration file {p} lacks {k!r}; {again}")
    if not _number(cal["mem_bw_gb_s"]) or not cal["mem_bw_gb_s"] > 0:
        raise UserError(f"calibration file {p}: mem_bw_gb_s={cal['mem_bw_gb_s']!r} is not a number > 0 GB/s; {again}")
    mm = cal["matmul_tflops"]
    if not isinstance(mm, dict) or not all(v is None or _number(v) for v in mm.values()):
        raise UserError(f"calibration file {p}: matmul_tflops={mm!r} is not {{dtype: TFLOPS >= 0}}; {again}")
    for k in CALIBRATION_NUMBERS:
        if cal.get(k) is not None and not _number(cal[k]):
            raise UserError(f"calibration file {p}: {k}={cal[k]!r} is not a finite number >= 0; {again}")
    sp = cal.get("stack_profile")
    if sp is not None:
        from kit.plan.stack import profile_from_dict

        if not isinstance(sp, dict):
            raise UserError(f"calibration file {p}: stack_profile={sp!r} is not an object; {again}")
        try:
            profile_from_dict(sp, f"calibration file {p}: stack_profile")
        except UserError as e:
            raise UserError(f"{e}; {again}") from None
    cal["matmul_tflops"] = {k: v for k, v in mm.items() if v}
    cal["path"] = str(p)
    return cal


def add_cli(sub) -> None:
    """``kit calibrate``: measure this device and store the figures the planner uses."""
    p = sub.add_parser(
        "calibrate",
        description="Measure this device's memory bandwidth (copy), matmul TFLOPS per dtype and the "
        "per-step overhead of the kit's decode loop (warm-up, repeats, medians), and "
        "store them as JSON for `kit plan --accelerator local`.",
    )
    p.add_argument("--device", default=None, help="auto | cpu | cuda | rocm (default: auto)")
    p.add_argument("--out", default=None, help="JSON path (default: ~/.cache/kit/calibration-<device>.json)")
    p.add_argument("--quick", action="store_true", help="small buffers, few repeats (seconds)")
    p.add_argument(
        "--threads",
        type=number_arg(int, minimum=1, maximum=os.cpu_count() or 1),
        default=None,
        help="torch CPU threads to measure with, at most the cores (default: torch's); match what your sweeps use",
    )
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.out is not None:  # "" is refused, not taken as the default file
        check_out_file(args.out, example="calibration.json")  # before minutes of measuring, not after
    cal = calibrate(args.device, quick=args.quick)
    path = save_calibration(cal, args.out)
    if args.json:
        print(json.dumps({**cal, "path": str(path)}, indent=2, default=str))
        return 0
    d = cal["details"]
    print(f"Calibrated {cal['device_name']} ({cal['device']}, {cal['threads']} threads) -> {path}")
    bw = d["bandwidth"]
    print(
        f"  memory copy   {bw['copy_gb_s']:.1f} GB/s (p10 {bw['copy_p10']:.1f}, p90 {bw['copy_p90']:.1f}, n={bw['n']}, "
        f"{bw['size_mb']:.0f} MB); read {bw['read_gb_s']:.1f} GB/s"
    )
    for dt, r in d["matmul"].items():
        if r.get("tflops"):
            print(f"  matmul {dt:9s} {r['tflops'] * 1e3:.1f} GFLOP/s (n={r['n']}, {r['size']}x{r['size']})")
        else:
            print(f"  matmul {dt:9s} unavailable ({r.get('error')})")
    if cal.get("attn_tflops"):
        print(f"  decode attention {cal['attn_tflops'] * 1e3:.1f} GFLOP/s (engine SDPA path, float32)")
    ov = d["overhead"]
    print(
        f"  step overhead {cal['overhead_ms_fixed']:.3f} ms fixed + {cal['overhead_ms_per_layer']:.3f} ms/layer "
        f"(toy decode steps: {', '.join(f'{k} layers {v:.3f} ms' for k, v in ov['step_ms'].items())})"
    )
    la, fl = d["launch"], d["floor"]
    graph = (
        f"graph {la['graph_launch_us_fixed']:.2f} us + {la['graph_launch_us_per_op']:.3f} us/op"
        if la["graph_launch_us_per_op"] is not None
        else f"graph: not available ({la['graph_note']})"
    )
    print(f"  launch eager {la['launch_us_fixed']:.2f} us + {la['launch_us_per_op']:.3f} us/op; {graph}")
    sp = cal["stack_profile"]
    print(
        f"  per-layer floor {fl['floor_ms_per_layer'] * 1e3:.1f} us ({fl['preset']} step {fl['step_ms']:.3f} ms - "
        f"roofline {fl['roofline_ms']:.3f} ms - fixed, over {fl['layers']} layers) -> stack profile {sp['name']} "
        f"(floors us/layer: {', '.join(f'{c} {v:.1f}' for c, v in sp['floors_us'].items())}; {sp['floor_mode']})"
    )
    return 0
