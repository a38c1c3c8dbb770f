"""One decode step as a sum of named terms (weights, KV, compute, per-layer floors, collectives latency and
bandwidth, overhead, draft), optionally a speculative-decoding verify step.

``step = t_linear + t_attn + t_floor + t_comm + overhead (+ draft)``, where the roofline parts come from
:func:`kit.plan.step.roofline_times` and split by what bounds them: ``t_weights`` (linear layers, memory-bound),
``t_kv`` (attention, memory-bound), ``t_compute`` (whichever class is compute-bound); collectives from
:mod:`kit.plan.comm`.

**Stack profiles** (:mod:`kit.plan.stack`): per kernel class c (attention, MoE/GEMM, norm, KDA/other) with n_c
layers, the class takes ``n_c × max(bytes_c / n_c / (η·BW), floor_c)`` (``floor_mode`` ``max``; ``add``: the
bandwidth time plus n_c × floor_c, for a host that runs its kernels itself). The bandwidth part stays in
``t_weights`` / ``t_kv``; what the floor adds on top is ``t_floor_<class>_ms`` (their sum ``t_floor_ms``, less any
compute-bound time already counted: a floor is a least time, not extra work). The profile's all-reduce α replaces
the scale-up link's for TP all-reduces, its host time per step is the overhead, and its η the bandwidth
efficiency. Without a profile the floor terms are 0.

**Speculative decoding** (``spec_k`` draft tokens, ``spec_accept`` mean tokens emitted per verify step per
sequence, 1 ≤ accept ≤ k + 1): the verify step is a decode step over B × (k + 1) query tokens — weights touched
and matmul FLOPs for B(k+1) tokens (routed-expert coverage grows), the KV cache read once per sequence with
attention FLOPs × (k + 1), collectives over B(k+1) tokens — plus the draft: k forwards of ``draft_layers``
decoder layers, each costed as that fraction of a plain decode step (an MTP / EAGLE draft is one decoder layer:
DeepSeek-V3 technical report §2.2). Tokens per second scale by ``spec_accept``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kit import dtypes
from kit.errors import UserError
from kit.plan.comm import comm_terms, decode_messages, describe
from kit.plan.device import DeviceModel
from kit.plan.spec import ArchSpec
from kit.plan.stack import GROUP_CLASS, KERNEL_CLASSES, StackProfile, class_layers
from kit.plan.step import decode_terms, roofline_times

#: a published acceptance figure for a one-token MTP draft: "the acceptance rate of the second token prediction
#: ranges between 85% and 90%" (DeepSeek-V3 technical report, §5.4.3) → 1 + 0.85 tokens per verify step
DEFAULT_SPEC_K = 1
DEFAULT_SPEC_ACCEPT = 1.85
#: the stacked-bar terms of a decode step, in order (x_t_<term>_ms columns)
STEP_TERMS = ("weights", "kv", "compute", "floor", "comm_lat", "comm_bw", "overhead", "draft")


def check_spec(spec_k, spec_accept) -> tuple[int, float]:
    """``(k, accept)``; ``(0, 1.0)`` when speculative decoding is off (``spec_k`` None or 0).

    Raises:
        UserError: k not a non-negative integer, or accept outside [1, k + 1].
    """
    if not spec_k:
        if spec_accept is not None:
            raise UserError(
                f"spec_accept={spec_accept!r} needs spec_k (draft tokens per verify step, e.g. --spec-k 1): "
                "without it speculative decoding is off"
            )
        return 0, 1.0
    if isinstance(spec_k, bool) or not isinstance(spec_k, int) or spec_k < 0:
        raise UserError(f"spec_k={spec_k!r} must be a non-negative integer (draft tokens per verify step)")
    a = float(spec_accept if spec_accept is not None else min(DEFAULT_SPEC_ACCEPT, spec_k + 1))
    if not 1.0 <= a <= spec_k + 1:  # (NaN fails too)
        raise UserError(
            f"spec_accept={spec_accept!r} must be in [1, k + 1 = {spec_k + 1}] (mean tokens emitted per verify step)"
        )
    return spec_k, a


@dataclass(frozen=True)
class StepSetup:
    """Everything one step's time depends on besides the model and the batch, with every default settled: built by
    :func:`kit.plan.roofline.predict_point` from a :class:`kit.plan.config.PredictConfig` and the memory fit.

    Fields: ``dev`` (the device, link figures included), ``tp`` / ``ep`` / ``pp`` (parallel sizes),
    ``weight_dtypes`` (per weight group), ``kv_dtype``, ``state_dtype``, ``act_dtype``, ``compute_dtype``
    (canonical names), ``eff_bw`` / ``eff_flops`` (fractions of peak, checked), ``overhead_ms`` (per step, ms),
    ``spec_k`` / ``spec_accept`` / ``draft_layers`` (speculative decoding as given; checked by :func:`check_spec`),
    ``draft_passes`` (draft forwards per verify step; None: one per draft token, k), ``stack`` (the stack profile,
    :mod:`kit.plan.stack`; None: none), ``spec_note`` (why speculative decoding is off when it was asked for).
    """

    dev: DeviceModel
    tp: int
    ep: int
    pp: int
    weight_dtypes: dict
    kv_dtype: str
    state_dtype: str
    act_dtype: str
    compute_dtype: str
    eff_bw: float
    eff_flops: float
    overhead_ms: float
    spec_k: int | None = None
    spec_accept: float | None = None
    draft_layers: int = 1
    draft_passes: int | None = None
    stack: StackProfile | None = None
    spec_note: str = ""


def floor_terms(spec: ArchSpec, terms: dict, setup: StepSetup, compute_ms: float = 0.0) -> dict[str, float]:
    """What the stack profile's per-layer floors add to a step with the bytes of ``terms`` (a
    :func:`kit.plan.step.decode_terms` result): ``{class: ms}`` for :data:`kit.plan.stack.KERNEL_CLASSES` (all 0
    without a profile). ``max`` mode: n_c × floor_c − the class's bandwidth time, where positive, scaled down so
    the sum does not count ``compute_ms`` (compute-bound time already in the step) twice; ``add`` mode: n_c × floor_c.
    """
    st = setup.stack
    if st is None:
        return dict.fromkeys(KERNEL_CLASSES, 0.0)
    bw = setup.dev.mem_bw_gb_s * 1e9 * setup.eff_bw
    mem = dict.fromkeys(KERNEL_CLASSES, 0.0)
    for g, b in terms["group_bytes"].items():
        if g in GROUP_CLASS:
            mem[GROUP_CLASS[g]] += b
    mem["attn"] += terms["kv_bytes"] - terms["state_bytes"]
    mem["other"] += terms["state_bytes"]
    n = class_layers(spec)
    floors = {c: n[c] * st.floor_us(c) * 1e-3 for c in KERNEL_CLASSES}
    if st.floor_mode == "add":
        return floors
    ex = {c: max(0.0, floors[c] - mem[c] / bw * 1e3) for c in KERNEL_CLASSES}
    tot = sum(ex.values())
    if tot > 0 and compute_ms > 0:
        keep = max(0.0, tot - compute_ms) / tot
        ex = {c: v * keep for c, v in ex.items()}
    return ex


def _roofline(s: StepSetup, terms: dict, tokens: float = 1.0) -> dict:
    dev = s.dev
    rate = s.stack.gemm_rate(tokens) if s.stack is not None else None
    if rate:  # the stack's measured skinny-GEMM rate at this many rows replaces the matmul peak for decode
        dev = replace(dev, tflops={**dev.tflops, dtypes.peak_key(s.compute_dtype): rate / s.eff_flops})
    rl = roofline_times(dev, terms, s.compute_dtype, s.eff_bw, s.eff_flops)
    bw = s.dev.mem_bw_gb_s * 1e9 * s.eff_bw
    lm, am = terms["weight_bytes"] / bw * 1e3, terms["kv_bytes"] / bw * 1e3
    rl["t_weights"] = lm if lm >= rl["t_linear"] else 0.0
    rl["t_kv"] = am if am >= rl["t_attn"] else 0.0
    rl["t_compute_part"] = max(0.0, rl["t_linear"] + rl["t_attn"] - rl["t_weights"] - rl["t_kv"])
    return rl


def decode_step(spec: ArchSpec, B: int, att: int, setup: StepSetup) -> dict:
    """The terms of one (verify) step of ``B`` sequences attending ``att`` positions under ``setup``.

    Returns:
        dict: ``step_ms``, ``emitted`` (tokens per sequence per step), ``t_<term>_ms`` for :data:`STEP_TERMS`
        and every collective term (``t_tp_allreduce_lat_ms`` ...), ``t_linear``, ``t_attn``, ``mem_part``,
        ``compute_part``, ``bytes``, ``flops``, ``expert_coverage``, ``comm_text``, ``messages``.

    Raises:
        UserError: a bad ``spec_k`` / ``spec_accept`` (:func:`check_spec`).
    """
    s = setup
    k, accept = check_spec(s.spec_k, s.spec_accept)
    d1 = decode_terms(spec, B, att, s.tp, s.ep, s.weight_dtypes, s.kv_dtype, s.state_dtype)
    dk = decode_terms(spec, B * (k + 1), att, s.tp, s.ep, s.weight_dtypes, s.kv_dtype, s.state_dtype) if k else d1
    attn_flops = d1["attn_flops"] * (k + 1)
    terms = {**dk, "kv_bytes": d1["kv_bytes"], "attn_flops": attn_flops, "state_bytes": d1["state_bytes"]}
    rl = _roofline(s, terms, B * (k + 1))
    floors = floor_terms(spec, terms, s, rl["t_compute_part"])
    msgs = decode_messages(spec, s.dev, B * (k + 1), s.tp, s.ep, s.pp, s.act_dtype)
    if s.stack is not None and s.stack.allreduce_alpha_us is not None:
        a = s.stack.allreduce_alpha_us
        ar = [m.term == "tp_allreduce" and m.link.name == "scale-up" for m in msgs]
        msgs = [replace(m, link=replace(m.link, alpha_us=a)) if hit else m for m, hit in zip(msgs, ar)]
    comm = comm_terms(msgs)
    t_floor = sum(floors.values())
    step = rl["t_linear"] + rl["t_attn"] + t_floor + comm["t_comm_ms"] + s.overhead_ms
    draft = 0.0
    if k:
        plain = decode_step(spec, B, att, replace(s, spec_k=None, spec_accept=None))
        passes = k if s.draft_passes is None else s.draft_passes
        draft = passes * s.draft_layers / spec.num_layers * plain["step_ms"]
    out = {
        **comm,
        "step_ms": step + draft,
        "emitted": accept,
        "spec_k": k,
        "t_weights_ms": rl["t_weights"],
        "t_kv_ms": rl["t_kv"],
        "t_compute_ms": rl["t_compute_part"],
        "t_floor_ms": t_floor,
        **{f"t_floor_{c}_ms": v for c, v in floors.items()},
        "t_comm_lat_ms": comm["t_comm_lat_ms"],
        "t_comm_bw_ms": comm["t_comm_bw_ms"],
        "t_overhead_ms": s.overhead_ms,
        "t_draft_ms": draft,
        "t_linear": rl["t_linear"],
        "t_attn": rl["t_attn"],
        "t_mem": rl["t_mem"],
        "t_compute": rl["t_compute"],
        "mem_part": rl["mem_part"],
        "compute_part": rl["compute_part"],
        "bytes": dk["weight_bytes"] + d1["kv_bytes"],
        "flops": dk["linear_flops"] + attn_flops,
        "expert_coverage": dk["expert_coverage"],
        "comm_text": describe(msgs),
        "messages": msgs,
    }
    return out


def dominant_term(step: dict) -> str:
    """The largest of :data:`STEP_TERMS` in a :func:`decode_step` result."""
    return max(STEP_TERMS, key=lambda t: step[f"t_{t}_ms"])


def assumptions_text(d: dict, setup: StepSetup, layout_text: str) -> str:
    """The ``assumptions`` of a prediction: every term of the step (:func:`decode_step` result ``d``) with its
    value, the collectives with their sizes, counts and link figures, the device figures of ``setup`` and
    ``layout_text``."""
    dev, eb, ef, compute_dtype = setup.dev, setup.eff_bw, setup.eff_flops, setup.compute_dtype
    spec_txt = (
        f" + draft {d['t_draft_ms']:.3f} ms (speculative k={d['spec_k']}, {d['emitted']:g} tokens/verify step)"
        if d["spec_k"]
        else (f" (speculative decoding off: {setup.spec_note})" if setup.spec_note else "")
    )
    return (
        f"roofline per op class (linear, attention): max(bytes/(BW×{eb:g}), flops/(rate×{ef:g})), "
        f"summed (weights {d['t_weights_ms']:.3f} + KV {d['t_kv_ms']:.3f} + compute {d['t_compute_ms']:.3f} ms), "
        + (
            f"+ per-layer floors {d['t_floor_ms']:.3f} ms ("
            + ", ".join(f"{c} {d[f't_floor_{c}_ms']:.3f}" for c in KERNEL_CLASSES)
            + f") [{setup.stack.summary()}] "
            if setup.stack is not None
            else ""
        )
        + f"+ collectives {d['t_comm_lat_ms']:.3f} ms latency + {d['t_comm_bw_ms']:.3f} ms bandwidth [{d['comm_text']}]"
        f" + overhead {d['t_overhead_ms']:.3f} ms{spec_txt}; {dev.name} {dev.mem_bw_gb_s:,.0f} GB/s, "
        f"{dev.peak_tflops(compute_dtype):,.3g} TFLOPS {compute_dtype}"
        + (f", attention {dev.attn_tflops * 1e3:,.1f} GFLOP/s" if dev.attn_tflops else "")
        + f" ({dev.source.split(' [')[0]}); links: {dev.link_source.split(';')[0][:80] or 'none'}; {layout_text}"
    )
