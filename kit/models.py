"""Model presets: real ``transformers`` architectures built from configs with random weights, on any device.

Nothing here downloads: presets are configs written out below (shapes from each model's published
``config.json`` on the Hugging Face Hub, as recorded in ``../shared/reference/models.csv``), built with
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

from kit.errors import UserError
from kit import dtypes


@dataclass(frozen=True)
class Preset:
    """A named model: ``model_type`` + config fields for ``transformers.AutoConfig.for_model``."""

    name: str
    model_type: str
    fields: dict
    description: str
    source: str
    cpu_ok: bool = False


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_theta": 500000.0}

_DEEPSEEK_V3 = dict(
    hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
    num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
    qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1,
    first_k_dense_replace=3, n_group=8, topk_group=4, routed_scaling_factor=2.5, norm_topk_prob=True,
    vocab_size=129280, max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_parameters={"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0})

PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("tiny-llama", "llama", dict(
        hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        head_dim=32, vocab_size=4096, max_position_embeddings=16384, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "tiny Llama (GQA 8/2 heads, 4 layers, ~4.9M params); runs a sweep on a laptop CPU in seconds",
        "kit's own (Llama-3 architecture, scaled down)", cpu_ok=True),
    Preset("llama-3.2-1b", "llama", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={**_LLAMA3_ROPE, "factor": 32.0}),
        "Llama-3.2-1B shape (1.24B params)", "HF meta-llama/Llama-3.2-1B config.json", cpu_ok=True),
    Preset("tiny-deepseek", "deepseek_v3", dict(
        hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32,
        v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, vocab_size=4096,
        max_position_embeddings=16384, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "tiny DeepSeek-V3 architecture: MLA attention + MoE (8 routed experts, top-2, 1 shared)",
        "kit's own (DeepSeek-V3 architecture, scaled down)", cpu_ok=True),
    Preset("llama-3.1-8b", "llama", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=False, rope_parameters=dict(_LLAMA3_ROPE)),
        "Llama-3.1-8B (8.03B params)", "HF meta-llama/Llama-3.1-8B config.json"),
    Preset("llama-3.1-70b", "llama", dict(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=False, rope_parameters=dict(_LLAMA3_ROPE)),
        "Llama-3.1-70B (70.6B params)", "HF meta-llama/Llama-3.1-70B config.json"),
    Preset("qwen3-32b", "qwen3", dict(
        hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        "Qwen3-32B (32.8B params, QK-norm)", "HF Qwen/Qwen3-32B config.json"),
    Preset("deepseek-v3", "deepseek_v3", dict(_DEEPSEEK_V3),
        "DeepSeek-V3 (671B total / 37B active; MLA + MoE)", "HF deepseek-ai/DeepSeek-V3 config.json"),
    # Kimi K2 is the DeepSeek-V3 architecture with half the heads, 384 experts and one dense layer
    Preset("kimi-k2", "deepseek_v3", {**_DEEPSEEK_V3, **dict(
        num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384, first_k_dense_replace=1, n_group=1,
        topk_group=1, routed_scaling_factor=2.827, vocab_size=163840, max_position_embeddings=131072,
        rope_parameters={**_DEEPSEEK_V3["rope_parameters"], "factor": 32.0, "beta_fast": 1.0,
                         "rope_theta": 50000.0})},
        "Kimi K2 (1.03T total / 32.9B active; DeepSeek-V3 architecture)", "HF moonshotai/Kimi-K2-Instruct config.json"),
]}
DEFAULT_PRESET = "tiny-llama"


def is_checkpoint_dir(model: str | os.PathLike) -> bool:
    """True if ``model`` is a local directory holding a ``config.json``."""
    p = Path(model)
    return p.is_dir() and (p / "config.json").exists()


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
        raise UserError(f"checkpoint {str(path)!r} needs its own Python code (config.json auto_map: "
                        f"{sorted(auto_map)}); the kit does not run it unless you pass --trust-remote-code "
                        "(trust_remote_code=True) after reading that code")


def get_config(model: str, trust_remote_code: bool = False):
    """The ``transformers`` config of a preset name or a local checkpoint directory.

    Args:
        trust_remote_code: allow a checkpoint's own Python code (see :func:`check_custom_code`).

    Raises:
        UserError: unknown preset and not a checkpoint directory (lists the presets); a checkpoint that needs
            custom code without ``trust_remote_code``; a config.json transformers cannot read.
    """
    from transformers import AutoConfig

    if model in PRESETS:
        p = PRESETS[model]
        cfg = AutoConfig.for_model(p.model_type, **copy.deepcopy(p.fields))
        cfg.name_or_path = p.name
        return cfg
    if is_checkpoint_dir(model):
        check_custom_code(model, trust_remote_code)
        try:
            return AutoConfig.from_pretrained(str(model), local_files_only=True, trust_remote_code=trust_remote_code)
        except (ValueError, KeyError, OSError) as e:
            raise UserError(f"cannot read the config of checkpoint {str(model)!r}: {str(e).splitlines()[0]}") from e
    if Path(model).exists():
        raise UserError(f"model={model!r} is a path but holds no config.json; a checkpoint directory needs "
                         "config.json + *.safetensors")
    if any(sep in str(model) for sep in ("/", "\\")) or str(model).startswith((".", "~")):
        raise UserError(f"model={model!r} looks like a checkpoint path but it does not exist; give an existing "
                         f"directory (config.json + *.safetensors) or a preset: {sorted(PRESETS)}")
    raise UserError(f"unknown model preset {model!r}; allowed presets: {sorted(PRESETS)}, "
                     "or a local checkpoint directory (config.json + *.safetensors)")


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


def build_model(model: str = DEFAULT_PRESET, dtype: str | torch.dtype = "float32", device: str = "cpu",
                seed: int = 0, trust_remote_code: bool = False) -> torch.nn.Module:
    """Build a preset with random weights (or load a local checkpoint) on ``device`` in ``dtype``, eval mode.

    Args:
        model: preset name (see ``PRESETS``) or a local checkpoint directory.
        dtype: float32 | bfloat16 | float16 (aliases fp32, bf16, fp16).
        device: torch device string ("cpu", "cuda", "cuda:1"); ROCm uses "cuda".
        seed: seed for the random weights.
        trust_remote_code: allow a checkpoint's own Python code (see :func:`check_custom_code`).

    Returns:
        a ``transformers`` causal-LM module with ``.config``; attention runs with the "sdpa" implementation.

    Raises:
        ValueError: unknown preset/dtype.
    """
    from transformers import AutoModelForCausalLM

    dt = dtypes.to_torch(dtype)
    if is_checkpoint_dir(model):
        return load_checkpoint(model, dt, device, trust_remote_code)
    cfg = get_config(model)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dt, attn_implementation="sdpa")
    return m.eval()


def load_checkpoint(path: str | os.PathLike, dtype: str | torch.dtype = "bfloat16", device: str = "cpu",
                    trust_remote_code: bool = False):
    """Load a causal LM from a local directory (config.json + safetensors); never touches the network.

    Raises:
        UserError: the directory has no config.json or no weights, or needs custom code without
            ``trust_remote_code`` (:func:`check_custom_code`).
    """
    from transformers import AutoModelForCausalLM

    p = Path(path)
    if not is_checkpoint_dir(p):
        raise UserError(f"checkpoint path {str(p)!r} is not a directory with config.json")
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise UserError(f"checkpoint directory {str(p)!r} has config.json but no *.safetensors weights")
    check_custom_code(p, trust_remote_code)
    m = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtypes.to_torch(dtype), device_map=str(torch.device(device)),
                                             local_files_only=True, attn_implementation="sdpa",
                                             trust_remote_code=trust_remote_code)
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
        rows.append({"preset": p.name, "model_type": p.model_type, "layers": f["num_hidden_layers"],
                     "hidden": f["hidden_size"], "heads": f["num_attention_heads"],
                     "kv_heads": f.get("num_key_value_heads"), "max_positions": f["max_position_embeddings"],
                     "mla": "kv_lora_rank" in f, "moe_experts": f.get("n_routed_experts"),
                     "cpu_ok": p.cpu_ok, "description": p.description, "source": p.source})
    return pd.DataFrame(rows)


__all__ = ["PRESETS", "DEFAULT_PRESET", "Preset", "get_config", "build_model", "load_checkpoint",
           "save_checkpoint", "count_params", "param_bytes", "max_positions", "preset_table"]
