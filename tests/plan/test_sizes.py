"""kit.plan.sizes: KV bytes per token (case P1), constant state per sequence, weight bytes and their sharding."""

from __future__ import annotations

import pytest

from kit.plan.sizes import check_pos_int, kv_bytes_per_token, shard_fraction, state_bytes_per_seq, weight_bytes
from kit.plan.spec import get_spec, list_models, model_table


def _table():
    return model_table()


def test_p1_llama_31_8b_gqa():
    s = get_spec("llama-3.1-8b")
    assert kv_bytes_per_token(s, "bfloat16") == 131_072
    assert 131_072 * 128 * 1024 == 16 * 2**30  # 16 GiB at 128k tokens
    assert kv_bytes_per_token(s, "fp8") == 65_536


def test_p1_deepseek_v3_mla_not_mha():
    s = get_spec("deepseek-v3")
    assert kv_bytes_per_token(s, "bfloat16") == 70_272
    assert kv_bytes_per_token(s, "fp8") == 35_136
    assert kv_bytes_per_token(s, "bf16") not in (124_928, 4_997_120)  # the wrong answers seen in the wild


@pytest.mark.parametrize("key", list_models())
def test_kv_bytes_and_state_match_models_csv_exactly(key):
    row = _table().set_index("key").loc[key]
    s = get_spec(key)
    assert kv_bytes_per_token(s, "bfloat16") == int(row["kv_bytes_per_token_bf16"])
    assert kv_bytes_per_token(s, "fp8") == int(row["kv_bytes_per_token_fp8"])
    assert state_bytes_per_seq(s, 10**9, "bfloat16", "bfloat16") == int(row["per_seq_const_state_bytes_bf16"])


def test_kimi_k3_fp32_state_matches_note():
    s = get_spec("kimi-k3")
    assert state_bytes_per_seq(s, 10**6, "bfloat16", "float32") == 449_372_160
    assert "UNSURE" in s.flags


def test_gqa_kv_split_by_heads_mla_replicated():
    l70 = get_spec("llama-3.1-70b")  # 8 kv heads
    full = kv_bytes_per_token(l70, "bfloat16", tp=1)
    assert kv_bytes_per_token(l70, "bfloat16", tp=8) == full / 8
    assert kv_bytes_per_token(l70, "bfloat16", tp=16) == full / 8  # one head per rank, replicated
    ds = get_spec("deepseek-v3")
    assert kv_bytes_per_token(ds, "bfloat16", tp=8) == kv_bytes_per_token(ds, "bfloat16", tp=1) == 70_272


def test_weights_shard_over_gpus():
    s = get_spec("llama-3.1-70b")
    one = sum(weight_bytes(s, tp=1).values())
    eight = sum(weight_bytes(s, tp=8).values())
    assert one == pytest.approx(70.55e9 * 2, rel=0.01)
    assert eight == pytest.approx(one / 8, rel=0.01)


def test_check_pos_int_and_shard_fractions():
    from kit.errors import UserError

    assert check_pos_int("tp", 4.0) == 4
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(UserError, match="tp="):
            check_pos_int("tp", bad)
    ds, l70 = get_spec("deepseek-v3"), get_spec("llama-3.1-70b")
    assert shard_fraction("rep", ds, 8, 8) == 1.0 and shard_fraction("tp", ds, 8, 8) == 1 / 8
    assert shard_fraction("experts", ds, 8, 8) == pytest.approx(32 / 256)  # 256 experts over 8 EP ranks
    assert shard_fraction("experts", ds, 8, 4) == pytest.approx(64 / 256 / 2)  # EP4, then TP2 within an expert
    assert shard_fraction("kv", l70, 16, 1) == 1 / 8  # 8 kv heads over 16 ranks: one (replicated) head each
    with pytest.raises(UserError, match="ep=3 must divide tp=8"):
        weight_bytes(ds, tp=8, ep=3)
