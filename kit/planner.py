"""Plan before you rent: an analytic memory-fit and roofline model of LLM inference, on the kit's results schema.

Everything here is arithmetic on an architecture spec (:class:`ArchSpec`) and a device (:class:`Device`):

- **Specs** come from ``kit/data/models.csv`` (the reference models with their sources and UNSURE flags, see
  :func:`list_models`) or from any ``transformers`` config object, dict or ``config.json`` path
  (:func:`spec_from_config`). Parameter counts are recomputed from the shapes per *group* (embed, lm_head, attn,
  linear_attn, norms, dense_mlp, shared_experts, routed_experts, router, moe_latent) so each group can have its
  own dtype (e.g. routed experts in MXFP4 at 4.25 bits, attention in bf16).
- **Memory fit** (:func:`memory_fit`): weights per GPU under tensor/expert/pipeline parallelism, KV-cache bytes per
  token (MHA/GQA split by kv heads across TP ranks; MLA latent replicated on every TP rank), constant per-sequence
  state of sliding-window and linear-attention layers, a workspace reserve; answers fits / KV tokens left / max
  concurrency at a context / max context at a concurrency; :func:`min_gpus` per catalog accelerator.
- **Roofline** (:func:`predict_point`): prefill and one decode step at (batch B, context C):
  ``t = max(bytes / (BW × eff_bw), flops / (peak × eff_flops)) + t_comm + overhead``; bytes = weights touched
  (routed experts: E·(1−(1−1/E)^(B·k)) of E are touched per MoE layer) + KV reads; rows use the schema of
  :mod:`kit.results` with ``backend="planner"`` and the assumptions in columns (``eff_bw``, ``eff_flops``, ``tp``,
  ``assumptions``, ``x_*``) so predicted and measured points plot on the same axes.
- **Local device**: ``accelerator="local"`` (or ``"cpu"``) uses the numbers ``kit calibrate`` measured
  (:mod:`kit.calibrate`): achievable bandwidth and matmul TFLOPS (so efficiencies are 1.0) and a measured per-step
  overhead (fixed + per layer) that dominates small batches in eager PyTorch.

Formulas: ``../shared/METRICS.md`` (Planner section). KV bytes/token: MHA/GQA ``2 × layers × n_kv_heads ×
head_dim × bytes``; MLA ``layers × (kv_lora_rank + qk_rope_head_dim) × bytes`` (DeepSeek-V3 paper, §2.1.1; no factor
2). Expert coverage: expected number of distinct experts hit by B·k uniform draws.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path

import pandas as pd

from . import metrics

# ---------------------------------------------------------------- dtypes
#: bytes per element. MXFP4 (OCP MX): 4-bit E2M1 + one 8-bit E8M0 scale per 32 elements = 4.25 bits.
#: NVFP4: 4-bit E2M1 + one FP8 E4M3 scale per 16 elements = 4.5 bits (per-tensor fp32 scale ignored).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0, "mxfp4": 4.25 / 8, "nvfp4": 4.5 / 8,
}
_DTYPE_ALIASES = {
    "fp32": "float32", "float": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
    "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e4m3fnuz": "fp8", "e4m3": "fp8", "fp8_e4m3": "fp8",
    "float8_e5m2": "fp8", "e5m2": "fp8", "mxfp4": "mxfp4", "nvfp4": "nvfp4", "int8": "int8",
}
#: which peak-TFLOPS figure a compute dtype uses (catalog / calibration keys)
_PEAK_KEY = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "fp8": "fp8", "int8": "fp8",
             "mxfp4": "fp4", "nvfp4": "fp4"}

GROUPS = ("embed", "lm_head", "attn", "linear_attn", "norms", "dense_mlp", "shared_experts", "routed_experts",
          "router", "moe_latent")


def canonical_dtype(name) -> str:
    """Canonical dtype name (float32, bfloat16, float16, fp8, int8, mxfp4, nvfp4) of a name or torch dtype.

    Raises:
        ValueError: unknown dtype (lists the allowed names).
    """
    s = str(name).strip().lower().removeprefix("torch.")
    s = _DTYPE_ALIASES.get(s, s)
    if s not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; allowed: {sorted(DTYPE_BYTES)} (aliases: {sorted(_DTYPE_ALIASES)})")
    return s


def dtype_bytes(name) -> float:
    """Bytes per element of a dtype (MXFP4 = 0.53125, NVFP4 = 0.5625). Raises ValueError for unknown dtypes."""
    return DTYPE_BYTES[canonical_dtype(name)]


def _dtype_items(spec) -> dict[str, str]:
    if isinstance(spec, dict):
        return {str(k): str(v) for k, v in spec.items()}
    if not isinstance(spec, str):
        raise ValueError(f"weight dtypes must be a 'group=dtype;...' string or a dict, got {type(spec).__name__}")
    items = {}
    for part in filter(None, (p.strip() for p in spec.replace(",", ";").split(";"))):
        if "=" not in part:
            raise ValueError(f"weight dtype entry {part!r} must look like group=dtype (e.g. routed_experts=mxfp4)")
        k, v = (x.strip() for x in part.split("=", 1))
        items[k] = v
    return items


def parse_weight_dtypes(spec: str | dict | None, default: str = "bfloat16") -> dict[str, str]:
    """Per-group weight dtypes from ``"default=bf16;routed_experts=mxfp4"`` or a dict; every group gets one.

    Raises:
        ValueError: unknown group (lists :data:`GROUPS`) or unknown dtype, or a malformed entry.
    """
    items = _dtype_items(spec) if spec is not None else {}
    base = canonical_dtype(items.pop("default", items.pop("*", default)))
    out = {g: base for g in GROUPS}
    for k, v in items.items():
        if k not in GROUPS:
            raise ValueError(f"unknown parameter group {k!r} in weight dtypes; allowed: default, {', '.join(GROUPS)}")
        out[k] = canonical_dtype(v)
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
                raise ValueError(f"{self.name}: {f}={v!r} must be a positive integer")
        if self.attention not in ("gqa", "mla"):
            raise ValueError(f"{self.name}: attention={self.attention!r}; allowed: 'gqa', 'mla'")
        if self.attention == "mla":
            for f in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                if not getattr(self, f):
                    raise ValueError(f"{self.name}: MLA attention needs {f} (a positive integer)")
        if self.n_kv_layers is None:
            object.__setattr__(self, "n_kv_layers", self.num_layers - self.n_swa_layers - self.n_linear_layers)
        if self.n_kv_layers + self.n_swa_layers + self.n_linear_layers != self.num_layers or self.n_kv_layers < 0:
            raise ValueError(f"{self.name}: layer kinds n_kv_layers={self.n_kv_layers} + n_swa_layers="
                             f"{self.n_swa_layers} + n_linear_layers={self.n_linear_layers} must equal num_layers="
                             f"{self.num_layers}")
        if self.n_swa_layers and not self.sliding_window:
            raise ValueError(f"{self.name}: n_swa_layers={self.n_swa_layers} needs sliding_window")
        if self.n_linear_layers and not (self.linear_num_heads and self.linear_head_dim):
            raise ValueError(f"{self.name}: linear-attention layers need linear_num_heads and linear_head_dim")
        if self.n_routed_experts:
            if not (self.experts_per_token and self.moe_intermediate_size):
                raise ValueError(f"{self.name}: a MoE needs experts_per_token and moe_intermediate_size")
            if not 0 < self.experts_per_token <= self.n_routed_experts:
                raise ValueError(f"{self.name}: experts_per_token={self.experts_per_token} must be in "
                                 f"[1, n_routed_experts={self.n_routed_experts}]")
        if self.n_dense_layers is None:
            object.__setattr__(self, "n_dense_layers", 0 if self.n_routed_experts else self.num_layers)
        if self.n_dense_layers and not self.intermediate_size:
            raise ValueError(f"{self.name}: {self.n_dense_layers} dense MLP layer(s) need intermediate_size")
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
            d = self.moe_latent_size or h
            per_expert = 3 * d * mi + ((2 * mi + d) if self.expert_bias else 0)
            out.append(("routed_experts", "experts", m * E * per_expert))
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
                d = {g: canonical_dtype(base) for g in GROUPS}
            for k, v in o.items():
                if k not in GROUPS:
                    raise ValueError(f"unknown parameter group {k!r} in weight dtypes; allowed: default, "
                                     f"{', '.join(GROUPS)}")
                d[k] = canonical_dtype(v)
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
def _models_csv() -> Path:
    return Path(str(resources.files("kit") / "data" / "models.csv"))


def model_table() -> pd.DataFrame:
    """The shipped reference models (``kit/data/models.csv``), one row each, with sources and flags."""
    return pd.read_csv(_models_csv(), dtype=str, keep_default_na=False)


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
    raise ValueError(f"config is missing {names}, which the planner needs for {why}")


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
            raise FileNotFoundError(f"config file {str(p)!r} does not exist")
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
        raise ValueError(f"config must be a transformers config, a dict or a config.json path, "
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
            raise ValueError(f"config layer_types has {len(lt)} entries but num_hidden_layers={L}")
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
        base = canonical_dtype(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
        q = cfg.get("quantization_config") or {}
        qm = str(q.get("quant_method", "")).lower() if isinstance(q, dict) else ""
        if qm == "mxfp4":
            weight_dtypes = f"default={base};routed_experts=mxfp4"
        elif qm == "fp8":
            weight_dtypes = f"default=fp8;embed={base};lm_head={base};norms={base};router={base}"
        else:
            weight_dtypes = f"default={base}"
    elif isinstance(weight_dtypes, dict):
        weight_dtypes = ";".join(f"{k}={v}" for k, v in weight_dtypes.items())
    kw["weight_dtypes"] = weight_dtypes
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
        t = model_table()
        low = model.strip().lower()
        hit = t[(t["key"].str.lower() == low) | (t["model"].str.lower() == low)
                | (t["model"].str.split(" ").str[0].str.lower() == low) | (t["hf_repo"].str.lower() == low)]
        if len(hit):
            spec = _spec_from_row(hit.iloc[0])
            return replace(spec, weight_dtypes=_dt_str(weight_dtypes)) if weight_dtypes else spec
        try:
            from . import models as _models
        except ImportError:  # pragma: no cover - kit.models is part of the kit
            _models = None
        presets = sorted(getattr(_models, "PRESETS", {})) if _models else []
        if _models is not None and model in presets:
            return spec_from_config(_models.get_config(model), name=model, weight_dtypes=weight_dtypes)
        raise KeyError(f"unknown model {model!r}; reference models: {list_models()}; presets: {presets}; "
                       "or pass a transformers config, a dict or a config.json path")
    return spec_from_config(model, weight_dtypes=weight_dtypes)


def _dt_str(d):
    if d is None or isinstance(d, str):
        return d
    return ";".join(f"{k}={v}" for k, v in d.items())


# ---------------------------------------------------------------- KV cache and state
def _check_pos_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int,)) and not (isinstance(v, float) and v.is_integer()):
        raise ValueError(f"{name}={v!r} must be a positive integer")
    if int(v) <= 0:
        raise ValueError(f"{name}={v!r} must be > 0")
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
    b = dtype_bytes(kv_dtype)
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
    b = dtype_bytes(kv_dtype)
    out = 0.0
    if spec.n_swa_layers:
        out += spec.n_swa_layers * min(spec.sliding_window, context_len) * 2 * _kv_heads_per_rank(spec, tp) \
            * spec.head_dim * b
    if spec.n_linear_layers:
        heads = math.ceil(spec.linear_num_heads / tp)
        hd = spec.linear_head_dim
        out += spec.n_linear_layers * (heads * hd * hd * dtype_bytes(state_dtype)
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
        raise ValueError(f"ep={ep} must divide tp={tp} (experts are split over ep ranks, TP within an expert)")
    dt = spec.dtypes(weight_dtypes)
    out = {g: 0.0 for g in GROUPS}
    for g, kind, n in spec.param_items():
        out[g] += n * DTYPE_BYTES[dt[g]] * _shard(kind, spec, tp, ep)
    return out


# ---------------------------------------------------------------- devices
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
        key = _PEAK_KEY[canonical_dtype(dtype)]
        v = self.tflops.get(key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            if key == "fp4" and self.tflops.get("fp8"):
                return float(self.tflops["fp8"])
            have = {k: v for k, v in self.tflops.items() if v and not (isinstance(v, float) and math.isnan(v))}
            raise ValueError(f"{self.name} has no {key} TFLOPS figure; it has {sorted(have)} (set compute_dtype)")
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
        KeyError: unknown accelerator (lists the catalog). FileNotFoundError: ``"local"`` on a device never
        calibrated and with no catalog row. ValueError: a non-positive override.
    """
    from .catalog import load_catalog

    acc = str(accelerator).strip()
    cal = None
    if isinstance(calibration, dict):
        cal = calibration
    elif calibration is not None:
        from . import calibrate as _cal

        cal = _cal.load_calibration(calibration)
    elif acc.lower() in ("local", "cpu"):
        from . import calibrate as _cal

        try:
            cal = _cal.load_calibration(device="cpu" if acc.lower() == "cpu" else None)
        except FileNotFoundError:
            if acc.lower() == "local":
                from .hardware import detect

                info = detect()
                if info.backend != "cpu":
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
            raise ValueError(f"unknown device field {k!r}; allowed: {sorted(asdict(dev))}")
        if isinstance(v, (int, float)) and k != "overhead_ms_fixed" and k != "overhead_ms_per_layer" and v <= 0:
            raise ValueError(f"{k}={v!r} must be > 0")
        if k in ("overhead_ms_fixed", "overhead_ms_per_layer") and v < 0:
            raise ValueError(f"{k}={v!r} must be >= 0")
        setattr(dev, k, v)
    return dev


# ---------------------------------------------------------------- memory fit
#: runtime memory a GPU serving engine keeps outside weights and KV (CUDA/HIP context, graphs, communication
#: buffers); an assumption, stated in every fit. 0 for the local calibrated device (a CPU process).
DEFAULT_RUNTIME_GB = 2.0
DEFAULT_MEM_UTIL = 0.90  # fraction of device memory the engine may use (vLLM's gpu_memory_utilization default)
DEFAULT_MAX_BATCHED_TOKENS = 8192


def _layout(device: Device, n_gpus: int, tp: int | None, ep: int | None, pp: int | None, spec: ArchSpec):
    n_gpus = _check_pos_int("n_gpus", n_gpus)
    if tp is None and pp is None:
        tp = min(n_gpus, max(1, device.gpus_per_node))
        pp = n_gpus // tp
    elif tp is None:
        pp = _check_pos_int("pp", pp)
        tp = n_gpus // pp
    elif pp is None:
        tp = _check_pos_int("tp", tp)
        pp = n_gpus // tp
    tp, pp = _check_pos_int("tp", tp), _check_pos_int("pp", pp)
    if tp * pp != n_gpus:
        raise ValueError(f"tp={tp} × pp={pp} must equal n_gpus={n_gpus}")
    if ep is None:
        ep = tp if spec.is_moe else 1
    ep = _check_pos_int("ep", ep)
    if tp % ep:
        raise ValueError(f"ep={ep} must divide tp={tp}")
    return n_gpus, tp, ep, pp


def workspace_gb(spec: ArchSpec, tp: int = 1, max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
                 act_dtype="bfloat16") -> float:
    """Activation workspace of one forward over ``max_batched_tokens`` tokens on one rank, GB: hidden-sized
    buffers (residual, norm, attention in/out: ~6 × hidden) plus the widest MLP intermediate (gate and up, split
    over TP) per token. A coarse reserve (an assumption, printed with every fit)."""
    widest = max(spec.intermediate_size or 0, (spec.moe_intermediate_size or 0) * max(1, spec.experts_per_token),
                 spec.shared_expert_intermediate_size or 0)
    per_tok = 6 * spec.hidden_size + 2 * widest / tp
    return max_batched_tokens * per_tok * dtype_bytes(act_dtype) / 1e9


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
        ValueError: non-positive sizes, unknown dtype, inconsistent tp/ep/pp, mem_util outside (0, 1].
        KeyError: unknown model or accelerator.
    """
    spec = get_spec(model)
    dev = device or get_device(accelerator, catalog=catalog, calibration=calibration)
    if not 0 < mem_util <= 1:
        raise ValueError(f"mem_util={mem_util!r} must be in (0, 1]")
    if context_len is not None:
        context_len = _check_pos_int("context_len", context_len)
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
        raise ValueError(f"reserve_gb={reserve_gb!r} must be >= 0")
    usable = dev.mem_gb * mem_util
    budget_b = (usable - w_gpu / 1e9 - reserve) * 1e9
    kv_tok = kv_bytes_per_token(spec, kv_dtype, tp) / pp
    big_ctx = spec.max_position_embeddings or 10**7
    fits_w = budget_b > 0
    tokens_free = max(0.0, budget_b) / kv_tok if kv_tok else float("inf")
    res = FitResult(model=spec.name, accelerator=dev.name, n_gpus=n_gpus, tp=tp, ep=ep, pp=pp,
                    kv_dtype=canonical_dtype(kv_dtype), weight_dtypes=dts, mem_gb_per_gpu=dev.mem_gb,
                    usable_gb_per_gpu=usable, weights_gb_total=w_total / 1e9, weights_gb_per_gpu=w_gpu / 1e9,
                    reserve_gb_per_gpu=reserve, kv_budget_gb_per_gpu=budget_b / 1e9,
                    kv_bytes_per_token=kv_bytes_per_token(spec, kv_dtype, 1), kv_bytes_per_token_per_gpu=kv_tok,
                    state_bytes_per_seq_per_gpu=state_bytes_per_seq(spec, context_len or big_ctx, kv_dtype,
                                                                    state_dtype, tp) / pp,
                    fits_weights=fits_w, kv_tokens_free=tokens_free, context_len=context_len, concurrency=concurrency)
    if context_len:
        per_seq = context_len * kv_tok + state_bytes_per_seq(spec, context_len, kv_dtype, state_dtype, tp) / pp
        res.max_concurrency = int(max(0.0, budget_b) // per_seq) if per_seq else None
    if concurrency:
        st = state_bytes_per_seq(spec, big_ctx, kv_dtype, state_dtype, tp) / pp
        room = max(0.0, budget_b) / concurrency - st
        res.max_context = int(max(0.0, room) // kv_tok) if kv_tok else None
        if spec.max_position_embeddings and res.max_context is not None:
            res.max_context = min(res.max_context, int(spec.max_position_embeddings))
    res.fits = fits_w
    if context_len and concurrency:
        need = concurrency * (context_len * kv_tok + state_bytes_per_seq(spec, context_len, kv_dtype, state_dtype, tp)
                              / pp)
        res.need_gb_per_gpu = (w_gpu + need) / 1e9 + reserve
        res.fits = fits_w and need <= budget_b
    res.assumptions = (f"mem_util={mem_util}; reserve={reserve:.2f} GB/GPU (runtime {runtime} GB + workspace for "
                       f"{max_batched_tokens} tokens); kv {canonical_dtype(kv_dtype)}, state "
                       f"{canonical_dtype(state_dtype)}; weights {_dt_summary(dts)}; device {dev.name} ({dev.source.split(' [')[0]})")
    return res


def _dt_summary(dts: dict) -> str:
    from collections import Counter

    base = Counter(dts.values()).most_common(1)[0][0]
    rest = [f"{g}={d}" for g, d in dts.items() if d != base]
    return f"{base}" + (f" ({', '.join(rest)})" if rest else "")


def min_gpus(model, accelerator: str, context_len: int | None = None, concurrency: int | None = None,
             max_gpus: int = 128, **kw) -> int | None:
    """Fewest GPUs of ``accelerator`` on which ``model`` fits (with ``concurrency`` × ``context_len`` of KV when
    given): tries 1, 2, 4, ... up to a node, then whole nodes (TP within a node, PP across nodes). None if even
    ``max_gpus`` is not enough. Raises as :func:`memory_fit`."""
    dev = kw.pop("device", None) or get_device(accelerator, catalog=kw.pop("catalog", None),
                                               calibration=kw.pop("calibration", None))
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


def _decode_terms(spec: ArchSpec, dev: Device, B: int, ctx: float, tp: int, ep: int, dts: dict, kv_dtype,
                  state_dtype, compute_dtype, act_dtype) -> dict:
    wr = weight_bytes(spec, dts, tp, ep)
    cov = expert_coverage(spec.n_routed_experts, B, spec.experts_per_token)
    w_bytes = sum(v for g, v in wr.items() if g not in ("embed", "routed_experts"))
    w_bytes += wr["routed_experts"] * cov
    w_bytes += B * spec.hidden_size * DTYPE_BYTES[dts["embed"]]  # embedding rows gathered
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
    size = tokens * spec.hidden_size * dtype_bytes(act_dtype)
    return 2 * spec.num_layers * size * 2 * (tp - 1) / tp / (dev.scaleup_gb_s * 1e9) * 1e3


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
        ValueError: non-positive sizes, unknown dtype, bad parallel layout. KeyError: unknown model/accelerator.
    """
    spec = get_spec(model)
    B = _check_pos_int("concurrency", concurrency)
    C = _check_pos_int("context_len", context_len)
    dev = device or get_device(accelerator, catalog=catalog, calibration=calibration)
    if dtype is not None:
        dtype = canonical_dtype(dtype)
        weight_dtypes = weight_dtypes or f"default={dtype}"
    dts = spec.dtypes(weight_dtypes)
    kv_dtype = canonical_dtype(kv_dtype or dtype or "bfloat16")
    act_dtype = canonical_dtype(act_dtype or dtype or "bfloat16")
    compute_dtype = canonical_dtype(compute_dtype or dts["attn"])
    n_gpus, tp, ep, pp = _layout(dev, n_gpus, tp, ep, pp, spec)
    eb = dev.eff_bw if eff_bw is None else float(eff_bw)
    ef = dev.eff_flops if eff_flops is None else float(eff_flops)
    for nm, v in (("eff_bw", eb), ("eff_flops", ef)):
        if not 0 < v <= 1.5:
            raise ValueError(f"{nm}={v!r} must be in (0, 1.5]")
    ovh = (dev.overhead_ms_fixed + dev.overhead_ms_per_layer * spec.num_layers) if overhead_ms is None \
        else float(overhead_ms)
    if ovh < 0:
        raise ValueError(f"overhead_ms={overhead_ms!r} must be >= 0")
    att = _check_pos_int("attend_len", attend_len) if attend_len is not None else C
    fit = memory_fit(spec, dev.name, n_gpus, C, B, kv_dtype, state_dtype, dts, tp, ep, pp, mem_util, reserve_gb,
                     device=dev)
    d = _decode_terms(spec, dev, B, att, tp, ep, dts, kv_dtype, state_dtype, compute_dtype, act_dtype)
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
        "peak_mem_gb": (fit.weights_gb_per_gpu + fit.reserve_gb_per_gpu
                        + B * (C * fit.kv_bytes_per_token_per_gpu + state_bytes_per_seq(spec, C, kv_dtype, state_dtype,
                                                                                          tp) / pp) / 1e9),
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
    from .results import to_frame

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
    from .results import to_frame

    need = ["model", "dtype", "concurrency", "context_len"]
    missing = [c for c in need if c not in measured.columns]
    if missing:
        raise ValueError(f"measured frame lacks column(s) {missing}")
    ok = measured[(measured.get("status", "ok") == "ok")] if "status" in measured.columns else measured
    ok = ok.dropna(subset=need)
    if ok.empty:
        raise ValueError("measured frame has no ok rows with model, dtype, concurrency and context_len")
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
    p = sub.add_parser("plan", help="will it fit, how fast, at what cost (analytic; no GPU needed)",
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
    from .catalog import load_catalog
    from .cost import add_cost_columns
    from .results import to_frame

    spec = get_spec(args.model, args.weight_dtypes)
    cat = load_catalog(extra_prices=args.prices)
    dev = get_device(args.accelerator, catalog=cat, calibration=args.calibration, eff_bw=args.eff_bw,
                     eff_flops=args.eff_flops)
    kw = dict(kv_dtype=args.kv_dtype, mem_util=args.mem_util)
    least = min_gpus(spec, dev.name, args.context, args.concurrency, device=dev, **kw)
    if args.gpus is not None and args.gpus < 1:
        raise ValueError(f"--gpus {args.gpus} must be >= 1")
    n = args.gpus if args.gpus is not None else (least or dev.gpus_per_node)
    fit = memory_fit(spec, dev.name, n, args.context, args.concurrency, tp=args.tp, ep=args.ep, device=dev, **kw)
    pts = [predict_point(spec, dev.name, n, b, args.context, tp=args.tp, ep=args.ep, device=dev,
                         overhead_ms=args.overhead_ms, **kw)
           for b in sorted({1, args.concurrency})]
    df = to_frame(pts)
    costs = []
    if dev.name != "local" and dev.name != "CPU" or args.price:
        bases = [args.basis] if args.basis else sorted(set(cat.prices[cat.prices.accelerator == dev.name].basis))
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
          f"KV {s['kv_bytes_per_token_bf16']:,.0f} B/token bf16" + (f"; flags: {spec.flags[:160]}" if spec.flags else ""))
    print(fit)
    print(f"  fewest {dev.name} that fit {args.concurrency} users × {args.context} tokens: {least}")
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
