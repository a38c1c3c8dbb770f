"""Memory fit: does a model fit on N accelerators, how much KV cache is left, how many users at a context.

Per GPU: ``usable = mem_gb × mem_util``; ``kv_budget = usable − weights − reserve`` (reserve = runtime +
:func:`workspace_gb`); weights per GPU follow :func:`kit.plan.sizes.weight_bytes` under tensor/expert/pipeline
parallelism (:func:`parallel_layout`); users at a context = budget ÷ (context × KV bytes/token/GPU + constant
state/seq/GPU). :func:`memory_fit` answers for one layout (:class:`FitResult`), :func:`min_gpus` finds the fewest
accelerators that fit. Formulas: ``docs/metrics.md`` (Memory fit).
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import asdict, dataclass, replace

from kit import dtypes
from kit.errors import UserError
from kit.plan.config import DEFAULT_MAX_BATCHED_TOKENS, PredictConfig
from kit.plan.device import DeviceModel
from kit.plan.sizes import check_pos_int, kv_bytes_per_token, state_bytes_per_seq, weight_bytes
from kit.plan.spec import ArchSpec, get_spec

#: runtime memory a GPU serving engine keeps outside weights and KV (CUDA/HIP context, graphs, communication
#: buffers); an assumption, stated in every fit. 0 for the local calibrated device (a CPU process).
DEFAULT_RUNTIME_GB = 2.0
MIN_GPUS_MAX = 128  # most GPUs :func:`min_gpus` tries


#: widest tensor-parallel group chosen by default inside a scale-up domain larger than a node (an NVL72 rack):
#: deployments on such racks run TP up to 8 and add EP/DP/PP beyond it (the node-sized TP of HGX/OAM systems)
DEFAULT_TP_MAX = 8


def default_tp(device: DeviceModel, n_gpus: int) -> int:
    """The tensor-parallel size used when none is given for ``n_gpus`` GPUs of ``device``: the largest divisor of
    ``n_gpus`` within one scale-up domain (:meth:`~kit.plan.device.DeviceModel.scaleup_size`) and at most
    ``max(gpus_per_node,`` :data:`DEFAULT_TP_MAX` ``)``; e.g. 8 on 8 GB200 (NVL72, 4 GPUs per tray), 8 with PP2 on
    2×8 B200."""
    cap = min(device.scaleup_size(), max(1, device.gpus_per_node, DEFAULT_TP_MAX), n_gpus)
    return max(d for d in divisors(n_gpus) if d <= cap)


def parallel_layout(
    device: DeviceModel, n_gpus: int, tp: int | None, ep: int | None, pp: int | None, spec: ArchSpec
) -> tuple[int, int, int, int]:
    """``(n_gpus, tp, ep, pp)`` settled from what is given: tp defaults to :func:`default_tp` and
    pp = n_gpus // tp (or tp = n_gpus // pp); ep defaults to tp for a MoE, 1 for a dense model.

    Raises:
        UserError: tp or pp does not divide n_gpus, tp × pp ≠ n_gpus, ep > 1 on a dense model, ep not dividing tp.
    Warns:
        UserWarning: heads that do not split evenly over tp (:func:`check_heads_split`).
    """
    n_gpus = check_pos_int("n_gpus", n_gpus)
    given_tp, given_pp = tp, pp
    if tp is None and pp is None:
        tp = default_tp(device, n_gpus)
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
    model, context_len: int | None = None, concurrency: int | None = None, config: PredictConfig | None = None
) -> FitResult:
    """Does ``model`` fit on ``config.n_gpus`` × ``config.accelerator``, and how much KV cache is left?

    Per GPU: ``usable = mem_gb × mem_util``; ``kv_budget = usable − weights − reserve`` with ``reserve`` = runtime
    (2 GB on GPUs) + :func:`workspace_gb`. Weights per GPU follow :func:`weight_bytes`' sharding; with pipeline
    parallelism each stage holds 1/pp of the layers plus the embedding or the LM head. ``max_concurrency`` =
    floor(budget / (context × KV bytes/token/GPU + constant state/seq/GPU)); ``max_context`` solves the same for a
    given concurrency (capped at the model's ``max_position_embeddings``).

    Args:
        model: anything :func:`get_spec` accepts.
        context_len, concurrency: tokens per sequence (prompt + output) and sequences; either may be None.
        config: the deployment (:class:`kit.plan.config.PredictConfig`: accelerator, n_gpus, tp/ep/pp, dtypes,
            mem_util, reserve_gb, max_batched_tokens; the step-time fields are not used here). Default: one
            ``"local"`` device.

    Raises:
        UserError: non-positive sizes, ``context_len`` beyond the model's ``max_position_embeddings``, unknown
            dtype, inconsistent tp/ep/pp (ep > 1 on a dense model), ``mem_util`` not in the interval from 0
            (excluded) to 1, a negative ``reserve_gb``.
        UnknownNameError: unknown model or accelerator.
    Warns:
        UserWarning: attention / KV heads that do not split evenly over tp (see :func:`check_heads_split`).
    """
    cfg = config or PredictConfig()
    spec = get_spec(model)
    dev = cfg.device()
    if not 0 < cfg.mem_util <= 1:
        raise UserError(f"mem_util={cfg.mem_util!r} must be in (0, 1]")
    if context_len is not None:
        context_len = check_context(spec, context_len)
    if concurrency is not None:
        concurrency = check_pos_int("concurrency", concurrency)
    n_gpus, tp, ep, pp = parallel_layout(dev, cfg.n_gpus, cfg.tp, cfg.ep, cfg.pp, spec)
    dts, kv_dtype = cfg.dtypes(spec)[:2]
    w_total, w_gpu = _weight_bytes_total_and_per_gpu(spec, dts, tp, ep, pp)
    runtime, reserve = _reserve_gb(spec, dev, tp, cfg)
    usable = dev.mem_gb * cfg.mem_util
    budget_b = (usable - w_gpu / 1e9 - reserve) * 1e9
    kv_tok = kv_bytes_per_token(spec, kv_dtype, tp) / pp
    big_ctx = spec.max_position_embeddings or 10**7
    res = FitResult(
        model=spec.name,
        accelerator=dev.name,
        n_gpus=n_gpus,
        tp=tp,
        ep=ep,
        pp=pp,
        kv_dtype=kv_dtype,
        weight_dtypes=dts,
        mem_gb_per_gpu=dev.mem_gb,
        usable_gb_per_gpu=usable,
        weights_gb_total=w_total / 1e9,
        weights_gb_per_gpu=w_gpu / 1e9,
        reserve_gb_per_gpu=reserve,
        kv_budget_gb_per_gpu=budget_b / 1e9,
        kv_bytes_per_token=kv_bytes_per_token(spec, kv_dtype, 1),
        kv_bytes_per_token_per_gpu=kv_tok,
        state_bytes_per_seq_per_gpu=state_bytes_per_seq(spec, context_len or big_ctx, kv_dtype, cfg.state_dtype, tp)
        / pp,
        fits_weights=budget_b > 0,
        kv_tokens_free=max(0.0, budget_b) / kv_tok if kv_tok else float("inf"),
        context_len=context_len,
        concurrency=concurrency,
    )
    _fit_users(res, spec, budget_b, w_gpu, cfg.state_dtype)
    res.assumptions = (
        f"mem_util={cfg.mem_util}; reserve={reserve:.2f} GB/GPU (runtime {runtime} GB + workspace for "
        f"{cfg.max_batched_tokens} tokens); kv {kv_dtype}, state "
        f"{dtypes.canonical(cfg.state_dtype)}; weights {weight_dtypes_summary(dts)}; device {dev.name} "
        f"({dev.source.split(' [')[0]})"
    )
    return res


def _weight_bytes_total_and_per_gpu(spec: ArchSpec, dts: dict, tp: int, ep: int, pp: int) -> tuple[float, float]:
    """(bytes of all weights, bytes on one GPU): a pipeline stage holds 1/pp of the layers plus the embedding or
    the LM head (both when pp = 1)."""
    wr = weight_bytes(spec, dts, tp, ep)
    layer_part = sum(v for g, v in wr.items() if g not in ("embed", "lm_head"))
    ends = (wr["embed"] + wr["lm_head"]) if pp == 1 else max(wr["embed"], wr["lm_head"])
    return sum(weight_bytes(spec, dts, 1, 1).values()), layer_part / pp + ends


def _reserve_gb(spec: ArchSpec, dev: DeviceModel, tp: int, cfg: PredictConfig) -> tuple[float, float]:
    """(runtime GB, reserve GB) per GPU: ``cfg.reserve_gb``, else runtime + the activation workspace.

    Raises:
        UserError: a negative ``reserve_gb``.
    """
    runtime = 0.0 if dev.device == "cpu" else DEFAULT_RUNTIME_GB
    reserve = cfg.reserve_gb if cfg.reserve_gb is not None else runtime + workspace_gb(spec, tp, cfg.max_batched_tokens)
    if reserve < 0:
        raise UserError(f"reserve_gb={cfg.reserve_gb!r} must be >= 0")
    return runtime, reserve


def _fit_users(res: FitResult, spec: ArchSpec, budget_b: float, w_gpu: float, state_dtype) -> None:
    """Fill ``res``'s max_concurrency (at its context), max_context (at its concurrency), need and fits, from the KV
    budget ``budget_b`` and the weights ``w_gpu`` (bytes per GPU)."""
    C, B, kv_tok, pp = res.context_len, res.concurrency, res.kv_bytes_per_token_per_gpu, res.pp
    per_seq = C * kv_tok + state_bytes_per_seq(spec, C, res.kv_dtype, state_dtype, res.tp) / pp if C else None
    if C:
        res.max_concurrency = int(max(0.0, budget_b) // per_seq) if per_seq else None
    if B:
        big_ctx = spec.max_position_embeddings or 10**7
        st = state_bytes_per_seq(spec, big_ctx, res.kv_dtype, state_dtype, res.tp) / pp
        room = max(0.0, budget_b) / B - st
        res.max_context = int(max(0.0, room) // kv_tok) if kv_tok else None
        if spec.max_position_embeddings and res.max_context is not None:
            res.max_context = min(res.max_context, int(spec.max_position_embeddings))
    res.fits = res.fits_weights
    if C and B:
        need = B * per_seq
        res.need_gb_per_gpu = (w_gpu + need) / 1e9 + res.reserve_gb_per_gpu
        res.fits = res.fits_weights and need <= budget_b


def weight_dtypes_summary(dts: dict) -> str:
    """Per-group dtypes as short text: the most common one, then the exceptions
    (``"bfloat16 (routed_experts=mxfp4)"``)."""
    base = Counter(dts.values()).most_common(1)[0][0]
    rest = [f"{g}={d}" for g, d in dts.items() if d != base]
    return f"{base}" + (f" ({', '.join(rest)})" if rest else "")


def min_gpus(
    model,
    context_len: int | None = None,
    concurrency: int | None = None,
    config: PredictConfig | None = None,
    max_gpus: int | None = None,
) -> int | None:
    """Fewest GPUs of ``config.accelerator`` on which ``model`` fits (with ``concurrency`` × ``context_len`` of KV
    when given): tries 1, 2, 4, ... up to the default TP group (:func:`default_tp`), then whole groups (PP across
    them); the config's
    ``n_gpus``, ``tp`` and ``pp`` are replaced by each candidate's. None if even ``max_gpus`` (default
    :data:`MIN_GPUS_MAX`) is not enough. Raises as :func:`memory_fit`."""
    cfg = config or PredictConfig()
    dev = cfg.device()
    max_gpus = MIN_GPUS_MAX if max_gpus is None else max_gpus
    group = default_tp(dev, max(1, dev.scaleup_size(), dev.gpus_per_node))
    cands = [n for n in (1, 2, 4, 8, 16, 32, 64) if n < group] + list(range(group, max_gpus + 1, group))
    if dev.device == "cpu":
        cands = [1]  # one host: the planner does not split a model over CPUs
    for n in cands:
        tp = default_tp(dev, n)
        r = memory_fit(model, context_len, concurrency, replace(cfg, n_gpus=n, tp=tp, pp=n // tp, device_model=dev))
        if r.fits:
            return n
    return None
