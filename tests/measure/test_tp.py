"""Tensor-parallel points on real torchrun ranks (gloo, 2 ranks, tiny-llama): the sharded model computes the
single-process logits; a TP sweep writes ok rows with tp = n_gpus = 2 and resumes; a rank killed mid-sweep ends
its point as an error, the sweep goes on, and no process of the point's group is left."""

import os
import signal
import threading
import time

import psutil
import pytest
import torch

from kit.measure import sweep, tp
from kit.models import build_model, param_bytes

pytestmark = pytest.mark.slow


def test_tp2_logits_equal_the_single_process_model(tmp_path):
    ckpt = tp.tp_checkpoint("tiny-llama", "float32", seed=0, root=tmp_path / "ckpt")
    assert tp.tp_checkpoint("tiny-llama", "float32", seed=0, root=tmp_path / "ckpt") == ckpt  # written once
    ids = torch.randint(0, 4096, (2, 13), generator=torch.Generator().manual_seed(3))
    sharded = tp.tp_logits(ckpt, "float32", ids, 2, tmp_path / "work")
    single = tp.last_step_logits(build_model("tiny-llama", "float32", "cpu", seed=0), ids)
    assert sharded.shape == single.shape == (2, 4096)
    assert torch.allclose(sharded, single, atol=1e-4), (sharded - single).abs().max()


def _ranks_of(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "kit.measure.tp_worker" in cmd and marker in cmd:
            out.append(p)
    return out


def test_tp_sweep_a_killed_rank_is_an_error_point_and_no_process_is_left(tmp_path, monkeypatch):
    """Case: SIGKILL rank 1 of the first point. That point is `error` naming a rank, the second point is ok with
    tp = n_gpus = 2, and no process of the killed point's group survives (resume is the grid's, by point id)."""
    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path / "cache"))
    cfg = sweep.SweepConfig(tp=2, kv_lens=[16], concurrencies=[1, 2], decode_steps=2, warmup_steps=1, repeats=1)
    out = tmp_path / "run"
    first = sweep.EngineBackend(cfg).points()[0].point_id
    killed = {}

    def kill_rank1():
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120 and not killed:
            for p in _ranks_of(str(out / "tp" / first)):  # this test's ranks, not another run's of the same point
                try:
                    if p.environ().get("LOCAL_RANK") == "1":
                        killed["pgid"] = os.getpgid(p.pid)
                        p.send_signal(signal.SIGKILL)
                        return
                except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                    pass
            time.sleep(0.05)

    killer = threading.Thread(target=kill_rank1)
    killer.start()
    df = sweep.run_sweep(cfg, out, progress=False)
    killer.join()
    assert "pgid" in killed
    by_b = df.set_index("concurrency")
    assert by_b.loc[1, "status"] == "error" and "rank" in by_b.loc[1, "error"], by_b.loc[1, "error"]
    assert by_b.loc[2, "status"] == "ok" and by_b.loc[2, "tp"] == 2 and by_b.loc[2, "n_gpus"] == 2
    assert by_b.loc[2, "x_tp_ranks"] == 2 and by_b.loc[2, "tpot_n"] == 2
    single = build_model("tiny-llama")
    c = single.config  # KV bytes summed over ranks = the whole model's cache
    assert by_b.loc[2, "kv_cache_gb"] * 1e9 == 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4 * 2 * 18
    # issue 22: each rank counted the global size of its sharded tensors and the ranks were summed (2x, 38.9 MB);
    # now local shards summed + replicated tensors once = the single-process figure (19,473,536 bytes)
    assert round(by_b.loc[2, "weights_gb"] * 1e9) == param_bytes(single)
    left = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == killed["pgid"]]
    assert not left and not _ranks_of(str(out)), left


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_tp_settings_are_checked_before_any_work():
    with pytest.raises(ValueError, match="tp=0"):
        sweep.SweepConfig(tp=0).validate()
    with pytest.raises(ValueError, match="not both"):
        sweep.SweepConfig(tp=2, compile=True).validate()
