"""Faults found trying the served benchmark as its users would, each kind with a test that failed before its fix:
a run answered from the prefix cache passing as valid, the kit's own late sends stored as ordinary rows."""

import pytest

from kit.serve.load import LoadConfig
from kit.serve.modes import serve_bench
from kit.serve.point import measure_point
from kit.serve.simserver import SimModel, SimServer
from kit.validity import validity


@pytest.fixture(scope="module")
def cached_sim():
    """A simulated server with a prefix cache of 4-token blocks that reports cached tokens in its usage."""
    with SimServer(SimModel(ttft_base_ms=2, prefill_ms_per_token=0.2, tpot_base_ms=1, block_tokens=4)) as s:
        yield s


@pytest.mark.slow
def test_a_rerun_sends_new_prompts_unless_the_seed_pins_them(cached_sim, tmp_path):
    """Twice the same unique-prompt benchmark: without --seed the second run sends prompts no run sent (no cache
    hit, valid); with the same pinned seed the second run is answered from the cache and is invalid, saying why."""
    kw = {"model": "sim", "num_requests": 6, "warmup_requests": 1, "isl": 16, "osl": 2, "progress": False}
    first = serve_bench(cached_sim.url, [2], out_dir=tmp_path / "a", **kw).iloc[0]
    second = serve_bench(cached_sim.url, [2], out_dir=tmp_path / "b", **kw).iloc[0]
    assert first["x_seed"] != second["x_seed"]
    for row in (first, second):
        assert row["x_prefix_hit_rate_achieved"] == 0 and row["x_valid"], row["x_invalid_reasons"]
        assert "prefix_cache_usage" in row["x_validity_checks"]
    pinned = serve_bench(cached_sim.url, [2], out_dir=tmp_path / "c", seed=7, **kw).iloc[0]
    again = serve_bench(cached_sim.url, [2], out_dir=tmp_path / "d", seed=7, **kw).iloc[0]
    assert pinned["x_valid"] and again["x_seed"] == 7
    assert again["x_prefix_hit_rate_achieved"] == 1.0 and not again["x_valid"]
    assert "100 % of prompt tokens from its prefix cache" in again["x_invalid_reasons"]
    assert "the workload intended 0 %" in again["x_invalid_reasons"]
    # a resumed run (same out, no seed) keeps its points: the point id does not carry the run's new seed
    seen = []
    serve_bench(cached_sim.url, [2], out_dir=tmp_path / "a", on_point=lambda r, f: seen.append(r), **kw)
    assert seen == []


def test_intended_sharing_is_not_counted_against_a_row():
    row = {"x_prefix_hit_rate_achieved": 0.40, "x_prefix_hit_rate_intended": 0.375}
    assert validity(row)["x_valid"]
    row["x_prefix_hit_rate_achieved"] = 0.5
    assert not validity(row)["x_valid"]
    assert validity({"x_prefix_hit_rate_achieved": 0.9})["x_valid"]  # nothing intended stated: not judged


@pytest.mark.slow
def test_late_sends_of_the_kits_own_schedule_make_a_row_invalid(cached_sim, tmp_path, monkeypatch):
    """The kit's own sending (not the server) was 40 ms late on an open loop: the row says so."""
    from kit.serve import loop

    real = loop.sleep_until

    async def late(t):
        await real(t + 0.04)

    monkeypatch.setattr(loop, "sleep_until", late)
    cfg = LoadConfig(url=cached_sim.url, model="sim", num_requests=4, warmup_requests=0, isl=8, osl=2)
    cfg.request_rate, cfg.max_concurrency = 50.0, None
    row = measure_point(cfg, out_dir=tmp_path)
    assert row["x_send_late_ms_p99"] >= 40 and row["x_valid"] is False
    assert "the client sent requests late (p99" in row["x_invalid_reasons"]


def test_a_server_refusing_the_prompts_token_ids_gets_the_tokenizer_hint():
    """vLLM 0.32 refuses a token-id prompt outside its model's vocabulary ("Token id 19704 is out of vocabulary",
    seen with a 354-token tiny checkpoint and no tokenizer given): the row's error names the cure; other failures
    do not get it."""
    from kit.serve.aggregate import VOCAB_HINT, error_summary

    oov = [{"ok": False, "error": "error event: Token id 19704 is out of vocabulary"}, {"ok": True}]
    got = error_summary(oov, None)
    assert got.startswith("1 of 2 requests failed: error event: Token id 19704") and got.endswith(f"({VOCAB_HINT})")
    assert "--tokenizer" in VOCAB_HINT and "1000-19999" in VOCAB_HINT
    assert VOCAB_HINT not in error_summary([{"ok": False, "error": "HTTP 500: engine dead"}], None)
