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
