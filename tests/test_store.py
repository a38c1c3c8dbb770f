"""kit.store: the run directory — append log, lock, torn tails, unreadable lines, killed points, run metadata."""

import json
import multiprocessing as mp

import pytest

from kit.errors import OutputPathError, UserError
from kit.store import ResultStore, latest_rows, load_results, read_log, repair_log, run_lock


def _rec(**kw):
    return {"backend": "engine", "status": "ok", "model": "m", **kw}


def test_store_appends_and_sets_a_torn_line_aside(tmp_path, caplog):
    store = ResultStore(tmp_path / "run", {"model": "m"})
    store.append(_rec(point_id="a"))
    store.append(_rec(point_id="b", status="oom"))
    log = tmp_path / "run" / "points.jsonl"
    with open(log, "a") as f:
        f.write('{"backend": "engine", "status": "o')  # killed mid-write
    again = ResultStore(tmp_path / "run")
    assert again.finished_ids() == {"a", "b"} and "torn last line" in caplog.text
    assert (tmp_path / "run" / "points.jsonl.torn-1").read_text() == '{"backend": "engine", "status": "o'
    again.append(_rec(point_id="c"))  # starts a line of its own: nothing glued onto the fragment
    assert [r["point_id"] for r in read_log(log)] == ["a", "b", "c"] and log.read_text().count("\n") == 3
    assert list(load_results(tmp_path / "run").point_id) == ["a", "b", "c"]
    assert repair_log(log) is None  # a clean log is left alone


def test_unreadable_lines_are_skipped_with_the_file_and_line_named(tmp_path, caplog):
    log = tmp_path / "points.jsonl"
    rec = b'{"point_id": "%s", "status": "ok", "backend": "engine"}\n'
    log.write_bytes(rec % b"a" + b'\xff\xfe not utf-8\n[1, 2]\n{"status": "ok"}\n{"point_id": 5, "status": "ok"}\n'
                    + rec % b"b")  # fmt: skip
    assert [r["point_id"] for r in read_log(log)] == ["a", "b"]
    assert f"{log}:2: unreadable line skipped" in caplog.text and f"{log}:3: not a JSON object" in caplog.text
    # records the kit did not write never become rows (least of all ok ones)
    assert f"{log}:4: not a kit point record (no string point_id, backend)" in caplog.text
    assert f"{log}:5: not a kit point record (no string point_id, backend)" in caplog.text


def test_a_flagged_ok_point_is_not_finished_and_files_are_readable_by_others(tmp_path):
    import stat

    s = ResultStore(tmp_path)
    s.append(_rec(point_id="clean"))
    s.append(_rec(point_id="flagged", x_valid=False))
    assert s.finished_ids() == {"clean"}  # measured again on resume, like an error
    for name in ("results.parquet", "results.json", "points.jsonl"):
        assert (tmp_path / name).stat().st_mode & stat.S_IROTH, name  # not mkstemp's 0600


def test_a_points_log_that_is_a_directory_is_refused(tmp_path):
    (tmp_path / "points.jsonl").mkdir()
    with pytest.raises(OutputPathError, match="points.jsonl is not a file"):
        ResultStore(tmp_path)


def test_store_refuses_a_file_and_file_errors_are_one_line_naming_the_path(tmp_path, monkeypatch):
    import errno

    import filelock

    from kit import store as store_mod

    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(OutputPathError, match="is a file"):
        ResultStore(f)

    def read_only(self, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(filelock.FileLock, "acquire", read_only)
    with pytest.raises(OutputPathError, match=r"cannot write .*\.kit\.lock: Read-only file system"):
        with run_lock(tmp_path / "ro"):
            pass
    monkeypatch.undo()
    s = ResultStore(tmp_path / "full")

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod.os, "fsync", disk_full)
    with pytest.raises(OutputPathError, match=r"cannot write .*points\.jsonl: No space left on device"):
        s.append(_rec(point_id="a"))


def _hold(path, ready, release):
    with run_lock(path):
        ready.set()
        release.wait(30)


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(tmp_path, ready, release))
    p.start()
    try:
        assert ready.wait(60)
        with pytest.raises(UserError, match=rf"being written by another kit run \(pid {p.pid} on"):
            with run_lock(tmp_path):
                pass
    finally:
        release.set()
        p.join(30)
    with run_lock(tmp_path):  # released: free again
        pass


def test_a_killed_holder_releases_the_lock(tmp_path):
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(tmp_path, ready, release))
    p.start()
    assert ready.wait(60)
    p.kill()  # kill -9: no cleanup runs
    p.join(30)
    with run_lock(tmp_path):
        pass


def test_a_point_the_process_died_on_is_recorded_killed(tmp_path):
    store = ResultStore(tmp_path, {"model": "m"})
    store.append(_rec(point_id="a"))
    store.mark_started("b", {"model": "m", "concurrency": 64})
    # the process dies here; the next run opens the directory
    again = ResultStore(tmp_path, {"model": "m"})
    rec = again.recover_killed("engine", "run-2")
    assert rec["status"] == "killed" and rec["point_id"] == "b" and rec["concurrency"] == 64
    assert "died while measuring" in rec["error"] and again.finished_ids(("killed",)) == {"b"}
    assert again.recover_killed("engine") is None  # recorded once


def test_the_log_is_the_truth_a_point_logged_after_its_marker_finished(tmp_path):
    store = ResultStore(tmp_path, {"model": "m"})
    store.append(_rec(point_id="b", status="error"))  # an earlier attempt: before the marker, not a finish
    store.mark_started("b", {"model": "m"})
    store.append(_rec(point_id="b"))  # its line is fsync'd; the process dies before the marker is cleared
    again = ResultStore(tmp_path, {"model": "m"})
    assert again.recover_killed("engine") is None and not (tmp_path / ".inflight.json").exists()
    assert again.finished_ids() == {"b"} and [r["status"] for r in read_log(tmp_path / "points.jsonl")] == [
        "error",
        "ok",
    ]


@pytest.mark.parametrize(
    "marker,killed",
    [
        ({"point_id": "a", "started": "t"}, False),  # an older kit's marker (no log_bytes): a finished latest record
        ({"point_id": "b", "started": "t"}, True),  # ... or none: killed
        ({"point_id": "a", "log_bytes": 10**9}, True),  # the log was replaced since (shorter than the offset)
        ([1, 2], False),  # not a marker: dropped
        ("torn {", False),
    ],
)
def test_markers_never_override_the_log(tmp_path, marker, killed):
    store = ResultStore(tmp_path)
    store.append(_rec(point_id="a"))
    text = marker if isinstance(marker, str) else json.dumps(marker)
    (tmp_path / ".inflight.json").write_text(text)
    rec = ResultStore(tmp_path).recover_killed("engine")
    assert (rec is not None and rec["status"] == "killed") is killed
    assert not (tmp_path / ".inflight.json").exists()


def test_every_runs_metadata_is_kept(tmp_path):
    ResultStore(tmp_path, {"model": "first", "created_utc": "1"}).append(_rec(point_id="a"))
    ResultStore(tmp_path, {"model": "second", "created_utc": "2"}).append(_rec(point_id="b", model="second"))
    df = load_results(tmp_path)
    assert df.attrs["metadata"]["model"] == "second"
    assert [r["model"] for r in df.attrs["runs"]] == ["first", "second"]
    assert [r["model"] for r in json.loads((tmp_path / "results.json").read_text())["runs"]] == ["first", "second"]


def test_latest_rows_keeps_the_last_row_of_each_point(tmp_path):
    store = ResultStore(tmp_path)
    for pid, status in (("a", "error"), ("b", "ok"), ("a", "ok"), ("c", "oom"), ("b", "killed")):
        store.append(_rec(point_id=pid, status=status))
    df = load_results(tmp_path)
    latest = latest_rows(df)
    assert list(zip(latest.point_id, latest.status)) == [("a", "ok"), ("c", "oom"), ("b", "killed")]  # df's order
    assert list(latest.index) == [2, 3, 4]
    assert list(latest_rows(df, ["b", "a", "z"]).point_id) == ["a", "b"]  # only those points, none invented
    assert latest_rows(df, []).empty
