"""Plan before you rent: an analytic memory-fit and roofline model of LLM inference, on the kit's results schema.

Everything here is arithmetic on an architecture spec (:class:`kit.plan.spec.ArchSpec`: reference models, configs,
per-group dtypes and the weight / KV / state byte counts live in :mod:`kit.plan.spec`, re-exported here) and a device
(:class:`Device`):

- **Memory fit** (:func:`memory_fit`): weights per GPU under tensor/expert/pipeline parallelism, KV-cache bytes per
  token, constant per-sequence state (:mod:`kit.plan.spec`), a workspace reserve; answers fits / KV tokens left / max
  concurrency at a context / max context at a concurrency; :func:`min_gpus` per catalog accelerator.
- **Roofline** (:func:`predict_point`): prefill and one decode step at (batch B, context C):
  ``t = max(bytes / (BW × eff_bw), flops / (peak × eff_flops)) + t_comm + overhead``; bytes = weights touched
  (routed experts: E·(1−(1−1/E)^(B·k)) of E are touched per MoE layer) + KV reads; rows use the schema of
  :mod:`kit.results` with ``backend="planner"`` and the assumptions in columns (``eff_bw``, ``eff_flops``, ``tp``,
  ``assumptions``, ``x_*``) so predicted and measured points plot on the same axes.
- **Local device**: ``accelerator="local"`` (or ``"cpu"``) uses the numbers ``kit calibrate`` measured
  (:mod:`kit.measure.calibrate`): achievable bandwidth and matmul TFLOPS (so efficiencies are 1.0) and a measured per-step
  overhead (fixed + per layer) that dominates small batches in eager PyTorch.

Formulas: ``../shared/METRICS.md`` (Planner section); KV bytes/token and state: :mod:`kit.plan.spec`. Expert coverage:
expected number of distinct experts hit by B·k uniform draws.
"""
from __future__ import annotations

import json
import math
import textwrap
from dataclasses import asdict, dataclass, replace

import pandas as pd

from kit import dtypes
from kit.errors import UserError
from kit import metrics
from kit.plan.spec import (GROUPS, ArchSpec, _check_pos_int, _shard, get_spec,
                    kv_bytes_per_token, list_models, model_table, parse_weight_dtypes, spec_from_config,
                    state_bytes_per_seq, weight_bytes)


# ---------------------------------------------------------------- devices
#: which peak-TFLOPS figure a compute dtype uses (catalog / calibration keys)


@dataclass
class Device:
    """What the roofline needs of one accelerator. ``mem_bw_gb_s`` and ``tflops`` are peaks (catalog) or measured
    achievable values (calibration, then ``eff_bw = eff_flops = 1``)."""

    name: str
    device: str  # cpu | cuda | rocm
    mem_gb: float
    mem_bw_gb_s: float
    tflops: dict
    eff_bw: float = 0.7
    eff_flops: float = 0.6
    overhead_ms_fixed: float = 0.0
    overhead_ms_per_layer: float = 0.0
    attn_tflops: float | None = None  # measured decode-attention throughput (calibration); None: matmul peak
    scaleup_gb_s: float | None = None
    gpus_per_node: int = 8
    full_name: str = ""
    source: str = "catalog"

    def peak_tflops(self, dtype) -> float:
        key = dtypes.peak_key(dtype)
        v = self.tflops.get(key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            if key == "fp4" and self.tflops.get("fp8"):
                return float(self.tflops["fp8"])
            have = {k: v for k, v in self.tflops.items() if v and not (isinstance(v, float) and math.isnan(v))}
            raise UserError(f"{self.name} has no {key} TFLOPS figure; it has {sorted(have)} (set compute_dtype)")
        return float(v)


#: Default efficiencies for catalog (peak) figures: the fraction of datasheet HBM bandwidth and dense TFLOPS a
#: well-tuned decode/prefill reaches. Assumptions, printed with every prediction; override per call.
DEFAULT_EFF_BW = 0.7
DEFAULT_EFF_FLOPS = 0.6
#: step overhead (fixed ms, ms per layer) and decode-attention TFLOPS for an uncalibrated CPU: what `kit calibrate`
#: measured on the kit's 2-core CI machine (Xeon, 2 threads, quiet). Replace with your own calibration.
UNCALIBRATED_CPU_OVERHEAD_MS = (0.4, 0.35)
UNCALIBRATED_CPU_ATTN_TFLOPS = 0.010


def get_device(accelerator: str = "local", catalog=None, calibration=None, **overrides) -> Device:
    """A :class:`Device` from the catalog (``"MI355X"``, ``"b300"``, ...) or the local calibration.

    ``"local"`` means this machine: the calibration file of the detected device (``kit calibrate``) — the figures
    are measured, so efficiencies are 1.0 and the measured per-step overhead applies. ``"cpu"`` uses the CPU
    calibration when one exists, else the catalog's CPU placeholder. ``overrides`` set fields (e.g.
    ``eff_bw=0.8``, ``mem_gb=...``).

    Raises:
        KeyError: unknown accelerator (lists the catalog).
        FileNotFoundError: ``"local"`` on a device never calibrated and with no catalog row.
        ValueError: a non-positive override, or ``eff_bw`` / ``eff_flops`` not in the interval from 0
            (excluded) to 1.
    """
    from kit.catalog import load_catalog

    acc = str(accelerator).strip()
    cal = None
    if isinstance(calibration, dict):
        cal = calibration
    elif calibration is not None:
        from kit.measure import calibrate as _cal

        cal = _cal.load_calibration(calibration)
    elif acc.lower() in ("local", "cpu"):
        from kit.measure import calibrate as _cal

        try:
            cal = _cal.load_calibration(device="cpu" if acc.lower() == "cpu" else None)
        except FileNotFoundError:
            if acc.lower() == "local":
                from kit.hardware import detect

                info = detect()
                if info.platform != "cpu":
                    acc = info.catalog_name or acc
                else:
                    acc = "CPU"
            else:
                acc = "CPU"
    if cal is not None:
        if cal.get("device", "cpu") == "cpu" and cal.get("threads"):
            import warnings

            import torch

            if int(cal["threads"]) != torch.get_num_threads():
                warnings.warn(f"calibration was measured with {cal['threads']} CPU threads but torch now uses "
                              f"{torch.get_num_threads()}: predictions for this process may be off "
                              "(rerun `kit calibrate --threads N`)", stacklevel=2)
        dev = Device(name=cal.get("catalog_name") or ("CPU" if cal.get("device", "cpu") == "cpu" else "local"),
                     device=cal.get("device", "cpu"), mem_gb=float(cal.get("memory_gb") or 0) or 1.0,
                     mem_bw_gb_s=float(cal["mem_bw_gb_s"]), tflops=dict(cal["matmul_tflops"]), eff_bw=1.0,
                     eff_flops=1.0, overhead_ms_fixed=float(cal.get("overhead_ms_fixed", 0.0)),
                     overhead_ms_per_layer=float(cal.get("overhead_ms_per_layer", 0.0)),
                     attn_tflops=float(cal["attn_tflops"]) if cal.get("attn_tflops") else None, scaleup_gb_s=None,
                     gpus_per_node=1, full_name=cal.get("device_name", ""),
                     source=f"calibration {cal.get('path', '')} ({cal.get('created_utc', '')})".strip())
    else:
        cat = catalog or load_catalog()
        row = cat.get(acc)
        tfl = {"float32": row.get("fp32_tflops"), "bfloat16": row.get("bf16_tflops"),
               "float16": row.get("fp16_tflops"), "fp8": row.get("fp8_tflops"), "fp4": row.get("fp4_tflops")}
        tfl = {k: float(v) for k, v in tfl.items() if v is not None and pd.notna(v)}
        vendor = str(row.get("vendor", "")).upper()
        kind = "rocm" if vendor == "AMD" else "cpu" if row.name == "CPU" else "cuda"
        su = row.get("scaleup_gb_s")
        dev = Device(name=str(row.name), device=kind, mem_gb=float(row["hbm_gb"]), mem_bw_gb_s=float(row["hbm_tb_s"]) * 1e3,
                     tflops=tfl, eff_bw=DEFAULT_EFF_BW, eff_flops=DEFAULT_EFF_FLOPS,
                     scaleup_gb_s=float(su) if su is not None and pd.notna(su) else None,
                     gpus_per_node=int(row["gpus_per_node"]), full_name=str(row.get("full_name", row.name)),
                     source="catalog" + (f" [{row.get('flags')}]" if isinstance(row.get("flags"), str)
                                         and row.get("flags") else ""))
    if cal is None and dev.name == "CPU":
        # The catalog's CPU row holds figures measured on the kit's 2-core CI machine, not datasheet peaks: use them
        # as achievable (efficiency 1) and add that machine's measured step overhead and decode-attention rate
        # (`kit calibrate`, 2 threads, 2026-11-30) so an uncalibrated CPU plan is not wildly optimistic.
        dev.eff_bw = dev.eff_flops = 1.0
        dev.overhead_ms_fixed, dev.overhead_ms_per_layer = UNCALIBRATED_CPU_OVERHEAD_MS
        dev.attn_tflops = UNCALIBRATED_CPU_ATTN_TFLOPS
        dev.source = "catalog CPU placeholder, uncalibrated (run `kit calibrate`) [UNSURE]"
    for k, v in overrides.items():
        if v is None:
            continue
        if not hasattr(dev, k):
            raise UserError(f"unknown device field {k!r}; allowed: {sorted(asdict(dev))}")
        if k in ("eff_bw", "eff_flops"):
            v = _check_eff(k, v)
        if isinstance(v, (int, float)) and k != "overhead_ms_fixed" and k != "overhead_ms_per_layer" and v <= 0:
            raise UserError(f"{k}={v!r} must be > 0")
        if k in ("overhead_ms_fixed", "overhead_ms_per_layer") and v < 0:
            raise UserError(f"{k}={v!r} must be >= 0")
        setattr(dev, k, v)
    return dev


# ---------------------------------------------------------------- memory fit
#: runtime memory a GPU serving engine keeps outside weights and KV (CUDA/HIP context, graphs, communication
#: buffers); an assumption, stated in every fit. 0 for the local calibrated device (a CPU process).
DEFAULT_RUNTIME_GB = 2.0
DEFAULT_MEM_UTIL = 0.90  # fraction of device memory the engine may use (vLLM's gpu_memory_utilization default)
DEFAULT_MAX_BATCHED_TOKENS = 8192
MIN_GPUS_MAX = 128  # most GPUs :func:`min_gpus` tries


def _layout(device: Device, n_gpus: int, tp: int | None, ep: int | None, pp: int | None, spec: ArchSpec):
    n_gpus = _check_pos_int("n_gpus", n_gpus)
    given_tp, given_pp = tp, pp
    if tp is None and pp is None:
        tp = min(n_gpus, max(1, device.gpus_per_node))
        pp = n_gpus // tp
    elif tp is None:
        pp = _check_pos_int("pp", pp)
        tp = n_gpus // pp
    elif pp is None:
        tp = _check_pos_int("tp", tp)
        pp = n_gpus // tp
    if given_tp is not None and given_pp is None and (tp < 1 or n_gpus % tp):
        raise UserError(f"tp={tp} does not divide n_gpus={n_gpus}: the pipeline-parallel size is derived as "
                         f"pp = n_gpus // tp, so n_gpus must be a multiple of tp; pass a tp that divides n_gpus "
                         f"({', '.join(str(d) for d in _divisors(n_gpus))}) or change the GPU count")
    if given_pp is not None and given_tp is None and (pp < 1 or n_gpus % pp):
        raise UserError(f"pp={pp} does not divide n_gpus={n_gpus}: the tensor-parallel size is derived as "
                         f"tp = n_gpus // pp, so n_gpus must be a multiple of pp; pass a pp that divides n_gpus "
                         f"({', '.join(str(d) for d in _divisors(n_gpus))}) or change the GPU count")
    tp, pp = _check_pos_int("tp", tp), _check_pos_int("pp", pp)
    if tp * pp != n_gpus:
        raise UserError(f"tp={tp} × pp={pp} must equal n_gpus={n_gpus}")
    _check_heads_split(spec, tp)
    if ep is not None and not spec.is_moe:
        if _check_pos_int("ep", ep) != 1:
            raise UserError(f"ep={ep}: expert parallelism applies only to MoE models, and {spec.name} is dense "
                             "(no routed experts); leave ep unset (or 1)")
    if ep is None:
        ep = tp if spec.is_moe else 1
    ep = _check_pos_int("ep", ep)
    if tp % ep:
        raise UserError(f"ep={ep} must divide tp={tp}")
    return n_gpus, tp, ep, pp


def _check_context(spec: ArchSpec, context_len, name: str = "context_len") -> int:
    """``context_len`` as a positive int, no larger than the model's ``max_position_embeddings`` (when known).

    Raises:
        ValueError: not a positive integer, or beyond the positions the model supports (names both numbers).
    """
    c = _check_pos_int(name, context_len)
    mp = spec.max_position_embeddings
    if mp and c > int(mp):
        raise UserError(f"{name}={c:,} exceeds {spec.name}'s max_position_embeddings={int(mp):,}: the model "
                         f"supports at most {int(mp):,} positions per sequence")
    return c


def _check_eff(name: str, v) -> float:
    """An efficiency (fraction of a peak) as a float in (0, 1]; ValueError naming the value and the range."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise UserError(f"{name}={v!r} must be a number in (0, 1]") from None
    if not 0 < f <= 1:
        raise UserError(f"{name}={v!r} is outside the allowed range (0, 1]: an efficiency is a fraction of the "
                         "peak figure (e.g. 0.7)")
    return f


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_heads_split(spec: ArchSpec, tp: int) -> None:
    """Warn (not raise) when attention heads do not split evenly over ``tp`` ranks.

    Serving engines (vLLM, SGLang) shard attention by heads: they reject a TP size that does not divide the query
    heads, and for GQA they need the KV heads to divide TP or TP to divide the KV heads (each KV head then replicated
    on TP/n_kv ranks). The planner can still do its arithmetic for such a layout (it counts ceil(n_kv/tp) KV heads
    per rank), so it warns with :class:`UserWarning` instead of raising: the prediction is for a layout a real engine
    will probably refuse. MLA caches one latent per token replicated on every rank, so only the query heads count.
    """
    import warnings

    if tp <= 1:
        return
    why = []
    nq = spec.num_attention_heads
    if nq and nq % tp:
        why.append(f"{nq} attention heads are not divisible by tp={tp}")
    nkv = spec.num_kv_heads
    if spec.attention != "mla" and nkv and nkv % tp and tp % nkv:
        why.append(f"{nkv} KV heads (GQA) neither divide nor are divisible by tp={tp}")
    if why:
        good = [d for d in _divisors(max(nq or 1, 1)) if d > 1 and (spec.attention == "mla" or not nkv
                                                                    or nkv % d == 0 or d % nkv == 0)]
        warnings.warn(f"{spec.name}: {'; '.join(why)}: serving engines such as vLLM reject this tensor-parallel "
                      f"size (the planner counts ceil(kv heads / tp) per rank); TP sizes that split evenly: "
                      f"{good[:8]}", UserWarning, stacklevel=3)


def workspace_gb(spec: ArchSpec, tp: int = 1, max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
                 act_dtype="bfloat16") -> float:
    """Activation workspace of one forward over ``max_batched_tokens`` tokens on one rank, GB: hidden-sized
    buffers (residual, norm, attention in/out: ~6 × hidden) plus the widest MLP intermediate (gate and up, split
    over TP) per token. A coarse reserve (an assumption, printed with every fit)."""
    widest = max(spec.intermediate_size or 0, (spec.moe_intermediate_size or 0) * max(1, spec.experts_per_token),
                 spec.shared_expert_intermediate_size or 0)
    per_tok = 6 * spec.hidden_size + 2 * widest / tp
    return max_batched_tokens * per_tok * dtypes.bytes_per_element(act_dtype) / 1e9


@dataclass
class FitResult:
    """Memory-fit answer for one model on ``n_gpus`` accelerators. GB are 1e9 bytes, per GPU unless named total."""

    model: str
    accelerator: str
    n_gpus: int
    tp: int
    ep: int
    pp: int
    kv_dtype: str
    weight_dtypes: dict
    mem_gb_per_gpu: float
    usable_gb_per_gpu: float
    weights_gb_total: float
    weights_gb_per_gpu: float
    reserve_gb_per_gpu: float
    kv_budget_gb_per_gpu: float
    kv_bytes_per_token: float  # whole model, one sequence
    kv_bytes_per_token_per_gpu: float
    state_bytes_per_seq_per_gpu: float
    fits_weights: bool
    kv_tokens_free: float  # tokens of KV the budget holds (per-seq constant state not included)
    context_len: int | None = None
    concurrency: int | None = None
    max_concurrency: int | None = None  # at context_len
    max_context: int | None = None  # at concurrency
    fits: bool = False  # weights fit and (if both given) concurrency × context fits
    need_gb_per_gpu: float | None = None
    assumptions: str = ""

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"{self.model} on {self.n_gpus}×{self.accelerator} (TP{self.tp}, EP{self.ep}, PP{self.pp}): "
                 f"{'FITS' if self.fits else 'DOES NOT FIT'}",
                 f"  weights        {self.weights_gb_total:,.1f} GB total, {self.weights_gb_per_gpu:,.1f} GB/GPU "
                 f"of {self.mem_gb_per_gpu:,.0f} GB ({self.usable_gb_per_gpu:,.1f} usable)",
                 f"  reserve        {self.reserve_gb_per_gpu:,.1f} GB/GPU (runtime + activation workspace)",
                 f"  KV budget      {self.kv_budget_gb_per_gpu:,.1f} GB/GPU; {self.kv_bytes_per_token:,.0f} B/token "
                 f"({self.kv_dtype}), {self.kv_bytes_per_token_per_gpu:,.0f} B/token/GPU; "
                 f"{self.state_bytes_per_seq_per_gpu / 1e6:,.1f} MB/seq/GPU constant state",
                 f"  KV tokens left {self.kv_tokens_free:,.0f}"]
        if self.context_len:
            lines.append(f"  max users at {self.context_len:,} tokens: {self.max_concurrency:,}")
        if self.concurrency:
            lines.append(f"  max context at {self.concurrency:,} users: {self.max_context:,} tokens")
        lines.append(f"  assumptions: {self.assumptions}")
        return "\n".join(lines)


def memory_fit(model, accelerator: str = "local", n_gpus: int = 1, context_len: int | None = None,
               concurrency: int | None = None, kv_dtype="bfloat16", state_dtype="bfloat16",
               weight_dtypes: str | dict | None = None, tp: int | None = None, ep: int | None = None,
               pp: int | None = None, mem_util: float = DEFAULT_MEM_UTIL, reserve_gb: float | None = None,
               max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS, device: Device | None = None,
               catalog=None, calibration=None) -> FitResult:
    """Does ``model`` fit on ``n_gpus`` × ``accelerator``, and how much KV cache is left?

    Per GPU: ``usable = mem_gb × mem_util``; ``kv_budget = usable − weights − reserve`` with ``reserve`` = runtime
    (2 GB on GPUs) + :func:`workspace_gb`. Weights per GPU follow :func:`weight_bytes`' sharding; with pipeline
    parallelism each stage holds 1/pp of the layers plus the embedding or the LM head. ``max_concurrency`` =
    floor(budget / (context × KV bytes/token/GPU + constant state/seq/GPU)); ``max_context`` solves the same for a
    given concurrency (capped at the model's ``max_position_embeddings``).

    Args:
        model: anything :func:`get_spec` accepts. accelerator: catalog name or "local"/"cpu".
        n_gpus: GPUs in total (tp × pp; default tp = min(n_gpus, GPUs per node)). context_len, concurrency: tokens
            per sequence (prompt + output) and sequences.
        kv_dtype, state_dtype: cache dtypes. weight_dtypes: per-group override, e.g. "routed_experts=mxfp4".

    Raises:
        ValueError: non-positive sizes, ``context_len`` beyond the model's ``max_position_embeddings``, unknown
            dtype, inconsistent tp/ep/pp (ep > 1 on a dense model), ``mem_util`` not in the interval from 0
            (excluded) to 1.
        KeyError: unknown model or accelerator.
    Warns:
        UserWarning: attention / KV heads that do not split evenly over tp (see :func:`_check_heads_split`).
    """
    spec = get_spec(model)
    dev = device or get_device(accelerator, catalog=catalog, calibration=calibration)
    if not 0 < mem_util <= 1:
        raise UserError(f"mem_util={mem_util!r} must be in (0, 1]")
    if context_len is not None:
        context_len = _check_context(spec, context_len)
    if concurrency is not None:
        concurrency = _check_pos_int("concurrency", concurrency)
    n_gpus, tp, ep, pp = _layout(dev, n_gpus, tp, ep, pp, spec)
    dts = spec.dtypes(weight_dtypes)
    wr = weight_bytes(spec, dts, tp, ep)
    w_total = sum(weight_bytes(spec, dts, 1, 1).values())
    layer_part = sum(v for g, v in wr.items() if g not in ("embed", "lm_head"))
    ends = (wr["embed"] + wr["lm_head"]) if pp == 1 else max(wr["embed"], wr["lm_head"])
    w_gpu = layer_part / pp + ends
    runtime = 0.0 if dev.device == "cpu" else DEFAULT_RUNTIME_GB
    reserve = reserve_gb if reserve_gb is not None else runtime + workspace_gb(spec, tp, max_batched_tokens)
    if reserve < 0:
        raise UserError(f"reserve_gb={reserve_gb!r} must be >= 0")
    usable = dev.mem_gb * mem_util
    budget_b = (usable - w_gpu / 1e9 - reserve) * 1e9
    kv_tok = kv_bytes_per_token(spec, kv_dtype, tp) / pp
    big_ctx = spec.max_position_embeddings or 10**7
    fits_w = budget_b > 0
    tokens_free = max(0.0, budget_b) / kv_tok if kv_tok else float("inf")
    res = FitResult(model=spec.name, accelerator=dev.name, n_gpus=n_gpus, tp=tp, ep=ep, pp=pp,
                    kv_dtype=dtypes.canonical(kv_dtype), weight_dtypes=dts, mem_gb_per_gpu=dev.mem_gb,
                    usable_gb_per_gpu=usable, weights_gb_total=w_total / 1e9, weights_gb_per_gpu=w_gpu / 1e9,
                    reserve_gb_per_gpu=reserve, kv_budget_gb_per_gpu=budget_b / 1e9,
                    kv_bytes_per_token=kv_bytes_per_token(spec, kv_dtype, 1), kv_bytes_per_token_per_gpu=kv_tok,
                    state_bytes_per_seq_per_gpu=state_bytes_per_seq(spec, context_len or big_ctx, kv_dtype,
                                                                    state_dtype, tp) / pp,
                    fits_weights=fits_w, kv_tokens_free=tokens_free, context_len=context_len, concurrency=concurrency)
    per_seq = (context_len * kv_tok + state_bytes_per_seq(spec, context_len, kv_dtype, state_dtype, tp) / pp
               if context_len else None)
    if context_len:
        res.max_concurrency = int(max(0.0, budget_b) // per_seq) if per_seq else None
    if concurrency:
        st = state_bytes_per_seq(spec, big_ctx, kv_dtype, state_dtype, tp) / pp
        room = max(0.0, budget_b) / concurrency - st
        res.max_context = int(max(0.0, room) // kv_tok) if kv_tok else None
        if spec.max_position_embeddings and res.max_context is not None:
            res.max_context = min(res.max_context, int(spec.max_position_embeddings))
    res.fits = fits_w
    if context_len and concurrency:
        need = concurrency * per_seq
        res.need_gb_per_gpu = (w_gpu + need) / 1e9 + reserve
        res.fits = fits_w and need <= budget_b
    res.assumptions = (f"mem_util={mem_util}; reserve={reserve:.2f} GB/GPU (runtime {runtime} GB + workspace for "
                       f"{max_batched_tokens} tokens); kv {dtypes.canonical(kv_dtype)}, state "
                       f"{dtypes.canonical(state_dtype)}; weights {_dt_summary(dts)}; device {dev.name} ({dev.source.split(' [')[0]})")
    return res


def _dt_summary(dts: dict) -> str:
    from collections import Counter

    base = Counter(dts.values()).most_common(1)[0][0]
    rest = [f"{g}={d}" for g, d in dts.items() if d != base]
    return f"{base}" + (f" ({', '.join(rest)})" if rest else "")


def min_gpus(model, accelerator: str, context_len: int | None = None, concurrency: int | None = None,
             max_gpus: int | None = None, **kw) -> int | None:
    """Fewest GPUs of ``accelerator`` on which ``model`` fits (with ``concurrency`` × ``context_len`` of KV when
    given): tries 1, 2, 4, ... up to a node, then whole nodes (TP within a node, PP across nodes). None if even
    ``max_gpus`` is not enough. Raises as :func:`memory_fit`."""
    dev = kw.pop("device", None) or get_device(accelerator, catalog=kw.pop("catalog", None),
                                               calibration=kw.pop("calibration", None))
    max_gpus = MIN_GPUS_MAX if max_gpus is None else max_gpus
    node = max(1, dev.gpus_per_node)
    cands = [n for n in (1, 2, 4, 8, 16, 32, 64) if n < node] + list(range(node, max_gpus + 1, node))
    if dev.device == "cpu":
        cands = [1]  # one host: the planner does not split a model over CPUs
    for n in cands:
        tp = min(n, node)
        r = memory_fit(model, accelerator, n, context_len, concurrency, tp=tp, pp=n // tp, device=dev, **kw)
        if r.fits:
            return n
    return None


# ---------------------------------------------------------------- roofline
def expert_coverage(n_experts: int, tokens: float, k: int) -> float:
    """Expected fraction of ``n_experts`` routed experts hit when ``tokens`` tokens each pick ``k``:
    1 − (1 − 1/E)^(tokens·k) (uniform independent routing; ../shared/METRICS.md)."""
    if n_experts <= 0:
        return 0.0
    return 1.0 - (1.0 - 1.0 / n_experts) ** (tokens * k)


def _matmul_params_rank(spec: ArchSpec, tp: int, ep: int, include_lm_head: bool = True) -> tuple[float, float]:
    """(dense params multiplied per token on one rank, routed-expert params per token on one rank on average)."""
    dense = 0.0
    for g, kind, n in spec.param_items():
        if g in ("embed", "routed_experts", "norms") or (g == "lm_head" and not include_lm_head):
            continue
        dense += n * _shard(kind, spec, tp, ep)
    if spec.tie_word_embeddings and include_lm_head:
        dense += spec.vocab_size * spec.hidden_size / tp
    routed = spec.n_moe_layers * spec.experts_per_token * spec.expert_params / tp
    return dense, routed


def _attn_flops_per_ctx_token(spec: ArchSpec, tp: int, decode: bool) -> float:
    """FLOPs per (query token × attended position) summed over full-attention layers, on one rank."""
    if spec.attention == "mla":
        heads = spec.num_attention_heads / tp
        if decode:  # absorbed: scores over the (kv_lora + rope) latent, values in the kv_lora latent
            per = 2 * (spec.kv_lora_rank + spec.qk_rope_head_dim) + 2 * spec.kv_lora_rank
        else:
            per = 2 * (spec.qk_nope_head_dim + spec.qk_rope_head_dim) + 2 * spec.v_head_dim
        return heads * per
    return 4 * (spec.num_attention_heads / tp) * spec.head_dim


def _decode_terms(spec: ArchSpec, B: int, ctx: float, tp: int, ep: int, dts: dict, kv_dtype, state_dtype) -> dict:
    wr = weight_bytes(spec, dts, tp, ep)
    cov = expert_coverage(spec.n_routed_experts, B, spec.experts_per_token)
    w_bytes = sum(v for g, v in wr.items() if g not in ("embed", "routed_experts"))
    w_bytes += wr["routed_experts"] * cov
    w_bytes += B * spec.hidden_size * dtypes.bytes_per_element(dts["embed"])  # embedding rows gathered
    if spec.tie_word_embeddings:
        w_bytes += wr["embed"]  # the tied matrix is read whole as the LM head
    kv_tok = kv_bytes_per_token(spec, kv_dtype, tp)
    kv_read = B * ctx * kv_tok
    swa = state_bytes_per_seq(replace(spec, n_linear_layers=0, n_kv_layers=spec.n_kv_layers + spec.n_linear_layers)
                              if spec.n_linear_layers else spec, ctx, kv_dtype, state_dtype, tp) if spec.n_swa_layers else 0
    lin = (state_bytes_per_seq(spec, ctx, kv_dtype, state_dtype, tp) - swa) if spec.n_linear_layers else 0
    kv_read += B * (swa + 2 * lin)  # SWA window read once; recurrent state read and written
    dense_p, routed_p = _matmul_params_rank(spec, tp, ep)
    lin_flops = 2 * B * (dense_p + routed_p)
    attn_flops = B * spec.n_kv_layers * ctx * _attn_flops_per_ctx_token(spec, tp, decode=True)
    if spec.n_swa_layers:
        attn_flops += B * spec.n_swa_layers * min(ctx, spec.sliding_window) * _attn_flops_per_ctx_token(spec, tp, True)
    if spec.n_linear_layers:
        attn_flops += B * spec.n_linear_layers * 4 * math.ceil(spec.linear_num_heads / tp) * spec.linear_head_dim ** 2
    return {"weight_bytes": w_bytes, "kv_bytes": kv_read, "linear_flops": lin_flops, "attn_flops": attn_flops,
            "flops": lin_flops + attn_flops, "expert_coverage": cov}


def _roofline(dev: Device, w_bytes: float, lin_flops: float, kv_bytes: float, attn_flops: float, compute_dtype,
              eff_bw: float, eff_flops: float, decode: bool = True) -> dict:
    """Per op class (linear layers; attention), time = max(bytes / (BW × eff_bw), flops / (rate × eff_flops)); the
    classes run one after the other, so their times add. Decode attention's rate is the device's measured
    decode-attention throughput when calibrated (``attn_tflops``), else the matmul peak; prefill attention (many
    queries per key: GEMM-shaped) uses the matmul peak."""
    bw = dev.mem_bw_gb_s * 1e9 * eff_bw
    peak = dev.peak_tflops(compute_dtype) * 1e12 * eff_flops
    arate = (dev.attn_tflops * 1e12 * eff_flops) if (dev.attn_tflops and decode) else peak
    lm, lc = w_bytes / bw * 1e3, lin_flops / peak * 1e3
    am, ac = kv_bytes / bw * 1e3, attn_flops / arate * 1e3
    t_lin, t_att = max(lm, lc), max(am, ac)
    mem = (t_lin if lm >= lc else 0.0) + (t_att if am >= ac else 0.0)
    return {"t_linear": t_lin, "t_attn": t_att, "t_mem": lm + am, "t_compute": lc + ac, "mem_part": mem,
            "compute_part": t_lin + t_att - mem}


def _comm_ms(spec: ArchSpec, dev: Device, tokens: float, tp: int, act_dtype) -> float:
    """Two all-reduces of tokens × hidden activations per layer over the scale-up link (nccl-tests bus-bandwidth
    convention: time = bytes × 2(n−1)/n / busbw)."""
    if tp <= 1 or not dev.scaleup_gb_s:
        return 0.0
    size = tokens * spec.hidden_size * dtypes.bytes_per_element(act_dtype)
    return 2 * spec.num_layers * size * metrics.busbw_factor("all_reduce", tp) / (dev.scaleup_gb_s * 1e9) * 1e3


def predict_point(model, accelerator: str = "local", n_gpus: int = 1, concurrency: int = 1, context_len: int = 1024,
                  *, dtype=None, kv_dtype=None, state_dtype="bfloat16", weight_dtypes=None, compute_dtype=None,
                  act_dtype=None, tp: int | None = None, ep: int | None = None, pp: int | None = None,
                  eff_bw: float | None = None, eff_flops: float | None = None, overhead_ms: float | None = None,
                  attend_len: int | None = None, prefill: bool = True, mem_util: float = DEFAULT_MEM_UTIL,
                  reserve_gb: float | None = None, device: Device | None = None, catalog=None, calibration=None,
                  model_label: str | None = None) -> dict:
    """Predict one point — a batch prefill of ``concurrency`` × ``context_len`` tokens and one decode step at that
    context — as a record in the :mod:`kit.results` schema (``backend="planner"``).

    Decode step (ms) = max(bytes / (BW × eff_bw), flops / (peak × eff_flops)) + t_comm + overhead, per rank, with
    bytes = weights (routed experts × coverage E·(1−(1−1/E)^(B·k))/E, embedding rows only) + B × attended
    positions × KV bytes/token/rank (+ sliding-window caches, + linear-attention state read and written); flops =
    2 × B × matmul params/rank + attention (grows with context); t_comm = two all-reduces per layer over the
    scale-up link; overhead = device per-step overhead (fixed + per layer; measured by ``kit calibrate``).
    Prefill likewise with B × C tokens (causal attention ≈ C²/2 per sequence, logits for the last token only).

    Args:
        dtype: one dtype for weights, KV and compute (the in-process engine's setting); finer control via
            ``weight_dtypes``, ``kv_dtype``, ``compute_dtype`` (which TFLOPS figure applies; default: the
            attention weights' dtype, fp4 groups aside) and ``act_dtype`` (activations, default bfloat16 or dtype).
        attend_len: positions each decode step attends over (default ``context_len``; the kit's engine attends
            over its whole preallocated static cache, ``context_len + decode_steps``).
        eff_bw, eff_flops, overhead_ms: override the device's efficiencies / per-step overhead (ms).

    Returns:
        dict: schema columns (prefill_ms, ttft_ms, tpot_ms_p50, decode_tok_s, tok_s_per_stream, prefill_tok_s,
        achieved_gb_s, peak_mem_gb, kv_cache_gb, weights_gb, eff_bw, eff_flops, tp, assumptions, ...) and x_ extras
        (x_bound, x_t_mem_ms, x_t_compute_ms, x_t_comm_ms, x_overhead_ms, x_bytes_per_step, x_flops_per_step,
        x_expert_coverage, x_kv_dtype, x_max_concurrency, x_kv_tokens_free, ...). status "oom" (timings missing)
        when the point is predicted not to fit.

    Raises:
        ValueError: non-positive sizes, ``context_len`` beyond the model's ``max_position_embeddings``, unknown
            dtype, bad parallel layout, ``eff_bw`` / ``eff_flops`` not in the interval from 0 (excluded) to 1.
        KeyError: unknown model or accelerator.
    """
    spec = get_spec(model)
    B = _check_pos_int("concurrency", concurrency)
    C = _check_context(spec, context_len)
    dev = device or get_device(accelerator, catalog=catalog, calibration=calibration)
    if dtype is not None:
        dtype = dtypes.canonical(dtype)
        weight_dtypes = weight_dtypes or f"default={dtype}"
    dts = spec.dtypes(weight_dtypes)
    kv_dtype = dtypes.canonical(kv_dtype or dtype or "bfloat16")
    act_dtype = dtypes.canonical(act_dtype or dtype or "bfloat16")
    compute_dtype = dtypes.canonical(compute_dtype or dts["attn"])
    fit = memory_fit(spec, dev.name, n_gpus, C, B, kv_dtype, state_dtype, dts, tp, ep, pp, mem_util, reserve_gb,
                     device=dev)  # also settles the parallel layout
    n_gpus, tp, ep, pp = fit.n_gpus, fit.tp, fit.ep, fit.pp
    eb = _check_eff("eff_bw", dev.eff_bw if eff_bw is None else eff_bw)
    ef = _check_eff("eff_flops", dev.eff_flops if eff_flops is None else eff_flops)
    ovh = (dev.overhead_ms_fixed + dev.overhead_ms_per_layer * spec.num_layers) if overhead_ms is None \
        else float(overhead_ms)
    if ovh < 0:
        raise UserError(f"overhead_ms={overhead_ms!r} must be >= 0")
    att = _check_pos_int("attend_len", attend_len) if attend_len is not None else C
    d = _decode_terms(spec, B, att, tp, ep, dts, kv_dtype, state_dtype)
    bytes_step = d["weight_bytes"] + d["kv_bytes"]
    rl = _roofline(dev, d["weight_bytes"], d["linear_flops"], d["kv_bytes"], d["attn_flops"], compute_dtype, eb, ef)
    t_comm = _comm_ms(spec, dev, B, tp, act_dtype)
    step_ms = rl["t_linear"] + rl["t_attn"] + t_comm + ovh
    bound = max((ovh, "overhead"), (rl["mem_part"], "memory"), (rl["compute_part"], "compute"))[1]
    rec: dict = {
        "backend": "planner", "status": "ok", "model": model_label or spec.name, "dtype": compute_dtype,
        "device": dev.device, "device_name": dev.full_name or dev.name, "accelerator": dev.name, "n_gpus": n_gpus,
        "concurrency": B, "context_len": C, "tp": tp, "eff_bw": eb, "eff_flops": ef,
        "peak_mem_method": "planner", "weights_gb": fit.weights_gb_total,
        "peak_mem_gb": fit.need_gb_per_gpu,
        "kv_cache_gb": B * (C * kv_bytes_per_token(spec, kv_dtype) + state_bytes_per_seq(spec, C, kv_dtype,
                                                                                          state_dtype)) / 1e9,
        "tpot_ms_p50": step_ms, "decode_tok_s": metrics.decode_tok_s(B, step_ms),
        "tok_s_per_stream": metrics.tok_s_per_stream(step_ms),
        "achieved_gb_s": metrics.achieved_gb_s(bytes_step * tp, step_ms / 1e3),
        "x_bound": bound, "x_t_linear_ms": rl["t_linear"], "x_t_attn_ms": rl["t_attn"], "x_t_mem_ms": rl["t_mem"],
        "x_t_compute_ms": rl["t_compute"], "x_t_comm_ms": t_comm, "x_overhead_ms": ovh,
        "x_bytes_per_step": bytes_step, "x_flops_per_step": d["flops"], "x_expert_coverage": d["expert_coverage"],
        "x_attend_len": att, "x_kv_dtype": kv_dtype, "x_compute_dtype": compute_dtype, "x_ep": ep, "x_pp": pp,
        "x_weights_gb_per_gpu": fit.weights_gb_per_gpu, "x_kv_tokens_free": fit.kv_tokens_free,
        "x_max_concurrency": fit.max_concurrency, "x_fits": fit.fits, "x_mem_bw_gb_s": dev.mem_bw_gb_s,
        "x_peak_tflops": dev.peak_tflops(compute_dtype), "x_device_source": dev.source,
    }
    if prefill:
        T = B * C
        wr = weight_bytes(spec, dts, tp, ep)
        cov = expert_coverage(spec.n_routed_experts, T, spec.experts_per_token)
        pbytes = sum(v for g, v in wr.items() if g != "routed_experts") + wr["routed_experts"] * cov \
            + T * kv_bytes_per_token(spec, kv_dtype, tp)
        dense_p, routed_p = _matmul_params_rank(spec, tp, ep, include_lm_head=False)
        p_lin = 2 * T * (dense_p + routed_p) + 2 * B * spec.vocab_size * spec.hidden_size / tp
        per_ctx = _attn_flops_per_ctx_token(spec, tp, decode=False)
        causal = C * attend_len if attend_len is not None else C * (C + 1) / 2
        p_att = B * spec.n_kv_layers * causal * per_ctx
        if spec.n_swa_layers:
            w = spec.sliding_window
            p_att += B * spec.n_swa_layers * (C * min(C, w) - min(C, w) ** 2 / 2) * per_ctx
        if spec.n_linear_layers:
            p_att += T * spec.n_linear_layers * 4 * math.ceil(spec.linear_num_heads / tp) * spec.linear_head_dim ** 2
        kv_w = T * kv_bytes_per_token(spec, kv_dtype, tp)
        pr = _roofline(dev, pbytes - kv_w, p_lin, kv_w, p_att, compute_dtype, eb, ef, decode=False)
        prefill_ms = pr["t_linear"] + pr["t_attn"] + _comm_ms(spec, dev, T, tp, act_dtype) + ovh
        pm, pc, pflops = pr["mem_part"], pr["compute_part"], p_lin + p_att
        rec.update({"prefill_ms": prefill_ms, "ttft_ms": prefill_ms,
                    "prefill_tok_s": metrics.prefill_tok_s(B, C, prefill_ms), "x_prefill_bound":
                    "memory" if pm >= pc else "compute", "x_prefill_flops": pflops})
    rec["assumptions"] = (f"roofline per op class (linear, attention): max(bytes/(BW×{eb:g}), flops/(rate×{ef:g})), "
                          f"summed, + comm + overhead "
                          f"{ovh:.3f} ms; {dev.name} {dev.mem_bw_gb_s:,.0f} GB/s, {dev.peak_tflops(compute_dtype):,.3g} "
                          f"TFLOPS {compute_dtype}" + (f", attention {dev.attn_tflops * 1e3:,.1f} GFLOP/s" if dev.attn_tflops else "")
                          + f" ({dev.source.split(' [')[0]}); TP{tp} EP{ep} PP{pp}; KV {kv_dtype}; weights "
                          f"{_dt_summary(dts)}; attends {att} positions; uniform expert routing")
    if not fit.fits:
        rec.update({"status": "oom", "error": f"predicted not to fit: needs {fit.need_gb_per_gpu or 0:,.1f} GB/GPU, "
                    f"{fit.usable_gb_per_gpu:,.1f} GB usable (weights {fit.weights_gb_per_gpu:,.1f} GB/GPU)"})
        for k in ("tpot_ms_p50", "decode_tok_s", "tok_s_per_stream", "achieved_gb_s", "prefill_ms", "ttft_ms",
                  "prefill_tok_s"):
            rec[k] = None
    return rec


def predict_grid(model, accelerator: str = "local", concurrencies=(1, 4, 16), context_lens=(128, 512, 2048),
                 n_gpus: int = 1, **kw) -> pd.DataFrame:
    """Planner rows for every (context_len, concurrency) pair, as a :mod:`kit.results` DataFrame. ``kw`` as
    :func:`predict_point`."""
    from kit.results import to_frame

    dev = kw.pop("device", None) or get_device(accelerator, catalog=kw.pop("catalog", None),
                                               calibration=kw.pop("calibration", None))
    recs = [predict_point(model, accelerator, n_gpus, int(b), int(c), device=dev, **kw)
            for c in context_lens for b in concurrencies]
    return to_frame(recs)


def predict_like(measured: pd.DataFrame, accelerator: str = "local", **kw) -> pd.DataFrame:
    """Planner rows for the grid of a measured sweep (one per distinct ok grid point: same model, dtype,
    concurrency and context_len), for overlays and error tables. The kit's engine attends over its whole static cache, so each
    step's attended length is taken as ``context_len + decode_steps`` (``x_cache_len`` when the row has it).

    Raises:
        ValueError: ``measured`` has no ok rows with model, dtype, concurrency and context_len.
    """
    from kit.results import to_frame

    need = ["model", "dtype", "concurrency", "context_len"]
    missing = [c for c in need if c not in measured.columns]
    if missing:
        raise UserError(f"measured frame lacks column(s) {missing}")
    ok = measured[(measured.get("status", "ok") == "ok")] if "status" in measured.columns else measured
    ok = ok.dropna(subset=need)
    if ok.empty:
        raise UserError("measured frame has no ok rows with model, dtype, concurrency and context_len")
    dev = kw.pop("device", None) or get_device(accelerator, catalog=kw.pop("catalog", None),
                                               calibration=kw.pop("calibration", None))
    recs = []
    grid = [c for c in ("model", "dtype", "concurrency", "context_len", "decode_steps", "n_gpus", "x_cache_len")
            if c in ok.columns]
    ok = ok.drop_duplicates(subset=grid)  # one prediction per grid point, however often it was measured
    for _, r in ok.iterrows():
        C = int(r["context_len"])
        if "x_cache_len" in r and pd.notna(r.get("x_cache_len")):
            att = int(r["x_cache_len"])
        elif "decode_steps" in r and pd.notna(r.get("decode_steps")):
            att = C + max(int(r["decode_steps"]), 3)
        else:
            att = C
        rec = predict_point(r["model"], accelerator, int(r["n_gpus"]) if "n_gpus" in r and pd.notna(r.get("n_gpus"))
                            else 1, int(r["concurrency"]), C, dtype=str(r["dtype"]), attend_len=att, device=dev, **kw)
        rec["decode_steps"] = int(r["decode_steps"]) if "decode_steps" in r and pd.notna(r.get("decode_steps")) else None
        recs.append(rec)
    return to_frame(recs)


def compare(measured: pd.DataFrame, predicted: pd.DataFrame, column: str = "tpot_ms_p50") -> pd.DataFrame:
    """Join measured and predicted rows on (model, dtype, concurrency, context_len) and add the error per point:
    ``error_pct = 100 × (predicted − measured) / measured`` for ``column``.

    Returns: DataFrame with model, dtype, concurrency, context_len, measured, predicted, error_pct, x_bound.
    """
    keys = ["model", "dtype", "concurrency", "context_len"]
    m = measured[measured["status"] == "ok"] if "status" in measured.columns else measured
    p = predicted[predicted["status"] == "ok"] if "status" in predicted.columns else predicted
    cols_p = keys + [column] + [c for c in ("x_bound", "x_overhead_ms", "x_t_linear_ms", "x_t_attn_ms")
                                if c in p.columns]
    p = p.drop_duplicates(subset=keys)
    j = m[keys + [column]].merge(p[cols_p], on=keys, suffixes=("_measured", "_predicted"))
    j = j.rename(columns={f"{column}_measured": "measured", f"{column}_predicted": "predicted"})
    j["error_pct"] = 100.0 * (j["predicted"] - j["measured"]) / j["measured"]
    return j.sort_values(keys).reset_index(drop=True)


def overlay_figure(measured: pd.DataFrame, predicted: pd.DataFrame, x: str = "context_len", y: str = "tpot_ms_p50",
                   hue: str = "concurrency"):
    """Predicted (dashed) over measured (solid, markers) ``y`` vs ``x``, one colour per ``hue`` value, with the
    per-point error in % annotated. Returns a matplotlib Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    err = compare(measured, predicted, y) if y == "tpot_ms_p50" else None
    m = measured[measured["status"] == "ok"] if "status" in measured.columns else measured
    p = predicted[predicted["status"] == "ok"] if "status" in predicted.columns else predicted
    for i, (hv, g) in enumerate(sorted(m.groupby(hue), key=lambda t: t[0])):
        col = f"C{i % 10}"
        g = g.sort_values(x)
        ax.plot(g[x], g[y], "o-", color=col, label=f"{hue}={hv} measured")
        gp = p[p[hue] == hv].sort_values(x)
        ax.plot(gp[x], gp[y], "--", color=col, alpha=0.8, label=f"{hue}={hv} planner")
        if err is not None:
            for _, r in err[err[hue] == hv].iterrows():
                ax.annotate(f"{r['error_pct']:+.0f}%", (r[x], r["measured"]), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color=col)
    ax.set_xscale("log", base=2)
    xs = sorted(pd.to_numeric(m[x], errors="coerce").dropna().unique())
    if xs:
        ax.set_xticks(xs, [f"{v:g}" for v in xs])
    ax.set_yscale("log")
    from matplotlib.ticker import ScalarFormatter

    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    title = "planner (dashed) vs measured (solid)"
    if err is not None and len(err):
        title += f": median |error| {err['error_pct'].abs().median():.0f}% (n={len(err)})"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- CLI
def add_cli(sub) -> None:
    """``kit plan``: memory fit, KV headroom, predicted tok/s and cost for a model on N accelerators."""
    p = sub.add_parser("plan",
                       description="Analytic plan for serving a model: weights per GPU, KV tokens left, max users "
                                   "at a context, predicted decode tok/s (roofline) and $ per million tokens. "
                                   f"Reference models: {', '.join(list_models())}; also kit presets and any "
                                   "config.json path.")
    p.add_argument("--model", required=True, help="reference model key, kit preset, or config.json path/dir")
    p.add_argument("--accelerator", default="local", help="catalog name (MI355X, B300, H200, ...) or local/cpu")
    p.add_argument("--gpus", type=int, default=None, help="number of accelerators (default: fewest that fit)")
    p.add_argument("--context", type=int, default=1424, help="tokens per sequence (prompt + output), default 1424")
    p.add_argument("--concurrency", type=int, default=64, help="concurrent sequences (batch), default 64")
    p.add_argument("--kv-dtype", default="bfloat16", help="KV-cache dtype: bfloat16, fp8, float32, ...")
    p.add_argument("--weight-dtypes", default=None,
                   help="per-group weight dtypes, e.g. 'default=bf16;routed_experts=mxfp4' (default: the model's)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: GPUs in a node)")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel size (default: tp for MoE)")
    p.add_argument("--eff-bw", type=float, default=None, help=f"fraction of peak bandwidth (default {DEFAULT_EFF_BW})")
    p.add_argument("--eff-flops", type=float, default=None,
                   help=f"fraction of peak TFLOPS (default {DEFAULT_EFF_FLOPS})")
    p.add_argument("--overhead-ms", type=float, default=None,
                   help="fixed per-step overhead, ms (default: 0 for catalog GPUs, measured for local)")
    p.add_argument("--mem-util", type=float, default=DEFAULT_MEM_UTIL, help="fraction of memory usable (0.9)")
    p.add_argument("--basis", default=None, help="price basis (tco, assumed-rental, on-demand); default: all")
    p.add_argument("--price", type=float, default=None, help="your $/GPU-hour (basis 'user')")
    p.add_argument("--prices", default=None,
                   help="price CSV (accelerator, usd_per_gpu_hr, basis) overriding the catalog's prices")
    p.add_argument("--calibration", default=None, help="calibration JSON for --accelerator local")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cli_plan)


def _cli_plan(args) -> int:
    from kit.catalog import load_catalog
    from kit.plan.cost import add_cost_columns
    from kit.results import to_frame

    spec = get_spec(args.model, args.weight_dtypes)
    cat = load_catalog(extra_prices=args.prices)
    dev = get_device(args.accelerator, catalog=cat, calibration=args.calibration, eff_bw=args.eff_bw,
                     eff_flops=args.eff_flops)
    kw = dict(kv_dtype=args.kv_dtype, mem_util=args.mem_util)
    least = min_gpus(spec, dev.name, args.context, args.concurrency, device=dev, **kw)
    if args.gpus is not None and args.gpus < 1:
        raise UserError(f"--gpus {args.gpus} must be >= 1")
    n = args.gpus if args.gpus is not None else (least or dev.gpus_per_node)
    fit = memory_fit(spec, dev.name, n, args.context, args.concurrency, tp=args.tp, ep=args.ep, device=dev, **kw)
    pts = [predict_point(spec, dev.name, n, b, args.context, tp=args.tp, ep=args.ep, device=dev,
                         overhead_ms=args.overhead_ms, **kw)
           for b in sorted({1, args.concurrency})]
    df = to_frame(pts)
    costs = []
    if dev.name != "local" and dev.name != "CPU" or args.price:
        bases = [args.basis] if args.basis else cat.bases_for(dev.name)
        if args.price:
            bases = [args.basis or "user"]
        for b in bases:
            c = add_cost_columns(df, basis=b, usd_per_gpu_hr=args.price, tok_s_col="decode_tok_s", catalog=cat)
            costs.append(c[["concurrency", "usd_per_gpu_hr", "price_basis", "tok_s_per_gpu", "usd_per_mtok",
                            "tok_per_usd"]])
    if args.json:
        out = {"spec": spec.summary(), "fit": fit.as_dict(), "min_gpus": least,
               "predictions": json.loads(df.to_json(orient="records")),
               "cost": [json.loads(c.to_json(orient="records")) for c in costs]}
        print(json.dumps(out, indent=2, default=str))
        return 0
    s = spec.summary()
    print(f"{spec.name}: {s['total_params_b']:,.1f}B params ({s['active_params_b']:,.1f}B active), "
          f"KV {s['kv_bytes_per_token_bf16']:,.0f} B/token bf16")
    if spec.flags:  # in full, wrapped at word boundaries (never cut mid-word)
        print(textwrap.fill(f"flags: {spec.flags}", width=110, initial_indent="  ", subsequent_indent="    ",
                            break_long_words=False, break_on_hyphens=False))
    print(fit)
    if least is None:
        where = ("one CPU host (the planner does not split a model over CPUs)" if dev.device == "cpu"
                 else f"any number of {dev.name} (tried up to {MIN_GPUS_MAX} GPUs)")
        least_txt = f"does not fit on {where}"
    else:
        least_txt = f"{least}"
    print(f"  fewest {dev.name} that fit {args.concurrency} users × {args.context} tokens: {least_txt}")
    print("Predicted (roofline):")
    for _, r in df.iterrows():
        if r["status"] != "ok":
            print(f"  concurrency {r['concurrency']:>5}: {r['error']}")
            continue
        print(f"  concurrency {r['concurrency']:>5}: decode step {r['tpot_ms_p50']:.2f} ms ({r['x_bound']}-bound) -> "
              f"{r['decode_tok_s']:,.0f} tok/s total, {r['tok_s_per_stream']:,.1f} tok/s/user; "
              f"prefill {r['prefill_ms']:,.0f} ms")
    for c in costs:
        for _, r in c.iterrows():
            if pd.notna(r["usd_per_mtok"]):
                print(f"  cost [{r['price_basis']}] ${r['usd_per_gpu_hr']:.2f}/GPU-h, concurrency {r['concurrency']}: "
                      f"${r['usd_per_mtok']:.2f}/M output tokens ({r['tok_s_per_gpu']:,.0f} tok/s/GPU)")
    print(f"  assumptions: {pts[-1]['assumptions']}")
    return 0


# the spec names (kit.plan.spec) are re-exported so ``from kit.plan.roofline import get_spec`` keeps working
__all__ = [
    # kit.plan.spec
    "GROUPS", "ArchSpec", "parse_weight_dtypes", "model_table",
    "list_models", "spec_from_config", "get_spec", "kv_bytes_per_token", "state_bytes_per_seq", "weight_bytes",
    # devices, memory fit, roofline, CLI
    "Device", "DEFAULT_EFF_BW", "DEFAULT_EFF_FLOPS", "UNCALIBRATED_CPU_OVERHEAD_MS", "UNCALIBRATED_CPU_ATTN_TFLOPS",
    "get_device", "DEFAULT_RUNTIME_GB", "DEFAULT_MEM_UTIL", "DEFAULT_MAX_BATCHED_TOKENS", "workspace_gb",
    "FitResult", "memory_fit", "min_gpus", "expert_coverage", "predict_point", "predict_grid", "predict_like",
    "compare", "overlay_figure", "add_cli",
]
