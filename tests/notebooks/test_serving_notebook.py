"""The how-to notebook "benchmark a serving endpoint" runs under papermill with small parameters: it starts
`transformers serve` on CPU itself, sweeps concurrency, runs an in-process sweep of the same checkpoint and
plots both. Assertions are on the files it wrote (rows, columns, statuses), never on timing values."""

import json

import pytest
from nbexec import execute

from kit.store import load_results

pytestmark = pytest.mark.slow


def test_benchmark_a_serving_endpoint_notebook():
    out = execute("how-to/benchmark-a-serving-endpoint.ipynb").out_dir
    served = load_results(out / "served")
    assert list(served["backend"]) == ["openai", "openai"] and list(served["concurrency"]) == [1, 4]
    assert (served["status"] == "ok").all() and (served["completed"] == 4).all() and (served["failed"] == 0).all()
    assert served["output_tok_s"].notna().all() and served["goodput_rps"].notna().all()
    assert len(list((out / "served").glob("requests-*.jsonl"))) == 2
    both = load_results(out / "combined.parquet")
    assert set(both["backend"]) == {"openai", "engine"}
    assert both.loc[both["backend"] == "engine", "decode_tok_s"].notna().all()
    assert (out / "served_vs_inprocess.png").read_bytes()[:4] == b"\x89PNG"
    log = out / "served" / "servers" / "default" / "server.log"  # the launched server's log, its command first
    assert log.read_text().startswith("$ ") and "Application startup complete" in log.read_text()
    assert not log.read_text().count("Traceback")
    assert json.loads(log.with_name("launch.json").read_text())["engine_version"].startswith("transformers ")
