"""Stack profiles (kit.plan.stack): each figure moves exactly its own decode-step terms; speculative decoding only
where the stack runs it with the layout; bad profiles are user errors naming the value; the published points
(kit.plan.anchors) are predicted like for like; kit plan names the profile (issue #26)."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest

from kit.errors import UnknownNameError, UserError
from kit.plan.anchors import fit_latency_scale, load_anchors, predict_anchor, scaled
from kit.plan.config import PredictConfig
from kit.plan.decode import STEP_TERMS
from kit.plan.device import DEFAULT_GPU_OVERHEAD_MS_PER_LAYER
from kit.plan.roofline import predict_point
from kit.plan.stack import KERNEL_CLASSES, default_stack, load_stacks, profile_from_dict, resolve_stack

TERMS = [f"x_t_{t}_ms" if t != "compute" else "x_t_compute_part_ms" for t in STEP_TERMS]


def _k3(stack, acc="B300", n=8, B=1, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return predict_point("kimi-k3", B, 1424, PredictConfig(acc, n, prefill=False, stack=stack, **kw))


def _moved(a: dict, b: dict) -> set[str]:
    """The x_t_*_ms columns that differ between two planner rows."""
    keys = {k for k in a if k.startswith("x_t_") and k.endswith("_ms")} | {k for k in b if k.startswith("x_t_")}
    return {k for k in keys if abs((a.get(k) or 0.0) - (b.get(k) or 0.0)) > 1e-12}


B300 = default_stack("B300")
FLOOR_COLS = {"x_t_floor_ms"}


def test_each_profile_figure_changes_exactly_its_terms():
    base = _k3(B300)
    assert base["x_stack"] == B300.name and base["tpot_ms_p50"] == pytest.approx(sum(base[c] for c in TERMS))
    moe = _k3(replace(B300, floors_us={**B300.floors_us, "moe": 80.0}))
    assert _moved(base, moe) == {"x_t_floor_ms", "x_t_floor_moe_ms"}
    assert moe["x_t_floor_moe_ms"] > base["x_t_floor_moe_ms"]
    ar = _k3(replace(B300, allreduce_alpha_us=20.0))
    assert _moved(base, ar) == {"x_t_comm_lat_ms", "x_t_tp_allreduce_lat_ms", "x_t_comm_ms"}
    assert ar["x_t_tp_allreduce_lat_ms"] == pytest.approx(186 * 20e-3)  # 93 after attention + 93 after the MLP
    host = _k3(replace(B300, host_us=400.0))
    assert _moved(base, host) == {"x_t_overhead_ms"} and host["x_t_overhead_ms"] == pytest.approx(0.4)
    # η moves the bandwidth terms and, through them, what the floors add on top; never the collectives
    eta = _k3(replace(B300, eta_bw=0.5))
    assert "x_t_weights_ms" in _moved(base, eta) and not _moved(base, eta) & {"x_t_comm_lat_ms", "x_t_overhead_ms"}
    assert eta["x_t_weights_ms"] == pytest.approx(base["x_t_weights_ms"] * 0.8 / 0.5)


def test_floors_are_a_least_time_per_layer_or_added_on_a_host_that_runs_its_kernels():
    zero = replace(B300, floors_us=dict.fromkeys(KERNEL_CLASSES, 0.0))
    assert _k3(zero)["x_t_floor_ms"] == 0.0
    tiny = replace(B300, floors_us={"norm": 1.0})  # norms move kilobytes: the floor is all there is
    norm = _k3(tiny)["x_t_floor_norm_ms"]
    assert 0.99 * 93e-3 < norm < 93e-3  # the floor less the norms' own (kilobytes of) bandwidth time
    added = _k3(replace(B300, floors_us={"moe": 10.0}, floor_mode="add"))
    assert added["x_t_floor_moe_ms"] == pytest.approx(93 * 10e-3)  # every layer's MLP/MoE block


def test_no_stack_is_the_plain_roofline_and_catalog_accelerators_get_their_default():
    plain = _k3("none")
    assert plain["x_stack"] is None and plain["x_t_floor_ms"] == 0.0
    assert plain["x_t_overhead_ms"] == pytest.approx(93 * DEFAULT_GPU_OVERHEAD_MS_PER_LAYER)
    assert _k3(None, "MI355X")["x_stack"] == "mi355x-sglang-day0" and _k3(None)["x_stack"] == B300.name
    assert _k3(None)["x_ep"] == 1  # SGLang's K3 recipes shard experts by TP
    h100 = predict_point("llama-3.1-8b", 1, 1024, PredictConfig("H100", prefill=False))
    assert h100["x_stack"] is None  # no profile shipped for H100: unchanged
    with pytest.raises(UnknownNameError, match="unknown stack 'vllm-9'.*b300-sglang"):
        resolve_stack("vllm-9", "B300")


def test_speculative_decoding_only_where_the_stack_runs_it_with_the_layout():
    pp = _k3(None, "B200", 16, speculative=True)
    assert (pp["x_pp"], pp["x_spec_k"]) == (2, 0) and "pipeline parallelism (PP2)" in pp["x_spec_note"]
    assert "speculative decoding off" in pp["assumptions"]
    tp16 = _k3(None, "B200", 16, tp=16, speculative=True)
    st = default_stack("B200")
    assert tp16["x_spec_k"] == st.spec_k and tp16["x_spec_accept"] == st.spec_accept and tp16["x_t_draft_ms"] > 0
    assert tp16["tpot_ms_p50"] == pytest.approx(tp16["x_step_ms"] / st.spec_accept)
    asked = _k3(None, "B200", 16, spec_k=2)  # an explicit k is still refused where the stack cannot run it
    assert asked["x_spec_k"] == 0 and asked["x_spec_note"]
    with pytest.raises(UserError, match="needs a stack profile"):
        _k3("none", speculative=True)


@pytest.mark.parametrize(
    "change, says",
    [
        ({"eta_bw": "1.5"}, "eta_bw='1.5' is outside the allowed range (0, 1]"),
        ({"floor_moe_us": "-3"}, "floor_moe_us='-3' is outside the allowed range >= 0"),
        ({"floor_mode": "sum"}, "floor_mode='sum'; allowed: ['max', 'add']"),
        ({"graph_mode": "cudagraph"}, "graph_mode='cudagraph'; allowed"),
        ({"spec_accept": "9"}, "spec_accept='9' is outside the allowed range [1, 4]"),
        ({"allreduce_alpha_us": "fast"}, "allreduce_alpha_us='fast' is not a number"),
        ({"spec_with_pp": "maybe"}, "spec_with_pp='maybe' is not a boolean"),
    ],
)
def test_a_bad_profile_value_is_a_user_error_naming_it(change, says, tmp_path):
    import pandas as pd

    from kit._io import data_path

    df = pd.read_csv(data_path("stacks.csv"), dtype=str, keep_default_na=False)
    for k, v in change.items():
        df.loc[0, k] = v
    p = tmp_path / "stacks.csv"
    df.to_csv(p, index=False)
    with pytest.raises(UserError, match=f"row 2 'b300-sglang-0.5.18'.*{__import__('re').escape(says)}"):
        load_stacks(p)


def test_shipped_profiles_cite_every_figure_and_flag_estimates():
    stacks = load_stacks()
    assert {s.default_for for s in stacks.values()} >= {"B200", "B300", "MI355X"}
    for s in stacks.values():
        assert {"eta_bw", "floors", "allreduce", "host", "spec"} <= set(s.sources), s.name
        assert all(s.sources[k].strip() for k in s.sources) and "UNSURE" in s.flags
    with pytest.raises(UserError, match="unknown kernel class"):
        profile_from_dict({"name": "x", "platform": "CPU", "eta_bw": 1, "floors_us": {"mlp": 1}})


def test_published_points_carry_their_conditions_and_are_predicted_like_for_like():
    a = load_anchors()
    assert {"8x B300", "8x MI355X", "2x8 B200"} <= set(a.system) and a.source.str.len().min() > 10
    nospec = a[(a.framework == "SGLang") & (a.spec_method == "none") & (a.concurrency <= 2) & (a.value < 25)]
    assert sorted(nospec.value) == [8.51, 10.12, 20.86]
    b300 = a[(a.value == 8.51)].iloc[0]
    r = predict_anchor(b300)
    assert r["stack"] == B300.name and r["like_for_like"].startswith("like for like (v0.5.18")
    assert r["ratio"] == pytest.approx(r["tpot_ms"] / 8.51) and r["row"]["x_attend_len"] == 8192 + 512
    wafer = a[a.system == "8x B300"].iloc[0]
    assert predict_anchor(wafer)["like_for_like"] == "not like for like: framework not stated"
    assert fit_latency_scale(B300, a.iloc[0:0]) == 1.0
    double = scaled(B300, 2.0)
    assert double.floor_us("moe") == 2 * B300.floor_us("moe") and double.host_us == 2 * B300.host_us


def test_kit_plan_names_the_stack_in_text_and_json(capsys):
    from kit.cli import main

    args = ["plan", "--model", "kimi-k3", "--accelerator", "B300", "--gpus", "8", "--concurrency", "1"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stack"]["name"] == B300.name and out["stack"]["sources"]["floors"]
    assert {p["x_stack"] for p in out["predictions"]} == {B300.name}
    assert main([*args, "--stack", "none"]) == 0
    assert "stack: none" in capsys.readouterr().out
    assert main([*args, "--stack", "nope"]) == 2


def test_a_measured_skinny_gemm_rate_bounds_decode_linear_layers_by_batch():
    base = {"name": "local-x", "platform": "CPU", "eta_bw": 1.0, "floor_mode": "add"}
    prof = profile_from_dict({**base, "gemm_tflops": {"4": 0.01, "16": 0.04}, "mem_bw_gb_s": 10})
    assert prof.gemm_rate(1) == prof.gemm_rate(4) == 0.01 and prof.gemm_rate(100) == 0.04
    assert prof.gemm_rate(8) == pytest.approx(0.02)  # log-linear between the measured points
    cfg = PredictConfig("CPU", dtype="float32", prefill=False, stack=prof)
    one, four = (predict_point("llama-3.2-1b", b, 128, cfg) for b in (1, 4))
    assert one["x_mem_bw_gb_s"] == 10 and one["x_bound"] == "memory"  # one row: reading the weights bounds it
    assert four["x_bound"] == "compute" and four["x_t_compute_part_ms"] > 100 * one["x_t_compute_part_ms"]
    with pytest.raises(UserError, match="gemm_tflops=.*is not"):
        profile_from_dict({**base, "gemm_tflops": [1]})
