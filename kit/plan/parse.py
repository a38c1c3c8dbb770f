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


def _count(cfg: dict, key: str, why: str, *aliases: str) -> int:
    """A shape count of the config (heads, layers, sizes): present and a whole number >= 1.

    Raises:
        UserError: missing, not a whole number, or < 1 (a config with 0 heads would divide by zero later).
    """
    v = _need(cfg, key, why, *aliases)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 1:
        raise UserError(f"config has {key}={v!r}; the planner needs a whole number >= 1 for {why}")
    return int(v)


def arch_fields(config, name: str | None = None, weight_dtypes: str | dict | None = None) -> dict:
    """The :class:`kit.plan.spec.ArchSpec` keyword arguments of a ``transformers`` config object, a dict, or a path
    to ``config.json`` (or a directory holding one). See :func:`kit.plan.spec.spec_from_config` for the families
    understood.

    Raises:
        UserError: a field the planner needs is missing (the message names it), or ``config`` is of another type.
        InputNotFoundError: a path without a ``config.json``.
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
        for k in (
            "head_dim",
            "layer_types",
            "linear_num_heads",
            "linear_head_dim",
            "linear_conv_kernel_dim",
            "mlp_layer_types",
            "num_key_value_heads",
        ):
            if getattr(config, k, None) is not None:
                cfg[k] = getattr(config, k)
        name = name or getattr(config, "name_or_path", "") or cfg.get("model_type", "config")
    else:
        raise UserError(
            f"config must be a transformers config, a dict or a config.json path, got {type(config).__name__}"
        )
    if isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "quantization_config": cfg.get("quantization_config")}
    name = name or cfg.get("_name_or_path") or cfg.get("model_type") or "config"
    mt = str(cfg.get("model_type", ""))
    h = _count(cfg, "hidden_size", "every weight shape", "d_model", "n_embd")
    L = _count(cfg, "num_hidden_layers", "the layer count", "n_layer", "num_layers")
    nh = _count(cfg, "num_attention_heads", "the attention shapes", "n_head")
    V = _count(cfg, "vocab_size", "the embedding size")
    mla = cfg.get("kv_lora_rank") is not None
    kw: dict = dict(
        name=str(name),
        hidden_size=h,
        num_layers=L,
        vocab_size=V,
        num_attention_heads=nh,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        source=f"config ({mt or 'dict'})",
    )
    if mla:
        kw.update(
            attention="mla",
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=_count(cfg, "kv_lora_rank", "the MLA latent cache"),
            qk_rope_head_dim=_count(cfg, "qk_rope_head_dim", "the MLA latent cache"),
            qk_nope_head_dim=_count(cfg, "qk_nope_head_dim", "the MLA query/key shapes"),
            v_head_dim=_count(cfg, "v_head_dim", "the MLA value shapes"),
        )
    else:
        nkv = (
            _count(cfg, "num_key_value_heads", "the KV-cache shape")
            if cfg.get("num_key_value_heads") is not None
            else nh
        )
        hd = _count(cfg, "head_dim", "the attention shapes") if cfg.get("head_dim") is not None else h // nh
        if hd < 1:
            raise UserError(f"config has hidden_size={h} < num_attention_heads={nh}: no head_dim; give head_dim")
        kw.update(
            num_kv_heads=nkv,
            head_dim=hd,
            qk_norm=mt.startswith("qwen3"),
            attention_sinks=mt == "gpt_oss",
        )
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
            kw.update(
                linear_num_heads=int(
                    _need(cfg, "linear_num_heads", "the linear-attention state", "linear_num_value_heads")
                ),
                linear_head_dim=int(
                    _need(cfg, "linear_head_dim", "the linear-attention state", "linear_value_head_dim")
                ),
                linear_conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4),
            )
            if mt != "kimi_linear":
                kw["flags"] = (
                    f"UNSURE: linear-attention layers of model_type {mt or '?'} are modelled as KDA "
                    "(kimi_linear): their parameter count and state size are approximate"
                )
    # MLP / MoE
    E = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    if E:
        k = int(
            _need(
                cfg,
                "num_experts_per_tok",
                "the active experts per token",
                "num_experts_per_token",
                "experts_per_token",
                "moe_topk",
            )
        )
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
        kw.update(
            n_routed_experts=int(E),
            experts_per_token=k,
            moe_intermediate_size=mi,
            n_dense_layers=n_dense,
            n_shared_experts=int(cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0),
            expert_bias=mt == "gpt_oss",
            shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size"),
            moe_latent_size=cfg.get("moe_latent_size"),
        )
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
    kw["weight_dtypes"] = weight_dtypes_text(weight_dtypes)
    return kw
