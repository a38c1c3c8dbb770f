"""The how-to "why is this point slow" notebook, executed by papermill with small parameters (nbexec.SMALL): two
profiled points of one sweep and their comparison; assertions on the files it wrote (issue 27)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from nbexec import execute

from kit.store import load_results

pytestmark = pytest.mark.slow


def test_why_is_this_point_slow():
    out = execute("how-to/why-is-this-point-slow.ipynb").out_dir
    df = load_results(out / "sweep").sort_values("context_len")
    assert list(df.context_len) == [16, 256] and df.x_profiled.all() and (df.tpot_n == 3).all()
    for trace in df.x_prof_trace:
        events = json.loads(open(trace).read())["traceEvents"]
        assert sum(e.get("name") == "kit.decode_step" for e in events) == 3
    table = pd.read_csv(out / "compare.csv")
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in set(table.op)
    assert (table.a_calls_per_step == table.b_calls_per_step).all()  # one graph at both contexts
    summary = json.loads((out / "compare.json").read_text())
    assert summary["gap_ms_per_step"] == pytest.approx(table.diff_ms_per_step.sum(), abs=1e-6)
    assert summary["figures"]["x_prof_ops_per_step"][0] == summary["figures"]["x_prof_ops_per_step"][1] > 100
    assert (out / "profile_compare.png").stat().st_size > 10_000
