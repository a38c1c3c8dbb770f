"""Memory fit: does a model fit on N accelerators, how much KV cache is left, how many users at a context.

Per GPU: ``usable = mem_gb × mem_util``; ``kv_budget = usable − weights − reserve`` (reserve = runtime +
:func:`workspace_gb`); weights per GPU follow :func:`kit.plan.sizes.weight_bytes` under tensor/expert/pipeline
parallelism (:func:`parallel_layout`); users at a context = budget ÷ (context × KV bytes/token/GPU + constant
state/seq/GPU). :func:`memory_fit` answers for one layout (:class:`FitResult`), :func:`min_gpus` finds the fewest
accelerators that fit. Formulas: ``../shared/METRICS.md`` (Planner section).
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import asdict, dataclass

from kit import dtypes
from kit.errors import UserError
from kit.plan.device import DeviceModel, get_device_model
from kit.plan.sizes import check_pos_int, kv_bytes_per_token, state_bytes_per_seq, weight_bytes
from kit.plan.spec import ArchSpec, get_spec

#: runtime memory a GPU serving engine keeps outside weights and KV (CUDA/HIP context, graphs, communication
#: buffers); an assumption, stated in every fit. 0 for the local calibrated device (a CPU process).
DEFAULT_RUNTIME_GB = 2.0
DEFAULT_MEM_UTIL = 0.90  # fraction of device memory the engine may use (vLLM's gpu_memory_utilization default)
DEFAULT_MAX_BATCHED_TOKENS = 8192
MIN_GPUS_MAX = 128  # most GPUs :func:`min_gpus` tries


def parallel_layout(
    device: DeviceModel, n_gpus: int, tp: int | None, ep: int | None, pp: int | None, spec: ArchSpec
) -> tuple[int, int, int, int]:
    """``(n_gpus, tp, ep, pp)`` settled from what is given: tp defaults to min(n_gpus, GPUs per node) and
    pp = n_gpus // tp (or tp = n_gpus // pp); ep defaults to tp for a MoE, 1 for a dense model.

    Raises:
        UserError: tp or pp does not divide n_gpus, tp × pp ≠ n_gpus, ep > 1 on a dense model, ep not dividing tp.
    Warns:
        UserWarning: heads that do not split evenly over tp (:func:`check_heads_split`).
    """
    n_gpus = check_pos_int("n_gpus", n_gpus)
    given_tp, given_pp = tp, pp
    if tp is None and pp is None:
        tp = min(n_gpus, max(1, device.gpus_per_node))
        pp = n_gpus // tp
    elif tp is None:
        pp = check_pos_int("pp", pp)
        tp = n_gpus // pp
    elif pp is None:
        tp = check_pos_int("tp", tp)
        pp = n_gpus // tp
    if given_tp is not None and given_pp is None and (tp < 1 or n_gpus % tp):
        raise UserError(
            f"tp={tp} does not divide n_gpus={n_gpus}: the pipeline-parallel size is derived as "
            f"pp = n_gpus // tp, so n_gpus must be a multiple of tp; pass a tp that divides n_gpus "
            f"({', '.join(str(d) for d in divisors(n_gpus))}) or change the GPU count"
        )
    if given_pp is not None and given_tp is None and (pp < 1 or n_gpus % pp):
        raise UserError(
            f"pp={pp} does not divide n_gpus={n_gpus}: the tensor-parallel size is derived as "
            f"tp = n_gpus // pp, so n_gpus must be a multiple of pp; pass a pp that divides n_gpus "
            f"({', '.join(str(d) for d in divisors(n_gpus))}) or change the GPU count"
        )
    tp, pp = check_pos_int("tp", tp), check_pos_int("pp", pp)
    if tp * pp != n_gpus:
        raise UserError(f"tp={tp} × pp={pp} must equal n_gpus={n_gpus}")
    if pp > spec.num_layers:
        raise UserError(
            f"n_gpus={n_gpus} with tp={tp} needs pp={pp} pipeline stages, more than {spec.name}'s "
            f"{spec.num_layers} layers (a stage holds at least one layer); use at most {tp * spec.num_layers} GPUs"
        )
    check_heads_split(spec, tp)
    if ep is not None and not spec.is_moe:
        if check_pos_int("ep", ep) != 1:
            raise UserError(
                f"ep={ep}: expert parallelism applies only to MoE models, and {spec.name} is dense "
                "(no routed experts); leave ep unset (or 1)"
            )
    if ep is None:
        ep = tp if spec.is_moe else 1
    ep = check_pos_int("ep", ep)
    if tp % ep:
        raise UserError(f"ep={ep} must divide tp={tp}")
    return n_gpus, tp, ep, pp


def check_context(spec: ArchSpec, context_len, name: str = "context_len") -> int:
    """``context_len`` as a positive int, no larger than the model's ``max_position_embeddings`` (when known).

    Raises:
        UserError: not a positive integer, or beyond the positions the model supports (names both numbers).
    """
    c = check_pos_int(name, context_len)
    mp = spec.max_position_embeddings
    if mp and c > int(mp):
        raise UserError(
            f"{name}={c:,} exceeds {spec.name}'s max_position_embeddings={int(mp):,}: the model "
            f"supports at most {int(mp):,} positions per sequence"
        )
    return c


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (the TP/PP sizes a GPU count allows)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def check_heads_split(spec: ArchSpec, tp: int) -> None:
    """Warn (not raise) when attention heads do not split evenly over ``tp`` ranks.

    Serving engines (vLLM, SGLang) shard attention by heads: they reject a TP size that does not divide the query
    heads, and for GQA they need the KV heads to divide TP or TP to divide the KV heads (each KV head then replicated
    on TP/n_kv ranks). The planner can still do its arithmetic for such a layout (it counts ceil(n_kv/tp) KV heads
    per rank), so it warns with :class:`UserWarning` instead of raising: the prediction is for a layout a real engine
    will probably refuse. MLA caches one latent per token replicated on every rank, so only the query heads count.
    """
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
        good = [
            d
            for d in divisors(max(nq or 1, 1))
            if d > 1 and (spec.attention == "mla" or not nkv or nkv % d == 0 or d % nkv == 0)
        ]
        warnings.warn(
            f"{spec.name}: {'; '.join(why)}: serving engines such as vLLM reject this tensor-parallel "
            f"size (the planner counts ceil(kv heads / tp) per rank); TP sizes that split evenly: "
            f"{good[:8]}",
            UserWarning,
            stacklevel=3,
        )


def workspace_gb(
    spec: ArchSpec, tp: int = 1, max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS, act_dtype="bfloat16"
) -> float:
    """Activation workspace of one forward over ``max_batched_tokens`` tokens on one rank, GB: hidden-sized
    buffers (residual, norm, attention in/out: ~6 × hidden) plus the widest MLP intermediate (gate and up, split
    over TP) per token. A coarse reserve (an assumption, printed with every fit)."""
    widest = max(
        spec.intermediate_size or 0,
        (spec.moe_intermediate_size or 0) * max(1, spec.experts_per_token),
        spec.shared_expert_intermediate_size or 0,
    )
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
        """Every field as a plain dict (for JSON and DataFrames)."""
        return asdict(self)

    def memory_parts(self) -> dict[str, float]:
        """Where one GPU's memory goes, GB: weights, reserve, the KV cache (+ constant state) of
        :attr:`max_concurrency` users at :attr:`context_len` tokens (0 without a context), and the rest
        (unused: ``1 − mem_util`` plus what no further user fits in). The parts sum to :attr:`mem_gb_per_gpu`."""
        per_seq = (self.context_len or 0) * self.kv_bytes_per_token_per_gpu + self.state_bytes_per_seq_per_gpu
        kv = (self.max_concurrency or 0) * per_seq / 1e9 if self.context_len else 0.0
        used = self.weights_gb_per_gpu + self.reserve_gb_per_gpu + kv
        return {
            "weights": self.weights_gb_per_gpu,
            "reserve": self.reserve_gb_per_gpu,
            "kv_at_max_users": kv,
            "unused": max(0.0, self.mem_gb_per_gpu - used),
        }

    def __str__(self) -> str:
        lines = [
            f"{self.model} on {self.n_gpus}×{self.accelerator} (TP{self.tp}, EP{self.ep}, PP{self.pp}): "
            f"{'FITS' if self.fits else 'DOES NOT FIT'}",
            f"  weights        {self.weights_gb_total:,.1f} GB total, {self.weights_gb_per_gpu:,.1f} GB/GPU "
            f"of {self.mem_gb_per_gpu:,.0f} GB ({self.usable_gb_per_gpu:,.1f} usable)",
            f"  reserve        {self.reserve_gb_per_gpu:,.1f} GB/GPU (runtime + activation workspace)",
            f"  KV budget      {self.kv_budget_gb_per_gpu:,.1f} GB/GPU; {self.kv_bytes_per_token:,.0f} B/token "
            f"({self.kv_dtype}), {self.kv_bytes_per_token_per_gpu:,.0f} B/token/GPU; "
            f"{self.state_bytes_per_seq_per_gpu / 1e6:,.1f} MB/seq/GPU constant state",
            f"  KV tokens left {self.kv_tokens_free:,.0f}",
        ]
        if self.context_len:
            lines.append(f"  max users at {self.context_len:,} tokens: {self.max_concurrency:,}")
        if self.concurrency:
            lines.append(f"  max context at {self.concurrency:,} users: {self.max_context:,} tokens")
        lines.append(f"  assumptions: {self.assumptions}")
        return "\n".join(lines)


def memory_fit(
    model,
    accelerator: str = "local",
    n_gpus: int = 1,
    context_len: int | None = None,
    concurrency: int | None = None,
    kv_dtype="bfloat16",
    state_dtype="bfloat16",
    weight_dtypes: str | dict | None = None,
    tp: int | None = None,
    ep: int | None = None,
    pp: int | None = None,
    mem_util: float = DEFAULT_MEM_UTIL,
    reserve_gb: float | None = None,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    device_model: DeviceModel | None = None,
    catalog=None,
    calibration=None,
) -> FitResult:
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
        UserError: non-positive sizes, ``context_len`` beyond the model's ``max_position_embeddings``, unknown
            dtype, inconsistent tp/ep/pp (ep > 1 on a dense model), ``mem_util`` not in the interval from 0
            (excluded) to 1.
        UnknownNameError: unknown model or accelerator.
    Warns:
        UserWarning: attention / KV heads that do not split evenly over tp (see :func:`check_heads_split`).
    """
    spec = get_spec(model)
    dev = device_model or get_device_model(accelerator, catalog=catalog, calibration=calibration)
    if not 0 < mem_util <= 1:
        raise UserError(f"mem_util={mem_util!r} must be in (0, 1]")
    if context_len is not None:
        context_len = check_context(spec, context_len)
    if concurrency is not None:
        concurrency = check_pos_int("concurrency", concurrency)
    n_gpus, tp, ep, pp = parallel_layout(dev, n_gpus, tp, ep, pp, spec)
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
    res = FitResult(
        model=spec.name,
        accelerator=dev.name,
        n_gpus=n_gpus,
        tp=tp,
        ep=ep,
        pp=pp,
        kv_dtype=dtypes.canonical(kv_dtype),
        weight_dtypes=dts,
        mem_gb_per_gpu=dev.mem_gb,
        usable_gb_per_gpu=usable,
        weights_gb_total=w_total / 1e9,
        weights_gb_per_gpu=w_gpu / 1e9,
        reserve_gb_per_gpu=reserve,
        kv_budget_gb_per_gpu=budget_b / 1e9,
        kv_bytes_per_token=kv_bytes_per_token(spec, kv_dtype, 1),
        kv_bytes_per_token_per_gpu=kv_tok,
        state_bytes_per_seq_per_gpu=state_bytes_per_seq(spec, context_len or big_ctx, kv_dtype, state_dtype, tp) / pp,
        fits_weights=fits_w,
        kv_tokens_free=tokens_free,
        context_len=context_len,
        concurrency=concurrency,
    )
    per_seq = (
        context_len * kv_tok + state_bytes_per_seq(spec, context_len, kv_dtype, state_dtype, tp) / pp
        if context_len
        else None
    )
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
    res.assumptions = (
        f"mem_util={mem_util}; reserve={reserve:.2f} GB/GPU (runtime {runtime} GB + workspace for "
        f"{max_batched_tokens} tokens); kv {dtypes.canonical(kv_dtype)}, state "
        f"{dtypes.canonical(state_dtype)}; weights {weight_dtypes_summary(dts)}; device {dev.name} "
        f"({dev.source.split(' [')[0]})"
    )
    return res


def weight_dtypes_summary(dts: dict) -> str:
    """Per-group dtypes as short text: the most common one, then the exceptions
    (``"bfloat16 (routed_experts=mxfp4)"``)."""
    base = Counter(dts.values()).most_common(1)[0][0]
    rest = [f"{g}={d}" for g, d in dts.items() if d != base]
    return f"{base}" + (f" ({', '.join(rest)})" if rest else "")


def min_gpus(
    model,
    accelerator: str,
    context_len: int | None = None,
    concurrency: int | None = None,
    max_gpus: int | None = None,
    **kw,
) -> int | None:
    """Fewest GPUs of ``accelerator`` on which ``model`` fits (with ``concurrency`` × ``context_len`` of KV when
    given): tries 1, 2, 4, ... up to a node, then whole nodes (TP within a node, PP across nodes). None if even
    ``max_gpus`` is not enough. Raises as :func:`memory_fit`."""
    dev = kw.pop("device_model", None) or get_device_model(
        accelerator, catalog=kw.pop("catalog", None), calibration=kw.pop("calibration", None)
    )
    max_gpus = MIN_GPUS_MAX if max_gpus is None else max_gpus
    node = max(1, dev.gpus_per_node)
    cands = [n for n in (1, 2, 4, 8, 16, 32, 64) if n < node] + list(range(node, max_gpus + 1, node))
    if dev.device == "cpu":
        cands = [1]  # one host: the planner does not split a model over CPUs
    for n in cands:
        tp = min(n, node)
        r = memory_fit(model, accelerator, n, context_len, concurrency, tp=tp, pp=n // tp, device_model=dev, **kw)
        if r.fits:
            return n
    return None
