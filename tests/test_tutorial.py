"""papermill runs the first tutorial with small parameters; assert on the files it wrote."""
from pathlib import Path

from kit.notebooks import NOTEBOOK_DIR, run_notebook
from kit.results import load_results


def test_first_sweep_tutorial(tmp_path):
    out = tmp_path / "out"
    run_notebook(NOTEBOOK_DIR / "tutorials" / "01-first-sweep.ipynb", tmp_path / "executed.ipynb",
                 parameters={"kv_lens": [16, 64], "concurrencies": [1, 2], "decode_steps": 3, "repeats": 1,
                             "device": "cpu", "out_dir": str(out)}, cell_timeout_s=300)
    df = load_results(out)
    assert len(df) == 4 and set(df.status) == {"ok"}
    assert sorted(set(df.context_len)) == [16, 64] and sorted(set(df.concurrency)) == [1, 2]
    for png in ("throughput_vs_concurrency.png", "tpot_vs_context.png", "heatmap_decode_tok_s.png"):
        assert (out / png).exists()
