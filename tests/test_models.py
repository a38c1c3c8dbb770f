"""Presets build real transformers architectures offline; local checkpoints load."""

import re

import pytest
import torch

from kit import models


@pytest.mark.parametrize("name,cls", [("tiny-llama", "LlamaForCausalLM"), ("tiny-deepseek", "DeepseekV3ForCausalLM")])
def test_cpu_presets_build_and_run(name, cls):
    m = models.build_model(name, "float32", "cpu")
    assert type(m).__name__ == cls and not m.training
    with torch.inference_mode():
        out = m(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert out.shape == (1, 3, m.config.vocab_size) and torch.isfinite(out).all()


def test_tiny_deepseek_is_mla_moe():
    cfg = models.get_config("tiny-deepseek")
    assert cfg.model_type == "deepseek_v3" and cfg.kv_lora_rank > 0 and cfg.n_routed_experts > cfg.num_experts_per_tok


@pytest.mark.parametrize(
    "name,published_b",
    [
        ("llama-3.2-1b", 1.24),
        ("llama-3.1-8b", 8.03),
        ("llama-3.1-70b", 70.55),
        ("qwen3-32b", 32.76),
        ("deepseek-v3", 671.03),
        ("kimi-k2", 1026.41),
    ],
)
def test_full_size_configs_have_published_parameter_counts(name, published_b):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(models.get_config(name))
    assert models.count_params(m) / 1e9 == pytest.approx(published_b, rel=0.01)


def test_bf16_build_and_param_bytes():
    m = models.build_model("tiny-llama", "bf16", "cpu")
    assert next(m.parameters()).dtype is torch.bfloat16
    assert models.param_bytes(m) >= models.count_params(m) * 2


def test_unknown_preset_lists_allowed(tmp_path):
    with pytest.raises(ValueError, match="unknown model preset 'gpt-9'.*tiny-llama"):
        models.get_config("gpt-9")
    with pytest.raises(ValueError, match="is a directory without config.json; give a preset .*tiny-llama"):
        models.get_config(str(tmp_path))
    (tmp_path / "weights.bin").write_text("x")
    file_or_empty = [(str(tmp_path / "weights.bin"), "is a file, not a checkpoint directory"), ("", "is empty")]
    for model, what in file_or_empty:  # not "holds no config.json": what was given, and what is allowed
        with pytest.raises(ValueError, match=re.escape(f"model={model!r} {what}; give a preset (")):
            models.get_config(model)


def test_local_checkpoint_round_trip(tmp_path):
    m = models.build_model("tiny-llama", "float32", "cpu", seed=3)
    path = models.save_checkpoint(m, tmp_path / "ckpt")
    assert (path / "config.json").exists() and list(path.glob("*.safetensors"))
    loaded = models.build_model(str(path), "float32", "cpu")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        assert torch.allclose(m(input_ids=ids).logits, loaded(input_ids=ids).logits, atol=1e-5)
    cfg = models.get_config(str(path))
    assert cfg.num_hidden_layers == 4
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        models.load_checkpoint(tmp_path / "noweights")


def test_preset_table():
    t = models.preset_table()
    assert {"tiny-llama", "llama-3.1-8b", "deepseek-v3", "kimi-k2"} <= set(t.preset)


def test_shard_bytes_without_tensor_parallelism_is_every_byte_whole():
    """No DTensor: nothing sharded, every byte held whole (= param_bytes, tied weights once). The sharded branch is
    checked on real ranks: tests/measure/test_tp.py (TP=2 weights_gb equals the single-process figure)."""
    m = models.build_model("tiny-llama")
    assert models.shard_bytes(m) == (0, models.param_bytes(m)) and models.param_bytes(m) == 19_473_536
