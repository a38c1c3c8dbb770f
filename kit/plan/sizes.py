"""Bytes from an architecture: weights per group, KV cache per token, constant state per sequence, on one rank.

Sharding follows the serving engines (vLLM, SGLang): attention, MLP, shared experts and embeddings split over
tensor-parallel (TP) ranks; GQA k/v projections and caches split by kv heads (replicated when fewer heads than
ranks); an MLA latent cache, norms and routers replicated on every rank; routed experts split over expert-parallel
(EP) ranks, then TP within an expert.

Formulas: ``docs/metrics.md`` (Planner formulas). KV bytes/token: MHA/GQA ``2 × layers × n_kv_heads ×
head_dim × bytes``; MLA ``layers × (kv_lora_rank + qk_rope_head_dim) × bytes`` (DeepSeek-V3 paper, §2.1.1; no factor
2). Every function takes an :class:`kit.plan.spec.ArchSpec`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kit import dtypes
from kit.errors import UserError

if TYPE_CHECKING:
    from kit.plan.spec import ArchSpec


def check_pos_int(name: str, v) -> int:
    """``v`` as a positive int (an integral float is accepted).

    Raises:
        UserError: a bool, a non-integer, or a value <= 0 (the message names ``name`` and the value).
    """
    if isinstance(v, bool) or not isinstance(v, (int,)) and not (isinstance(v, float) and v.is_integer()):
        raise UserError(f"{name}={v!r} must be a positive integer")
    if int(v) <= 0:
        raise UserError(f"{name}={v!r} must be > 0")
    return int(v)


def kv_heads_per_rank(spec: ArchSpec, tp: int) -> int:
    """KV heads one TP rank holds: ceil(n_kv / tp), at least 1 (heads are replicated when n_kv < tp)."""
    return max(1, math.ceil(spec.num_kv_heads / tp))


def shard_fraction(kind: str, spec: ArchSpec, tp: int, ep: int) -> float:
    """Fraction of a parameter group one rank holds, by its sharding ``kind`` (see
    :meth:`kit.plan.spec.ArchSpec.param_items`): ``rep`` 1; ``tp`` / ``vocab`` 1/tp; ``kv`` kv heads per rank /
    kv heads; ``experts`` ceil(E/ep)/E whole experts, split over the tp/ep ranks within an expert."""
    if kind == "rep":
        return 1.0
    if kind in ("tp", "vocab"):
        return 1.0 / tp
    if kind == "kv":
        return kv_heads_per_rank(spec, tp) / spec.num_kv_heads
    if kind == "experts":
        E = spec.n_routed_experts
        return math.ceil(E / ep) / E / (tp // ep)
    raise AssertionError(kind)


def kv_bytes_per_token(spec: ArchSpec, kv_dtype="bfloat16", tp: int = 1) -> float:
    """KV-cache bytes one token of one sequence adds, on one TP rank (``tp=1``: the whole model), from the
    architecture (the engine's measured counterpart: :func:`kit.measure.engine.cache_bytes_per_token`).

    MHA/GQA: ``2 × n_kv_layers × n_kv_heads × head_dim × bytes``; under TP each rank holds n_kv/tp heads (at least
    one: kv heads are replicated when fewer than ranks). MLA: ``n_kv_layers × (kv_lora_rank + qk_rope_head_dim) ×
    bytes``, no factor 2 and replicated on every TP rank. Sliding-window and linear-attention layers add no per-token
    cache (see :func:`state_bytes_per_seq`). Source: docs/metrics.md, case P1 (Llama-3.1-8B bf16 → 131,072;
    DeepSeek-V3 bf16 → 70,272, fp8 → 35,136).

    Raises:
        UserError: unknown dtype, tp < 1.
    """
    b = dtypes.bytes_per_element(kv_dtype)
    tp = check_pos_int("tp", tp)
    if spec.attention == "mla":
        return spec.n_kv_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * b
    return 2 * spec.n_kv_layers * kv_heads_per_rank(spec, tp) * spec.head_dim * b


def state_bytes_per_seq(
    spec: ArchSpec, context_len: int, kv_dtype="bfloat16", state_dtype="bfloat16", tp: int = 1
) -> float:
    """Per-sequence cache bytes that do not grow with context, on one TP rank.

    Sliding-window layers: ``n_swa × min(window, context) × 2 × kv_heads × head_dim × kv bytes``. Linear attention
    (KDA / gated delta rule): ``n_linear × (heads × head_dim² × state bytes + 3 × heads × head_dim × (conv_kernel − 1)
    × kv bytes)`` (recurrent state + short-conv tail of q, k, v); heads split over TP. Kimi K3 bf16 → 232,316,928
    B/seq; fp32 state → 449,372,160 (``kit/data/models.csv``).

    Raises:
        UserError: unknown dtype, tp < 1.
    """
    tp = check_pos_int("tp", tp)
    b = dtypes.bytes_per_element(kv_dtype)
    out = 0.0
    if spec.n_swa_layers:
        out += (
            spec.n_swa_layers
            * min(spec.sliding_window, context_len)
            * 2
            * kv_heads_per_rank(spec, tp)
            * spec.head_dim
            * b
        )
    if spec.n_linear_layers:
        heads = math.ceil(spec.linear_num_heads / tp)
        hd = spec.linear_head_dim
        out += spec.n_linear_layers * (
            heads * hd * hd * dtypes.bytes_per_element(state_dtype) + 3 * heads * hd * (spec.linear_conv_kernel - 1) * b
        )
    return out


def weight_bytes(spec: ArchSpec, weight_dtypes: str | dict | None = None, tp: int = 1, ep: int = 1) -> dict[str, float]:
    """Weight bytes per parameter group on one rank (``tp=ep=1``: the whole model), by each group's dtype, from the
    architecture (a built model's own figure: :func:`kit.models.param_bytes`).

    Sharding: attention/MLP/shared experts/embeddings split over TP; GQA k/v projections by kv heads (replicated
    when fewer than ranks); MLA down-projections (q_a, kv_a), norms and routers replicated; routed experts split over
    EP ranks (whole experts, ceil(E/ep) each), then over the remaining tp/ep ranks within an expert.

    Returns:
        ``{group: bytes}`` for every group of :data:`kit.plan.spec.GROUPS`.

    Raises:
        UserError: unknown dtype/group; tp or ep < 1; tp not a multiple of ep.
    """
    tp, ep = check_pos_int("tp", tp), check_pos_int("ep", ep)
    if tp % ep:
        raise UserError(f"ep={ep} must divide tp={tp} (experts are split over ep ranks, TP within an expert)")
    dt = spec.dtypes(weight_dtypes)
    out = dict.fromkeys(dt, 0.0)
    for g, kind, n in spec.param_items():
        out[g] += n * dtypes.DTYPES[dt[g]].bytes * shard_fraction(kind, spec, tp, ep)
    return out
