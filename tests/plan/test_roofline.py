"""kit.plan.roofline: architecture specs, parameter counts, KV bytes (case P1), memory fit, roofline rows, kit plan."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from kit.plan import roofline as planner
from kit.plan.roofline import get_spec, kv_bytes_per_token, memory_fit, predict_point, spec_from_config
from kit.results import validate_record

REF = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "models.csv"


# ---------------------------------------------------------------- case P1: KV bytes per token
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


def test_p1_from_transformers_configs():
    """The same numbers from transformers config objects (the planner's other entry point)."""
    from transformers import DeepseekV3Config, LlamaConfig

    llama = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256)
    assert kv_bytes_per_token(spec_from_config(llama), "bfloat16") == 131_072
    ds = DeepseekV3Config(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
                          num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                          qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=256,
                          num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=3, vocab_size=129280)
    s = spec_from_config(ds)
    assert kv_bytes_per_token(s, "bfloat16") == 70_272
    assert kv_bytes_per_token(s, "fp8") == 35_136
    assert abs(s.total_params / 671.03e9 - 1) < 0.01


def _table():
    return planner.model_table()


@pytest.mark.parametrize("key", planner.list_models())
def test_kv_bytes_and_state_match_models_csv_exactly(key):
    row = _table().set_index("key").loc[key]
    s = get_spec(key)
    assert kv_bytes_per_token(s, "bfloat16") == int(row["kv_bytes_per_token_bf16"])
    assert kv_bytes_per_token(s, "fp8") == int(row["kv_bytes_per_token_fp8"])
    assert planner.state_bytes_per_seq(s, 10**9, "bfloat16", "bfloat16") == int(row["per_seq_const_state_bytes_bf16"])


@pytest.mark.skipif(not REF.exists(), reason="../shared/reference/models.csv not beside the checkout")
def test_shipped_models_csv_matches_the_reference():
    ref = pd.read_csv(REF, dtype=str, keep_default_na=False).set_index("model")
    ours = _table().set_index("model")
    for m, r in ref.iterrows():
        for col in ("kv_bytes_per_token_bf16", "kv_bytes_per_token_fp8", "per_seq_const_state_bytes_bf16",
                    "total_params_b", "hidden_size", "num_layers", "source"):
            assert ours.loc[m, col] == r[col], (m, col)


def test_kimi_k3_fp32_state_matches_note():
    s = get_spec("kimi-k3")
    assert planner.state_bytes_per_seq(s, 10**6, "bfloat16", "float32") == 449_372_160
    assert "UNSURE" in s.flags


# ---------------------------------------------------------------- parameter counts
@pytest.mark.parametrize("key", planner.list_models())
def test_total_params_within_1pct_of_published(key):
    s = get_spec(key)
    assert abs(s.total_params / (s.published_total_b * 1e9) - 1) < 0.01


# Kimi K3: "2.8T" is the rounding of the 2,779.3B total in ../shared/reference/models.csv; the recomputation
# (2,771.5B) is within 0.3% of that total (and 1.02% under the rounded 2.8T).
@pytest.mark.parametrize("key,published", [("deepseek-v3", 671e9), ("llama-3.1-405b", 405e9), ("kimi-k2", 1.03e12),
                                           ("kimi-k3", 2779.3e9)])
def test_headline_totals(key, published):
    assert abs(get_spec(key).total_params / published - 1) < 0.01


@pytest.mark.parametrize("key", ["llama-3.1-8b", "qwen3-235b-a22b", "deepseek-v3", "kimi-k2"])
def test_active_params_within_1pct(key):
    s = get_spec(key)
    assert abs(s.active_params / (s.published_active_b * 1e9) - 1) < 0.01


def test_gpt_oss_active_without_embedding():
    s = get_spec("gpt-oss-120b")
    assert abs(s.active_matmul_params / 5.13e9 - 1) < 0.01


def _meta_count(cfg) -> int:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())


def _small_configs():
    from transformers import AutoConfig

    from kit.models import get_config

    return {
        "tiny-llama": get_config("tiny-llama"),
        "tiny-deepseek": get_config("tiny-deepseek"),
        "qwen3": AutoConfig.for_model("qwen3", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=48, vocab_size=1000),
        "qwen3_moe": AutoConfig.for_model("qwen3_moe", hidden_size=128, intermediate_size=256,
                                          moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=32, vocab_size=1000),
        "gpt_oss": AutoConfig.for_model("gpt_oss", hidden_size=128, intermediate_size=96, num_local_experts=8,
                                        num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=32, vocab_size=1000, sliding_window=16),
        "kimi_linear": AutoConfig.for_model("kimi_linear", hidden_size=128, intermediate_size=256,
                                            moe_intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
                                            num_hidden_layers=8, num_attention_heads=4, q_lora_rank=48,
                                            kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
                                            vocab_size=1000, linear_num_heads=4, linear_head_dim=16, pad_token_id=0,
                                            bos_token_id=1, eos_token_id=2),
    }


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseek", "qwen3", "qwen3_moe", "gpt_oss", "kimi_linear"])
def test_analytic_count_equals_the_real_architecture(name):
    """Every formula checked against transformers' own modules (built on the meta device: no memory)."""
    cfg = _small_configs()[name]
    s = spec_from_config(cfg)
    assert s.total_params == _meta_count(cfg)


def test_layer_kinds_from_configs():
    c = _small_configs()
    g = spec_from_config(c["gpt_oss"])
    assert (g.n_kv_layers, g.n_swa_layers, g.sliding_window, g.expert_bias) == (2, 2, 16, True)
    k = spec_from_config(c["kimi_linear"])
    assert k.attention == "mla" and k.n_linear_layers == 7 and k.n_kv_layers == 1


def test_config_json_path_and_dict(tmp_path):
    from kit.models import get_config

    d = get_config("tiny-llama").to_dict()
    (tmp_path / "config.json").write_text(json.dumps(d))
    a, b = spec_from_config(tmp_path), spec_from_config(d)
    assert a.total_params == b.total_params == get_spec("tiny-llama").total_params


def test_quantization_config_sets_group_dtypes():
    d = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
         "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088, "intermediate_size": 2880,
         "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128,
         "layer_types": ["sliding_attention", "full_attention"] * 18, "attention_bias": True,
         "quantization_config": {"quant_method": "mxfp4"}}
    s = spec_from_config(d)
    assert s.dtypes()["routed_experts"] == "mxfp4" and s.dtypes()["attn"] == "bfloat16"
    assert abs(s.total_params / 116.83e9 - 1) < 0.01
    w = sum(planner.weight_bytes(s).values())
    assert 55e9 < w < 70e9  # MXFP4 experts at 4.25 bits: ~61 GB, not 234 GB


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("drop,field", [("num_hidden_layers", "num_hidden_layers"), ("hidden_size", "hidden_size"),
                                        ("vocab_size", "vocab_size"), ("intermediate_size", "intermediate_size")])
def test_missing_field_is_named(drop, field):
    from kit.models import get_config

    d = get_config("tiny-llama").to_dict()
    d.pop(drop)
    with pytest.raises(ValueError, match=field):
        spec_from_config(d)


def test_missing_moe_field_is_named():
    from kit.models import get_config

    d = get_config("tiny-deepseek").to_dict()
    d.pop("moe_intermediate_size")
    with pytest.raises(ValueError, match="moe_intermediate_size"):
        spec_from_config(d)
    d = get_config("tiny-deepseek").to_dict()
    d.pop("kv_lora_rank"), d.pop("qk_rope_head_dim")  # now looks like GQA, still needs nothing MLA
    d2 = get_config("tiny-deepseek").to_dict()
    d2.pop("qk_rope_head_dim")
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        spec_from_config(d2)


@pytest.mark.parametrize("kw,match", [
    ({"context_len": 0}, "context_len"), ({"concurrency": -1}, "concurrency"), ({"n_gpus": 0}, "n_gpus"),
    ({"kv_dtype": "fp7"}, "fp7"), ({"tp": 3, "n_gpus": 8}, "tp"), ({"mem_util": 1.5}, "mem_util"),
])
def test_bad_sizes_and_dtypes(kw, match):
    args = dict(model="llama-3.1-8b", accelerator="H100", n_gpus=1, context_len=1024, concurrency=1)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        memory_fit(**args)


def test_unknown_accelerator_and_model():
    with pytest.raises(KeyError, match="Z100"):
        memory_fit("llama-3.1-8b", "Z100", 1)
    with pytest.raises(KeyError, match="kimi-k3"):  # the message lists the known models
        get_spec("no-such-model")
    with pytest.raises(ValueError, match="group"):
        get_spec("llama-3.1-8b").dtypes("experts_typo=fp8")


# ---------------------------------------------------------------- memory fit and sharding
def test_gqa_kv_split_by_heads_mla_replicated():
    l70 = get_spec("llama-3.1-70b")  # 8 kv heads
    full = kv_bytes_per_token(l70, "bfloat16", tp=1)
    assert kv_bytes_per_token(l70, "bfloat16", tp=8) == full / 8
    assert kv_bytes_per_token(l70, "bfloat16", tp=16) == full / 8  # one head per rank, replicated
    ds = get_spec("deepseek-v3")
    assert kv_bytes_per_token(ds, "bfloat16", tp=8) == kv_bytes_per_token(ds, "bfloat16", tp=1) == 70_272


def test_weights_shard_over_gpus():
    s = get_spec("llama-3.1-70b")
    one = sum(planner.weight_bytes(s, tp=1).values())
    eight = sum(planner.weight_bytes(s, tp=8).values())
    assert one == pytest.approx(70.55e9 * 2, rel=0.01)
    assert eight == pytest.approx(one / 8, rel=0.01)


def test_kimi_k3_on_8_mi355x_and_b300():
    for acc in ("MI355X", "B300"):
        r = memory_fit("kimi-k3", acc, 8, context_len=1424, concurrency=64)
        assert r.fits and r.weights_gb_total > 1500  # ">1.5 TB of weights"
        assert r.max_concurrency >= 64 and r.kv_tokens_free > 1e6
    a = memory_fit("kimi-k3", "MI355X", 8, context_len=1424)
    b = memory_fit("kimi-k3", "B300", 8, context_len=1424)
    assert a.max_concurrency > b.max_concurrency  # 288 GB vs 268 GB usable
    fp8 = memory_fit("kimi-k3", "B300", 8, context_len=1424, kv_dtype="fp8")
    assert fp8.kv_tokens_free == pytest.approx(2 * b.kv_tokens_free)


def test_min_gpus():
    assert planner.min_gpus("kimi-k3", "B200") == 16  # 8 x 180 GB cannot hold ~1.54 TB
    assert planner.min_gpus("kimi-k3", "MI355X") == 8
    assert planner.min_gpus("llama-3.1-8b", "H100") == 1
    assert not memory_fit("kimi-k3", "B200", 8).fits


def test_max_context_at_concurrency_consistent():
    r = memory_fit("llama-3.1-70b", "H200", 8, concurrency=32)
    again = memory_fit("llama-3.1-70b", "H200", 8, context_len=r.max_context, concurrency=32)
    assert again.fits
    assert not memory_fit("llama-3.1-70b", "H200", 8, context_len=r.max_context + 100, concurrency=32).fits


# ---------------------------------------------------------------- roofline
def test_expert_coverage():
    assert planner.expert_coverage(256, 1, 8) == pytest.approx(1 - (255 / 256) ** 8)
    assert planner.expert_coverage(256, 10_000, 8) == pytest.approx(1.0)
    assert planner.expert_coverage(0, 5, 1) == 0.0


def test_decode_is_memory_bound_at_batch_one_and_matches_formula():
    r = predict_point("llama-3.1-8b", "H100", 1, 1, 1024, prefill=False)
    assert r["x_bound"] == "memory" and r["status"] == "ok"
    s = get_spec("llama-3.1-8b")
    bytes_ = sum(planner.weight_bytes(s).values()) - s.param_counts()["embed"] * 2 + 4096 * 2 \
        + 1024 * 131_072
    assert r["x_bytes_per_step"] == pytest.approx(bytes_)
    assert r["tpot_ms_p50"] == pytest.approx(bytes_ / (3.35e12 * 0.7) * 1e3, rel=1e-6)
    assert r["decode_tok_s"] == pytest.approx(1000 / r["tpot_ms_p50"])


def test_decode_time_monotone_in_batch_and_context():
    t = [predict_point("deepseek-v3", "H200", 8, b, c, prefill=False)["tpot_ms_p50"]
         for b, c in ((1, 1024), (8, 1024), (64, 1024), (64, 8192))]
    assert t == sorted(t)


def test_planner_rows_fit_the_results_schema():
    df = planner.predict_grid("tiny-llama", "H100", concurrencies=(1, 4), context_lens=(128, 512))
    assert len(df) == 4 and set(df["backend"]) == {"planner"}
    for rec in df.to_dict("records"):
        validate_record(rec)
    for col in ("eff_bw", "eff_flops", "tp", "assumptions", "tpot_ms_p50", "prefill_ms"):
        assert df[col].notna().all(), col


def test_oom_point_has_status_and_no_timings():
    r = predict_point("kimi-k3", "B200", 8, 1, 1024)
    assert r["status"] == "oom" and "fit" in r["error"] and r["tpot_ms_p50"] is None


def test_local_calibration_drives_prediction():
    cal = {"device": "cpu", "device_name": "test cpu", "memory_gb": 16.0, "mem_bw_gb_s": 10.0,
           "matmul_tflops": {"float32": 0.1, "bfloat16": 0.2}, "overhead_ms_fixed": 1.0, "overhead_ms_per_layer": 0.5}
    dev = planner.get_device("local", calibration=cal)
    assert dev.eff_bw == 1.0 and dev.mem_bw_gb_s == 10.0
    r = predict_point("tiny-llama", "local", 1, 1, 128, dtype="float32", calibration=cal)
    s = get_spec("tiny-llama")
    assert r["x_overhead_ms"] == pytest.approx(1.0 + 0.5 * s.num_layers)
    assert r["tpot_ms_p50"] == pytest.approx(r["x_t_linear_ms"] + r["x_t_attn_ms"] + r["x_overhead_ms"])
    with pytest.raises(ValueError, match="float16"):
        predict_point("tiny-llama", "local", 1, 1, 128, dtype="float16", calibration=cal)


def test_predict_like_and_compare():
    cal = {"device": "cpu", "memory_gb": 16.0, "mem_bw_gb_s": 10.0, "matmul_tflops": {"float32": 0.1},
           "overhead_ms_fixed": 1.0, "overhead_ms_per_layer": 0.5}
    measured = pd.DataFrame([{"backend": "engine", "status": "ok", "model": "tiny-llama", "dtype": "float32",
                              "concurrency": b, "context_len": c, "decode_steps": 16, "tpot_ms_p50": 5.0}
                             for b in (1, 4) for c in (128, 512)])
    pred = planner.predict_like(measured, "local", calibration=cal)
    assert len(pred) == 4 and (pred["x_attend_len"] == pred["context_len"] + 16).all()
    err = planner.compare(measured, pred)
    assert len(err) == 4
    assert err["error_pct"].tolist() == pytest.approx((100 * (err["predicted"] - 5.0) / 5.0).tolist())
    fig = planner.overlay_figure(measured, pred)
    assert fig.axes[0].get_title().startswith("planner")


def test_cli_plan_json(capsys):
    from kit.cli import main

    rc = main(["plan", "--model", "kimi-k3", "--accelerator", "mi355x", "--gpus", "8", "--context", "1424",
               "--concurrency", "64", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fit"]["fits"] and out["min_gpus"] == 8 and out["fit"]["max_concurrency"] >= 64
    assert {c["price_basis"] for cost in out["cost"] for c in cost} >= {"tco", "assumed-rental"}
    assert all(math.isfinite(p["decode_tok_s"]) for p in out["predictions"])


def test_cli_plan_text_and_bad_accelerator(capsys):
    from kit.cli import main

    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "H100", "--gpus", "1", "--context", "2048",
                 "--concurrency", "8"]) == 0
    out = capsys.readouterr().out
    assert "FITS" in out and "tok/s" in out and "$" in out
    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "Z100"]) == 2
    assert "Z100" in capsys.readouterr().err
    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "H100", "--gpus", "0"]) == 2
    assert "--gpus 0" in capsys.readouterr().err


def test_cli_plan_price_table_override(tmp_path, capsys):
    from kit.cli import main

    f = tmp_path / "prices.csv"
    f.write_text("accelerator,usd_per_gpu_hr,basis\nMI355X,1.99,my-contract\n")
    assert main(["plan", "--model", "kimi-k3", "--accelerator", "MI355X", "--gpus", "8", "--prices", str(f),
                 "--basis", "my-contract"]) == 0
    assert "[my-contract] $1.99/GPU-h" in capsys.readouterr().out


def test_max_context_capped_at_model_limit():
    r = memory_fit("tiny-llama", "H200", 1, concurrency=1)
    assert r.max_context == get_spec("tiny-llama").max_position_embeddings


def test_other_linear_attention_types_are_flagged_not_silently_trusted():
    from transformers import AutoConfig

    c = AutoConfig.for_model("qwen3_next", hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                             num_experts=8, num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=32, vocab_size=1000, linear_num_value_heads=4,
                             linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)
    s = spec_from_config(c)
    assert s.n_linear_layers == 3 and "UNSURE" in s.flags and "qwen3_next" in s.flags


def test_predict_like_one_row_per_grid_point():
    cal = {"device": "cpu", "memory_gb": 16.0, "mem_bw_gb_s": 10.0, "matmul_tflops": {"float32": 0.1}}
    rows = [{"backend": "engine", "status": "ok", "model": "tiny-llama", "dtype": "float32", "concurrency": 1,
             "context_len": 128, "decode_steps": 16, "tpot_ms_p50": t} for t in (5.0, 6.0)]
    measured = pd.DataFrame(rows)
    pred = planner.predict_like(measured, "local", calibration=cal)
    assert len(pred) == 1
    assert len(planner.compare(measured, pd.concat([pred, pred]))) == 2  # one per measured row, no cross product


# ---------------------------------------------------------------- input validation (new-user trial)
def test_context_beyond_model_positions_rejected_everywhere(capsys):
    from kit.cli import main

    msg = r"context_len=10,000,000 exceeds llama-3\.1-8b's max_position_embeddings=131,072"
    with pytest.raises(ValueError, match=msg):
        memory_fit("llama-3.1-8b", "B300", 1, context_len=10_000_000, concurrency=1)
    with pytest.raises(ValueError, match=msg):
        predict_point("llama-3.1-8b", "B300", 1, 1, 10_000_000)
    with pytest.raises(ValueError, match=msg):
        planner.predict_grid("llama-3.1-8b", "B300", concurrencies=(1,), context_lens=(10_000_000,))
    with pytest.raises(ValueError, match=msg):
        planner.min_gpus("llama-3.1-8b", "B300", 10_000_000, 1)
    assert memory_fit("llama-3.1-8b", "B300", 1, context_len=131_072, concurrency=1).context_len == 131_072
    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "b300", "--context", "10000000"]) == 2
    captured = capsys.readouterr()
    assert "131,072" in captured.err and "max users" not in captured.out


def test_parallel_layout_messages():
    with pytest.raises(ValueError, match=r"tp=3 does not divide n_gpus=8.*pp = n_gpus // tp.*\(1, 2, 4, 8\)"):
        memory_fit("llama-3.1-8b", "B300", 8, tp=3)
    with pytest.raises(ValueError, match=r"pp=3 does not divide n_gpus=8.*tp = n_gpus // pp"):
        memory_fit("llama-3.1-8b", "B300", 8, pp=3)
    with pytest.raises(ValueError, match=r"tp=2 × pp=2 must equal n_gpus=8"):  # both given: unchanged
        memory_fit("llama-3.1-8b", "B300", 8, tp=2, pp=2)
    with pytest.raises(ValueError, match="expert parallelism applies only to MoE models.*llama-3.1-8b is dense"):
        memory_fit("llama-3.1-8b", "B300", 1, ep=4)
    assert memory_fit("llama-3.1-8b", "B300", 1, ep=1).ep == 1
    assert memory_fit("kimi-k3", "B300", 8, ep=4).ep == 4  # MoE: still allowed
    # 8 KV heads over 3 ranks: warned (engines reject it), not refused
    with pytest.warns(UserWarning, match=r"8 KV heads \(GQA\) neither divide nor are divisible by tp=3"):
        r = memory_fit("llama-3.1-8b", "B300", 3)
    assert r.tp == 3
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory_fit("llama-3.1-70b", "B300", 16)  # 8 kv heads, tp 8 × pp 2: even split, no warning
        memory_fit("llama-3.1-70b", "B300", 16, tp=16, pp=1)  # tp a multiple of kv heads: replicated, fine


@pytest.mark.parametrize("v", [1.5, 0, -0.2, 1.0001])
def test_efficiency_outside_unit_interval_rejected(v, capsys):
    from kit.cli import main

    for kw in ("eff_bw", "eff_flops"):
        with pytest.raises(ValueError, match=rf"{kw}={v!r} is outside the allowed range \(0, 1\]"):
            predict_point("llama-3.1-8b", "H100", 1, 1, 1024, **{kw: v})
        with pytest.raises(ValueError, match=rf"{kw}={v!r} is outside the allowed range \(0, 1\]"):
            planner.get_device("H100", **{kw: v})
    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "H100", "--eff-bw", str(v)]) == 2
    assert "(0, 1]" in capsys.readouterr().err
    assert predict_point("llama-3.1-8b", "H100", 1, 1, 1024, eff_bw=1.0)["eff_bw"] == 1.0


def test_cli_plan_flags_not_cut_and_no_raw_none(capsys):
    from kit.cli import main

    assert main(["plan", "--model", "kimi-k3", "--accelerator", "cpu"]) == 0
    out = capsys.readouterr().out
    flags = get_spec("kimi-k3").flags
    assert len(flags) > 160
    lines = out.splitlines()
    assert "flags" not in lines[0] and lines[0].startswith("kimi-k3:")
    block = []
    for ln in lines[1:]:
        if not ln.startswith("  flags: ") and not (block and ln.startswith("    ")):
            break
        block.append(ln.strip())
    assert " ".join(block) == "flags: " + " ".join(flags.split())  # every word, none cut
    fewest = next(ln for ln in lines if "fewest CPU" in ln)
    assert "None" not in fewest and "does not fit on one CPU host" in fewest
