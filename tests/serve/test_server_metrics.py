"""kit.serve.server_metrics + kit.validity against a scripted server serving /metrics in vLLM's and in SGLang's
naming (counters that advance with the requests it serves): the deltas, prefix-cache hit rate and speculative
acceptance in the row; injected preemptions and prefix-cache hits make the row invalid (and flagged by
kit.results); a server without /metrics (the scripted SSE server, a dead port, real `transformers serve`) is
"not available", never a failure."""

import json
import math
from pathlib import Path

import pytest
from metrics_server import start
from sse_server import dead_url

from kit import results as R
from kit.serve import server_metrics as S
from kit.serve.load import LoadConfig
from kit.serve.point import measure_point
from kit.validity import invalid_note, validity

# 1 warm-up + 6 measured requests of 8 output tokens each: the server counts 56 generation tokens; per request
# 2 drafts (8 // 4), 6 draft tokens, 4 accepted → acceptance rate 4/6, mean acceptance length 1 + 4/2 = 3
CFG = dict(model="normal", num_requests=6, warmup_requests=1, isl=8, osl=8, max_concurrency=2, timeout_s=30)


def served_point(url: str, out: Path, period_s: float = 0.02) -> dict:
    """A served point with the hooks the served backend gets: watch /metrics around measure_point, add the
    server columns (client tokens incl. warm-up, from the detail file) and the validity verdict."""
    cfg = LoadConfig(url=url, **CFG)
    with S.ServerMetricsWatch(url, period_s=period_s) as watch:
        row = measure_point(cfg, out_dir=out)
    records = [json.loads(x) for x in Path(row["x_detail_file"]).read_text().splitlines()]
    row.update(watch.columns(S.client_output_tokens(records)))
    row.update(validity(row))
    return row


@pytest.fixture(params=["vllm", "sglang"])
def naming(request):
    return request.param


@pytest.mark.slow
def test_deltas_hit_rate_acceptance_in_both_namings(naming, tmp_path):
    srv = start(naming, prefix_hits=False)
    try:
        measure_point(LoadConfig(url=srv.url, **CFG), out_dir=tmp_path / "before")  # counters already non-zero
        row = served_point(srv.url, tmp_path / "point")
    finally:
        srv.stop()
    assert row["x_server_metrics"] == naming
    assert row["completed"] == 6 and row["failed"] == 0
    assert row["x_server_generation_tokens"] == 56  # the delta over this point only
    assert row["x_server_client_output_tokens"] == 56 and row["x_server_output_tokens_diff_frac"] == 0
    assert row["x_server_prompt_tokens"] > 0 and row["x_server_prefix_cache_hits"] == 0
    assert row["x_server_prefix_cache_hit_rate"] == 0.0
    assert row["x_server_preemptions"] == 0
    assert row["x_server_spec_acceptance_rate"] == pytest.approx(2 / 3)
    assert row["x_server_spec_mean_acceptance_length"] == pytest.approx(3.0)
    assert row["x_server_running_requests_max"] >= 1  # seen while the point ran, not after it (0)
    assert row["x_server_running_requests_last"] == 0
    assert row["x_server_kv_cache_usage_max"] == pytest.approx(0.1 * row["x_server_running_requests_max"])
    assert row["x_valid"] is True and row["x_invalid_reasons"] is None, row["x_invalid_reasons"]
    assert {"failed", "preemptions", "prefix_cache", "server_tokens", "osl"} <= set(row["x_validity_checks"].split(","))
    if naming == "vllm":
        assert row["x_server_spec_drafts"] == 14 and row["x_server_spec_draft_tokens"] == 42
        assert row["x_server_spec_accepted_tokens"] == 28


@pytest.mark.slow
def test_injected_preemptions_and_prefix_hits_make_the_row_invalid(naming, tmp_path):
    srv = start(naming, preempt=True, prefix_hits=True)
    try:
        row = served_point(srv.url, tmp_path)
    finally:
        srv.stop()
    assert row["x_server_preemptions"] == 7
    assert 0.4 < row["x_server_prefix_cache_hit_rate"] <= 0.5
    assert row["x_valid"] is False
    assert "7 preemption(s) during the point" in row["x_invalid_reasons"]
    assert "prefix-cache hit tokens although every prompt was unique" in row["x_invalid_reasons"]
    df = R.to_frame([{k: v for k, v in row.items()}])
    assert list(R.verdict(df)) == ["flagged"] and not R.ok_mask(df).any()
    assert "failed the validity checks" in R.row_problems(df.iloc[0])[0]
    assert invalid_note(row).startswith("INVALID: 7 preemption(s)")
    assert validity(row, unique_prompts=False)["x_invalid_reasons"].count(";") == 0  # shared prompts: hits allowed


@pytest.mark.slow
def test_server_without_metrics_is_not_available(scripted, tmp_path):
    """The scripted SSE server has no /metrics route (404) — like transformers serve: the point completes."""
    row = served_point(scripted.url, tmp_path)
    assert row["completed"] == 6
    assert row["x_server_metrics"] == f"not available: HTTP 404 from {scripted.url}/metrics"
    assert "preemptions" not in row["x_validity_checks"]
    # metrics that are not available never make a row invalid; on a shared machine the suite's other workers may
    # (late time stamps: machine contention or a starved client, each named)
    starved = bool(row["x_machine_contention"] or row["x_client_bound"])
    assert row["x_valid"] is True or starved, row["x_invalid_reasons"]
    assert "metrics" not in (row["x_invalid_reasons"] or "")


def test_unreachable_and_non_prometheus():
    assert S.scrape(dead_url(), timeout_s=2).error.endswith(")") and "unreachable" in S.scrape(dead_url()).error
    bad = S.parse_metrics("<html><body>502</body></html>")
    assert bad.error.startswith("/metrics is not Prometheus text")
    cols = S.server_columns(bad, bad, 10)
    assert cols == {"x_server_metrics": f"not available: {bad.error}"}
    assert S.ServerMetricsWatch("http://x", enabled=False).__enter__().columns()["x_server_metrics"] == (
        "not available: switched off (--no-server-metrics)"
    )


VLLM_OLD = """# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} %d
vllm:gpu_prefix_cache_queries_created{model_name="m"} 1.7e9
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} %d
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{model_name="m"} %d
"""


def test_parsed_text_old_vllm_names_and_missing_metrics():
    """Names from before a rename still map; metrics a version lacks are simply absent; counters are deltas."""
    a = S.parse_metrics(VLLM_OLD % (1000, 100, 500), 0.0)
    b = S.parse_metrics(VLLM_OLD % (1400, 300, 600), 2.0)
    c = S.server_columns(a, b, client_output_tokens=99, during=[b, b])
    assert c["x_server_metrics"] == "vllm" and c["x_server_scrape_s"] == 2.0 and c["x_server_gauge_samples"] == 2
    assert c["x_server_prefix_cache_queries"] == 400 and c["x_server_prefix_cache_hits"] == 200
    assert c["x_server_prefix_cache_hit_rate"] == 0.5 and c["x_server_kv_cache_usage_max"] == 0.25
    assert c["x_server_generation_tokens"] == 100
    assert c["x_server_output_tokens_diff_frac"] == pytest.approx(1 / 99)
    assert "x_server_preemptions" not in c and c["x_server_spec_acceptance_rate"] is None
    v = validity({**c, "failed": 0})
    assert (
        v["x_valid"] is False and "server counted 100 output tokens, client 99 (1.0 % apart" in v["x_invalid_reasons"]
    )
    restarted = S.server_columns(b, a)
    assert restarted["x_server_generation_tokens"] is None  # a counter that went down: no delta
    # no scrape while the point ran (a point shorter than the polling period): the gauge's maximum is unknown (NaN),
    # never the idle server's value before or after it
    unseen = S.server_columns(a, b, client_output_tokens=99)
    assert math.isnan(unseen["x_server_kv_cache_usage_max"]) and unseen["x_server_kv_cache_usage_last"] == 0.25
    assert unseen["x_server_gauge_samples"] == 0


def test_sglang_tp_ranks_are_summed_and_gauges_averaged():
    text = """# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{tp_rank="0"} %d
sglang:generation_tokens_total{tp_rank="1"} %d
# TYPE sglang:token_usage gauge
sglang:token_usage{tp_rank="0"} 0.2
sglang:token_usage{tp_rank="1"} 0.4
"""
    a, b = S.parse_metrics(text % (10, 10), 0), S.parse_metrics(text % (20, 30), 1)
    c = S.server_columns(a, b, during=[b, b])
    assert c["x_server_generation_tokens"] == 30 and c["x_server_kv_cache_usage_max"] == pytest.approx(0.3)


def test_speculative_acceptance_is_checked_against_the_tokens_the_client_received():
    """A server counting drafts accepted past a sequence's end: its counters imply more emitted tokens (drafts +
    accepted) than the client received; the row says so and is invalid. Without the overcount it is valid."""
    base = {"x_server_spec_drafts": 100, "failed": 0}
    # 300 tokens received in 100 verify steps: 3 per step; the server claims 2.75 accepted + 1 bonus = 3.75
    over = S.spec_cross_check({**base, "x_server_spec_accepted_tokens": 275}, client_output_tokens=300)
    assert over["x_spec_tokens_per_step_client"] == 3.0 and over["x_server_spec_overcount_frac"] == pytest.approx(0.25)
    v = validity({**base, **over})
    assert v["x_valid"] is False and "speculative-decoding counters imply 25 % more" in v["x_invalid_reasons"]
    fine = S.spec_cross_check({**base, "x_server_spec_accepted_tokens": 200}, client_output_tokens=300)
    assert fine["x_server_spec_overcount_frac"] == 0 and validity({**base, **fine})["x_valid"]
    assert S.spec_cross_check({}, 300)["x_server_spec_overcount_frac"] is None


def test_metric_table_has_a_source_per_row():
    rows = S.metric_table()
    assert {r["server"] for r in rows} == {"vllm", "sglang"}
    assert all(r["source"] and r["kind"] in ("counter", "gauge") and r["aggregate"] in ("sum", "mean") for r in rows)
    kit_names = {r["kit_name"] for r in rows}
    need = {
        "running_requests",
        "waiting_requests",
        "kv_cache_usage",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "preemptions",
        "prompt_tokens",
        "generation_tokens",
    }
    assert need <= kit_names and {"spec_draft_tokens", "spec_accepted_tokens", "spec_accept_rate"} <= kit_names


@pytest.mark.slow
def test_transformers_serve_has_no_metrics(tmp_path):
    """The real `transformers serve` on CPU: the point completes, server metrics "not available"."""
    from kit._io import free_port
    from kit.serve import launch as L
    from kit.serve import recipes
    from kit.serve.checkpoint import build_tiny_checkpoint
    from kit.serve.client import load_tokenizer

    ckpt = build_tiny_checkpoint(tmp_path / "tiny-llama")
    spec = recipes.LaunchSpec("transformers", str(ckpt), "CPU", port=free_port(), max_model_len=128, max_num_seqs=2)
    with L.Server(spec, log_path=tmp_path / "server.log") as srv:
        srv.wait_ready(120, poll_s=0.25)
        cfg = LoadConfig(url=srv.url, num_requests=2, warmup_requests=0, isl=8, osl=4, max_concurrency=2)
        with S.ServerMetricsWatch(srv.url, period_s=0.1) as watch:
            row = measure_point(cfg, out_dir=tmp_path / "out", tokenizer=load_tokenizer(str(ckpt)))
    row.update(watch.columns(row["x_output_tokens_total"]))
    assert row["completed"] == 2, row["error"]
    assert row["x_server_metrics"] == f"not available: HTTP 404 from {srv.url}/metrics"


def test_speculative_decoding_recipes():
    """vLLM: --speculative-config JSON; SGLang: its algorithm names and draft flags, plus --enable-metrics."""
    from kit.errors import UserError
    from kit.serve import recipes

    argv, _ = recipes.build_command(
        recipes.LaunchSpec(
            "vllm", "/m", "B300", speculative_method="eagle3", speculative_model="/d", speculative_num_tokens=3
        )
    )
    cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert cfg == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}
    argv, _ = recipes.build_command(
        recipes.LaunchSpec(
            "sglang",
            "/m",
            "MI355X",
            speculative_method="mtp",
            speculative_num_steps=3,
            speculative_topk=1,
            speculative_num_tokens=4,
        )
    )
    a = " ".join(argv)
    assert "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1" in a
    assert "--speculative-num-draft-tokens 4 --enable-metrics" in a and "--speculative-draft-model-path" not in a
    plain, _ = recipes.build_command(recipes.LaunchSpec("vllm", "/m", "B300"))
    assert "--speculative-config" not in plain
    with pytest.raises(UserError, match="needs speculative_model"):
        recipes.LaunchSpec("vllm", "/m", "B300", speculative_method="eagle").validate()
    with pytest.raises(UserError, match="allowed: \\('eagle', 'eagle3', 'mtp'\\)"):
        recipes.LaunchSpec("sglang", "/m", "B300", speculative_method="medusa").validate()
    with pytest.raises(UserError, match="speculative_num_tokens=0"):
        recipes.LaunchSpec("sglang", "/m", "B300", speculative_method="mtp", speculative_num_tokens=0).validate()


HISTOGRAMS = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} %d
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{model_name="m"} %g
vllm:time_to_first_token_seconds_count{model_name="m"} %d
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_sum{model_name="m"} %g
vllm:request_queue_time_seconds_count{model_name="m"} %d
"""


def test_histogram_means_one_scrape_is_not_a_maximum_and_queueing_is_noted():
    """The server's latency histograms become means over the point (sum and count deltas, ms); a gauge seen by one
    scrape only is "not sampled" (NaN); a row whose TTFT is mostly server queue time carries a note, and stays
    valid."""
    from kit.validity import queueing_note

    a = S.parse_metrics(HISTOGRAMS % (0, 10.0, 100, 5.0, 100), 0.0)
    b = S.parse_metrics(HISTOGRAMS % (6, 10.0 + 8 * 0.300, 108, 5.0 + 8 * 0.250, 108), 1.0)
    c = S.server_columns(a, b, during=[b])
    assert c["x_server_ttft_ms_mean"] == pytest.approx(300.0) and c["x_server_ttft_n"] == 8
    assert c["x_server_queue_ms_mean"] == pytest.approx(250.0) and "x_server_ttft_s_sum" not in c
    assert math.isnan(c["x_server_waiting_requests_max"]) and c["x_server_gauge_samples"] == 1
    two = S.server_columns(a, b, during=[a, b])
    assert two["x_server_waiting_requests_max"] == 6
    row = {**two, "x_ttft_ms_mean": 305.0, "failed": 0}
    note = queueing_note(row)
    assert note.startswith("queueing: 250.0 ms of the mean TTFT 305.0 ms is server queue time, up to 6 request(s)")
    assert validity(row)["x_valid"] is True
    idle = S.server_columns(a, S.parse_metrics(HISTOGRAMS % (0, 10.1, 101, 5.0, 101), 1.0), during=[a, a])
    assert queueing_note({**idle, "x_ttft_ms_mean": 100.0}) is None


def test_scrapes_during_a_point_parse_only_the_tables_lines_with_the_same_values():
    """A real vLLM 0.32 (CPU) /metrics: the lines the table names parse to the same values as the whole text, every
    table metric present there survives, and nothing else is kept (no histogram buckets, no process metrics)."""
    text = (Path(__file__).parents[1] / "fixtures" / "vllm_0.32_cpu_metrics.txt").read_text()
    full, few = S.parse_metrics(text, 0.0), S.parse_metrics(S.table_lines(text), 0.0)
    assert few.error is None and few.server == "vllm"
    assert few.values == {k: v for k, v in full.values.items() if k in few.values}
    named = {r["metric"] for r in S.metric_table() if r["server"] == "vllm"}
    assert {k for k in full.values if k in named} <= set(few.values)
    assert set(few.values) <= named | {n.removesuffix("_total") for n in named}
    assert few.values["vllm:generation_tokens_total"] == [24.0]
    assert len(S.table_lines(text)) < len(text) / 2
