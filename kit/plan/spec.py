"""Model architecture specs: what the planner knows of a model (:class:`ArchSpec`), and where specs come from.

- **Specs** come from ``kit/data/models.csv`` (the reference models with their sources and UNSURE flags, see
  :func:`list_models`, :func:`model_table`) or from any ``transformers`` config object, dict or ``config.json`` path
  (:func:`spec_from_config`; both parsed by :mod:`kit.plan.parse`); :func:`get_spec` takes either, or a kit preset.
  Parameter counts are recomputed from the shapes per *group* (embed, lm_head, attn, linear_attn, norms, dense_mlp,
  shared_experts, routed_experts, router, moe_latent) so each group can have its own dtype (e.g. routed experts in
  MXFP4 at 4.25 bits, attention in bf16; :func:`parse_weight_dtypes`, :func:`kit.dtypes.bytes_per_element`).
- **Bytes** per group, per token and per sequence under tensor/expert parallelism: :mod:`kit.plan.sizes`. The memory
  fit built on them is :mod:`kit.plan.fit`, the roofline :mod:`kit.plan.roofline`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from kit import dtypes
from kit._io import data_path
from kit.errors import UnknownNameError, UserError
from kit.plan.parse import arch_fields, row_fields, weight_dtypes_text
from kit.plan.sizes import kv_bytes_per_token, state_bytes_per_seq

#: parameter groups a weight dtype can be set for (``parse_weight_dtypes``: "default=bf16;routed_experts=mxfp4")
GROUPS = (
    "embed",
    "lm_head",
    "attn",
    "linear_attn",
    "norms",
    "dense_mlp",
    "shared_experts",
    "routed_experts",
    "router",
    "moe_latent",
)


def _dtype_items(spec) -> dict[str, str]:
    if isinstance(spec, dict):
        return {str(k): str(v) for k, v in spec.items()}
    if not isinstance(spec, str):
        raise UserError(f"weight dtypes must be a 'group=dtype;...' string or a dict, got {type(spec).__name__}")
    items = {}
    for part in filter(None, (p.strip() for p in spec.replace(",", ";").split(";"))):
        if "=" not in part:
            raise UserError(f"weight dtype entry {part!r} must look like group=dtype (e.g. routed_experts=mxfp4)")
        k, v = (x.strip() for x in part.split("=", 1))
        items[k] = v
    return items


def parse_weight_dtypes(spec: str | dict | None, default: str = "bfloat16") -> dict[str, str]:
    """Per-group weight dtypes from ``"default=bf16;routed_experts=mxfp4"`` or a dict; every group gets one.

    Raises:
        UserError: unknown group (lists :data:`GROUPS`) or unknown dtype, or a malformed entry.
    """
    items = _dtype_items(spec) if spec is not None else {}
    base = dtypes.canonical(items.pop("default", items.pop("*", default)))
    out = {g: base for g in GROUPS}
    for k, v in items.items():
        if k not in GROUPS:
            raise UserError(f"unknown parameter group {k!r} in weight dtypes; allowed: default, {', '.join(GROUPS)}")
        out[k] = dtypes.canonical(v)
    return out


# ---------------------------------------------------------------- architecture spec
@dataclass(frozen=True)
class ArchSpec:
    """Shapes the planner needs. Layer kinds: ``n_kv_layers`` full softmax attention (GQA or MLA, cache grows per
    token), ``n_swa_layers`` sliding-window attention (cache capped at ``sliding_window`` tokens),
    ``n_linear_layers`` linear attention / KDA (constant recurrent state per sequence). They sum to ``num_layers``.
    """

    name: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    attention: str = "gqa"  # gqa | mla
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    n_kv_layers: int | None = None
    n_swa_layers: int = 0
    sliding_window: int | None = None
    n_linear_layers: int = 0
    linear_num_heads: int | None = None
    linear_head_dim: int | None = None
    linear_conv_kernel: int = 4
    intermediate_size: int | None = None
    n_dense_layers: int | None = None
    moe_intermediate_size: int | None = None
    n_routed_experts: int = 0
    experts_per_token: int = 0
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int | None = None
    moe_latent_size: int | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False
    expert_bias: bool = False
    weight_dtypes: str = "default=bfloat16"
    published_total_b: float | None = None
    published_active_b: float | None = None
    max_position_embeddings: int | None = None
    source: str = ""
    flags: str = ""

    def __post_init__(self):
        for f in ("hidden_size", "num_layers", "vocab_size", "num_attention_heads"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise UserError(f"{self.name}: {f}={v!r} must be a positive integer")
        if self.attention not in ("gqa", "mla"):
            raise UserError(f"{self.name}: attention={self.attention!r}; allowed: 'gqa', 'mla'")
        if self.attention == "mla":
            for f in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                if not getattr(self, f):
                    raise UserError(f"{self.name}: MLA attention needs {f} (a positive integer)")
        if self.n_kv_layers is None:
            object.__setattr__(self, "n_kv_layers", self.num_layers - self.n_swa_layers - self.n_linear_layers)
        if self.n_kv_layers + self.n_swa_layers + self.n_linear_layers != self.num_layers or self.n_kv_layers < 0:
            raise UserError(
                f"{self.name}: layer kinds n_kv_layers={self.n_kv_layers} + n_swa_layers="
                f"{self.n_swa_layers} + n_linear_layers={self.n_linear_layers} must equal num_layers="
                f"{self.num_layers}"
            )
        if self.n_swa_layers and not self.sliding_window:
            raise UserError(f"{self.name}: n_swa_layers={self.n_swa_layers} needs sliding_window")
        if self.n_linear_layers and not (self.linear_num_heads and self.linear_head_dim):
            raise UserError(f"{self.name}: linear-attention layers need linear_num_heads and linear_head_dim")
        if self.n_routed_experts:
            if not (self.experts_per_token and self.moe_intermediate_size):
                raise UserError(f"{self.name}: a MoE needs experts_per_token and moe_intermediate_size")
            if not 0 < self.experts_per_token <= self.n_routed_experts:
                raise UserError(
                    f"{self.name}: experts_per_token={self.experts_per_token} must be in "
                    f"[1, n_routed_experts={self.n_routed_experts}]"
                )
        if self.n_dense_layers is None:
            object.__setattr__(self, "n_dense_layers", 0 if self.n_routed_experts else self.num_layers)
        if self.n_dense_layers and not self.intermediate_size:
            raise UserError(f"{self.name}: {self.n_dense_layers} dense MLP layer(s) need intermediate_size")
        if self.attention == "gqa":
            if self.num_kv_heads is None:
                object.__setattr__(self, "num_kv_heads", self.num_attention_heads)
            if self.head_dim is None:
                object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        parse_weight_dtypes(self.weight_dtypes)  # validate early

    # ---- derived shapes
    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def n_moe_layers(self) -> int:
        return self.num_layers - self.n_dense_layers if self.is_moe else 0

    @property
    def n_attn_layers(self) -> int:
        return self.n_kv_layers + self.n_swa_layers

    def param_items(self) -> list[tuple[str, str, float]]:
        """``[(group, sharding, count)]`` with sharding one of ``tp`` (split over tensor-parallel ranks),
        ``kv`` (split by kv heads, replicated when kv heads < TP), ``rep`` (replicated), ``experts`` (routed
        experts: split over expert-parallel ranks, then TP within an expert), ``vocab`` (embedding rows split)."""
        h, L, V = self.hidden_size, self.num_layers, self.vocab_size
        nh = self.num_attention_heads
        out: list[tuple[str, str, float]] = [("embed", "vocab", V * h)]
        if not self.tie_word_embeddings:
            out.append(("lm_head", "vocab", V * h))
        la = self.n_attn_layers
        if self.attention == "gqa":
            hd, nkv = self.head_dim, self.num_kv_heads
            qo = 2 * h * nh * hd + (nh * hd + h if self.attention_bias else 0) + (nh if self.attention_sinks else 0)
            kv = 2 * h * nkv * hd + (2 * nkv * hd if self.attention_bias else 0)
            out += [("attn", "tp", la * qo), ("attn", "kv", la * kv)]
            if self.qk_norm:
                out.append(("norms", "rep", la * 2 * hd))
        else:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            kvl, rope, v = self.kv_lora_rank, self.qk_rope_head_dim, self.v_head_dim
            if self.q_lora_rank:
                q_rep, q_tp = h * self.q_lora_rank, self.q_lora_rank * nh * qk
                out.append(("norms", "rep", la * self.q_lora_rank))
            else:
                q_rep, q_tp = 0, h * nh * qk
            out += [
                ("attn", "rep", la * (q_rep + h * (kvl + rope))),
                ("attn", "tp", la * (q_tp + kvl * nh * (self.qk_nope_head_dim + v) + nh * v * h)),
                ("norms", "rep", la * kvl),
            ]
        if self.n_linear_layers:
            n, lh, hd_l = self.n_linear_layers, self.linear_num_heads, self.linear_head_dim
            D = lh * hd_l
            # KDA (Kimi Linear): q,k,v,o projections, depthwise short conv over q,k,v, low-rank forget and output
            # gates (f_a/f_b, g_a/g_b), beta projection, dt_bias, A_log; per transformers' kimi_linear modeling.
            out += [
                (
                    "linear_attn",
                    "tp",
                    n * (4 * h * D + 3 * D * self.linear_conv_kernel + 2 * hd_l * D + D + h * lh + lh),
                ),
                ("linear_attn", "rep", n * 2 * h * hd_l),
                ("norms", "rep", n * hd_l),
            ]
        out.append(("norms", "rep", 2 * L * h + h))
        if self.n_dense_layers:
            out.append(("dense_mlp", "tp", self.n_dense_layers * 3 * h * self.intermediate_size))
        if self.is_moe:
            m, E, mi = self.n_moe_layers, self.n_routed_experts, self.moe_intermediate_size
            out.append(("routed_experts", "experts", m * E * self.expert_params))
            out.append(("router", "rep", m * (E * h + (E if self.expert_bias else 0))))
            si = self.shared_expert_intermediate_size or self.n_shared_experts * mi
            if self.n_shared_experts and si:
                out.append(("shared_experts", "tp", m * 3 * h * si))
            if self.moe_latent_size:
                out.append(("moe_latent", "tp", m * 2 * h * self.moe_latent_size))
        return out

    def param_counts(self) -> dict[str, int]:
        """Parameters per group (see :data:`GROUPS`), recomputed from the shapes."""
        out = {g: 0 for g in GROUPS}
        for g, _, n in self.param_items():
            out[g] += int(n)
        return out

    @property
    def total_params(self) -> int:
        """All parameters (tied embeddings once)."""
        return sum(self.param_counts().values())

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert in one layer (incl. biases)."""
        if not self.is_moe:
            return 0
        d = self.moe_latent_size or self.hidden_size
        return 3 * d * self.moe_intermediate_size + ((2 * self.moe_intermediate_size + d) if self.expert_bias else 0)

    @property
    def active_matmul_params(self) -> int:
        """Parameters one token multiplies through: everything but the input embedding and the unused experts."""
        c = self.param_counts()
        routed_active = self.n_moe_layers * self.experts_per_token * self.expert_params
        return self.total_params - c["embed"] - c["routed_experts"] + routed_active

    @property
    def active_params(self) -> int:
        """Active parameters per token as usually published: :attr:`active_matmul_params` + the input embedding
        (gpt-oss publishes it without the embedding: compare with ``active_matmul_params`` there)."""
        return self.active_matmul_params + self.param_counts()["embed"]

    def dtypes(self, override: str | dict | None = None) -> dict[str, str]:
        """Per-group weight dtypes: the spec's, with ``override`` entries on top (``default=`` resets every group).

        Raises:
            UserError: unknown group or dtype.
        """
        d = parse_weight_dtypes(self.weight_dtypes)
        if override:
            o = _dtype_items(override)
            base = o.pop("default", o.pop("*", None))
            if base is not None:
                d = {g: dtypes.canonical(base) for g in GROUPS}
            for k, v in o.items():
                if k not in GROUPS:
                    raise UserError(
                        f"unknown parameter group {k!r} in weight dtypes; allowed: default, {', '.join(GROUPS)}"
                    )
                d[k] = dtypes.canonical(v)
        return d

    def summary(self) -> dict:
        """Totals next to the published figures, and KV bytes per token (bf16/fp8)."""
        out = {
            "model": self.name,
            "total_params_b": self.total_params / 1e9,
            "active_params_b": self.active_params / 1e9,
            "active_matmul_params_b": self.active_matmul_params / 1e9,
            "published_total_b": self.published_total_b,
            "published_active_b": self.published_active_b,
            "kv_bytes_per_token_bf16": kv_bytes_per_token(self, "bfloat16"),
            "kv_bytes_per_token_fp8": kv_bytes_per_token(self, "fp8"),
            "per_seq_state_bytes_bf16": state_bytes_per_seq(self, 10**9, "bfloat16", "bfloat16"),
        }
        if self.published_total_b:
            out["total_vs_published_pct"] = 100 * (out["total_params_b"] / self.published_total_b - 1)
        return out


# ---------------------------------------------------------------- loading specs
def model_table() -> pd.DataFrame:
    """The shipped reference models (``kit/data/models.csv``), one row each, with sources and flags (a copy; the file
    is read once per process)."""
    return _read_model_table().copy()


@functools.lru_cache(maxsize=1)
def _read_model_table() -> pd.DataFrame:
    return pd.read_csv(data_path("models.csv"), dtype=str, keep_default_na=False)


def list_models() -> list[str]:
    """Keys of the shipped reference models (``llama-3.1-8b``, ``deepseek-v3``, ``kimi-k3``, ...)."""
    return list(model_table()["key"])


def spec_from_config(config, name: str | None = None, weight_dtypes: str | dict | None = None) -> ArchSpec:
    """An :class:`ArchSpec` from a ``transformers`` config object, a dict, or a path to ``config.json`` (or a
    directory holding one).

    Understands Llama/Mistral/Qwen2/Qwen3 (GQA, QK-norm), Qwen3-MoE, gpt-oss (sliding-window layers, sinks, expert
    biases, MXFP4 experts), DeepSeek-V3/Kimi-K2 (MLA + MoE, fp8), Kimi-Linear (KDA + MLA) and multimodal configs with
    a ``text_config``. Weight dtypes: ``weight_dtypes`` if given, else from ``quantization_config`` (mxfp4 → routed
    experts MXFP4; fp8 → fp8 linear weights) and ``dtype``/``torch_dtype`` (default bfloat16).

    Raises:
        UserError: a field the planner needs is missing (the message names it). InputNotFoundError: bad path.
    """
    return ArchSpec(**arch_fields(config, name, weight_dtypes))


def get_spec(model, weight_dtypes: str | dict | None = None) -> ArchSpec:
    """A spec by reference-model key or name (``kimi-k3``, ``DeepSeek-V3``), kit preset (``tiny-llama``, via
    :func:`kit.models.get_config`), transformers config, dict, or ``config.json`` path.

    Raises:
        UnknownNameError: unknown name (lists the reference models and presets). UserError: bad config.
    """
    if isinstance(model, ArchSpec):
        return replace(model, weight_dtypes=weight_dtypes_text(weight_dtypes)) if weight_dtypes else model
    if isinstance(model, str) and not Path(model).exists():
        spec = _named_spec(model)
        return replace(spec, weight_dtypes=weight_dtypes_text(weight_dtypes)) if weight_dtypes else spec
    return spec_from_config(model, weight_dtypes=weight_dtypes)


@functools.cache
def _named_spec(model: str) -> ArchSpec:
    """The spec of a reference-model name or kit preset, built once per process (specs are frozen, so sharing is
    safe; the planner asks for the same name once per grid point)."""
    t = model_table()
    low = model.strip().lower()
    hit = t[
        (t["key"].str.lower() == low)
        | (t["model"].str.lower() == low)
        | (t["model"].str.split(" ").str[0].str.lower() == low)
        | (t["hf_repo"].str.lower() == low)
    ]
    if len(hit):
        return ArchSpec(**row_fields(hit.iloc[0]))
    from kit import models

    if model in models.PRESETS:
        return spec_from_config(models.get_config(model), name=model)
    raise UnknownNameError(
        f"unknown model {model!r}; reference models: {list(t['key'])}; presets: "
        f"{sorted(models.PRESETS)}; or pass a transformers config, a dict or a config.json path"
    )
