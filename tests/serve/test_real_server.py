"""The served view against a real server: ``transformers serve --continuous-batching`` on CPU with a tiny
random-weight Llama and a locally trained tokenizer (kit.serve.checkpoint.build_tiny_checkpoint), on 127.0.0.1,
started by kit.serve.launch.Server; points and sweeps through kit.serve.sweep.

transformers serve streams ``data:`` events without a final ``[DONE]``, sends usage in its last chunk, and its
chunks are decoded text, not tokens. One server per module (start-up ~10 s); the last test kills it mid-run.
"""

import json
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kit._io import free_port
from kit.serve import launch as L
from kit.serve import recipes
from kit.serve.checkpoint import build_tiny_checkpoint
from kit.serve.client import load_tokenizer
from kit.serve.load import LoadConfig
from kit.serve.point import measure_point, served_point_id
from kit.serve.sweep import run_served_sweep
from kit.store import load_results

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tserve")
    ckpt = build_tiny_checkpoint(d / "tiny-llama")
    spec = recipes.LaunchSpec(
        "transformers", str(ckpt), "CPU", port=free_port(), max_model_len=256, max_num_seqs=16, max_batch_tokens=512
    )
    srv = L.Server(spec, log_path=d / "server.log")
    srv.start()
    try:
        srv.wait_ready(120, poll_s=0.25)
        yield srv, str(ckpt), load_tokenizer(str(ckpt))
    finally:
        srv.stop()


def test_completions_and_chat_stream(server, tmp_path):
    srv, model, tok = server
    for endpoint in ("completions", "chat"):
        cfg = LoadConfig(
            url=srv.url, endpoint=endpoint, isl=32, osl=12, num_requests=3, max_concurrency=3, warmup_requests=1
        )
        row = measure_point(cfg, out_dir=tmp_path / endpoint, tokenizer=tok)
        assert row["model"] == model  # from /v1/models
        assert row["completed"] == 3 and row["failed"] == 0, row["error"]
        assert row["x_output_tokens_estimated"] == 0  # usage came in the last chunk
        # "tokenizer" counted the tokens per chunk ("buffered" joins it when a starved run got a response in one read)
        assert "tokenizer" in row["x_tokens_per_chunk_source"].split(",")
        assert row["ttft_ms"] > 0 and row["tpot_ms_p50"] > 0 and row["itl_n"] > 0
        assert row["x_input_tokens_total"] >= 3 * 32 * (0.9 if endpoint == "completions" else 1.0)


def _max_in_flight(detail) -> int:
    """Most requests in flight at once, from a point's detail file (each request's sent_s / end_s)."""
    reqs = [json.loads(line) for line in detail.read_text().splitlines()]
    return max(sum(1 for o in reqs if o["sent_s"] <= r["sent_s"] < o["end_s"]) for r in reqs)


def test_concurrency_sweep_keeps_that_many_in_flight(server, tmp_path):
    # Throughput rising with concurrency is a speed figure (the served benchmarks print it); what a test can hold
    # on a shared CPU is that each point really kept its concurrency in flight against the real server.
    srv, _, tok = server
    cfg = LoadConfig(url=srv.url, isl=32, osl=24, num_requests=8, warmup_requests=2)
    df = run_served_sweep(cfg, [2, 8], tmp_path, tokenizer=tok, progress=False)
    assert (df["failed"] == 0).all() and (df["completed"] == 8).all()
    assert (df["output_tok_s"] > 0).all()
    flight = {int(r.concurrency): _max_in_flight(Path(r.x_detail_file)) for r in df.itertuples()}
    assert flight == {2: 2, 8: 8}, flight
    assert load_results(tmp_path)["backend"].eq("openai").all()


def test_ignore_eos_rejected_is_counted_not_raised(server, tmp_path):
    srv, _, tok = server
    cfg = LoadConfig(url=srv.url, isl=8, osl=4, num_requests=2, warmup_requests=0, ignore_eos=True)
    row = measure_point(cfg, out_dir=tmp_path, tokenizer=tok)
    assert row["failed"] == 2 and "HTTP 422" in row["error"] and "ignore_eos" in row["error"]


def test_server_killed_mid_run(server, tmp_path):
    srv, model, tok = server
    cfg = LoadConfig(
        url=srv.url,
        isl=16,
        osl=128,
        num_requests=24,
        max_concurrency=2,
        warmup_requests=0,
        timeout_s=20,
        stall_timeout_s=5,
    )
    detail = tmp_path / f"requests-{served_point_id(replace(cfg, model=model))}.jsonl"  # the sweep lists the model

    def kill_after_two_finished(n_done: int, ok: bool) -> None:
        if n_done == 2:
            os.killpg(srv.proc.pid, signal.SIGKILL)  # killed, not shut down gracefully

    t = time.perf_counter()
    rows = []
    run_served_sweep(
        cfg,
        [2],
        tmp_path,
        tokenizer=tok,
        progress=False,
        on_progress=kill_after_two_finished,
        on_point=lambda rec, frame: rows.append(rec),
    )
    row = rows[0]
    assert time.perf_counter() - t < 40
    assert row["completed"] >= 2 and row["failed"] >= 1 and row["completed"] + row["failed"] == 24, row["error"]
    assert len(detail.read_text().splitlines()) == 24
    assert int(load_results(tmp_path)["failed"].iloc[0]) == row["failed"]
    assert row["x_detail_file"] == str(detail)
