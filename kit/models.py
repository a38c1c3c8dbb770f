"""Model presets: real ``transformers`` architectures built from configs with random weights, on any device.

Nothing here downloads: presets are configs written out below (shapes from each model's published
``config.json`` on the Hugging Face Hub, as recorded in ``kit/data/models.csv`` with their sources), built with
``AutoModelForCausalLM.from_config`` directly on the target device and dtype. A real checkpoint is loaded from a
local directory (``config.json`` + ``*.safetensors``) with ``local_files_only=True``.

Presets (``PRESETS``):

=================  ==================================================  =========================
name               architecture                                         intended for
=================  ==================================================  =========================
tiny-llama         Llama, 4 layers, hidden 256, GQA 8 q / 2 kv heads    CPU, CI, tutorials (default)
llama-3.2-1b       Llama-3.2-1B shape (16 layers, hidden 2048, GQA)     CPU (slow) or GPU
tiny-deepseek      DeepSeek-V3 architecture: MLA + MoE (8 experts,      CPU: MLA/MoE code paths
                   top-2, 1 shared), 4 layers
llama-3.1-8b       Llama-3.1-8B                                         GPU
llama-3.1-70b      Llama-3.1-70B                                        GPU (>= 2 x 80 GB in bf16)
qwen3-32b          Qwen3-32B                                            GPU
deepseek-v3        DeepSeek-V3 (671B)                                   planner / multi-GPU only
kimi-k2            Kimi K2 (1.03T, DeepSeek-V3 architecture)            planner / multi-GPU only
=================  ==================================================  =========================
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from kit import dtypes
from kit._io import data_path
from kit.errors import UserError


@dataclass(frozen=True)
class Preset:
    """A named model: ``model_type`` + config fields for ``transformers.AutoConfig.for_model``."""

    name: str
    model_type: str
    fields: dict
    description: str
    source: str
    cpu_ok: bool = False


def _merged(base: dict, over: dict) -> dict:
    """``base`` with ``over`` applied; a dict value (e.g. ``rope_parameters``) is merged key by key."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _load_presets() -> dict[str, Preset]:
    """The presets of ``kit/data/presets.json`` (a preset may name a ``base`` preset it overrides)."""
    raw = {k: v for k, v in json.loads(data_path("presets.json").read_text()).items() if not k.startswith("_")}
    out: dict[str, Preset] = {}
    for name, d in raw.items():
        base = out[d["base"]] if "base" in d else None
        fields = _merged(base.fields, d["fields"]) if base else d["fields"]
        out[name] = Preset(
            name,
            base.model_type if base else d["model_type"],
            fields,
            d["description"],
            d["source"],
            bool(d.get("cpu_ok", False)),
        )
    return out


#: name → :class:`Preset`, from ``kit/data/presets.json`` (each with its source: a published config.json, or the
#: kit's own scaled-down architecture for the CPU presets)
PRESETS: dict[str, Preset] = _load_presets()
DEFAULT_PRESET = "tiny-llama"


def is_checkpoint_dir(model: str | os.PathLike) -> bool:
    """True if ``model`` is a local directory holding a ``config.json``."""
    p = Path(model)
    return p.is_dir() and (p / "config.json").exists()


def has_weights(path: str | os.PathLike) -> bool:
    """True if the checkpoint directory ``path`` holds weight files (``*.safetensors`` or ``*.bin``)."""
    p = Path(path)
    return any(p.glob("*.safetensors")) or any(p.glob("*.bin"))


def check_custom_code(path: str | os.PathLike, trust_remote_code: bool = False) -> None:
    """Refuse a checkpoint that needs its own Python code (``auto_map`` in config.json) unless the user trusts it.

    transformers would otherwise stop and ask "run the custom code? [y/N]" in the middle of a run, and a ``y``
    runs the directory's Python. The kit never offers that: it passes ``trust_remote_code`` explicitly everywhere.

    Raises:
        UserError: the checkpoint ships custom code and ``trust_remote_code`` is False.
    """
    cfg_file = Path(path) / "config.json"
    try:
        auto_map = json.loads(cfg_file.read_text()).get("auto_map")
    except (OSError, ValueError, AttributeError):
        return  # unreadable configs are reported by transformers' own loader below
    if auto_map and not trust_remote_code:
        raise UserError(
            f"checkpoint {str(path)!r} needs its own Python code (config.json auto_map: "
            f"{sorted(auto_map)}); the kit does not run it unless you pass --trust-remote-code "
            "(trust_remote_code=True) after reading that code"
        )


def override_positions(cfg, max_position_embeddings: int | None, checkpoint: bool, extend_checkpoint: bool = False):
    """Set ``cfg.max_position_embeddings`` (the longest sequence the kit lets a point use) to the requested value.

    For a random-weight preset this is a free override: RoPE computes its angles from the position ids, so positions
    past the preset's limit run, and speed and memory do not depend on the limit. A real checkpoint was trained up
    to its limit, so a larger value is refused unless ``extend_checkpoint`` (logits past it are extrapolation).

    Raises:
        UserError: the value is not an integer >= 1, or it extends a real checkpoint without ``extend_checkpoint``.
    """
    if max_position_embeddings is None:
        return cfg
    v = max_position_embeddings
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise UserError(f"max_position_embeddings={v!r} must be an integer >= 1")
    have = max_positions(cfg)
    if checkpoint and v > have and not extend_checkpoint:
        raise UserError(
            f"max_position_embeddings={v} is past this checkpoint's trained limit of {have} positions; "
            "pass extend_checkpoint_positions=True (--extend-positions) to run it anyway (logits past the "
            "limit are extrapolation)"
        )
    cfg.max_position_embeddings = v
    return cfg


def get_config(
    model: str,
    trust_remote_code: bool = False,
    max_position_embeddings: int | None = None,
    extend_checkpoint_positions: bool = False,
):
    """The ``transformers`` config of a preset name or a local checkpoint directory.

    Args:
        trust_remote_code: allow a checkpoint's own Python code (see :func:`check_custom_code`).
        max_position_embeddings: override the position limit (:func:`override_positions`): free for a preset,
            refused past a real checkpoint's limit unless ``extend_checkpoint_positions``.

    Raises:
        UserError: unknown preset and not a checkpoint directory (lists the presets); a checkpoint that needs
            custom code without ``trust_remote_code``; a config.json transformers cannot read; a refused override.
    """
    from transformers import AutoConfig

    if model in PRESETS:
        p = PRESETS[model]
        cfg = AutoConfig.for_model(p.model_type, **copy.deepcopy(p.fields))
        cfg.name_or_path = p.name
        return override_positions(cfg, max_position_embeddings, False)
    if is_checkpoint_dir(model):
        check_custom_code(model, trust_remote_code)
        try:
            cfg = AutoConfig.from_pretrained(str(model), local_files_only=True, trust_remote_code=trust_remote_code)
        except (ValueError, KeyError, OSError) as e:
            raise UserError(f"cannot read the config of checkpoint {str(model)!r}: {str(e).splitlines()[0]}") from e
        return override_positions(cfg, max_position_embeddings, True, extend_checkpoint_positions)
    allowed = f"give a preset ({', '.join(sorted(PRESETS))}) or a checkpoint directory (config.json + *.safetensors)"
    if not str(model).strip():
        raise UserError(f"model={model!r} is empty; {allowed}")
    if Path(model).exists():
        what = "a directory without config.json" if Path(model).is_dir() else "a file, not a checkpoint directory"
        raise UserError(f"model={model!r} is {what}; {allowed}")
    if any(sep in str(model) for sep in ("/", "\\")) or str(model).startswith((".", "~")):
        raise UserError(
            f"model={model!r} looks like a checkpoint path but it does not exist; give an existing "
            f"directory (config.json + *.safetensors) or a preset: {sorted(PRESETS)}"
        )
    raise UserError(
        f"unknown model preset {model!r}; allowed presets: {sorted(PRESETS)}, "
        "or a local checkpoint directory (config.json + *.safetensors)"
    )


def max_positions(config) -> int:
    """Longest sequence the config supports (``max_position_embeddings``)."""
    return int(getattr(config, "max_position_embeddings", 0) or 0)


def count_params(model: torch.nn.Module) -> int:
    """Number of parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def param_bytes(model: torch.nn.Module) -> int:
    """Bytes of all parameters and buffers (tied weights once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def shard_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """This process's parameter and buffer bytes under tensor parallelism (tied weights once):
    ``(sharded, whole)``. ``sharded``: the local shards of tensors split over the ranks (a ``DTensor`` with a
    ``Shard`` placement, as transformers' ``tp_plan`` makes them; its ``numel()`` is the *global* size, its
    ``to_local()`` what this rank holds). ``whole``: tensors every rank holds in full (plain tensors, replicated
    DTensors: norms, rotary buffers). The model's bytes are Σ over ranks of ``sharded`` + ``whole`` once; without
    tensor parallelism ``sharded`` is 0 and ``whole`` is :func:`param_bytes`."""
    seen, sharded, whole = set(), 0, 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        placements = getattr(t, "placements", None)  # torch.distributed.tensor.DTensor
        if placements is not None and any(p.is_shard() for p in placements):
            local = t.to_local()
            sharded += local.numel() * local.element_size()
        else:
            whole += t.numel() * t.element_size()
    return sharded, whole


def build_model(
    model: str = DEFAULT_PRESET,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    seed: int = 0,
    trust_remote_code: bool = False,
    max_position_embeddings: int | None = None,
    extend_checkpoint_positions: bool = False,
) -> torch.nn.Module:
    """Build a preset with random weights (or load a local checkpoint) on ``device`` in ``dtype``, eval mode.

    Args:
        model: preset name (see ``PRESETS``) or a local checkpoint directory.
        dtype: float32 | bfloat16 | float16 (aliases fp32, bf16, fp16).
        device: torch device string ("cpu", "cuda", "cuda:1"); ROCm uses "cuda".
        seed: seed for the random weights.
        trust_remote_code: allow a checkpoint's own Python code (see :func:`check_custom_code`).
        max_position_embeddings: override the position limit (:func:`override_positions`; e.g. a KV-cache
            stress past a preset's 16,384); past a real checkpoint's limit only with ``extend_checkpoint_positions``.

    Returns:
        a ``transformers`` causal-LM module with ``.config``; attention runs with the "sdpa" implementation.

    Raises:
        ValueError: unknown preset/dtype; a refused position override.
    """
    from transformers import AutoModelForCausalLM

    dt = dtypes.to_torch(dtype)
    if is_checkpoint_dir(model):
        if max_position_embeddings is None:
            return load_checkpoint(model, dt, device, trust_remote_code)
        cfg = get_config(model, trust_remote_code, max_position_embeddings, extend_checkpoint_positions)
        return load_checkpoint(model, dt, device, trust_remote_code, config=cfg)
    cfg = get_config(model, max_position_embeddings=max_position_embeddings)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dt, attn_implementation="sdpa")
    return m.eval()


def load_checkpoint(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "bfloat16",
    device: str = "cpu",
    trust_remote_code: bool = False,
    config=None,
):
    """Load a causal LM from a local directory (config.json + safetensors); never touches the network.
    ``config``: a config to use instead of the directory's (e.g. with a position override from :func:`get_config`).

    Raises:
        UserError: the directory has no config.json or no weights, or needs custom code without
            ``trust_remote_code`` (:func:`check_custom_code`).
    """
    from transformers import AutoModelForCausalLM

    p = Path(path)
    if not is_checkpoint_dir(p):
        raise UserError(f"checkpoint path {str(p)!r} is not a directory with config.json")
    if not has_weights(p):
        raise UserError(f"checkpoint directory {str(p)!r} has config.json but no *.safetensors weights")
    check_custom_code(p, trust_remote_code)
    m = AutoModelForCausalLM.from_pretrained(
        str(p),
        dtype=dtypes.to_torch(dtype),
        device_map=str(torch.device(device)),
        local_files_only=True,
        attn_implementation="sdpa",
        trust_remote_code=trust_remote_code,
        **({"config": config} if config is not None else {}),
    )
    return m.eval()


def save_checkpoint(model: torch.nn.Module, path: str | os.PathLike) -> Path:
    """Save a model as config.json + model.safetensors (for tests and offline hand-off)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(p), safe_serialization=True)
    return p


def preset_table():
    """Presets as a DataFrame: name, architecture, layers, hidden, heads, kv heads, params (B), max positions."""
    import pandas as pd

    rows = []
    for p in PRESETS.values():
        f = p.fields
        rows.append(
            {
                "preset": p.name,
                "model_type": p.model_type,
                "layers": f["num_hidden_layers"],
                "hidden": f["hidden_size"],
                "heads": f["num_attention_heads"],
                "kv_heads": f.get("num_key_value_heads"),
                "max_positions": f["max_position_embeddings"],
                "mla": "kv_lora_rank" in f,
                "moe_experts": f.get("n_routed_experts"),
                "cpu_ok": p.cpu_ok,
                "description": p.description,
                "source": p.source,
            }
        )
    return pd.DataFrame(rows)
