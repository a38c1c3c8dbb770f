"""Bytes and FLOPs of one prefill or decode step on one rank, and the roofline time they take on a device.

Per op class (linear layers; attention): ``t = max(bytes / (BW × eff_bw), flops / (rate × eff_flops))``, the classes
summed (:func:`roofline_times`); weights touched follow expert coverage (:func:`expert_coverage`: expected distinct
experts hit by B·k uniform draws); communication is :mod:`kit.plan.comm`, the named terms of a decode step
:mod:`kit.plan.decode`. Formulas: ``docs/metrics.md`` (Planner formulas). The rows built on these
are :func:`kit.plan.roofline.predict_point`.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kit import dtypes
from kit.plan.device import DeviceModel
from kit.plan.sizes import kv_bytes_per_token, shard_fraction, state_bytes_per_seq, weight_bytes
from kit.plan.spec import ArchSpec


def expert_coverage(n_experts: int, tokens: float, k: int) -> float:
    """Expected fraction of ``n_experts`` routed experts hit when ``tokens`` tokens each pick ``k``:
    1 − (1 − 1/E)^(tokens·k) (uniform independent routing; docs/metrics.md, Decode step)."""
    if n_experts <= 0:
        return 0.0
    return 1.0 - (1.0 - 1.0 / n_experts) ** (tokens * k)


def matmul_params_rank(spec: ArchSpec, tp: int, ep: int, include_lm_head: bool = True) -> tuple[float, float]:
    """(dense params multiplied per token on one rank, routed-expert params per token on one rank on average)."""
    dense = 0.0
    for g, kind, n in spec.param_items():
        if g in ("embed", "routed_experts", "norms") or (g == "lm_head" and not include_lm_head):
            continue
        dense += n * shard_fraction(kind, spec, tp, ep)
    if spec.tie_word_embeddings and include_lm_head:
        dense += spec.vocab_size * spec.hidden_size / tp
    routed = spec.n_moe_layers * spec.experts_per_token * spec.expert_params / tp
    return dense, routed


def attn_flops_per_ctx_token(spec: ArchSpec, tp: int, decode: bool) -> float:
    """FLOPs per (query token × attended position) summed over full-attention layers, on one rank."""
    if spec.attention == "mla":
        heads = spec.num_attention_heads / tp
        if decode:  # absorbed: scores over the (kv_lora + rope) latent, values in the kv_lora latent
            per = 2 * (spec.kv_lora_rank + spec.qk_rope_head_dim) + 2 * spec.kv_lora_rank
        else:
            per = 2 * (spec.qk_nope_head_dim + spec.qk_rope_head_dim) + 2 * spec.v_head_dim
        return heads * per
    return 4 * (spec.num_attention_heads / tp) * spec.head_dim


def decode_terms(spec: ArchSpec, B: int, ctx: float, tp: int, ep: int, dts: dict, kv_dtype, state_dtype) -> dict:
    """Bytes and FLOPs of one decode step of ``B`` sequences attending ``ctx`` positions, on one rank: weights
    touched (routed experts by coverage, embedding rows only, a tied LM head whole), KV reads (+ sliding-window
    caches, + linear-attention state read and written); 2 × B × matmul params/rank + attention FLOPs. Returns
    ``weight_bytes``, ``kv_bytes``, ``linear_flops``, ``attn_flops``, ``flops``, ``expert_coverage``, and the
    split the stack profiles need (:mod:`kit.plan.stack`): ``group_bytes`` (weight bytes touched per group,
    summing to ``weight_bytes``) and ``state_bytes`` (the linear-attention part of ``kv_bytes``)."""
    wr = weight_bytes(spec, dts, tp, ep)
    cov = expert_coverage(spec.n_routed_experts, B, spec.experts_per_token)
    touched = {g: v for g, v in wr.items() if g not in ("embed", "routed_experts")}
    touched["routed_experts"] = wr["routed_experts"] * cov
    touched["embed"] = B * spec.hidden_size * dtypes.bytes_per_element(dts["embed"])  # embedding rows gathered
    if spec.tie_word_embeddings:
        touched["embed"] += wr["embed"]  # the tied matrix is read whole as the LM head
    w_bytes = sum(touched.values())
    kv_tok = kv_bytes_per_token(spec, kv_dtype, tp)
    kv_read = B * ctx * kv_tok
    swa = (
        state_bytes_per_seq(
            replace(spec, n_linear_layers=0, n_kv_layers=spec.n_kv_layers + spec.n_linear_layers)
            if spec.n_linear_layers
            else spec,
            ctx,
            kv_dtype,
            state_dtype,
            tp,
        )
        if spec.n_swa_layers
        else 0
    )
    lin = (state_bytes_per_seq(spec, ctx, kv_dtype, state_dtype, tp) - swa) if spec.n_linear_layers else 0
    kv_read += B * (swa + 2 * lin)  # SWA window read once; recurrent state read and written
    dense_p, routed_p = matmul_params_rank(spec, tp, ep)
    lin_flops = 2 * B * (dense_p + routed_p)
    attn_flops = B * spec.n_kv_layers * ctx * attn_flops_per_ctx_token(spec, tp, decode=True)
    if spec.n_swa_layers:
        attn_flops += B * spec.n_swa_layers * min(ctx, spec.sliding_window) * attn_flops_per_ctx_token(spec, tp, True)
    if spec.n_linear_layers:
        attn_flops += B * spec.n_linear_layers * 4 * math.ceil(spec.linear_num_heads / tp) * spec.linear_head_dim**2
    return {
        "weight_bytes": w_bytes,
        "kv_bytes": kv_read,
        "linear_flops": lin_flops,
        "attn_flops": attn_flops,
        "flops": lin_flops + attn_flops,
        "expert_coverage": cov,
        "group_bytes": touched,
        "state_bytes": B * 2 * lin,
    }


def roofline_times(
    dev: DeviceModel, terms: dict, compute_dtype, eff_bw: float, eff_flops: float, decode: bool = True
) -> dict:
    """Per op class (linear layers; attention), time = max(bytes / (BW × eff_bw), flops / (rate × eff_flops)); the
    classes run one after the other, so their times add. ``terms`` holds the bytes and FLOPs on one rank
    (``weight_bytes``, ``linear_flops``, ``kv_bytes``, ``attn_flops``: :func:`decode_terms` / :func:`prefill_terms`).
    Decode attention's rate is the device's measured decode-attention throughput when calibrated (``attn_tflops``),
    else the matmul peak; prefill attention (many queries per key: GEMM-shaped) uses the matmul peak.

    Returns:
        dict of times in ms, ``t_linear``, ``t_attn``, ``t_mem`` (both classes at bandwidth), ``t_compute`` (both at the
        FLOP rate), ``mem_part`` / ``compute_part`` (the summed time split by what bounds each class).
    """
    w_bytes, lin_flops = terms["weight_bytes"], terms["linear_flops"]
    kv_bytes, attn_flops = terms["kv_bytes"], terms["attn_flops"]
    bw = dev.mem_bw_gb_s * 1e9 * eff_bw
    peak = dev.peak_tflops(compute_dtype) * 1e12 * eff_flops
    arate = (dev.attn_tflops * 1e12 * eff_flops) if (dev.attn_tflops and decode) else peak
    lm, lc = w_bytes / bw * 1e3, lin_flops / peak * 1e3
    am, ac = kv_bytes / bw * 1e3, attn_flops / arate * 1e3
    t_lin, t_att = max(lm, lc), max(am, ac)
    mem = (t_lin if lm >= lc else 0.0) + (t_att if am >= ac else 0.0)
    return {
        "t_linear": t_lin,
        "t_attn": t_att,
        "t_mem": lm + am,
        "t_compute": lc + ac,
        "mem_part": mem,
        "compute_part": t_lin + t_att - mem,
    }


def prefill_terms(
    spec: ArchSpec, B: int, C: int, attend_len: int | None, tp: int, ep: int, dts: dict, kv_dtype
) -> dict:
    """Bytes and FLOPs of a batch prefill of ``B`` × ``C`` tokens on one rank: weights read once (routed experts
    by coverage over B·C tokens), KV written; matmul FLOPs 2 × tokens × params/rank + logits of the last token per
    sequence; causal attention ≈ C²/2 per sequence (C × ``attend_len`` when given), sliding windows capped, linear
    attention per token. Returns ``weight_bytes``, ``kv_bytes``, ``linear_flops``, ``attn_flops``, ``flops``."""
    T = B * C
    wr = weight_bytes(spec, dts, tp, ep)
    cov = expert_coverage(spec.n_routed_experts, T, spec.experts_per_token)
    pbytes = (
        sum(v for g, v in wr.items() if g != "routed_experts")
        + wr["routed_experts"] * cov
        + T * kv_bytes_per_token(spec, kv_dtype, tp)
    )
    dense_p, routed_p = matmul_params_rank(spec, tp, ep, include_lm_head=False)
    p_lin = 2 * T * (dense_p + routed_p) + 2 * B * spec.vocab_size * spec.hidden_size / tp
    per_ctx = attn_flops_per_ctx_token(spec, tp, decode=False)
    causal = C * attend_len if attend_len is not None else C * (C + 1) / 2
    p_att = B * spec.n_kv_layers * causal * per_ctx
    if spec.n_swa_layers:
        w = spec.sliding_window
        p_att += B * spec.n_swa_layers * (C * min(C, w) - min(C, w) ** 2 / 2) * per_ctx
    if spec.n_linear_layers:
        p_att += T * spec.n_linear_layers * 4 * math.ceil(spec.linear_num_heads / tp) * spec.linear_head_dim**2
    kv_w = T * kv_bytes_per_token(spec, kv_dtype, tp)
    return {
        "weight_bytes": pbytes - kv_w,
        "kv_bytes": kv_w,
        "linear_flops": p_lin,
        "attn_flops": p_att,
        "flops": p_lin + p_att,
    }
