"""Profiles of in-process points (issue 27): `kit sweep --profile` writes a trace and a top-operators table per
chosen point from a pass of its own (the row's timings stay unprofiled), `kit profile compare` lines two up
operator by operator, and the launch share says "not calibrated" without a calibration. The new-user trial's faults
(issue 27 follow-up): per-step medians, noise warnings, CPU wording, signed shares, bad --out / selections."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from kit.cli import main
from kit.errors import UserError
from kit.measure import sweep
from kit.measure.profile import (
    NO_KERNELS,
    OUTSIDE_OPS,
    STEP_RANGE,
    launch_cost_us,
    launch_share,
    operator_table,
    trace_counts,
)
from kit.measure.profile_compare import ADVICE, compare_profiles, compare_text, resolve_profile
from kit.measure.profile_select import parse_profile_points

STEPS = 3
GRID = dict(kv_lens=[16, 512], concurrencies=[1], decode_steps=STEPS, warmup_steps=1, repeats=2, threads=1)


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    """One sweep of tiny-llama, two points, both profiled; and the same grid unprofiled (its point ids)."""
    out = tmp_path_factory.mktemp("profiled")
    df = sweep.run_sweep(sweep.SweepConfig(profile="all", **GRID), out, progress=False)
    return out, df.sort_values("context_len").reset_index(drop=True)


def test_profile_points_parse_all_and_selections_and_name_bad_ones():
    assert parse_profile_points(None) is None
    assert parse_profile_points("").everything and parse_profile_points("all").everything
    sel = parse_profile_points("kv=32768,B=8;kv=4096")
    assert sel.selects(32768, 8) and sel.selects(4096, 1) and not sel.selects(32768, 4) and not sel.selects(128, 8)
    assert parse_profile_points("kv=16,dtype=bf16").selects(16, 2, "bfloat16")
    assert not parse_profile_points("kv=16,dtype=bf16").selects(16, 2, "float32")
    for bad, said in (("kv=abc", "integer >= 1"), ("x=1", "keys kv, B, dtype"), ("kv=0", "integer >= 1"),
                      ("kv=1;;", "empty match")):  # fmt: skip
        with pytest.raises(UserError, match=said):
            parse_profile_points(bad)
    with pytest.raises(UserError, match="tp > 1"):
        sweep.SweepConfig(profile="all", tp=2).validate()


def test_a_profiled_point_writes_a_trace_and_top_operators_and_keeps_its_timings_apart(profiled_run):
    out, df = profiled_run
    assert list(df.status) == ["ok", "ok"] and df.x_profiled.all()
    for _, r in df.iterrows():
        trace = json.loads(open(r.x_prof_trace).read())  # a Chrome/Perfetto trace: JSON with trace events
        steps = [e for e in trace["traceEvents"] if e.get("name") == STEP_RANGE]
        assert len(steps) == STEPS == r.x_prof_steps  # the profiled pass: one block of the point's decode steps
        # the row's timings are the plain pass's only (2 repeats x 3 steps), never the profiled steps
        assert r.tpot_n == len(r.x_step_ms) == 2 * STEPS
        ops = pd.read_csv(r.x_prof_ops_csv)
        assert {"op", "self_ms_per_step", "calls_per_step", "pct_of_step", "kernels_per_step"} <= set(ops.columns)
        assert ops.self_ms_per_step.is_monotonic_decreasing
        mm = ops.set_index("op").loc["aten::mm"]
        assert mm.calls_per_step == int(mm.calls_per_step) > 0  # the same matmuls every step
        assert 0 < ops.pct_of_step.sum() < 150  # per-operator medians of the median step: about the whole step
        assert OUTSIDE_OPS in set(ops.op) and STEP_RANGE not in set(ops.op)  # the time outside operators, not an op
        assert ops.kernels_per_step.isna().all()  # the CPU runs no device kernels: not "0 kernels"
        assert r.x_prof_step_ms_min <= r.x_prof_step_ms <= r.x_prof_step_ms_max and r.x_prof_step_spread >= 0
        # CPU: the launches are the operators called from Python; they call others inside
        assert r.x_prof_ops_per_step > r.x_prof_top_ops_per_step == r.x_prof_launches_per_step > 10
        assert pd.isna(r.x_prof_kernels_per_step) and r.x_prof_activities == "cpu"
        assert r.x_prof_kernels_note == f"{NO_KERNELS}: dispatches per step {r.x_prof_launches_per_step:.0f}"
        assert r.x_prof_top_op == json.loads(r.x_prof_top)[0]["op"] != STEP_RANGE
        assert (out / "profiles" / r.point_id / "profile.json").exists()
    # the same graph at both contexts: the same operators per step
    assert df.x_prof_ops_per_step[0] == df.x_prof_ops_per_step[1]
    plain = sweep.SweepConfig(**GRID)
    assert not set(df.point_id) & {sweep.sweep_point_id(plain, "float32", "cpu", p) for _, p in plain.points()}


def test_only_the_selected_points_are_profiled(tmp_path):
    grid = dict(GRID, kv_lens=[16, 32], repeats=1, decode_steps=2)
    df = sweep.run_sweep(sweep.SweepConfig(profile="kv=32", **grid), tmp_path, progress=False)
    flagged = df.set_index("context_len").x_profiled
    assert flagged[32] is True and pd.isna(flagged[16])
    assert [p.name for p in (tmp_path / "profiles").iterdir()] == list(df[df.context_len == 32].point_id)


def test_profile_compare_lines_up_operators_and_names_what_explains_the_gap(profiled_run, tmp_path, capsys):
    out, df = profiled_run
    a, b = resolve_profile(f"{out}:kv=16"), resolve_profile(f"{out}:kv=512,B=1")
    c = compare_profiles(a, b)
    t = c["table"].set_index("op")
    assert c["gap_ms_per_step"] == pytest.approx(t.diff_ms_per_step.sum())
    assert (t.diff_ms_per_step == t.b_ms_per_step - t.a_ms_per_step).all()
    assert (t.a_calls_per_step == t.b_calls_per_step).all()  # one graph: only the times differ
    if c["explains"]:  # the named operators move in the gap's direction and make up most of it
        assert all(e["share_of_gap"] > 0 for e in c["explains"]) and c["explained_fraction"] >= 0.8
    rc = main(["profile", "compare", f"{out}:kv=16", f"{out}:kv=512", "--json", "--out", str(tmp_path / "cmp")])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["figures"]["x_prof_ops_per_step"][0] == df.x_prof_ops_per_step[0]
    assert (tmp_path / "cmp" / "profile_compare.png").stat().st_size > 10_000
    assert len(pd.read_csv(tmp_path / "cmp" / "compare.csv")) == len(t)
    # a run with two profiled points needs a selection; the message lists both
    assert main(["profile", "compare", str(out), f"{out}:kv=16", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "2 profiled points match" in err and f"{out}:kv=16,B=1" in err and f"{out}:kv=512,B=1" in err


def test_launch_share_is_launches_times_cost_over_the_step_or_not_calibrated(tmp_path):
    us, note = launch_cost_us("eager", {"launch_us_per_op": 5.0, "path": "cal.json"})
    assert us == 5.0 and "launch_us_per_op from cal.json" in note
    assert launch_share(200, us, 4.0) == pytest.approx(200 * 5e-3 / 4.0)
    us, note = launch_cost_us("compiled+graphs", {"launch_us_per_op": 5.0, "graph_launch_us_per_op": 2.0})
    assert us == 2.0 and "graph_launch_us_per_op" in note
    us, note = launch_cost_us("eager", {"mem_bw_gb_s": 10.0, "path": "old.json"})
    assert us is None and note.startswith("not calibrated") and "old.json" in note
    assert launch_share(200, None, 4.0) is None
    runtime = [{"cat": "cuda_runtime", "name": n} for n in ("cudaLaunchKernel", "cudaMalloc", "hipGraphLaunch")]
    marks = [{"cat": "user_annotation", "name": STEP_RANGE}] * 2
    # per step: an op at 0-10 µs with one nested inside it, then one more op inside a named range (not an op)
    op = {"cat": "cpu_op", "name": "aten::x", "tid": 1}
    ops = [op | {"ts": t0 + t, "dur": d} for t0 in (0, 100) for t, d in ((0, 10), (2, 5), (12, 3))]
    region = [
        {"cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "tid": 1, "ts": t0 + 11, "dur": 5} for t0 in (0, 100)
    ]
    trace = {"traceEvents": ops + region + [{"cat": "kernel"}] * 4 + runtime * 2 + marks}
    want = {"ops_per_step": 3, "top_ops_per_step": 2, "kernels_per_step": 2, "launches_per_step": 2, "steps_marked": 2}
    assert trace_counts(trace, 2) == want


@pytest.mark.compile
def test_compiled_decode_dispatches_fewer_operators_per_step_than_eager(tmp_path):
    """One inductor compile of a 1-layer tiny-llama at test_compiled.py's shape (B=2, a 12-token cache: inductor's
    FX graph cache serves whichever of the two compiles second): the compiled step dispatches fewer operators."""
    import torch
    from transformers import AutoModelForCausalLM

    from kit.measure.engine import PointConfig
    from kit.measure.profile import profile_point
    from kit.models import get_config

    cfg = get_config("tiny-llama")
    cfg.num_hidden_layers = 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    p = PointConfig(2, 8, decode_steps=4, warmup_steps=1, repeats=1, kv_fill="synthetic")
    eager = profile_point(model, p, "cpu", tmp_path / "eager")
    comp = profile_point(model, p, "cpu", tmp_path / "compiled", compile=True)
    assert comp["x_prof_engine_mode"] == "compiled" and eager["x_prof_engine_mode"] == "eager"
    assert comp["x_prof_ops_per_step"] < eager["x_prof_ops_per_step"] / 2, (comp, eager)
    ops = pd.read_csv(comp["x_prof_ops_csv"])
    assert ops.op.str.contains("CompiledFxGraph ##").any()  # the graph's per-compile hash dropped


def _event(name, start_us, dur_us, self_us):
    """A host event as torch.profiler's ``prof.events()`` gives it (the fields operator_table reads)."""
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start_us, end=start_us + dur_us),
                           self_cpu_time_total=self_us, self_device_time_total=0.0, kernels=[])  # fmt: skip


def test_operator_times_per_step_are_medians_so_one_stalled_step_does_not_move_them():
    # three 10 ms steps; in the third the machine stalled inside aten::mm (100 ms instead of 1 ms)
    ev = []
    for i, mm in enumerate((1000, 1000, 100_000)):
        t0 = i * 200_000
        ev += [_event(STEP_RANGE, t0, 150_000, 4000), _event("aten::mm", t0 + 10, mm, mm),
               _event("aten::add", t0 + 120_000, 500, 500)]  # fmt: skip
    ev.append(_event("aten::empty", 900_000, 10, 30))  # outside every step: in the mean, not in a step's sum
    t = operator_table(ev, 3, step_ms=5.5).set_index("op")
    assert t.loc["aten::mm", "self_ms_per_step"] == pytest.approx(1.0)  # the old total / steps said 34 ms
    assert t.loc["aten::mm", "self_ms_mean_per_step"] == pytest.approx(34.0)
    assert t.loc["aten::add", "calls_per_step"] == 1 and t.loc["aten::add", "self_ms_per_step"] == pytest.approx(0.5)
    assert t.loc[OUTSIDE_OPS, "self_ms_per_step"] == pytest.approx(4.0) and STEP_RANGE not in t.index
    assert t.loc["aten::empty", "self_ms_per_step"] == 0 and t.kernels_per_step.isna().all()
    assert t.loc["aten::mm", "pct_of_step"] == pytest.approx(100 / 5.5)


def _profile(folder, kv, plain, step, lo, hi, ops):
    """A profile folder as `kit sweep --profile` writes it (profile.json, ops.csv), with the given step figures."""
    folder.mkdir(parents=True)
    summary = {"context_len": kv, "concurrency": 1, "dtype": "float32", "plain_step_ms": plain, "x_prof_step_ms": step,
               "x_prof_step_ms_min": lo, "x_prof_step_ms_max": hi, "x_prof_step_spread": (hi - lo) / step,
               "x_prof_overhead_ratio": step / plain, "x_prof_ops_per_step": 300.0, "x_prof_top_ops_per_step": 282.0,
               "x_prof_kernels_per_step": None, "x_prof_launches_per_step": 282.0, "x_prof_launch_share": None,
               "x_prof_launch_note": "not calibrated (run `kit calibrate`)"}  # fmt: skip
    (folder / "profile.json").write_text(json.dumps(summary))
    rows = [{"op": op, "self_ms_per_step": ms, "calls_per_step": 1.0} for op, ms in ops.items()]
    pd.DataFrame(rows).to_csv(folder / "ops.csv", index=False)
    return str(folder)


def test_a_noisy_comparison_warns_in_the_text_the_json_and_the_figure(tmp_path, capsys):
    # the trial: B's profiled step 1.84x its plain TPOT, steps 14.8-205.9 ms, gap +34 ms against a plain +5.7 ms
    a = _profile(tmp_path / "a", 128, 16.0, 14.9, 14.0, 16.0, {"aten::mm": 8.0, STEP_RANGE: 4.0, "aten::bmm": 1.0})
    b = _profile(tmp_path / "b", 4096, 21.7, 40.0, 14.8, 205.9, {"aten::mm": 20.0, STEP_RANGE: 13.0, "aten::bmm": 3.0})
    rc = main(["profile", "compare", a, b, "--json", "--out", str(tmp_path / "cmp")])
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert rc == 0 and doc["reliable"] is False and doc["warnings"][-1] == ADVICE
    said = " ".join(doc["warnings"])
    assert "B's profiled step is 1.84x its plain TPOT" in said and "14.8-205.9 ms" in said
    assert "+25.100 ms disagrees with the plain TPOT gap +5.700 ms" in said and "A's" not in said
    assert doc["figures"]["x_prof_overhead_ratio"] == [pytest.approx(14.9 / 16), pytest.approx(40 / 21.7)]
    assert doc["figures"]["x_prof_step_spread"][1] == pytest.approx((205.9 - 14.8) / 40)
    assert ADVICE in cap.err  # whoever runs a --json script still sees it
    c = compare_profiles(resolve_profile(a), resolve_profile(b))
    text = compare_text(c)
    assert "WARNING: the profiles look noisy" in text and ADVICE in text and "profiled / plain (overhead)" in text
    # CPU profiles: no kernel count of 0 or "-" beside the dispatches; the outside time is not called an operator
    assert f"{NO_KERNELS}: dispatches per step" in text and "kernels per step" not in text
    assert OUTSIDE_OPS in text and STEP_RANGE not in text
    from kit.view.profile_plots import operator_differences

    fig = operator_differences(c["table"], "A", "B", subtitle=f"noisy profiles: {c['warnings'][0]}; {ADVICE}")
    assert "re-run on a quiet machine" in fig._suptitle.get_text().replace("\n", " ")
    # a quiet pair with matching gaps: no warning
    qa = _profile(tmp_path / "qa", 128, 10.0, 11.0, 10.5, 12.0, {"aten::mm": 5.0})
    qb = _profile(tmp_path / "qb", 4096, 14.0, 15.2, 14.6, 16.0, {"aten::mm": 9.0})
    q = compare_profiles(resolve_profile(qa), resolve_profile(qb))
    assert q["warnings"] == [] and q["reliable"] and "WARNING" not in compare_text(q)


def test_share_of_change_carries_the_sign_of_the_difference(tmp_path):
    a = _profile(tmp_path / "a", 128, 10.0, 10.0, 9.5, 10.5, {"aten::mm": 10.0, "aten::bmm": 1.0, "aten::add": 1.0})
    b = _profile(tmp_path / "b", 4096, 8.0, 8.0, 7.5, 8.5, {"aten::mm": 0.73, "aten::bmm": 4.0, "aten::add": 1.0})
    t = compare_profiles(resolve_profile(a), resolve_profile(b))
    rows = t["table"].set_index("op")
    assert rows.loc["aten::mm", "diff_ms_per_step"] == pytest.approx(-9.27)
    assert rows.loc["aten::mm", "share_of_change"] < 0 < rows.loc["aten::bmm", "share_of_change"]  # old: +147 %
    assert rows.share_of_change.abs().sum() == pytest.approx(1.0)
    assert [e["op"] for e in t["explains"]] == ["aten::mm"] and t["explains"][0]["share_of_gap"] > 0  # the net gap < 0


def test_bad_out_folders_and_selections_are_user_errors(profiled_run, tmp_path, capsys):
    out, _ = profiled_run
    for bad in ("/proc/nope", "/proc/nope/deeper"):
        assert main(["profile", "compare", f"{out}:kv=16", f"{out}:kv=512", "--out", bad]) == 2
        assert f"--out {bad!r} cannot be created" in capsys.readouterr().err
    # a selection that matches no profiled point lists the ones there are
    assert main(["profile", "compare", f"{out}:kv=999", f"{out}:kv=16", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "no profiled point matches" in err and f"{out}:kv=16,B=1" in err and f"{out}:kv=512,B=1" in err
    # a --profile selection that matches no grid point is refused before the sweep runs, naming the grid
    with pytest.raises(UserError, match=r"'kv=999' matches no point of the grid \(kv 16,512; B 1; dtype float32\)"):
        sweep.SweepConfig(profile="kv=999", **GRID).validate()
    run = tmp_path / "sweep"
    assert main(["sweep", "--kv", "16", "--concurrency", "1", "--profile", "kv=999", "--out", str(run)]) == 2
    assert "matches no point of the grid (kv 16; B 1" in capsys.readouterr().err and not run.exists()
    # kv-stress: the probes run at one batch and dtype, at contexts from --start to --max-context
    from kit.measure.stress import StressConfig

    for bad in ("kv=99999", "B=4"):
        with pytest.raises(UserError, match="matches no probe: they run at B 1, dtype float32, contexts 64-512"):
            StressConfig(model="tiny-llama", start=64, max_context=512, profile=bad).validate()
    StressConfig(model="tiny-llama", start=64, max_context=512, profile="kv=128").validate()


def test_compare_help_says_where_the_files_go_by_default(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "compare", "--help"])
    assert "./results/profile-compare under the current directory" in " ".join(capsys.readouterr().out.split())
