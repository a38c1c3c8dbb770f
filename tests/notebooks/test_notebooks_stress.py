"""The how-to "stress the KV cache" notebook, executed by papermill with a small ceiling (nbexec.SMALL); assertions
on the files it wrote (issue 13)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from nbexec import execute

from kit.store import load_results

pytestmark = pytest.mark.slow


def test_stress_the_kv_cache():
    out = execute("how-to/stress-the-kv-cache.ipynb").out_dir
    t = pd.read_csv(out / "stress.csv")
    assert list(t.context_len) == [64, 128, 256] and set(t.status) == {"ok"}  # doubles up to the small ceiling
    assert (t.x_kv_error_pct.abs() < 1).all(), t.x_kv_error_pct.tolist()
    # peak RSS vs prediction: the +15 % bound is a property at scale (the 1M-token CLI run measured -1.8 %); these
    # probes are ~0.5 GB, nearly all of it the kernel's own baseline, which varies with what else ran in the
    # kernel (+58 % seen under the parallel doc-test run vs -0.1 % alone), so only its presence is checked here
    assert (t.x_pred_peak_gb > 0).all() and (t.peak_mem_gb > 0).all() and t.x_peak_vs_pred_pct.notna().all()
    assert t.x_alloc_stats.str.startswith("not available").all()
    refused = pd.read_csv(out / "refused.csv")
    assert list(refused.status) == ["refused", "refused"] and list(refused.context_len) == [1048576, 524288]
    assert (refused.x_pred_total_gb > refused.x_avail_gb).all() and refused.error.str.contains("not allocated").all()
    assert len(load_results(out / "batch-1")) == 3 and set(load_results(out / "far-beyond").status) == {"refused"}
    check = json.loads((out / "batch-1" / "correctness.json").read_text())
    assert check["context_len"] == 128 and check["ok"] and check["control_discriminates"]
    for png in ("memory_vs_context.png", "tpot_vs_context.png"):
        assert (out / png).stat().st_size > 10_000
