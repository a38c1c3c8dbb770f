"""Smoke test of ``benchmarks/vs_vllm_bench.py`` without vLLM: the referee's figures from two ``/metrics`` texts,
and the kit's client run as its own process against the scripted server with vLLM-named counters
(tests/metrics_server.py), checked against them. Seconds; the benchmark itself (real vLLM) is never run here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kit.serve.server_metrics import parse_metrics, scrape

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
import metrics_server  # noqa: E402
import vs_vllm_bench as vs  # noqa: E402


def _exposition(ttft_sum_s: float, ttft_n: int, tokens: int) -> str:
    return (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {ttft_n}\n'
        f"vllm:time_to_first_token_seconds_count {ttft_n}\n"
        f"vllm:time_to_first_token_seconds_sum {ttft_sum_s}\n"
        "# TYPE vllm:generation_tokens counter\n"
        f'vllm:generation_tokens_total{{engine="0"}} {tokens}\n'
        f'vllm:generation_tokens_total{{engine="1"}} {tokens}\n'
    )


def test_the_referee_takes_means_from_histogram_deltas_and_sums_label_sets():
    ref = vs.referee(parse_metrics(_exposition(1.0, 10, 100)), parse_metrics(_exposition(1.5, 20, 164)))
    assert ref["mean_ttft_ms"] == pytest.approx(50.0)  # (1.5 - 1.0) s over 10 requests
    assert ref["output_tokens"] == 128  # 64 more on each of the two label sets
    assert ref["mean_itl_ms"] is None and ref["completed"] is None  # not exported: not made up


def test_a_kit_client_run_in_its_own_process_agrees_with_the_server_counters():
    srv = metrics_server.start("vllm", gap_ms=1.0, spec=False)
    try:
        spec = {"url": srv.url, "model": "normal", "endpoint": "completions", "isl": 4, "osl": 16}
        spec |= {"requests": 6, "conc": 3, "seed": 1, "tokenizer": None}
        before = scrape(srv.url)
        run = vs.run_worker(vs.kit_command(spec), timeout_s=120)
        ref = vs.referee(before, scrape(srv.url))
    finally:
        srv.stop()
    assert (run["completed"], run["failed"], run["chunks"]) == (6, 0, 96)
    assert ref["output_tokens"] == run["total_output_tokens"] == 96
    assert 0 < run["cpu_stream_s"] <= run["cpu_all_s"] < run["proc_cpu_s"]  # imports are outside the brackets
    row = vs.summarize([{**run, "referee": ref}])
    assert row["us_per_tok_stream"] == pytest.approx(1e6 * run["cpu_stream_s"] / 96) and row["n"] == 1
