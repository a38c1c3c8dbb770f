"""Launch/dispatch overhead and per-layer floors of this device, and the local stack profile built from them.

- :func:`measure_launch`: a chain of N tiny ops (``y = y + 1`` on a one-element tensor) for several N, timed eagerly
  and — where the device has CUDA/HIP graphs — replayed from a captured graph; ``t = fixed + per_op × N`` fitted by
  least squares (µs). On a CPU there are no graphs: the graph figures are None and the result says so.
- :func:`measure_layer_floor`: the kit's decode step of a small preset (batch 1, a few cached positions, so the bytes
  and FLOPs are small) minus its roofline time (max(weights + KV bytes / calibrated bandwidth, 2 × params FLOPs /
  calibrated float32 rate)) minus the fixed per-step cost, per layer: the least time a layer takes on this device
  however little it moves. Forward hooks time each layer's attention, MLP and norms in the same steps, which
  splits the floor per kernel class.
- :func:`local_stack_profile`: a :mod:`kit.plan.stack` profile of this machine from a calibration (η 1: the
  calibrated bandwidth is already achieved; ``add`` floors on a CPU, which runs its kernels itself; ``max`` on a
  GPU), stored in the calibration as ``stack_profile`` and used by the planner for ``--accelerator local``.
"""

from __future__ import annotations

import time

import torch

from kit import hardware
from kit.measure.timing import timed_repeats
from kit.metrics import percentiles

#: the kernel class of a Llama decoder layer's submodules (kit.plan.stack.KERNEL_CLASSES)
_LLAMA_CLASSES = {"self_attn": "attn", "mlp": "moe", "input_layernorm": "norm", "post_attention_layernorm": "norm"}


def _fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys on xs; both clamped at 0."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    slope = max(0.0, slope)
    return max(0.0, my - slope * mx), slope


def _chain(x: torch.Tensor, n: int) -> torch.Tensor:
    y = x
    for _ in range(n):
        y = y + 1.0
    return y


def measure_launch(device: str = "cpu", counts=(8, 32, 128), warmup: int = 3, repeats: int = 20) -> dict:
    """Launch/dispatch cost of tiny ops on ``device``, µs: ``fixed + per_op × N`` over chains of ``counts`` ops.

    Returns:
        ``{"launch_us_fixed", "launch_us_per_op", "graph_launch_us_fixed", "graph_launch_us_per_op" (None without
        graphs), "graph_note", "chain_us": {N: median µs eager}, "graph_chain_us": {N: µs} or {}, "n": repeats}``.

    Raises:
        UserError: fewer than two different counts.
    """
    from kit.errors import UserError

    counts = sorted(set(int(c) for c in counts))
    if len(counts) < 2 or counts[0] < 1:
        raise UserError(f"counts={counts!r} needs two or more different op counts >= 1")
    x = torch.zeros(1, device=device)
    eager = {}
    for n in counts:
        ts = timed_repeats(lambda n=n: _chain(x, n), device, warmup, repeats)
        eager[n] = percentiles([t * 1e6 for t in ts], (50,))["p50"]
    fixed, per_op = _fit_line(list(eager), list(eager.values()))
    out = {"launch_us_fixed": fixed, "launch_us_per_op": per_op, "chain_us": eager, "n": repeats}
    graph: dict = {}
    note = f"CUDA/HIP graphs are not available on {device}"
    if device != "cpu" and torch.cuda.is_available():
        try:
            for n in counts:
                static = torch.zeros(1, device=device)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    _chain(static, n)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    _chain(static, n)
                ts = timed_repeats(g.replay, device, warmup, repeats)
                graph[n] = percentiles([t * 1e6 for t in ts], (50,))["p50"]
            note = "captured with torch.cuda.CUDAGraph (CUDA or HIP graphs)"
        except RuntimeError as e:  # a device without graph support: say so, keep the eager figures
            graph, note = {}, f"graph capture failed: {e}"[:200]
    gf, gp = _fit_line(list(graph), list(graph.values())) if graph else (None, None)
    out.update(graph_launch_us_fixed=gf, graph_launch_us_per_op=gp, graph_chain_us=graph, graph_note=note)
    return out


def measure_gemv_bandwidth(device: str = "cpu", size_mb: float = 256.0, warmup: int = 2, repeats: int = 10) -> dict:
    """Bandwidth a decode-shaped kernel reaches, GB/s: a float32 matrix (``size_mb``) times a vector, bytes = the
    matrix (read once), median over ``repeats`` — what reading weights in a batch-1 decode step achieves (it can
    differ from a copy: other kernels, prefetching, one thread).

    Returns: ``{"gemv_gb_s": median, "p10", "p90", "n", "size_mb"}``.
    """
    cols = 4096
    rows = max(1, int(size_mb * 1e6 // (4 * cols)))
    w = torch.randn(rows, cols, device=device)
    x = torch.randn(cols, device=device)
    ts = timed_repeats(lambda: w @ x, device, warmup, repeats)
    nbytes = rows * cols * 4
    p = percentiles([nbytes / t / 1e9 for t in ts], (10, 50, 90))
    return {"gemv_gb_s": p["p50"], "p10": p["p10"], "p90": p["p90"], "n": p["n"], "size_mb": nbytes / 1e6}


def measure_decode_gemm(
    device: str = "cpu", tokens=(4, 16, 64), k: int = 2048, n: int = 2048, warmup: int = 2, repeats: int = 5
) -> dict:
    """Float32 matmul rate of decode-shaped (skinny) GEMMs, TFLOPS: ``tokens`` rows × ``k`` times ``k`` × ``n``
    (2·tokens·k·n FLOPs, median over ``repeats``) — what a decode step of a few sequences gets from its linear
    layers, often far below a square matmul's rate on a CPU.

    Returns: ``{"tflops": {tokens: median TFLOPS}, "k", "n", "n_repeats"}``.
    """
    w = torch.randn(k, n, device=device)
    out = {}
    for m in tokens:
        x = torch.randn(int(m), k, device=device)
        ts = timed_repeats(lambda x=x: x @ w, device, warmup, repeats)
        out[int(m)] = percentiles([2 * m * k * n / t / 1e12 for t in ts], (50,))["p50"]
    return {"tflops": out, "k": k, "n": n, "n_repeats": repeats}


def _class_timers(model) -> tuple[dict, list]:
    """Forward hooks adding each Llama layer submodule's wall time (ms) to its kernel class; (totals, handles)."""
    tot = {"attn": 0.0, "moe": 0.0, "norm": 0.0}
    handles = []
    for name, mod in model.named_modules():
        cls = _LLAMA_CLASSES.get(name.rsplit(".", 1)[-1])
        if cls is None or ".layers." not in f".{name}":
            continue
        start: dict = {}
        handles.append(mod.register_forward_pre_hook(lambda m, a, s=start: s.__setitem__("t", time.perf_counter())))
        handles.append(
            mod.register_forward_hook(
                lambda m, a, o, s=start, c=cls: tot.__setitem__(c, tot[c] + (time.perf_counter() - s["t"]) * 1e3)
            )
        )
    return tot, handles


def measure_layer_floor(cal: dict, preset: str = "tiny-llama", decode_steps: int = 16, repeats: int = 3) -> dict:
    """The per-layer floor (ms) of ``preset`` on the device of ``cal`` (a calibration dict with ``mem_bw_gb_s``,
    ``matmul_tflops`` and ``overhead_ms_fixed``): (median decode step at batch 1, context 16 − its roofline time,
    max(bytes read / bandwidth (``gemv_gb_s`` when given, else ``mem_bw_gb_s``), 2 × params / float32 matmul
    rate) − the fixed per-step cost) / layers, and its
    split over kernel classes from forward hooks (shares of the time spent in attention, MLP and norm submodules).

    Returns:
        ``{"floor_ms_per_layer", "class_share": {attn, moe, norm}, "step_ms", "roofline_ms", "layers", "preset",
        "n": steps pooled}``.
    """
    from kit.measure.engine import PointConfig, run_point
    from kit.models import build_model, count_params

    device = hardware.detect(cal.get("device") if cal.get("device") in ("cpu", "cuda", "rocm") else None).device
    model = build_model(preset, "float32", device)
    pc = PointConfig(concurrency=1, context_len=16, decode_steps=decode_steps, warmup_steps=3, repeats=1)
    steps: list[float] = []
    tot, handles = _class_timers(model)
    try:
        for _ in range(repeats):
            rec = run_point(model, pc, device=device)
            steps.extend(rec["x_step_ms"])
    finally:
        for h in handles:
            h.remove()
    layers, n_params = model.config.num_hidden_layers, count_params(model)
    del model
    step = percentiles(steps, (50,))["p50"]
    nbytes = (rec["weights_gb"] + rec["kv_cache_gb"]) * 1e9  # weights and the whole static cache, read per step
    rate = (cal.get("matmul_tflops") or {}).get("float32") or 0.0
    bw = cal.get("gemv_gb_s") or cal["mem_bw_gb_s"]
    rl = max(nbytes / (bw * 1e9), 2 * n_params / (rate * 1e12) if rate else 0.0) * 1e3
    floor = max(0.0, (step - rl - float(cal.get("overhead_ms_fixed") or 0.0)) / layers)
    s = sum(tot.values())
    share = {c: v / s for c, v in tot.items()} if s > 0 else {"attn": 1 / 3, "moe": 1 / 3, "norm": 1 / 3}
    return {
        "floor_ms_per_layer": floor,
        "class_share": share,
        "step_ms": step,
        "roofline_ms": rl,
        "layers": layers,
        "preset": preset,
        "n": len(steps),
    }


def local_stack_profile(cal: dict) -> dict:
    """The local stack profile (a :func:`kit.plan.stack.profile_from_dict` dict) of a calibration that has
    ``details.floor`` (:func:`measure_layer_floor`) and the launch figures (:func:`measure_launch`)."""
    fl = cal["details"]["floor"]
    per_layer_us = fl["floor_ms_per_layer"] * 1e3
    share = fl["class_share"]
    cpu = cal.get("device", "cpu") == "cpu"
    how = (
        f"measured by kit calibrate {cal.get('created_utc', '')}: {fl['preset']} decode step {fl['step_ms']:.3f} ms "
        f"- roofline {fl['roofline_ms']:.3f} ms - fixed {cal.get('overhead_ms_fixed', 0):.3f} ms, over "
        f"{fl['layers']} layers (n={fl['n']} steps); split by forward-hook time shares"
    )
    return {
        "name": f"local-{cal.get('device_key', 'cpu')}",
        "platform": cal.get("catalog_name") or ("CPU" if cpu else cal.get("device_name", "local")),
        "engine": "kit in-process engine (PyTorch eager)",
        "version": f"torch {cal.get('torch_version', '')}, {cal.get('threads', '')} threads",
        "eta_bw": 1.0,
        "mem_bw_gb_s": cal.get("gemv_gb_s"),
        "gemm_tflops": (cal["details"].get("decode_gemm") or {}).get("tflops"),
        "floors_us": {c: per_layer_us * share.get(c, 0.0) for c in ("attn", "moe", "norm")} | {"other": 0.0},
        "floor_mode": "add" if cpu else "max",
        "graph_mode": "eager",
        "host_us": float(cal.get("overhead_ms_fixed") or 0.0) * 1e3,
        "moe_ep": "tp",
        "sources": {
            "eta_bw": "measured: a float32 matrix-vector product's read bandwidth (mem_bw_gb_s; eta 1)",
            "floors": how,
            "host": "fixed per-step cost of the 1- and 4-layer toy decode steps (kit calibrate)",
            "launch": f"eager {cal.get('launch_us_fixed', 0):.2f} us + {cal.get('launch_us_per_op', 0):.2f} us/op",
        },
        "flags": "" if not cal.get("quick") else "UNSURE: quick calibration (few repeats)",
    }
