"""kit._io: atomic writes, output-path checks, data files, cache dir, free port."""

import os
import socket

import pytest

from kit._io import atomic_write_text, atomic_write_with, cache_dir, check_out_dir, check_out_file, data_path, free_port
from kit.errors import OutputPathError


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "sub" / "a.json"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two" and sorted(os.listdir(p.parent)) == ["a.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "r.parquet"
    p.write_text("old")

    def boom(tmp):
        open(tmp, "w").write("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputPathError, match=f"^cannot write {p}: No space left on device$"):  # one line
        atomic_write_with(p, boom)
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["r.parquet"]

    def not_os(tmp):
        raise ValueError("not a table")

    with pytest.raises(ValueError, match="not a table"):  # the writer's own errors propagate unchanged
        atomic_write_with(p, not_os)
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["r.parquet"]


def test_output_path_checks(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OutputPathError, match="is a directory"):
        check_out_file(tmp_path, "--out")
    with pytest.raises(OutputPathError, match="is a file, not a directory"):
        check_out_file(f / "x.json")
    with pytest.raises(OutputPathError, match="exists and is a file"):
        check_out_dir(f)
    with pytest.raises(OutputPathError, match="its parent"):
        check_out_dir(f / "sub")
    with pytest.raises(OutputPathError, match="--out is empty"):
        check_out_dir(" ", "--out")
    assert check_out_dir(tmp_path / "new") == tmp_path / "new" and not (tmp_path / "new").exists()


def test_data_files_cache_dir_and_port(tmp_path, monkeypatch):
    assert data_path("accelerators.csv").read_text().startswith("name") or data_path("accelerators.csv").exists()
    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("KIT_CACHE_DIR")
    assert cache_dir().name == "kit"
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # still free
