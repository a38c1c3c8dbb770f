"""kit.measure.stress: the context search, the memory guard's refusals, resume after an interrupt, measured vs
predicted KV bytes, correctness of a cached decode step at length (issue 13)."""

from __future__ import annotations

import json

import pytest

from kit import models
from kit.errors import UserError
from kit.grid import oom_error_type
from kit.measure.engine import run_point
from kit.measure.stress import KILLS_TO_GIVE_UP, ContextSearch, StressConfig, run_kv_stress, stress_summary
from kit.measure.stress_check import cached_vs_uncached
from kit.store import INFLIGHT_NAME, load_results

#: a few cheap probes: tiny-llama, a handful of decode steps
TINY = dict(start=64, max_context=256, decode_steps=2, warmup_steps=1, repeats=1, check_context=0, threads=1)


def search_until(threshold: int, start: int, max_context: int, resolution: float = 0.05):
    """Drive a ContextSearch against "fits iff context <= threshold"; return the probes and the search."""
    s, probes = ContextSearch(start, max_context, resolution), []
    while (c := s.next()) is not None:
        assert c not in probes and c <= max_context and len(probes) < 100
        probes.append(c)
        s.record(c, c <= threshold)
    return probes, s


def test_search_doubles_then_bisects_to_the_resolution():
    probes, s = search_until(100_000, 4096, 4_194_304)
    assert probes[:6] == [4096, 8192, 16384, 32768, 65536, 131072]  # x2 until the first failure
    assert s.lo <= 100_000 < s.hi and s.hi - s.lo <= 0.05 * s.lo
    assert all(65536 < p < 131072 for p in probes[6:])  # then only inside the bracket


def test_search_stops_at_max_context_and_never_past_it():
    probes, s = search_until(10**9, 4096, 1_000_000)
    assert probes[-1] == 1_000_000 and s.lo == 1_000_000 and s.hi is None
    assert probes == [4096 * 2**i for i in range(8)] + [1_000_000]


def test_search_from_a_start_that_does_not_fit_goes_down():
    probes, s = search_until(300, 1_048_576, 4_194_304)
    assert probes[0] == 1_048_576 and s.lo <= 300 < s.hi and s.hi - s.lo <= max(1, 0.05 * s.lo)
    probes, s = search_until(0, 64, 64)  # nothing fits: ends at one token, no context decodes
    assert s.lo is None and s.hi == 1 and len(probes) == 7


def test_config_validation_names_the_bad_value():
    for bad, match in (
        ({"batch": 0}, "batch=0"),
        ({"start": 512, "max_context": 256}, "start=512"),
        ({"resolution": 1.5}, "resolution"),
        ({"dtype": "fp8"}, "fp8"),
        ({"margin_gb": -1.0}, "margin_gb"),
        ({"model": "gpt-9"}, "gpt-9"),
    ):
        with pytest.raises(UserError, match=match):
            run_kv_stress(StressConfig(**{**TINY, **bad}), "/tmp/never-written-kv-stress")
    with pytest.raises(UserError, match="GPUs"):
        run_kv_stress(StressConfig(**TINY, expandable_segments=True), "/tmp/never-written-kv-stress")


def test_stress_reaches_max_context_with_kv_bytes_as_predicted(tmp_path):
    df = run_kv_stress(StressConfig(**TINY), tmp_path)
    assert list(df.context_len) == [64, 128, 256] and set(df.status) == {"ok"}
    assert df.attrs["largest_ok"] == 256 and df.attrs["smallest_failed"] is None
    assert (df.x_kv_bytes_per_token_pred == 2048).all() and (df.x_kv_bytes_per_token_meas == 2048).all()
    assert (df.x_kv_error_pct.abs() < 1).all()
    assert (df.x_peak_vs_pred_pct < 15).all() and (df.peak_mem_gb > 0).all()  # per-probe RSS peak, in bounds
    assert (df.x_alloc_stats.str.startswith("not available")).all() and df.x_frag_ratio.isna().all()
    stored = load_results(tmp_path)
    assert len(stored) == 3 and set(stored.backend) == {"engine"} and (stored.tpot_n == 2).all()
    assert json.loads((tmp_path / "stress.json").read_text())["largest_ok"] == 256
    assert stress_summary(df) == (
        "largest context that decodes: 256 tokens (the --max-context limit: larger contexts were not tried; "
        "raise --max-context to search further)"
    )


def test_mla_kv_bytes_match_the_planner_within_one_percent(tmp_path):
    df = run_kv_stress(StressConfig(model="tiny-deepseek", **{**TINY, "max_context": 128}), tmp_path)
    assert set(df.status) == {"ok"} and (df.x_kv_bytes_per_token_pred == 1280).all()  # 4 x (64 + 16) x 4 B
    assert (df.x_kv_error_pct.abs() < 1).all()


def test_chunked_prefill_probes_report_prefill_speed(tmp_path):
    cfg = StressConfig(**{**TINY, "max_context": 128, "kv_fill": "prefill", "prefill_chunk": 48})
    df = run_kv_stress(cfg, tmp_path)
    assert set(df.status) == {"ok"} and (df.prefill_tok_s > 0).all() and (df.x_kv_error_pct.abs() < 1).all()
    assert (df.x_pred_workspace_gb > 0).all()  # a 48-token chunk against the whole cache: in the prediction


def test_guard_refuses_without_allocating_and_the_search_goes_down(tmp_path):
    def never(*a):
        raise AssertionError("a refused probe must not be measured")

    cfg = StressConfig(**{**TINY, "start": 1_048_576, "max_context": 1_048_576, "batch": 64, "max_probes": 3})
    df = run_kv_stress(cfg, tmp_path, runner=never)
    assert list(df.status) == ["refused"] * 3 and list(df.context_len) == [1_048_576, 524_288, 262_144]
    first = df.iloc[0]
    assert first.x_pred_kv_gb == pytest.approx(64 * (1_048_576 + 2) * 2048 / 1e9)  # ~137 GB (128 GiB)
    assert first.x_pred_total_gb > first.x_avail_gb - first.x_margin_gb
    assert "predicted" in first.error and "available" in first.error and "not allocated" in first.error
    assert first.x_pred_weights_gb > 0  # the model was never built: its weights are part of the prediction


def test_guard_off_records_an_oom_and_bisects_between(tmp_path):
    def oom_above(model, point, device, seed):
        if point.context_len > 150:
            raise oom_error_type()("CUDA out of memory. Tried to allocate 1.00 GiB")
        return run_point(model, point, device, seed)

    cfg = StressConfig(**{**TINY, "max_context": 1024, "guard": False, "resolution": 0.1})
    df = run_kv_stress(cfg, tmp_path, runner=oom_above)
    assert list(df.context_len[:4]) == [64, 128, 256, 192] and df.attrs["largest_ok"] <= 150
    assert set(df.status) == {"ok", "oom"} and df.attrs["smallest_failed"] - df.attrs["largest_ok"] <= 15


def test_an_interrupted_stress_resumes_from_the_recorded_probes(tmp_path):
    cfg = StressConfig(**{**TINY, "max_context": 512})
    calls = []

    def interrupt_third(model, point, device, seed):
        calls.append(point.context_len)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return run_point(model, point, device, seed)

    with pytest.raises(KeyboardInterrupt):
        run_kv_stress(cfg, tmp_path, runner=interrupt_third)
    assert calls == [64, 128, 256] and len(load_results(tmp_path)) == 2
    again = []
    df = run_kv_stress(cfg, tmp_path, runner=lambda m, p, d, s: again.append(p.context_len) or run_point(m, p, d, s))
    assert again == [256, 512] and list(df.context_len) == [64, 128, 256, 512] and set(df.status) == {"ok"}
    fresh = []
    run_kv_stress(cfg, tmp_path, runner=lambda m, p, d, s: fresh.append(1) or run_point(m, p, d, s), resume=False)
    assert len(fresh) == 4 and (tmp_path / "previous").is_dir()


def _killed_at(cfg: StressConfig, out, context: int) -> None:
    """A stress that dies like ``kill -9`` while measuring ``context``: the in-flight marker stays behind (the
    runner saves it, the interrupt's clean-up removes it, the test puts it back)."""
    saved = {}

    def die(model, point, device, seed):
        if point.context_len == context:
            saved["marker"] = (out / INFLIGHT_NAME).read_bytes()
            raise KeyboardInterrupt
        return run_point(model, point, device, seed)

    with pytest.raises(KeyboardInterrupt):
        run_kv_stress(cfg, out, runner=die)
    (out / INFLIGHT_NAME).write_bytes(saved["marker"])


def test_a_probe_the_process_died_on_is_measured_again_on_resume(tmp_path):
    """Issue 28: after a kill -9 during the 128-token probe the resumed stress read that probe as "does not fit"
    forever and answered 124 tokens where 256 decode. One kill proves nothing: the probe is measured again; a probe
    that killed KILLS_TO_GIVE_UP runs (an OOM kill repeats) counts as not fitting, and stays so on resume."""
    cfg = StressConfig(**TINY)
    _killed_at(cfg, tmp_path / "once", 128)
    calls = []
    runner = lambda m, p, d, s: calls.append(p.context_len) or run_point(m, p, d, s)
    df = run_kv_stress(cfg, tmp_path / "once", runner=runner)
    assert calls == [128, 256] and df.attrs["largest_ok"] == 256 and df.attrs["smallest_failed"] is None
    assert list(df.status) == ["ok"] * 3
    for _ in range(KILLS_TO_GIVE_UP):
        _killed_at(cfg, tmp_path / "twice", 128)
    df = run_kv_stress(cfg, tmp_path / "twice", runner=runner)
    assert df.attrs["smallest_failed"] == 128 and 64 <= df.attrs["largest_ok"] < 128
    assert "128 tokens did not (killed)" in stress_summary(df)
    calls.clear()
    again = run_kv_stress(cfg, tmp_path / "twice", runner=runner)
    assert calls == [] and again.attrs["smallest_failed"] == 128  # replayed, not measured a third time


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-deepseek"])
def test_cached_decode_equals_an_uncached_forward_at_length(preset):
    res = cached_vs_uncached(models.build_model(preset, "float32", "cpu"), 384, chunk=100)
    assert res["ok"] and res["argmax_equal"] and res["max_abs_err"] < 1e-4
    assert res["control_discriminates"] and res["control_max_abs_diff"] > 100 * res["max_abs_err"]


def test_the_stress_runs_the_check_first_and_writes_it(tmp_path):
    df = run_kv_stress(StressConfig(**{**TINY, "max_context": 96, "check_context": 80}), tmp_path)
    check = json.loads((tmp_path / "correctness.json").read_text())
    assert check["context_len"] == 80 and check["ok"] and df.attrs["check"] == check


def test_the_check_never_runs_past_the_longest_probe():
    cfg = StressConfig(**{**TINY, "max_context": 64, "check_context": 1024}).validate()
    assert cfg.check_context == 64
    assert StressConfig(**{**TINY, "max_context": 64, "check_context": 0}).validate().check_context == 0


def test_position_override_is_free_for_presets_and_refused_past_a_checkpoint(tmp_path):
    m = models.build_model("tiny-llama", "float32", "cpu", max_position_embeddings=2_000_000)
    assert m.config.max_position_embeddings == 2_000_000 and models.get_config("tiny-llama").max_position_embeddings
    path = models.save_checkpoint(models.build_model("tiny-llama"), tmp_path / "ckpt")
    with pytest.raises(UserError, match="trained limit of 16384"):
        models.get_config(str(path), max_position_embeddings=32768)
    assert models.get_config(str(path), max_position_embeddings=8192).max_position_embeddings == 8192
    cfg = models.get_config(str(path), max_position_embeddings=32768, extend_checkpoint_positions=True)
    assert cfg.max_position_embeddings == 32768
    with pytest.raises(UserError, match="integer >= 1"):
        models.get_config("tiny-llama", max_position_embeddings=0)
    capped = StressConfig(model=str(path), **{**TINY, "max_context": 10**6}).validate()
    assert capped.max_context == 16384 - 2  # a checkpoint's contexts stop at its limit unless extend_positions
