"""Stack profiles: what a serving stack (platform × engine × version) does to a decode step, beyond the hardware.

A :class:`StackProfile` is one row of ``kit/data/stacks.csv`` (or a local profile written by ``kit calibrate``):

- ``eta_bw``: the fraction of the accelerator's peak HBM bandwidth its kernels reach (replaces the catalog default);
  a local profile may instead give ``mem_bw_gb_s``, the bandwidth its decode kernels were measured to reach;
- a **per-layer floor** per kernel class (:data:`KERNEL_CLASSES`: ``attn`` — softmax/MLA attention layers with
  their projections; ``moe`` — the MLP or MoE block, GEMMs; ``norm`` — the layer's norms when not fused elsewhere;
  ``other`` — linear attention / KDA layers and anything else), µs: the least time one layer of that class takes
  however few bytes it moves (kernel latency, launch gaps inside a graph, unfused tails);
- ``floor_mode``: ``max`` (a device that runs kernels asynchronously: per layer max(bytes / (η·BW), floor)) or
  ``add`` (the host runs the kernels itself, e.g. a CPU: bytes / (η·BW) + floor);
- the TP all-reduce latency α (µs, replaces the scale-up link's α for all-reduces), the graph mode, the host time
  per step (µs), which fusions exist, whether MoE experts are expert-parallel by default (``moe_ep``: ``1`` or
  ``tp``), and speculative decoding: the method, whether it runs with pipeline / expert parallelism, draft tokens
  ``spec_k``, accepted tokens per verify step ``spec_accept`` and draft layers.

Every figure carries its source (``source_*`` columns) and estimated ones are named in ``flags`` (UNSURE). How the
planner uses a profile: :func:`kit.plan.decode.decode_step` (the ``floor`` terms) and
:func:`kit.plan.roofline.predict_point`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from kit._io import data_path
from kit.errors import UnknownNameError, UserError

#: the kernel classes a profile gives a per-layer floor for (``floor_<class>_us`` columns)
KERNEL_CLASSES = ("attn", "moe", "norm", "other")
FLOOR_MODES = ("max", "add")
GRAPH_MODES = ("cuda-graph", "hip-graph", "eager")
#: speculative-decoding methods whose draft proposes its k tokens in one forward (block-parallel), so a verify step
#: pays one draft pass, not k: DSpark's draft is "block-parallel" (ai-dynamo/aiconfigurator PR #1435, 2026-07-28)
BLOCK_PARALLEL_DRAFTS = ("dspark",)
#: the value of ``--stack`` that turns profiles off (the plain roofline with the device's overhead)
NO_STACK = "none"


@dataclass(frozen=True)
class StackProfile:
    """One serving stack's figures (see the module docstring); floors and α in µs, ``host_us`` µs per step."""

    name: str
    platform: str
    engine: str
    version: str
    eta_bw: float
    floors_us: dict = field(default_factory=dict)
    floor_mode: str = "max"
    allreduce_alpha_us: float | None = None
    graph_mode: str = "eager"
    host_us: float = 0.0
    moe_ep: str = "tp"
    fusions: tuple = ()
    spec_method: str | None = None
    spec_with_pp: bool = False
    spec_with_ep: bool = False
    spec_k: int | None = None
    spec_accept: float | None = None
    spec_draft_layers: int = 1
    mem_bw_gb_s: float | None = None  # measured achieved bandwidth of the stack's decode kernels (replaces η × peak)
    gemm_tflops: dict | None = None  # measured skinny-GEMM rate {tokens: TFLOPS} of decode's linear layers
    image_date: str = ""
    default_for: str = ""
    sources: dict = field(default_factory=dict)
    flags: str = ""

    def floor_us(self, cls: str) -> float:
        """The per-layer floor of kernel class ``cls`` (µs; 0 when the profile gives none)."""
        return float(self.floors_us.get(cls, 0.0))

    def gemm_rate(self, tokens: float) -> float | None:
        """Decode's linear-layer rate (TFLOPS) at ``tokens`` rows per GEMM: the measured ``gemm_tflops`` point at or
        below ``tokens`` (log-linear between points, the first below the smallest); None without measurements."""
        if not self.gemm_tflops:
            return None
        pts = sorted((float(m), float(v)) for m, v in self.gemm_tflops.items())
        if tokens <= pts[0][0]:
            return pts[0][1]
        for (m0, v0), (m1, v1) in zip(pts, pts[1:]):
            if tokens <= m1:
                f = math.log(tokens / m0) / math.log(m1 / m0)
                return v0 * (v1 / v0) ** f
        return pts[-1][1]

    def spec_blocker(self, pp: int, ep: int) -> str | None:
        """Why speculative decoding cannot run with this layout on this stack (None when it can)."""
        if not self.spec_method:
            return f"stack {self.name} runs no speculative decoding"
        if pp > 1 and not self.spec_with_pp:
            return f"{self.spec_method} does not run with pipeline parallelism (PP{pp}) on stack {self.name}"
        if ep > 1 and not self.spec_with_ep:
            return f"{self.spec_method} does not run with expert parallelism (EP{ep}) on stack {self.name}"
        return None

    def as_dict(self) -> dict:
        """Every field, JSON-ready (what ``kit plan --json`` and a calibration file carry)."""
        d = asdict(self)
        d["fusions"] = list(self.fusions)
        return d

    def summary(self) -> str:
        """One line for a prediction's assumptions."""
        fl = ", ".join(f"{c} {self.floor_us(c):g}" for c in KERNEL_CLASSES)
        ar = f"{self.allreduce_alpha_us:g} µs" if self.allreduce_alpha_us is not None else "link's"
        return (
            f"stack {self.name} ({self.engine} {self.version}; η {self.eta_bw:g}; floors µs/layer [{fl}] "
            f"({self.floor_mode}); all-reduce α {ar}; {self.graph_mode}; host {self.host_us:g} µs/step"
            + (f"; {self.flags.split(':')[0]}" if self.flags else "")
            + ")"
        )


def _num(where: str, col: str, v, *, lo: float = 0.0, hi: float = math.inf, lo_open: bool = False) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {col}={v!r} is not a number") from None
    ok = (f > lo if lo_open else f >= lo) and f <= hi and math.isfinite(f)
    if not ok:
        rng = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]" if hi < math.inf else f">= {lo:g}"
        raise UserError(f"{where}: {col}={v!r} is outside the allowed range {rng}")
    return f


def _bool(where: str, col: str, v) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no", "", "nan", "none"):
        return False
    raise UserError(f"{where}: {col}={v!r} is not a boolean (true/false)")


def _blank(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() == ""


def _choice(where: str, key: str, value, default: str, allowed, said: str | None = None) -> str:
    """``value`` (``default`` when blank) as a stripped string, checked to be one of ``allowed``."""
    v = default if _blank(value) else str(value).strip()
    if v not in allowed:
        raise UserError(f"{where}: {key}={v!r}; allowed: {said or list(allowed)}")
    return v


def profile_from_dict(d: dict, where: str = "stack profile") -> StackProfile:
    """A checked :class:`StackProfile` from a CSV row or a dict (``floor_<class>_us`` columns or a ``floors_us``
    dict; ``source_<figure>`` columns or a ``sources`` dict).

    Raises:
        UserError: a missing name/platform/eta_bw, an η outside (0, 1], a negative or non-finite floor, α or host
            time, an unknown ``floor_mode`` / ``graph_mode`` / ``moe_ep``, spec settings out of range (k < 1,
            accept outside [1, k + 1]) — each naming the bad value and what is allowed.
    """
    name = d.get("name")
    where = f"{where} {name!r}" if name else where
    for k in ("name", "platform", "eta_bw"):
        if _blank(d.get(k)):
            raise UserError(f"{where}: {k} is missing")
    eta = _num(where, "eta_bw", d["eta_bw"], lo=0.0, hi=1.0, lo_open=True)
    floors = dict(d.get("floors_us") or {})
    for c in KERNEL_CLASSES:
        col = f"floor_{c}_us"
        if col in d and not _blank(d[col]):
            floors[c] = d[col]
    unknown = set(floors) - set(KERNEL_CLASSES)
    if unknown:
        raise UserError(f"{where}: unknown kernel class(es) {sorted(unknown)}; allowed: {list(KERNEL_CLASSES)}")
    floors = {c: _num(where, f"floor_{c}_us", v) for c, v in floors.items()}
    mode = _choice(where, "floor_mode", d.get("floor_mode"), "max", FLOOR_MODES)
    graph = _choice(where, "graph_mode", d.get("graph_mode"), "eager", GRAPH_MODES)
    moe_ep = _choice(where, "moe_ep", d.get("moe_ep"), "tp", ("1", "tp"), "'1' (experts TP-sharded) or 'tp' (EP = TP)")
    alpha = None if _blank(d.get("allreduce_alpha_us")) else _num(where, "allreduce_alpha_us", d["allreduce_alpha_us"])
    host = 0.0 if _blank(d.get("host_us")) else _num(where, "host_us", d["host_us"])
    bw = None if _blank(d.get("mem_bw_gb_s")) else _num(where, "mem_bw_gb_s", d["mem_bw_gb_s"], lo=0.0, lo_open=True)
    gemm = d.get("gemm_tflops") or None
    if gemm is not None:
        if not isinstance(gemm, dict):
            raise UserError(f"{where}: gemm_tflops={gemm!r} is not {{tokens: TFLOPS}}")
        gemm = {
            int(_num(where, "gemm_tflops tokens", m, lo=1)): _num(where, "gemm_tflops", v, lo=0.0, lo_open=True)
            for m, v in gemm.items()
        }
    method = None if _blank(d.get("spec_method")) else str(d["spec_method"]).strip()
    k = accept = None
    if method:
        k = int(_num(where, "spec_k", d.get("spec_k"), lo=1))
        accept = _num(where, "spec_accept", d.get("spec_accept"), lo=1.0, hi=k + 1)
    draft = 1 if _blank(d.get("spec_draft_layers")) else int(_num(where, "spec_draft_layers", d["spec_draft_layers"]))
    fus = d.get("fusions") or ()
    if isinstance(fus, str):
        fus = tuple(f.strip() for f in fus.split(";") if f.strip())
    sources = dict(d.get("sources") or {})
    sources.update({k2[7:]: str(v) for k2, v in d.items() if k2.startswith("source_") and not _blank(v)})
    return StackProfile(
        name=str(name).strip(),
        platform=str(d["platform"]).strip(),
        engine=str(d.get("engine") or "").strip(),
        version=str(d.get("version") or "").strip(),
        eta_bw=eta,
        floors_us=floors,
        floor_mode=mode,
        allreduce_alpha_us=alpha,
        graph_mode=graph,
        host_us=host,
        moe_ep=moe_ep,
        fusions=tuple(fus),
        spec_method=method,
        spec_with_pp=_bool(where, "spec_with_pp", d.get("spec_with_pp")),
        spec_with_ep=_bool(where, "spec_with_ep", d.get("spec_with_ep")),
        spec_k=k,
        spec_accept=accept,
        spec_draft_layers=draft,
        mem_bw_gb_s=bw,
        gemm_tflops=gemm,
        image_date="" if _blank(d.get("image_date")) else str(d["image_date"]),
        default_for="" if _blank(d.get("default_for")) else str(d["default_for"]).strip(),
        sources=sources,
        flags="" if _blank(d.get("flags")) else str(d["flags"]),
    )


def load_stacks(path: str | Path | None = None) -> dict[str, StackProfile]:
    """The stack profiles of ``path`` (default ``kit/data/stacks.csv``), by name, each checked.

    Raises:
        UserError: a row fails :func:`profile_from_dict` (names the file, row and value), or a name repeats.
    """
    if path is None:
        return dict(_shipped())
    return _read(Path(path), str(path))


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[str, StackProfile], ...]:
    return tuple(_read(data_path("stacks.csv"), "kit/data/stacks.csv").items())


def _read(p: Path, origin: str) -> dict[str, StackProfile]:
    df = pd.read_csv(p, dtype=str, keep_default_na=False)
    out: dict[str, StackProfile] = {}
    for i, row in df.iterrows():
        prof = profile_from_dict(row.to_dict(), f"{origin} row {i + 2}")
        if prof.name.lower() in (n.lower() for n in out):
            raise UserError(f"{origin}: stack name {prof.name!r} appears twice")
        out[prof.name] = prof
    return out


def default_stack(accelerator: str) -> StackProfile | None:
    """The shipped profile marked ``default_for`` this accelerator (catalog name, any case), or None."""
    for prof in load_stacks().values():
        if prof.default_for and prof.default_for.lower() == str(accelerator).lower():
            return prof
    return None


def resolve_stack(stack, accelerator: str, local: StackProfile | dict | None = None) -> StackProfile | None:
    """The profile a prediction uses: ``stack`` as given (a :class:`StackProfile`, a dict, a shipped name, or
    :data:`NO_STACK` for none); None means the default — the ``local`` profile of a calibration when there is one,
    else the shipped profile marked default for ``accelerator`` (None when there is none).

    Raises:
        UnknownNameError: an unknown stack name (lists the shipped ones). UserError: a bad profile dict.
    """
    if isinstance(stack, StackProfile):
        return stack
    if isinstance(stack, dict):
        return profile_from_dict(stack)
    if stack is None:
        if local is not None:
            return local if isinstance(local, StackProfile) else profile_from_dict(local, "calibration stack_profile")
        return default_stack(accelerator)
    s = str(stack).strip()
    if s.lower() == NO_STACK:
        return None
    if s.lower() == "local":
        if local is None:
            raise UserError("--stack local needs a calibration with a stack profile: run `kit calibrate` first")
        return local if isinstance(local, StackProfile) else profile_from_dict(local, "calibration stack_profile")
    stacks = load_stacks()
    for n, prof in stacks.items():
        if n.lower() == s.lower():
            return prof
    raise UnknownNameError(f"unknown stack {stack!r}; known: {sorted(stacks)}, 'local' (a calibration's), 'none'")


def with_stack_layout(cfg, spec, stack: StackProfile | None):
    """``cfg`` (:class:`kit.plan.config.PredictConfig`) with the stack's default MoE layout applied: ``ep=1`` for a
    MoE model when the stack shards experts by TP (``moe_ep`` ``1``) and no ``ep`` was given; else ``cfg``."""
    if stack is not None and stack.moe_ep == "1" and cfg.ep is None and spec.is_moe:
        from dataclasses import replace

        return replace(cfg, ep=1)
    return cfg


def class_layers(spec) -> dict[str, int]:
    """Layers of each kernel class in ``spec`` (:class:`kit.plan.spec.ArchSpec`): ``attn`` the softmax/MLA and
    sliding-window layers, ``other`` the linear-attention layers, ``moe`` and ``norm`` every layer."""
    return {
        "attn": spec.n_kv_layers + spec.n_swa_layers,
        "moe": spec.num_layers,
        "norm": spec.num_layers,
        "other": spec.n_linear_layers,
    }


#: weight groups (kit.plan.spec.GROUPS) → the kernel class whose bytes they are; groups not named (embedding rows,
#: LM head) have no floor
GROUP_CLASS = {
    "attn": "attn",
    "linear_attn": "other",
    "dense_mlp": "moe",
    "routed_experts": "moe",
    "shared_experts": "moe",
    "router": "moe",
    "moe_latent": "moe",
    "norms": "norm",
}
