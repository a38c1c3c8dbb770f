"""papermill runs the first tutorial with small parameters (once per session, via nbexec); assert on its files."""

import pytest
from nbexec import execute

from kit.store import load_results

pytestmark = pytest.mark.slow


def test_first_sweep_tutorial():
    out = execute("tutorials/01-first-sweep.ipynb").out_dir
    df = load_results(out)
    assert len(df) == 4 and set(df.status) == {"ok"}
    assert sorted(set(df.context_len)) == [16, 64] and sorted(set(df.concurrency)) == [1, 2]
    for png in ("throughput_vs_concurrency.png", "tpot_vs_context.png", "heatmap_decode_tok_s.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG", png  # required: a missing file fails here
