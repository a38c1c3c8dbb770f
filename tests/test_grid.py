"""kit.grid: the one grid runner, driven by a backend that needs no model (resume, failures, stop, archive)."""

import contextlib
import gc
import weakref

import pytest

from kit.errors import OutputPathError
from kit.grid import GridPoint, archive_previous, oom_error_type, run_grid
from kit.store import load_results, read_log, run_metadata


class Tensorish:
    """Stands in for a tensor the failing point allocated: freed only when the exception's frames are gone."""


class FakeBackend:
    kind = "planner"
    description = "fake"

    def __init__(self, n=4, fail=(), oom=(), hold=None):
        self.n, self.fail, self.oom, self.hold = n, set(fail), set(oom), hold
        self.measured, self.sessions, self.alive_at_cleanup = [], [], []

    def points(self):
        return [
            GridPoint(f"p{i}", {"concurrency": i + 1, "context_len": 128, "model": "fake"}, f"B={i + 1}", i)
            for i in range(self.n)
        ]

    def metadata(self):
        return run_metadata(model="fake")

    @contextlib.contextmanager
    def session(self):
        self.sessions.append("enter")
        try:
            yield self
        finally:
            self.sessions.append("exit")

    def measure(self, point):
        self.measured.append(point.config)
        if point.config in self.oom:
            big = Tensorish()
            self.hold = weakref.ref(big)
            raise oom_error_type()("CUDA out of memory. Tried to allocate 20.00 GiB\nmore detail")
        if point.config in self.fail:
            raise KeyError("boom")
        return {"status": "ok", "tpot_ms_p50": 1.0 + point.config}

    def after_failure(self):
        gc.collect()
        self.alive_at_cleanup.append(self.hold is not None and self.hold() is not None)
        return {"x_cleaned": True}


def test_runs_every_point_stores_them_and_resumes(tmp_path):
    b = FakeBackend()
    seen = []
    df = run_grid(b, tmp_path, progress=False, on_point=lambda rec, frame: seen.append(len(frame)))
    assert list(df.point_id) == ["p0", "p1", "p2", "p3"] and set(df.status) == {"ok"}
    assert set(df.backend) == {"planner"} and list(df.concurrency) == [1, 2, 3, 4] and seen == [1, 2, 3, 4]
    assert b.sessions == ["enter", "exit"]
    assert len(load_results(tmp_path)) == 4 and load_results(tmp_path).attrs["metadata"]["model"]
    b2 = FakeBackend()
    df2 = run_grid(b2, tmp_path, progress=False)
    assert b2.measured == [] and len(df2) == 4  # all finished: nothing measured again


def test_failures_are_recorded_and_the_grid_goes_on(tmp_path):
    b = FakeBackend(fail={1}, oom={2})
    df = run_grid(b, tmp_path, progress=False)
    by = df.set_index("point_id")
    assert list(df.status) == ["ok", "error", "oom", "ok"]
    assert by.loc["p1", "error"] == "KeyError: 'boom'"
    assert by.loc["p2", "error"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"
    assert by.loc["p2", "concurrency"] == 3 and by.loc["p2", "x_cleaned"]  # config columns kept on a failed row
    # after_failure runs once the exception's frames are gone: the failed point's objects can be freed
    assert b.alive_at_cleanup == [False, False]
    b2 = FakeBackend()
    run_grid(b2, tmp_path, progress=False)
    assert b2.measured == [1]  # errors are retried on resume; ok and oom points are not


def test_should_stop_ends_after_the_current_point(tmp_path):
    b = FakeBackend()
    df = run_grid(b, tmp_path, progress=False, should_stop=lambda: len(b.measured) >= 2)
    assert list(df.point_id) == ["p0", "p1"] and b.sessions == ["enter", "exit"]


def test_keyboard_interrupt_keeps_finished_points(tmp_path):
    class Interrupting(FakeBackend):
        def measure(self, point):
            if point.config == 2:
                raise KeyboardInterrupt
            return super().measure(point)

    b = Interrupting()
    with pytest.raises(KeyboardInterrupt):
        run_grid(b, tmp_path, progress=False)
    assert list(load_results(tmp_path).point_id) == ["p0", "p1"] and b.sessions == ["enter", "exit"]


def test_no_resume_archives_the_earlier_run(tmp_path):
    run_grid(FakeBackend(n=2), tmp_path, progress=False)
    b = FakeBackend(n=2)
    df = run_grid(b, tmp_path, progress=False, resume=False)
    assert b.measured == [0, 1] and len(df) == 2
    prev = list((tmp_path / "previous").iterdir())
    assert len(prev) == 1 and len(read_log(prev[0] / "points.jsonl")) == 2
    assert archive_previous(tmp_path / "nothing-here") is None


def test_out_dir_that_is_a_file_is_refused_before_any_work(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    b = FakeBackend()
    with pytest.raises(OutputPathError, match="is a file"):
        run_grid(b, f / "sub", progress=False)
    assert b.measured == [] and b.sessions == []


def test_a_point_that_killed_the_process_is_recorded_killed_and_skipped(tmp_path):
    from kit.store import ResultStore

    run_grid(FakeBackend(n=1), tmp_path, progress=False)  # p0 finished
    ResultStore(tmp_path).mark_started("p1", {"concurrency": 2, "model": "fake"})  # then the OS killed a run on p1
    b = FakeBackend(n=3)
    df = run_grid(b, tmp_path, progress=False)
    by = df.drop_duplicates("point_id", keep="last").set_index("point_id")
    assert by.loc["p1", "status"] == "killed" and by.loc["p1", "concurrency"] == 2
    assert b.measured == [2]  # p1 is not retried first (it would kill this run too); the points after it run
    b2 = FakeBackend(n=3)
    run_grid(b2, tmp_path, progress=False, retry_killed=True)
    assert b2.measured == [1]  # only when asked


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError(),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. "
            "DefaultCPUAllocator: can't allocate memory: you tried "
            "to allocate 280000000000 bytes"
        ),
    ],
)
def test_a_cpu_allocation_failure_is_an_oom(tmp_path, exc):
    class Alloc(FakeBackend):
        def measure(self, point):
            raise exc

    df = run_grid(Alloc(n=1), tmp_path, progress=False)
    assert list(df.status) == ["oom"]


def test_ctrl_c_mid_point_is_not_mistaken_for_a_kill(tmp_path):
    class Interrupting(FakeBackend):
        def measure(self, point):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_grid(Interrupting(n=2), tmp_path, progress=False)
    b = FakeBackend(n=2)
    run_grid(b, tmp_path, progress=False)
    assert b.measured == [0, 1]


#: a grid of one FakeBackend-like point run in a child process that blocks between the two writes of a finished
#: point — its line fsync'd to points.jsonl, the in-flight marker not yet cleared — until the test kills it
_KILLED_AFTER_APPEND = """
import contextlib, sys, time
from pathlib import Path
from kit.grid import GridPoint, run_grid
from kit.store import ResultStore

out, ready = Path(sys.argv[1]), Path(sys.argv[2])
flush = ResultStore.flush

def blocking_flush(self):  # the Parquet rewrite after the append: the moment a kill -9 used to lose the point
    if self.records:
        ready.write_text("appended")
        time.sleep(600)
    return flush(self)

ResultStore.flush = blocking_flush

class One:
    kind, description = "planner", "one"
    def points(self):
        return [GridPoint("p0", {"concurrency": 1, "context_len": 128, "model": "fake"}, "B=1", 0)]
    def metadata(self):
        return {"model": "fake", "run_id": "killed-run"}
    def session(self):
        return contextlib.nullcontext()
    def measure(self, point):
        return {"status": "ok", "tpot_ms_p50": 1.0}
    def after_failure(self):
        return {}

run_grid(One(), out, progress=False)
"""


@pytest.mark.slow
def test_a_kill_after_the_append_keeps_the_finished_point(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    out, ready = tmp_path / "run", tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_AFTER_APPEND, str(out), str(ready)])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the child never reached the append"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)  # kill -9 between the fsync'd line and the marker's removal
    finally:
        child.kill()
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    assert [r["status"] for r in read_log(out / "points.jsonl")] == ["ok"]
    assert (out / ".inflight.json").exists()  # the marker still names p0: the exact moment of the report
    b = FakeBackend(n=1)
    df = run_grid(b, out, progress=False)
    assert b.measured == [] and list(df.status) == ["ok"]  # finished, not killed; nothing measured again
    assert not (out / ".inflight.json").exists() and list(load_results(out).status) == ["ok"]


def test_a_point_retried_and_killed_is_still_recorded_killed(tmp_path):
    from kit.store import ResultStore

    run_grid(FakeBackend(n=1, fail={0}), tmp_path, progress=False)  # p0: error, retried on resume
    ResultStore(tmp_path).mark_started("p0", {"concurrency": 1, "model": "fake"})  # the retry killed the process
    b = FakeBackend(n=1)
    df = run_grid(b, tmp_path, progress=False)
    assert b.measured == [] and list(df.status) == ["error", "killed"]  # the earlier error is not a finish


def _enospc(*a, **k):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_on_the_append_stops_the_run_and_keeps_the_finished_lines(tmp_path, monkeypatch):
    from kit import store

    real = store.append_line
    monkeypatch.setattr(store, "append_line", lambda path, line: (_enospc if '"p1"' in line else real)(path, line))
    b = FakeBackend()
    with pytest.raises(OutputPathError) as e:
        run_grid(b, tmp_path, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and f"cannot write {tmp_path / 'points.jsonl'}: No space left on device" in msg
    assert "the run stopped" in msg and "re-run the same command to resume" in msg
    assert b.measured == [0, 1] and b.sessions == ["enter", "exit"]  # p2, p3 not measured for nothing
    assert [r["point_id"] for r in read_log(tmp_path / "points.jsonl")] == ["p0"]
    assert not (tmp_path / ".inflight.json").exists()
    monkeypatch.undo()
    b2 = FakeBackend()
    run_grid(b2, tmp_path, progress=False)
    assert b2.measured == [1, 2, 3]


def test_a_full_disk_on_the_parquet_rewrite_stops_the_run_and_keeps_the_log(tmp_path, monkeypatch):
    import pandas as pd

    real = pd.DataFrame.to_parquet
    monkeypatch.setattr(
        pd.DataFrame, "to_parquet", lambda df, *a, **k: (_enospc if len(df) == 2 else real)(df, *a, **k)
    )
    b = FakeBackend()
    with pytest.raises(OutputPathError, match=r"results\.parquet: No space left on device; the run stopped") as e:
        run_grid(b, tmp_path, progress=False)
    assert "the 2 records in" in str(e.value) and b.measured == [0, 1]
    assert [r["point_id"] for r in read_log(tmp_path / "points.jsonl")] == ["p0", "p1"]  # p1's line was written
    assert not list(tmp_path.glob(".results.parquet.*"))  # no temporary left behind
    monkeypatch.undo()
    b2 = FakeBackend()
    df = run_grid(b2, tmp_path, progress=False)
    assert b2.measured == [2, 3] and list(df.status) == ["ok"] * 4


@pytest.mark.parametrize("raised", [_enospc, "output-path-error"])
def test_a_backend_that_cannot_write_its_own_files_stops_the_run(tmp_path, raised):
    class Full(FakeBackend):
        def measure(self, point):
            super().measure(point)
            if point.config == 1:
                if raised == "output-path-error":
                    raise OutputPathError(f"cannot write {tmp_path / 'requests-p1.jsonl'}: No space left on device")
                raised()
            return {"status": "ok"}

    b = Full()
    with pytest.raises(OutputPathError, match="No space left on device; the run stopped") as e:
        run_grid(b, tmp_path, progress=False)
    assert "the 1 records in" in str(e.value) and b.measured == [0, 1]  # not recorded as an error: the run stops


def _tmpfs(path):
    """Mount a 1 MiB tmpfs at ``path`` (root only; the test is skipped elsewhere); returns the unmount command."""
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode(errors='replace').strip()}")
    return ["umount", "-l", str(path)]


def _fill(directory):
    """Fill the file system of ``directory`` with one file, to the last byte."""
    import errno

    with open(directory / "filler", "wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError as e:
            assert e.errno == errno.ENOSPC


@pytest.mark.slow
def test_a_real_full_disk_mid_run_stops_the_run_and_a_rerun_resumes(tmp_path):
    import subprocess

    disk = tmp_path / "disk"
    umount = _tmpfs(disk)
    try:
        out = disk / "run"

        class FillsTheDisk(FakeBackend):
            def measure(self, point):
                if point.config == 1:
                    _fill(disk)
                return super().measure(point)

        b = FillsTheDisk()
        with pytest.raises(OutputPathError, match="No space left on device; the run stopped"):
            run_grid(b, out, progress=False)
        assert b.measured == [0, 1]
        done = [r["point_id"] for r in read_log(out / "points.jsonl")]
        assert done in (["p0"], ["p0", "p1"])  # p1's line fits the log's last page, or not: never half of it
        (disk / "filler").unlink()
        b2 = FakeBackend()
        df = run_grid(b2, out, progress=False)
        assert b2.measured == [i for i in range(4) if f"p{i}" not in done] and list(df.status) == ["ok"] * 4
    finally:
        subprocess.run(umount, check=False)
