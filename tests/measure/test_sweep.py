"""Sweep persistence: kill -9 loses no finished point and resumes; OOM recorded, memory freed, sweep goes on."""

import gc
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
import torch

from kit import models
from kit.errors import OutputPathError, UserError
from kit.grid import oom_error_type
from kit.measure import sweep
from kit.measure.engine import run_point
from kit.store import load_results

SMALL = dict(kv_lens=[16, 32], concurrencies=[1, 2], decode_steps=3, warmup_steps=1, repeats=1)


def test_small_sweep_and_resume(tmp_path):
    cfg = sweep.SweepConfig(**SMALL)
    seen = []
    df = sweep.run_sweep(cfg, tmp_path, progress=False, on_point=lambda rec, frame: seen.append(len(frame)))
    assert len(df) == 4 and set(df.status) == {"ok"} and seen == [1, 2, 3, 4]
    assert (tmp_path / "results.parquet").exists() and (tmp_path / "results.json").exists()
    meta = load_results(tmp_path).attrs["metadata"]
    assert meta["model"] == "tiny-llama" and meta["torch_version"] and meta["device"]["platform"] == "cpu"
    calls = []
    df2 = sweep.run_sweep(cfg, tmp_path, progress=False, runner=lambda *a: calls.append(a) or {})
    assert calls == [] and len(df2) == 4  # everything already finished: nothing re-measured


def test_no_resume_starts_clean_and_keeps_the_old_run(tmp_path):
    cfg = sweep.SweepConfig(**{**SMALL, "threads": 1})
    sweep.run_sweep(cfg, tmp_path, progress=False)
    threads = torch.get_num_threads()
    df = sweep.run_sweep(cfg, tmp_path, progress=False, resume=False)
    assert len(df) == 4 and df.point_id.nunique() == 4 and len(load_results(tmp_path)) == 4
    assert len(list((tmp_path / "previous").glob("*/points.jsonl"))) == 1
    assert torch.get_num_threads() == threads  # restored after the sweep
    with pytest.raises(ValueError, match="threads=0"):
        sweep.SweepConfig(**{**SMALL, "threads": 0}).validate()


def test_should_stop_keeps_finished_points(tmp_path):
    cfg = sweep.SweepConfig(**SMALL)
    n = {"k": 0}

    def on_point(rec, frame):
        n["k"] += 1

    df = sweep.run_sweep(cfg, tmp_path, progress=False, on_point=on_point, should_stop=lambda: n["k"] >= 2)
    assert len(df) == 2 and len(load_results(tmp_path)) == 2


class _Holder:
    pass


def test_oom_recorded_memory_freed_and_sweep_continues(tmp_path):
    """Case R1: batches [8, 64, 16], the runner raises torch.OutOfMemoryError at batch >= 64."""
    refs = []

    def runner(model, point, device, seed):
        if point.concurrency >= 64:
            big = _Holder()
            big.t = torch.empty(1_000_000)
            refs.append(weakref.ref(big))
            raise oom_error_type()("CUDA out of memory. Tried to allocate 20.00 GiB")  # message text irrelevant
        if refs:  # the next point starts only after the failed point's tensors are gone
            gc.collect()
            assert refs[0]() is None, "the OOM point's tensors are still alive"
        return run_point(model, point, device, seed)

    cfg = sweep.SweepConfig(kv_lens=[16], concurrencies=[8, 64, 16], decode_steps=2, warmup_steps=0, repeats=1)
    df = sweep.run_sweep(cfg, tmp_path, progress=False, runner=runner)
    assert dict(zip(df.concurrency, df.status)) == {8: "ok", 64: "oom", 16: "ok"}
    assert "OutOfMemoryError" in df.set_index("concurrency").loc[64, "error"]
    assert issubclass(oom_error_type(), RuntimeError)


def test_other_errors_recorded_and_retried_on_resume(tmp_path):
    def runner(model, point, device, seed):
        if point.concurrency == 2:
            raise RuntimeError("kernel exploded")
        return run_point(model, point, device, seed)

    cfg = sweep.SweepConfig(**SMALL)
    df = sweep.run_sweep(cfg, tmp_path, progress=False, runner=runner)
    assert sorted(df.status) == ["error", "error", "ok", "ok"]
    assert df[df.status == "error"].error.str.contains("kernel exploded").all()
    df2 = sweep.run_sweep(cfg, tmp_path, progress=False)  # errors are retried, ok points skipped
    latest = df2.drop_duplicates("point_id", keep="last")
    assert set(latest.status) == {"ok"} and len(df2) == 6


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(model="gpt-9"), "unknown model preset 'gpt-9'"),
        (dict(kv_lens=[0, 128]), "KV length 0"),
        (dict(concurrencies=[-1]), "concurrency -1"),
        (dict(kv_lens=[20000]), "at most 16384 positions"),
        (dict(dtypes=["float8"]), "dtype 'float8'"),
        (dict(device="tpu"), "device='tpu'"),
        (dict(kv_fill="nope"), "kv_fill='nope'"),
        # bounded before any work: a seed torch cannot take failed every point, a limit of inf never ends, 1000
        # ranks fill the memory, 10^9 repeats never end
        (dict(seed=10**23), "seed=100000000000000000000000 .* from 0 to 9,223,372,036,854,775,807"),
        (dict(seed=1e23), "seed=1e\\+23"),
        (dict(tp_timeout_s=float("inf")), "tp_timeout_s=inf .* <= 604,800"),
        (dict(tp=1000), "tp=1000: (at most \\d+ gloo ranks|nccl runs one rank per GPU)"),
        (dict(repeats=10**9), "repeats=1000000000 must be an integer from 1 to 1000"),
    ],
)
def test_bad_input_rejected_before_any_work(tmp_path, kw, match):
    calls = []
    with pytest.raises(ValueError, match=match):
        sweep.run_sweep(
            sweep.SweepConfig(**{**SMALL, **kw}), tmp_path / "o", progress=False, runner=lambda *a: calls.append(1)
        )
    assert calls == [] and not (tmp_path / "o").exists()


def test_output_path_that_is_a_file(tmp_path):
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(OutputPathError, match="is a file"):
        sweep.run_sweep(sweep.SweepConfig(**SMALL), f, progress=False)


def test_killed_subprocess_loses_no_finished_point_and_resumes(tmp_path):
    out = tmp_path / "run"
    code = f"""
import time
from kit.measure import sweep
from kit.measure.engine import run_point
def slow(model, point, device, seed):
    rec = run_point(model, point, device, seed)
    if point.context_len == 32 and point.concurrency == 1:
        print('READY', flush=True)
        time.sleep(60)  # killed here, after two points are on disk
    return rec
sweep.run_sweep(sweep.SweepConfig(kv_lens=[16, 32], concurrencies=[1, 2], decode_steps=2, warmup_steps=0,
                                  repeats=1), {str(out)!r}, progress=False, runner=slow)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )
    deadline = time.time() + 120
    line = ""
    while time.time() < deadline and "READY" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
    assert "READY" in line, "the sweep subprocess never reached the third point"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before = load_results(out)
    assert len(before) == 2 and set(before.status) == {"ok"}
    cfg = sweep.SweepConfig(kv_lens=[16, 32], concurrencies=[1, 2], decode_steps=2, warmup_steps=0, repeats=1)
    measured = []
    df = sweep.run_sweep(
        cfg,
        out,
        progress=False,
        runner=lambda m, p, d, s: measured.append((p.context_len, p.concurrency)) or run_point(m, p, d, s),
    )
    # the point the process died on is recorded as killed and skipped (it could kill every re-run); the rest runs
    assert measured == [(32, 2)]
    assert df.point_id.nunique() == 4 and sorted(df.status) == ["killed", "ok", "ok", "ok"]
    killed = df[df.status == "killed"].iloc[0]
    assert (killed.context_len, killed.concurrency) == (32, 1) and "died while measuring" in killed.error
    measured.clear()
    df = sweep.run_sweep(
        cfg,
        out,
        progress=False,
        retry_killed=True,
        runner=lambda m, p, d, s: measured.append((p.context_len, p.concurrency)) or run_point(m, p, d, s),
    )
    assert measured == [(32, 1)] and df.drop_duplicates("point_id", keep="last").status.eq("ok").all()


class _InterruptsInItsFinaliser:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # the KeyboardInterrupt is raised inside __del__ and swallowed there


def test_ctrl_c_swallowed_by_a_finaliser_still_stops_the_sweep(tmp_path, capsys, caplog):
    """CI, 2026-11-30: the SIGINT landed in a regex ``Group.__del__``; Python printed "Exception ignored ...
    KeyboardInterrupt" and the sweep measured every remaining point. A swallowed Ctrl-C must stop the sweep at
    the next point, keep the finished ones, and print no traceback."""
    calls = []

    def runner(model, point, device, seed):
        calls.append((point.context_len, point.concurrency))
        rec = run_point(model, point, device, seed)
        if len(calls) == 1:
            obj = _InterruptsInItsFinaliser()
            del obj
        return rec

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    hook_before = sys.unraisablehook
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(sweep.SweepConfig(**SMALL), tmp_path, progress=False, runner=runner)
    assert len(calls) == 1 and len(load_results(tmp_path)) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "stopping after the current point" in caplog.text  # logged, one line
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler and hook restored
    assert sys.unraisablehook is hook_before


def test_identity_includes_seed_and_threads(tmp_path):
    base = sweep.SweepConfig(**SMALL)
    ids = {p.point_id for p in sweep.EngineBackend(base).points()}
    assert ids.isdisjoint(p.point_id for p in sweep.EngineBackend(sweep.SweepConfig(**SMALL, seed=1)).points())
    assert ids.isdisjoint(p.point_id for p in sweep.EngineBackend(sweep.SweepConfig(**SMALL, threads=1)).points())
    assert ids == {p.point_id for p in sweep.EngineBackend(sweep.SweepConfig(**SMALL)).points()}  # stable
    calls = []
    sweep.run_sweep(sweep.SweepConfig(**SMALL), tmp_path, progress=False)
    sweep.run_sweep(
        sweep.SweepConfig(**SMALL, threads=1),
        tmp_path,
        progress=False,
        runner=lambda *a: calls.append(a) or sweep.run_point(*a),
    )
    assert len(calls) == 4  # another --threads measures again, it does not "resume" the old numbers


def test_a_checkpoint_with_custom_code_is_refused_unless_trusted(tmp_path):
    import json

    from kit.models import build_model, save_checkpoint

    ckpt = save_checkpoint(build_model("tiny-llama"), tmp_path / "custom")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    (ckpt / "configuration_evil.py").write_text("raise SystemExit('custom code ran')\n")
    with pytest.raises(ValueError, match=r"needs its own Python code .*--trust-remote-code"):
        sweep.SweepConfig(model=str(ckpt), **SMALL).validate()
    with pytest.raises(ValueError, match="needs its own Python code"):
        models.build_model(str(ckpt))


def test_memory_preflight_refuses_a_sweep_that_cannot_fit_before_any_work(tmp_path, monkeypatch, capsys):
    """Issue 28: the 70B preset on a 24 GB host reached the kernel's OOM killer. The largest point is predicted
    (weights + KV + workspace) and a sweep that cannot fit is refused before any model is built: one line naming
    predicted and available bytes and the override; --no-guard runs it anyway."""
    from kit.cli import main
    from kit.measure import memguard

    host = memguard.FreeMemory(20.0, 24.0, "MemAvailable")  # a 24 GB host with 20 GB free
    monkeypatch.setattr(memguard, "available_memory", lambda device: host)
    monkeypatch.setattr(sweep, "_MODEL_CACHE", {})  # no model left loaded by an earlier test
    monkeypatch.setattr(sweep.models, "build_model", lambda *a, **k: pytest.fail("refused sweeps build no model"))
    args = ["sweep", "--model", "llama-3.1-70b", "--dtype", "bfloat16", "--kv", "128", "--concurrency", "1"]
    assert main([*args, "--out", str(tmp_path / "big")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the largest point (bfloat16 kv=128 B=1) needs a predicted 141," in err
    assert "20,000,000,000 bytes are available (MemAvailable) minus a 1.20 GB margin" in err and "--no-guard" in err
    assert not (tmp_path / "big").exists()
    # the largest point decides: tiny-llama fits at kv=16, not a 16,000-token prefill at B=64 in one forward
    # (its attention mask alone is 64 x 16,000 x 16,003 x 5 bytes = 82 GB; 98 GB in all)
    sweep.EngineBackend(sweep.SweepConfig(**SMALL))
    big = {**SMALL, "kv_lens": [16, 16_000], "concurrencies": [1, 64]}
    with pytest.raises(UserError, match=r"\(float32 kv=16000 B=64\) needs a predicted 98,[0-9,]+ bytes"):
        sweep.EngineBackend(sweep.SweepConfig(**big))
    assert sweep.EngineBackend(sweep.SweepConfig(**{**big, "guard": False})).config.guard is False
