"""Model architecture specs: what the planner knows of a model, and the bytes it needs per token, sequence, weight.

- **Specs** (:class:`ArchSpec`) come from ``kit/data/models.csv`` (the reference models with their sources and
  UNSURE flags, see :func:`list_models`, :func:`model_table`) or from any ``transformers`` config object, dict or
  ``config.json`` path (:func:`spec_from_config`); :func:`get_spec` takes either, or a kit preset. Parameter counts
  are recomputed from the shapes per *group* (embed, lm_head, attn, linear_attn, norms, dense_mlp, shared_experts,
  routed_experts, router, moe_latent) so each group can have its own dtype (e.g. routed experts in MXFP4 at 4.25
  bits, attention in bf16; :func:`parse_weight_dtypes`, :func:`kit.dtypes.bytes_per_element`).
- **Bytes**: :func:`weight_bytes` per group on one rank under tensor/expert parallelism; :func:`kv_bytes_per_token`
  (MHA/GQA split by kv heads across TP ranks; MLA latent replicated on every TP rank);
  :func:`state_bytes_per_seq`, the constant per-sequence state of sliding-window and linear-attention layers.

Formulas: ``../shared/METRICS.md`` (Planner section). KV bytes/token: MHA/GQA ``2 × layers × n_kv_heads ×
head_dim × bytes``; MLA ``layers × (kv_lora_rank + qk_rope_head_dim) × bytes`` (DeepSeek-V3 paper, §2.1.1; no factor
2). The memory fit and roofline built on these are in :mod:`kit.plan.roofline`.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import pandas as pd
from kit._io import data_path
from kit import dtypes
from kit.errors import InputNotFoundError, UnknownNameError, UserError

GROUPS = ("embed", "lm_head", "attn", "linear_attn", "norms", "dense_mlp", "shared_experts", "routed_experts",
          "router", "moe_latent")


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
        ValueError: unknown group (lists :data:`GROUPS`) or unknown dtype, or a malformed entry.
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
            raise UserError(f"{self.name}: layer kinds n_kv_layers={self.n_kv_layers} + n_swa_layers="
                             f"{self.n_swa_layers} + n_linear_layers={self.n_linear_layers} must equal num_layers="
                             f"{self.num_layers}")
        if self.n_swa_layers and not self.sliding_window:
            raise UserError(f"{self.name}: n_swa_layers={self.n_swa_layers} needs sliding_window")
        if self.n_linear_layers and not (self.linear_num_heads and self.linear_head_dim):
            raise UserError(f"{self.name}: linear-attention layers need linear_num_heads and linear_head_dim")
        if self.n_routed_experts:
            if not (self.experts_per_token and self.moe_intermediate_size):
                raise UserError(f"{self.name}: a MoE needs experts_per_token and moe_intermediate_size")
            if not 0 < self.experts_per_token <= self.n_routed_experts:
                raise UserError(f"{self.name}: experts_per_token={self.experts_per_token} must be in "
                                 f"[1, n_routed_experts={self.n_routed_experts}]")
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
            out += [("attn", "rep", la * (q_rep + h * (kvl + rope))),
                    ("attn", "tp", la * (q_tp + kvl * nh * (self.qk_nope_head_dim + v) + nh * v * h)),
                    ("norms", "rep", la * kvl)]
        if self.n_linear_layers:
            n, lh, hd_l = self.n_linear_layers, self.linear_num_heads, self.linear_head_dim
            D = lh * hd_l
            # KDA (Kimi Linear): q,k,v,o projections, depthwise short conv over q,k,v, low-rank forget and output
            # gates (f_a/f_b, g_a/g_b), beta projection, dt_bias, A_log; per transformers' kimi_linear modeling.
            out += [("linear_attn", "tp", n * (4 * h * D + 3 * D * self.linear_conv_kernel + 2 * hd_l * D + D
                                               + h * lh + lh)),
                    ("linear_attn", "rep", n * 2 * h * hd_l), ("norms", "rep", n * hd_l)]
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
            ValueError: unknown group or dtype.
        """
        d = parse_weight_dtypes(self.weight_dtypes)
        if override:
            o = _dtype_items(override)
            base = o.pop("default", o.pop("*", None))
            if base is not None:
                d = {g: dtypes.canonical(base) for g in GROUPS}
            for k, v in o.items():
                if k not in GROUPS:
                    raise UserError(f"unknown parameter group {k!r} in weight dtypes; allowed: default, "
                                     f"{', '.join(GROUPS)}")
                d[k] = dtypes.canonical(v)
        return d

    def summary(self) -> dict:
        """Totals next to the published figures, and KV bytes per token (bf16/fp8)."""
        out = {"model": self.name, "total_params_b": self.total_params / 1e9, "active_params_b": self.active_params / 1e9,
               "active_matmul_params_b": self.active_matmul_params / 1e9,
               "published_total_b": self.published_total_b, "published_active_b": self.published_active_b,
               "kv_bytes_per_token_bf16": kv_bytes_per_token(self, "bfloat16"),
               "kv_bytes_per_token_fp8": kv_bytes_per_token(self, "fp8"),
               "per_seq_state_bytes_bf16": state_bytes_per_seq(self, 10**9, "bfloat16", "bfloat16")}
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


def _i(v) -> int | None:
    v = str(v).strip()
    return int(float(v)) if v not in ("", "nan", "None") else None


def _b(v) -> bool:
    return str(v).strip().lower() in ("true", "1", "yes")


def _spec_from_row(r) -> ArchSpec:
    mla = str(r["attention"]).upper().find("MLA") >= 0
    return ArchSpec(
        name=r["key"], hidden_size=_i(r["hidden_size"]), num_layers=_i(r["num_layers"]), vocab_size=_i(r["vocab_size"]),
        num_attention_heads=_i(r["num_attention_heads"]), num_kv_heads=None if mla else _i(r["num_kv_heads"]),
        head_dim=None if mla else _i(r["head_dim"]), attention="mla" if mla else "gqa",
        q_lora_rank=_i(r["q_lora_rank"]), kv_lora_rank=_i(r["kv_lora_rank"]), qk_nope_head_dim=_i(r["qk_nope_head_dim"]),
        qk_rope_head_dim=_i(r["qk_rope_head_dim"]), v_head_dim=_i(r["v_head_dim"]),
        n_kv_layers=_i(r["kv_bearing_layers"]), n_swa_layers=_i(r["n_swa_layers"]) or 0,
        sliding_window=_i(r["sliding_window"]), n_linear_layers=_i(r["n_linear_layers"]) or 0,
        linear_num_heads=_i(r["linear_num_heads"]), linear_head_dim=_i(r["linear_head_dim"]),
        linear_conv_kernel=_i(r["linear_conv_kernel"]) or 4, intermediate_size=_i(r["intermediate_size_dense"]),
        n_dense_layers=_i(r["first_k_dense_layers"]) if _i(r["n_routed_experts"]) else None,
        moe_intermediate_size=_i(r["moe_intermediate_size"]), n_routed_experts=_i(r["n_routed_experts"]) or 0,
        experts_per_token=_i(r["experts_per_token"]) or 0, n_shared_experts=_i(r["n_shared_experts"]) or 0,
        shared_expert_intermediate_size=_i(r["shared_expert_intermediate_size"]),
        moe_latent_size=_i(r["moe_latent_size"]), tie_word_embeddings=_b(r["tie_word_embeddings"]),
        attention_bias=_b(r["attention_bias"]), qk_norm=_b(r["qk_norm"]), attention_sinks=_b(r["attention_sinks"]),
        expert_bias=_b(r["expert_bias"]), weight_dtypes=r["weight_dtypes"] or "default=bfloat16",
        published_total_b=float(r["total_params_b"]), published_active_b=float(r["active_params_b"]),
        max_position_embeddings=_i(r["max_position_embeddings"]), source=r["source"],
        flags="; ".join(x for x in (r["flags"], r["notes"]) if x))


def _need(cfg: dict, key: str, why: str, *aliases: str):
    for k in (key, *aliases):
        if cfg.get(k) is not None:
            return cfg[k]
    names = " / ".join(repr(k) for k in (key, *aliases))
    raise UserError(f"config is missing {names}, which the planner needs for {why}")


def spec_from_config(config, name: str | None = None, weight_dtypes: str | dict | None = None) -> ArchSpec:
    """An :class:`ArchSpec` from a ``transformers`` config object, a dict, or a path to ``config.json`` (or a
    directory holding one).

    Understands Llama/Mistral/Qwen2/Qwen3 (GQA, QK-norm), Qwen3-MoE, gpt-oss (sliding-window layers, sinks, expert
    biases, MXFP4 experts), DeepSeek-V3/Kimi-K2 (MLA + MoE, fp8), Kimi-Linear (KDA + MLA) and multimodal configs with
    a ``text_config``. Weight dtypes: ``weight_dtypes`` if given, else from ``quantization_config`` (mxfp4 → routed
    experts MXFP4; fp8 → fp8 linear weights) and ``dtype``/``torch_dtype`` (default bfloat16).

    Raises:
        ValueError: a field the planner needs is missing (the message names it). FileNotFoundError: bad path.
    """
    if isinstance(config, (str, Path)):
        p = Path(config)
        if p.is_dir():
            p = p / "config.json"
        if not p.exists():
            raise InputNotFoundError(f"config file {str(p)!r} does not exist")
        cfg = json.loads(p.read_text())
        name = name or p.parent.name
    elif isinstance(config, dict):
        cfg = dict(config)
    elif hasattr(config, "to_dict"):
        if hasattr(config, "get_text_config"):
            config = config.get_text_config()
        cfg = config.to_dict()
        for k in ("head_dim", "layer_types", "linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim",
                  "mlp_layer_types", "num_key_value_heads"):
            if getattr(config, k, None) is not None:
                cfg[k] = getattr(config, k)
        name = name or getattr(config, "name_or_path", "") or cfg.get("model_type", "config")
    else:
        raise UserError(f"config must be a transformers config, a dict or a config.json path, "
                         f"got {type(config).__name__}")
    if isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "quantization_config": cfg.get("quantization_config")}
    name = name or cfg.get("_name_or_path") or cfg.get("model_type") or "config"
    mt = str(cfg.get("model_type", ""))
    h = int(_need(cfg, "hidden_size", "every weight shape", "d_model", "n_embd"))
    L = int(_need(cfg, "num_hidden_layers", "the layer count", "n_layer", "num_layers"))
    nh = int(_need(cfg, "num_attention_heads", "the attention shapes", "n_head"))
    V = int(_need(cfg, "vocab_size", "the embedding size"))
    mla = cfg.get("kv_lora_rank") is not None
    kw: dict = dict(name=str(name), hidden_size=h, num_layers=L, vocab_size=V, num_attention_heads=nh,
                    tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                    attention_bias=bool(cfg.get("attention_bias", False)),
                    max_position_embeddings=cfg.get("max_position_embeddings"), source=f"config ({mt or 'dict'})")
    if mla:
        kw.update(attention="mla", q_lora_rank=cfg.get("q_lora_rank"),
                  kv_lora_rank=int(_need(cfg, "kv_lora_rank", "the MLA latent cache")),
                  qk_rope_head_dim=int(_need(cfg, "qk_rope_head_dim", "the MLA latent cache")),
                  qk_nope_head_dim=int(_need(cfg, "qk_nope_head_dim", "the MLA query/key shapes")),
                  v_head_dim=int(_need(cfg, "v_head_dim", "the MLA value shapes")))
    else:
        nkv = cfg.get("num_key_value_heads")
        kw.update(num_kv_heads=int(nkv) if nkv is not None else nh,
                  head_dim=int(cfg.get("head_dim") or h // nh), qk_norm=mt.startswith("qwen3"),
                  attention_sinks=mt == "gpt_oss")
    # layer kinds
    lt = cfg.get("layer_types")
    if lt:
        lt = list(lt)
        if len(lt) != L:
            raise UserError(f"config layer_types has {len(lt)} entries but num_hidden_layers={L}")
        n_lin = sum(t in ("linear_attention", "kda", "mamba", "gated_deltanet") for t in lt)
        n_swa = sum(t in ("sliding_attention", "sliding_window") for t in lt)
        kw.update(n_swa_layers=n_swa, n_linear_layers=n_lin, n_kv_layers=L - n_swa - n_lin)
        if n_swa:
            kw["sliding_window"] = int(_need(cfg, "sliding_window", "the sliding-window cache size"))
        if n_lin:
            kw.update(linear_num_heads=int(_need(cfg, "linear_num_heads", "the linear-attention state",
                                                 "linear_num_value_heads")),
                      linear_head_dim=int(_need(cfg, "linear_head_dim", "the linear-attention state",
                                                "linear_value_head_dim")),
                      linear_conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4))
            if mt != "kimi_linear":
                kw["flags"] = (f"UNSURE: linear-attention layers of model_type {mt or '?'} are modelled as KDA "
                               "(kimi_linear): their parameter count and state size are approximate")
    # MLP / MoE
    E = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    if E:
        k = int(_need(cfg, "num_experts_per_tok", "the active experts per token", "num_experts_per_token",
                      "experts_per_token", "moe_topk"))
        if mt == "gpt_oss":
            mi = int(_need(cfg, "intermediate_size", "the expert width"))
        else:
            mi = int(_need(cfg, "moe_intermediate_size", "the expert width"))
        mlt = cfg.get("mlp_layer_types")
        if mlt:
            n_dense = sum(t == "dense" for t in mlt)
        elif cfg.get("first_k_dense_replace") is not None:
            n_dense = int(cfg["first_k_dense_replace"])
        elif cfg.get("mlp_only_layers") or (cfg.get("decoder_sparse_step") or 1) > 1:
            step = int(cfg.get("decoder_sparse_step") or 1)
            only = set(cfg.get("mlp_only_layers") or [])
            n_dense = sum(1 for i in range(L) if i in only or (i + 1) % step != 0)
        else:
            n_dense = 0
        kw.update(n_routed_experts=int(E), experts_per_token=k, moe_intermediate_size=mi, n_dense_layers=n_dense,
                  n_shared_experts=int(cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0), expert_bias=mt == "gpt_oss",
                  shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size"),
                  moe_latent_size=cfg.get("moe_latent_size"))
        if n_dense:
            kw["intermediate_size"] = int(_need(cfg, "intermediate_size", "the dense MLP layers"))
    else:
        kw["intermediate_size"] = int(_need(cfg, "intermediate_size", "the MLP width", "ffn_dim", "n_inner"))
    # dtypes
    if weight_dtypes is None:
        base = dtypes.canonical(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
        q = cfg.get("quantization_config") or {}
        qm = str(q.get("quant_method", "")).lower() if isinstance(q, dict) else ""
        if qm == "mxfp4":
            weight_dtypes = f"default={base};routed_experts=mxfp4"
        elif qm == "fp8":
            weight_dtypes = f"default=fp8;embed={base};lm_head={base};norms={base};router={base}"
        else:
            weight_dtypes = f"default={base}"
    kw["weight_dtypes"] = _dt_str(weight_dtypes)
    return ArchSpec(**kw)


def get_spec(model, weight_dtypes: str | dict | None = None) -> ArchSpec:
    """A spec by reference-model key or name (``kimi-k3``, ``DeepSeek-V3``), kit preset (``tiny-llama``, via
    :func:`kit.models.get_config`), transformers config, dict, or ``config.json`` path.

    Raises:
        KeyError: unknown name (lists the reference models and presets). ValueError: bad config.
    """
    if isinstance(model, ArchSpec):
        return replace(model, weight_dtypes=_dt_str(weight_dtypes)) if weight_dtypes else model
    if isinstance(model, str) and not Path(model).exists():
        spec = _named_spec(model)
        return replace(spec, weight_dtypes=_dt_str(weight_dtypes)) if weight_dtypes else spec
    return spec_from_config(model, weight_dtypes=weight_dtypes)


@functools.lru_cache(maxsize=None)
def _named_spec(model: str) -> ArchSpec:
    """The spec of a reference-model name or kit preset, built once per process (specs are frozen, so sharing is
    safe; the planner asks for the same name once per grid point)."""
    t = model_table()
    low = model.strip().lower()
    hit = t[(t["key"].str.lower() == low) | (t["model"].str.lower() == low)
            | (t["model"].str.split(" ").str[0].str.lower() == low) | (t["hf_repo"].str.lower() == low)]
    if len(hit):
        return _spec_from_row(hit.iloc[0])
    from kit import models as _models

    if model in _models.PRESETS:
        return spec_from_config(_models.get_config(model), name=model)
    raise UnknownNameError(f"unknown model {model!r}; reference models: {list(t['key'])}; presets: {sorted(_models.PRESETS)}; "
                   "or pass a transformers config, a dict or a config.json path")


def _dt_str(d):
    if d is None or isinstance(d, str):
        return d
    return ";".join(f"{k}={v}" for k, v in d.items())


# ---------------------------------------------------------------- KV cache and state
def _check_pos_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int,)) and not (isinstance(v, float) and v.is_integer()):
        raise UserError(f"{name}={v!r} must be a positive integer")
    if int(v) <= 0:
        raise UserError(f"{name}={v!r} must be > 0")
    return int(v)


def _kv_heads_per_rank(spec: ArchSpec, tp: int) -> float:
    """kv heads one TP rank holds: n_kv/tp, at least 1 (heads are replicated when n_kv < tp)."""
    return max(1, math.ceil(spec.num_kv_heads / tp))


def kv_bytes_per_token(spec: ArchSpec, kv_dtype="bfloat16", tp: int = 1) -> float:
    """KV-cache bytes one token of one sequence adds, on one TP rank (``tp=1``: the whole model).

    MHA/GQA: ``2 × n_kv_layers × n_kv_heads × head_dim × bytes``; under TP each rank holds n_kv/tp heads (at least
    one: kv heads are replicated when fewer than ranks). MLA: ``n_kv_layers × (kv_lora_rank + qk_rope_head_dim) ×
    bytes``, no factor 2 and replicated on every TP rank. Sliding-window and linear-attention layers add no per-token
    cache (see :func:`state_bytes_per_seq`). Source: ../shared/METRICS.md; case P1 (Llama-3.1-8B bf16 → 131,072;
    DeepSeek-V3 bf16 → 70,272, fp8 → 35,136).

    Raises:
        ValueError: unknown dtype, tp < 1.
    """
    b = dtypes.bytes_per_element(kv_dtype)
    tp = _check_pos_int("tp", tp)
    if spec.attention == "mla":
        return spec.n_kv_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * b
    return 2 * spec.n_kv_layers * _kv_heads_per_rank(spec, tp) * spec.head_dim * b


def state_bytes_per_seq(spec: ArchSpec, context_len: int, kv_dtype="bfloat16", state_dtype="bfloat16",
                        tp: int = 1) -> float:
    """Per-sequence cache bytes that do not grow with context, on one TP rank.

    Sliding-window layers: ``n_swa × min(window, context) × 2 × kv_heads × head_dim × kv bytes``. Linear attention
    (KDA / gated delta rule): ``n_linear × (heads × head_dim² × state bytes + 3 × heads × head_dim × (conv_kernel − 1)
    × kv bytes)`` (recurrent state + short-conv tail of q, k, v); heads split over TP. Kimi K3 bf16 → 232,316,928
    B/seq; fp32 state → 449,372,160 (../shared/reference/models.csv).
    """
    tp = _check_pos_int("tp", tp)
    b = dtypes.bytes_per_element(kv_dtype)
    out = 0.0
    if spec.n_swa_layers:
        out += spec.n_swa_layers * min(spec.sliding_window, context_len) * 2 * _kv_heads_per_rank(spec, tp) \
            * spec.head_dim * b
    if spec.n_linear_layers:
        heads = math.ceil(spec.linear_num_heads / tp)
        hd = spec.linear_head_dim
        out += spec.n_linear_layers * (heads * hd * hd * dtypes.bytes_per_element(state_dtype)
                                       + 3 * heads * hd * (spec.linear_conv_kernel - 1) * b)
    return out


# ---------------------------------------------------------------- weights
def _shard(kind: str, spec: ArchSpec, tp: int, ep: int) -> float:
    if kind == "rep":
        return 1.0
    if kind in ("tp", "vocab"):
        return 1.0 / tp
    if kind == "kv":
        return _kv_heads_per_rank(spec, tp) / spec.num_kv_heads
    if kind == "experts":
        E = spec.n_routed_experts
        return math.ceil(E / ep) / E / (tp // ep)
    raise AssertionError(kind)


def weight_bytes(spec: ArchSpec, weight_dtypes: str | dict | None = None, tp: int = 1, ep: int = 1) -> dict[str, float]:
    """Weight bytes per group on one rank (``tp=ep=1``: the whole model), by each group's dtype.

    Sharding: attention/MLP/shared experts/embeddings split over TP; GQA k/v projections by kv heads (replicated
    when fewer than ranks); MLA down-projections (q_a, kv_a), norms and routers replicated; routed experts split over
    EP ranks (whole experts, ceil(E/ep) each), then over the remaining tp/ep ranks within an expert.

    Raises:
        ValueError: unknown dtype/group; tp or ep < 1; tp not a multiple of ep.
    """
    tp, ep = _check_pos_int("tp", tp), _check_pos_int("ep", ep)
    if tp % ep:
        raise UserError(f"ep={ep} must divide tp={tp} (experts are split over ep ranks, TP within an expert)")
    dt = spec.dtypes(weight_dtypes)
    out = {g: 0.0 for g in GROUPS}
    for g, kind, n in spec.param_items():
        out[g] += n * dtypes.DTYPES[dt[g]].bytes * _shard(kind, spec, tp, ep)
    return out
