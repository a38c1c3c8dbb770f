"""kit.plan.fit: memory fit, parallel layouts, min_gpus, input validation."""

from __future__ import annotations

import pytest

from kit.plan.config import PredictConfig
from kit.plan.fit import memory_fit, min_gpus
from kit.plan.roofline import predict_grid, predict_point
from kit.plan.spec import get_spec


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"context_len": 0}, "context_len"),
        ({"concurrency": -1}, "concurrency"),
        ({"n_gpus": 0}, "n_gpus"),
        ({"kv_dtype": "fp7"}, "fp7"),
        ({"tp": 3, "n_gpus": 8}, "tp"),
        ({"mem_util": 1.5}, "mem_util"),
    ],
)
def test_bad_sizes_and_dtypes(kw, match):
    point = {"context_len": 1024, "concurrency": 1}
    point.update({k: kw.pop(k) for k in list(kw) if k in point})
    with pytest.raises(ValueError, match=match):
        memory_fit("llama-3.1-8b", config=PredictConfig("H100", **kw), **point)


def test_unknown_accelerator_and_model():
    with pytest.raises(KeyError, match="Z100"):
        memory_fit("llama-3.1-8b", config=PredictConfig("Z100"))
    with pytest.raises(KeyError, match="kimi-k3"):  # the message lists the known models
        get_spec("no-such-model")
    with pytest.raises(ValueError, match="group"):
        get_spec("llama-3.1-8b").dtypes("experts_typo=fp8")


def test_kimi_k3_on_8_mi355x_and_b300():
    for acc in ("MI355X", "B300"):
        r = memory_fit("kimi-k3", 1424, 64, PredictConfig(acc, 8))
        assert r.fits and r.weights_gb_total > 1500  # ">1.5 TB of weights"
        assert r.max_concurrency >= 64 and r.kv_tokens_free > 1e6
    a = memory_fit("kimi-k3", 1424, config=PredictConfig("MI355X", 8))
    b = memory_fit("kimi-k3", 1424, config=PredictConfig("B300", 8))
    assert a.max_concurrency > b.max_concurrency  # 288 GB vs 268 GB usable
    fp8 = memory_fit("kimi-k3", 1424, config=PredictConfig("B300", 8, kv_dtype="fp8"))
    assert fp8.kv_tokens_free == pytest.approx(2 * b.kv_tokens_free)


def test_min_gpus():
    assert min_gpus("kimi-k3", config=PredictConfig("B200")) == 16  # 8 x 180 GB cannot hold ~1.54 TB
    assert min_gpus("kimi-k3", config=PredictConfig("MI355X")) == 8
    assert min_gpus("llama-3.1-8b", config=PredictConfig("H100")) == 1
    assert not memory_fit("kimi-k3", config=PredictConfig("B200", 8)).fits


def test_max_context_at_concurrency_consistent():
    r = memory_fit("llama-3.1-70b", concurrency=32, config=PredictConfig("H200", 8))
    again = memory_fit("llama-3.1-70b", r.max_context, 32, PredictConfig("H200", 8))
    assert again.fits
    assert not memory_fit("llama-3.1-70b", r.max_context + 100, 32, PredictConfig("H200", 8)).fits


def test_max_context_capped_at_model_limit():
    r = memory_fit("tiny-llama", concurrency=1, config=PredictConfig("H200"))
    assert r.max_context == get_spec("tiny-llama").max_position_embeddings


def test_context_beyond_model_positions_rejected_everywhere(capsys):
    from kit.cli import main

    msg = r"context_len=10,000,000 exceeds llama-3\.1-8b's max_position_embeddings=131,072"
    with pytest.raises(ValueError, match=msg):
        memory_fit("llama-3.1-8b", 10_000_000, 1, PredictConfig("B300"))
    with pytest.raises(ValueError, match=msg):
        predict_point("llama-3.1-8b", 1, 10_000_000, PredictConfig("B300"))
    with pytest.raises(ValueError, match=msg):
        predict_grid("llama-3.1-8b", (1,), (10_000_000,), PredictConfig("B300"))
    with pytest.raises(ValueError, match=msg):
        min_gpus("llama-3.1-8b", 10_000_000, 1, PredictConfig("B300"))
    assert memory_fit("llama-3.1-8b", 131_072, 1, PredictConfig("B300")).context_len == 131_072
    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "b300", "--context", "10000000"]) == 2
    captured = capsys.readouterr()
    assert "131,072" in captured.err and "max users" not in captured.out


def test_parallel_layout_messages():
    with pytest.raises(ValueError, match=r"tp=3 does not divide n_gpus=8.*pp = n_gpus // tp.*\(1, 2, 4, 8\)"):
        memory_fit("llama-3.1-8b", config=PredictConfig("B300", 8, tp=3))
    with pytest.raises(ValueError, match=r"pp=3 does not divide n_gpus=8.*tp = n_gpus // pp"):
        memory_fit("llama-3.1-8b", config=PredictConfig("B300", 8, pp=3))
    with pytest.raises(ValueError, match=r"tp=2 × pp=2 must equal n_gpus=8"):  # both given: unchanged
        memory_fit("llama-3.1-8b", config=PredictConfig("B300", 8, tp=2, pp=2))
    with pytest.raises(ValueError, match="expert parallelism applies only to MoE models.*llama-3.1-8b is dense"):
        memory_fit("llama-3.1-8b", config=PredictConfig("B300", ep=4))
    assert memory_fit("llama-3.1-8b", config=PredictConfig("B300", ep=1)).ep == 1
    assert memory_fit("kimi-k3", config=PredictConfig("B300", 8, ep=4)).ep == 4  # MoE: still allowed
    # 8 KV heads over 3 ranks: warned (engines reject it), not refused
    with pytest.warns(UserWarning, match=r"8 KV heads \(GQA\) neither divide nor are divisible by tp=3"):
        r = memory_fit("llama-3.1-8b", config=PredictConfig("B300", 3))
    assert r.tp == 3
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory_fit("llama-3.1-70b", config=PredictConfig("B300", 16))  # 8 kv heads, tp 8 × pp 2: even split
        memory_fit("llama-3.1-70b", config=PredictConfig("B300", 16, tp=16, pp=1))  # tp a multiple of kv heads: fine


def test_memory_parts_sum_to_the_gpu():
    r = memory_fit("kimi-k3", 1424, config=PredictConfig("MI355X", 8))
    parts = r.memory_parts()
    assert list(parts) == ["weights", "reserve", "kv_at_max_users", "unused"]
    assert sum(parts.values()) == pytest.approx(r.mem_gb_per_gpu)
    per_seq = 1424 * r.kv_bytes_per_token_per_gpu + r.state_bytes_per_seq_per_gpu
    assert parts["kv_at_max_users"] == pytest.approx(r.max_concurrency * per_seq / 1e9)
    assert parts["unused"] >= r.mem_gb_per_gpu * 0.1 * 0.999  # at least the 1 - mem_util share
    no_context = memory_fit("kimi-k3", config=PredictConfig("MI355X", 8))
    assert no_context.memory_parts()["kv_at_max_users"] == 0.0  # no context: no users
