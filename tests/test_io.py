"""kit._io: atomic writes, output-path checks, data files, cache dir, free port."""
import os
import socket

import pytest

from kit import _io
from kit.errors import OutputPathError


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "sub" / "a.json"
    _io.atomic_write_text(p, "one")
    _io.atomic_write_text(p, "two")
    assert p.read_text() == "two" and sorted(os.listdir(p.parent)) == ["a.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "r.parquet"
    p.write_text("old")

    def boom(tmp):
        open(tmp, "w").write("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _io.atomic_write_with(p, boom)
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["r.parquet"]


def test_output_path_checks(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OutputPathError, match="is a directory"):
        _io.check_out_file(tmp_path, "--out")
    with pytest.raises(OutputPathError, match="is a file, not a directory"):
        _io.check_out_file(f / "x.json")
    with pytest.raises(OutputPathError, match="exists and is a file"):
        _io.check_out_dir(f)
    with pytest.raises(OutputPathError, match="its parent"):
        _io.check_out_dir(f / "sub")
    with pytest.raises(OutputPathError, match="--out is empty"):
        _io.check_out_dir(" ", "--out")
    assert _io.check_out_dir(tmp_path / "new") == tmp_path / "new" and not (tmp_path / "new").exists()


def test_data_files_cache_dir_and_port(tmp_path, monkeypatch):
    assert _io.data_path("accelerators.csv").read_text().startswith("name") or _io.data_path("accelerators.csv").exists()
    monkeypatch.setenv("KIT_CACHE_DIR", str(tmp_path / "c"))
    assert _io.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("KIT_CACHE_DIR")
    assert _io.cache_dir().name == "kit"
    port = _io.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # still free
