"""The energy-per-token how-to, executed by papermill against a fake pynvml (450 W, no energy counter) and a
scripted vLLM-style /metrics server with injected preemptions; assertions on the files it wrote."""

from __future__ import annotations

import pandas as pd
import pytest
from nbexec import execute

pytestmark = pytest.mark.slow


def test_energy_per_token_and_trust_checks():
    out = execute("how-to/energy-per-token-and-trust-checks.ipynb").out_dir
    e = pd.read_csv(out / "energy.csv").iloc[0]
    assert e["x_power_status"] == "ok: nvml (0:NVIDIA H100 80GB HBM3)"
    assert e["x_energy_method"] == "integral"  # the fake has no energy counter
    assert e["avg_power_w"] == pytest.approx(450.0) and e["peak_power_w"] == 450.0
    tokens = 2 * 2 * (2 + 8)  # repeats x concurrency x (warm-up + decode steps)
    assert e["j_per_output_token"] == pytest.approx(e["energy_j"] / tokens)
    assert e["pct_tdp"] == pytest.approx(100 * 450 / 700)  # H100 TDP 700 W
    assert e["x_energy_usd_per_mtok"] == pytest.approx(e["energy_j"] / 3.6e6 * 0.12 / tokens * 1e6)
    assert bool(e["x_valid"]) and e["x_power_samples"] >= 2
    s = pd.read_csv(out / "served.csv").iloc[0]
    assert s["x_server_metrics"] == "vllm" and s["completed"] == 4 and s["failed"] == 0
    assert s["x_server_generation_tokens"] == 5 * 8 == s["x_server_client_output_tokens"]
    assert s["x_server_preemptions"] == 5 and s["x_server_spec_acceptance_rate"] == pytest.approx(2 / 3)
    assert not bool(s["x_valid"]) and "5 preemption(s) during the point" in s["x_invalid_reasons"]
    text = (out / "verdicts.txt").read_text()
    assert "in-process: valid" in text and "served: INVALID: 5 preemption(s)" in text
