"""Doc test of the how-to "run a tensor-parallel sweep": executed under papermill with 2 gloo ranks; asserts on
the run directories and the comparison table it wrote."""

import pandas as pd
import pytest
from nbexec import execute

from kit.store import load_results

pytestmark = pytest.mark.slow


def test_howto_run_a_tensor_parallel_sweep():
    out = execute("how-to/run-a-tensor-parallel-sweep.ipynb").out_dir
    sharded, single = load_results(out / "tp2"), load_results(out / "tp1")
    assert list(sharded.concurrency) == list(single.concurrency) == [2]  # nbexec.SMALL: one point
    assert set(sharded.status) == set(single.status) == {"ok"}
    assert set(sharded.tp) == set(sharded.n_gpus) == {2} and set(single.tp) == {1}
    assert all((out / "tp2" / "tp" / pid / "logs").is_dir() for pid in sharded.point_id)
    cache = dict(zip(single.concurrency, single.kv_cache_gb))  # summed over ranks = the whole model's cache
    assert all(abs(g - cache[b]) < 1e-12 for b, g in zip(sharded.concurrency, sharded.kv_cache_gb))
    table = pd.read_csv(out / "tp_vs_single.csv")
    assert len(table) == 1 and (table["ratio_tp1_over_tpN"] > 0).all()
