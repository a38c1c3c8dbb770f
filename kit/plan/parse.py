"""Reading model descriptions into the fields of an architecture spec: a ``transformers`` config (object, dict or
``config.json`` path; :func:`arch_fields`) or a row of the reference-model table ``kit/data/models.csv``
(:func:`row_fields`).

:func:`arch_fields` returns the keyword arguments of :class:`kit.plan.spec.ArchSpec` (which
:func:`kit.plan.spec.spec_from_config` builds); a field the planner needs and the config lacks raises a
:class:`kit.errors.UserError` naming it. Layer kinds come from ``layer_types`` (full, sliding-window, linear
attention), MoE layout from ``first_k_dense_replace`` / ``mlp_layer_types`` / ``decoder_sparse_step``, weight dtypes
from ``quantization_config`` and ``dtype`` / ``torch_dtype``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kit import dtypes
from kit.errors import InputNotFoundError, UserError


def weight_dtypes_text(d: str | dict | None) -> str | None:
    """Per-group weight dtypes as the ``"group=dtype;..."`` text an :class:`kit.plan.spec.ArchSpec` stores (a str or
    None passes through)."""
    if d is None or isinstance(d, str):
        return d
    return ";".join(f"{k}={v}" for k, v in d.items())


def _i(v) -> int | None:
    v = str(v).strip()
    return int(float(v)) if v not in ("", "nan", "None") else None


def _b(v) -> bool:
    return str(v).strip().lower() in ("true", "1", "yes")


#: ArchSpec field → models.csv column, for integer fields read as they are (a blank cell → None)
ROW_INT_FIELDS = {
    **{
        f: f
        for f in (
            "hidden_size",
            "num_layers",
            "vocab_size",
            "num_attention_heads",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "sliding_window",
            "linear_num_heads",
            "linear_head_dim",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "moe_latent_size",
            "max_position_embeddings",
        )
    },
    "n_kv_layers": "kv_bearing_layers",
    "intermediate_size": "intermediate_size_dense",
}
#: integer fields whose blank cell means 0, and boolean fields (true/1/yes), named as in models.csv
ROW_COUNT_FIELDS = ("n_swa_layers", "n_linear_layers", "n_routed_experts", "experts_per_token", "n_shared_experts")
ROW_BOOL_FIELDS = ("tie_word_embeddings", "attention_bias", "qk_norm", "attention_sinks", "expert_bias")


def row_fields(r) -> dict:
    """The :class:`kit.plan.spec.ArchSpec` keyword arguments of one row of ``kit/data/models.csv`` (a mapping of
    column → text; blank cells are None)."""
    mla = str(r["attention"]).upper().find("MLA") >= 0
    kw = {f: _i(r[c]) for f, c in ROW_INT_FIELDS.items()}
    kw.update({f: _i(r[f]) or 0 for f in ROW_COUNT_FIELDS})
    kw.update({f: _b(r[f]) for f in ROW_BOOL_FIELDS})
    kw.update(
        name=r["key"],
        attention="mla" if mla else "gqa",
        num_kv_heads=None if mla else _i(r["num_kv_heads"]),
        head_dim=None if mla else _i(r["head_dim"]),
        linear_conv_kernel=_i(r["linear_conv_kernel"]) or 4,
        n_dense_layers=_i(r["first_k_dense_layers"]) if _i(r["n_routed_experts"]) else None,
        weight_dtypes=r["weight_dtypes"] or "default=bfloat16",
        published_total_b=float(r["total_params_b"]),
        published_active_b=float(r["active_params_b"]),
        source=r["source"],
        flags="; ".join(x for x in (r["flags"], r["notes"]) if x),
    )
    return kw


def _need(cfg: dict, key: str, why: str, *aliases: str):
    for k in (key, *aliases):
        if cfg.get(k) is not None:
            return cfg[k]
    names = " / ".join(repr(k) for k in (key, *aliases))
    raise UserError(f"config is missing {names}, which the planner needs for {why}")


#: the largest shape count a config may give (int32; real models are far below, a typo or hostile file is not)
MAX_COUNT = 2**31 - 1
#: the most layers a config may give (the planner walks layers one by one; the deepest models have a few hundred)
MAX_LAYERS = 100_000


def _count(cfg: dict, key: str, why: str, *aliases: str, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """A shape count of the config (heads, layers, sizes) under ``key`` or an alias: present and a whole number in
    [minimum, maximum] (JSON's NaN and Infinity, strings, lists and booleans are not).

    Raises:
        UserError: missing, not a whole number, or out of range (0 heads would divide by zero later; 10**30 layers
            would never finish); the message names the key, its value and the range.
    """
    v = _need(cfg, key, why, *aliases)
    k = next(k for k in (key, *aliases) if cfg.get(k) is not None)
    whole = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v == int(v)
    if not whole or not minimum <= v <= maximum:
        shown = repr(v) if len(repr(v)) <= 60 else f"{repr(v)[:40]}... ({len(repr(v))} characters)"
        raise UserError(f"config has {k}={shown}; the planner needs a whole number in [{minimum}, {maximum}] for {why}")
    return int(v)


def _first_set(cfg: dict, *keys: str) -> str | None:
    """The first of ``keys`` the config sets to something truthy (not absent, None, 0 or empty), or None."""
    return next((k for k in keys if cfg.get(k)), None)


def _list_of(cfg: dict, key: str) -> list | None:
    """``cfg[key]`` when it is a non-empty list, None when absent or empty.

    Raises:
        UserError: set to something else (a number, a string, an object)."""
    v = cfg.get(key)
    if not v:
        return None
    if not isinstance(v, list):
        raise UserError(f"config has {key}={v!r}; the planner needs a list (one entry per layer)")
    return v


def arch_fields(config, name: str | None = None, weight_dtypes: str | dict | None = None) -> dict:
    """The :class:`kit.plan.spec.ArchSpec` keyword arguments of a ``transformers`` config object, a dict, or a path
    to ``config.json`` (or a directory holding one). See :func:`kit.plan.spec.spec_from_config` for the families
    understood.

    Raises:
        UserError: a field the planner needs is missing (the message names it), or ``config`` is of another type.
        InputNotFoundError: a path without a ``config.json``.
    """
    cfg, name = _config_dict(config, name)
    mt = str(cfg.get("model_type", ""))
    h = _count(cfg, "hidden_size", "every weight shape", "d_model", "n_embd")
    L = _count(cfg, "num_hidden_layers", "the layer count", "n_layer", "num_layers", maximum=MAX_LAYERS)
    nh = _count(cfg, "num_attention_heads", "the attention shapes", "n_head")
    V = _count(cfg, "vocab_size", "the embedding size")
    kw: dict = dict(
        name=str(name),
        hidden_size=h,
        num_layers=L,
        vocab_size=V,
        num_attention_heads=nh,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        max_position_embeddings=_count(cfg, "max_position_embeddings", "the longest context")
        if cfg.get("max_position_embeddings") is not None
        else None,
        source=f"config ({mt or 'dict'})",
    )
    kw.update(_attention_fields(cfg, mt, h, nh))
    kw.update(_layer_kind_fields(cfg, mt, L))
    kw.update(_mlp_fields(cfg, mt, L))
    kw["weight_dtypes"] = weight_dtypes_text(weight_dtypes if weight_dtypes is not None else _config_dtypes(cfg))
    return kw


def _config_dict(config, name: str | None) -> tuple[dict, str]:
    """``(config as a dict, model name)`` of a config object, dict or ``config.json`` path; a multimodal config's
    ``text_config`` (keeping the outer ``quantization_config``).

    Raises:
        InputNotFoundError: a path without a ``config.json``. UserError: unreadable JSON, not an object, another type.
    """
    if isinstance(config, (str, Path)):
        p = Path(config)
        if p.is_dir():
            p = p / "config.json"
        if not p.exists():
            raise InputNotFoundError(f"config file {str(p)!r} does not exist")
        try:
            cfg = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise UserError(f"config file {str(p)!r} is not readable JSON ({type(e).__name__}: {e})") from None
        if not isinstance(cfg, dict):
            raise UserError(f"config file {str(p)!r} holds a JSON {type(cfg).__name__}; a config is a JSON object")
        name = name or p.parent.name
    elif isinstance(config, dict):
        cfg = dict(config)
    elif hasattr(config, "to_dict"):
        if hasattr(config, "get_text_config"):
            config = config.get_text_config()
        cfg = config.to_dict()
        for k in _DERIVED_ATTRS:
            if getattr(config, k, None) is not None:
                cfg[k] = getattr(config, k)
        name = name or getattr(config, "name_or_path", "") or cfg.get("model_type", "config")
    else:
        raise UserError(
            f"config must be a transformers config, a dict or a config.json path, got {type(config).__name__}"
        )
    if isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "quantization_config": cfg.get("quantization_config")}
    return cfg, name or cfg.get("_name_or_path") or cfg.get("model_type") or "config"


#: attributes a transformers config object derives (properties or defaults) that ``to_dict()`` may leave out
_DERIVED_ATTRS = (
    "head_dim",
    "layer_types",
    "linear_num_heads",
    "linear_head_dim",
    "linear_conv_kernel_dim",
    "mlp_layer_types",
    "num_key_value_heads",
)


def _attention_fields(cfg: dict, mt: str, h: int, nh: int) -> dict:
    """MLA latent shapes (a config with ``kv_lora_rank``), else GQA heads and head size (``hidden / heads`` when
    ``head_dim`` is absent).

    Raises:
        UserError: a missing or non-positive shape, or no head_dim (hidden_size < num_attention_heads).
    """
    if cfg.get("kv_lora_rank") is not None:
        return dict(
            attention="mla",
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=_count(cfg, "kv_lora_rank", "the MLA latent cache"),
            qk_rope_head_dim=_count(cfg, "qk_rope_head_dim", "the MLA latent cache"),
            qk_nope_head_dim=_count(cfg, "qk_nope_head_dim", "the MLA query/key shapes"),
            v_head_dim=_count(cfg, "v_head_dim", "the MLA value shapes"),
        )
    nkv = _count(cfg, "num_key_value_heads", "the KV-cache shape") if cfg.get("num_key_value_heads") is not None else nh
    hd = _count(cfg, "head_dim", "the attention shapes") if cfg.get("head_dim") is not None else h // nh
    if hd < 1:
        raise UserError(f"config has hidden_size={h} < num_attention_heads={nh}: no head_dim; give head_dim")
    return dict(num_kv_heads=nkv, head_dim=hd, qk_norm=mt.startswith("qwen3"), attention_sinks=mt == "gpt_oss")


def _layer_kind_fields(cfg: dict, mt: str, L: int) -> dict:
    """Sliding-window, linear-attention and full-attention layer counts from ``layer_types`` (none: all full).

    Raises:
        UserError: ``layer_types`` of another length than the layers, or a window / linear-attention size missing.
    """
    lt = _list_of(cfg, "layer_types")
    if not lt:
        return {}
    if len(lt) != L:
        raise UserError(f"config layer_types has {len(lt)} entries but num_hidden_layers={L}")
    n_lin = sum(t in ("linear_attention", "kda", "mamba", "gated_deltanet") for t in lt)
    n_swa = sum(t in ("sliding_attention", "sliding_window") for t in lt)
    kw: dict = dict(n_swa_layers=n_swa, n_linear_layers=n_lin, n_kv_layers=L - n_swa - n_lin)
    if n_swa:
        kw["sliding_window"] = _count(cfg, "sliding_window", "the sliding-window cache size")
    if n_lin:
        kw.update(
            linear_num_heads=_count(cfg, "linear_num_heads", "the linear-attention state", "linear_num_value_heads"),
            linear_head_dim=_count(cfg, "linear_head_dim", "the linear-attention state", "linear_value_head_dim"),
            linear_conv_kernel=_count(cfg, "linear_conv_kernel_dim", "the conv state")
            if cfg.get("linear_conv_kernel_dim")
            else 4,
        )
        if mt != "kimi_linear":
            kw["flags"] = (
                f"UNSURE: linear-attention layers of model_type {mt or '?'} are modelled as KDA "
                "(kimi_linear): their parameter count and state size are approximate"
            )
    return kw


def _mlp_fields(cfg: dict, mt: str, L: int) -> dict:
    """The MLP: routed experts (count, active per token, width, dense layers, shared experts) for a MoE, else the
    dense intermediate size.

    Raises:
        UserError: a width or the active experts per token missing.
    """
    e_key = _first_set(cfg, "n_routed_experts", "num_local_experts", "num_experts")
    if e_key is None:
        return {"intermediate_size": _count(cfg, "intermediate_size", "the MLP width", "ffn_dim", "n_inner")}
    k = _count(cfg, "num_experts_per_tok", "the active experts per token", *_TOPK_ALIASES)
    width_key = "intermediate_size" if mt == "gpt_oss" else "moe_intermediate_size"
    n_dense = _dense_layers(cfg, L)
    s_key = _first_set(cfg, "n_shared_experts", "num_shared_experts")
    kw = dict(
        n_routed_experts=_count(cfg, e_key, "the routed experts"),
        experts_per_token=k,
        moe_intermediate_size=_count(cfg, width_key, "the expert width"),
        n_dense_layers=n_dense,
        n_shared_experts=_count(cfg, s_key, "the shared experts") if s_key else 0,
        expert_bias=mt == "gpt_oss",
        shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size"),
        moe_latent_size=cfg.get("moe_latent_size"),
    )
    if n_dense:
        kw["intermediate_size"] = _count(cfg, "intermediate_size", "the dense MLP layers")
    return kw


_TOPK_ALIASES = ("num_experts_per_token", "experts_per_token", "moe_topk")


def _dense_layers(cfg: dict, L: int) -> int:
    """Dense-MLP layers of a MoE: from ``mlp_layer_types``, ``first_k_dense_replace``, or ``mlp_only_layers`` /
    ``decoder_sparse_step`` (Qwen-MoE: layer i is sparse when (i + 1) % step == 0); 0 when none says."""
    mlt = _list_of(cfg, "mlp_layer_types")
    if mlt:
        return sum(t == "dense" for t in mlt)
    if cfg.get("first_k_dense_replace") is not None:
        return _count(cfg, "first_k_dense_replace", "the dense MLP layers", minimum=0, maximum=L)
    step = _count(cfg, "decoder_sparse_step", "the sparse layers") if cfg.get("decoder_sparse_step") else 1
    only = _list_of(cfg, "mlp_only_layers") or []
    if only or step > 1:
        return sum(1 for i in range(L) if i in only or (i + 1) % step != 0)
    return 0


def _config_dtypes(cfg: dict) -> str:
    """Per-group weight dtypes of a config: ``dtype`` / ``torch_dtype`` (default bfloat16), with an mxfp4
    quantization on the routed experts, or fp8 everywhere but the embedding, LM head, norms and router."""
    base = dtypes.canonical(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    q = cfg.get("quantization_config") or {}
    qm = str(q.get("quant_method", "")).lower() if isinstance(q, dict) else ""
    if qm == "mxfp4":
        return f"default={base};routed_experts=mxfp4"
    if qm == "fp8":
        return f"default=fp8;embed={base};lm_head={base};norms={base};router={base}"
    return f"default={base}"
