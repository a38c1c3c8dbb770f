"""kit dashboard without a browser: the notebook it serves, the Voilà command, its one launcher, its CLI options.

(The page in headless Chromium is ``test_dashboard_browser.py``.)
"""

from __future__ import annotations

import dataclasses

import nbformat
import pytest

from kit.cli import build_parser, main
from kit.errors import OutputPathError, UserError
from kit.measure.sweep import SweepConfig
from kit.serve.launch import Server
from kit.view import dashboard


def _panel_source(path) -> str:
    nb = nbformat.read(str(path), as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert len(code) == 1 and nb.metadata["kernelspec"]["name"] == "python3"
    return code[0]


def test_cli_options_and_defaults_derive_from_sweep_config(capsys):
    """One source of defaults: every SweepConfig field is a `kit dashboard` option with SweepConfig()'s default."""
    args = build_parser("dashboard").parse_args(["dashboard"])
    d = SweepConfig()
    for f in dataclasses.fields(SweepConfig):
        assert getattr(args, f.name) == getattr(d, f.name), f.name
    with pytest.raises(SystemExit):
        main(["dashboard", "--help"])
    help_text = capsys.readouterr().out
    for flag in (
        "--kv",
        "--concurrency",
        "--decode-steps",
        "--warmup-steps",
        "--repeats",
        "--kv-fill",
        "--dtype",
        "--model",
        "--device",
        "--port",
        "--out",
        "--print-command",
    ):
        assert flag in help_text, flag
    over = build_parser("dashboard").parse_args(["dashboard", "--kv", "16,32", "--repeats", "1", "--threads", "1"])
    assert (over.kv_lens, over.repeats, over.threads) == ([16, 32], 1, 1)


def test_notebook_builds_the_panel_from_the_config(tmp_path):
    path = dashboard.write_notebook(tmp_path / "d")
    assert path == tmp_path / "d" / "dashboard.ipynb"
    src = _panel_source(path)
    assert "from kit.view.panel import ControlPanel" in src and repr(str((tmp_path / "d").resolve())) in src
    ns: dict = {}
    exec(src, ns)  # the cell Voilà runs: the panel starts from SweepConfig()
    panel = ns["panel"]
    assert panel.initial == SweepConfig() and panel.out_dir.value == str((tmp_path / "d").resolve())
    cfg = SweepConfig(kv_lens=[16, 32], concurrencies=[2], decode_steps=4, device="cpu", threads=1)
    ns = {}
    exec(_panel_source(dashboard.write_notebook(tmp_path / "e", cfg)), ns)
    assert ns["panel"].initial == cfg and ns["panel"].kv_lens.value == "16, 32"


def test_bad_settings_and_out_paths_are_refused_before_serving(tmp_path):
    with pytest.raises(UserError, match="tiny-llama"):
        dashboard.write_notebook(tmp_path / "x", SweepConfig(model="no-such-model"))
    with pytest.raises(UserError, match="0"):
        dashboard.write_notebook(tmp_path / "x", SweepConfig(kv_lens=[0]))
    assert not (tmp_path / "x").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="is a file"):
        dashboard.write_notebook(tmp_path / "file")
    with pytest.raises(OutputPathError, match="is a file"):
        dashboard.launch(out_dir=tmp_path / "file" / "sub", port=0)


def test_voila_command_and_server(tmp_path):
    nb = tmp_path / "dashboard.ipynb"
    cmd = dashboard.voila_command(nb, 9999)
    assert cmd[1:3] == ["-m", "kit.view.voila_app"] and cmd[3] == str(nb.resolve())
    assert {"--port=9999", "--Voila.ip=127.0.0.1", "--Voila.port_retries=0", "--no-browser"} <= set(cmd)
    assert "--no-browser" not in dashboard.voila_command(nb, 9999, open_browser=True)
    srv = dashboard.voila_server(nb, 9999, tmp_path / "voila.log")
    assert isinstance(srv, Server) and srv.proc is None  # not started
    assert srv.url == "http://127.0.0.1:9999" and srv.argv == cmd and srv.log_path == tmp_path / "voila.log"
    assert srv.ready_paths == (dashboard.READY_PATH,)  # a static asset: probing it starts no kernel


def test_cli_print_command(tmp_path, capsys):
    assert main(["dashboard", "--print-command", "--port", "9999", "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "--Voila.ip=127.0.0.1" in out and "--port=9999" in out and "--Voila.port_retries=0" in out
    assert (tmp_path / "d" / "dashboard.ipynb").exists()
    assert main(["dashboard", "--model", "nope", "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "tiny-llama" in err
    assert main(["dashboard", "--print-command", "--kv", "0", "--out", str(tmp_path / "f")]) == 2
    assert "KV length 0" in capsys.readouterr().err
    (tmp_path / "g").write_text("x")
    assert main(["dashboard", "--print-command", "--out", str(tmp_path / "g")]) == 2
    assert "is a file" in capsys.readouterr().err
    # the notebook written for the CLI carries the options
    main(["dashboard", "--print-command", "--kv", "16", "--concurrency", "2,4", "--out", str(tmp_path / "h")])
    src = _panel_source(tmp_path / "h" / "dashboard.ipynb")
    assert "kv_lens=[16]" in src and "concurrencies=[2, 4]" in src


def test_a_read_only_out_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    """Issue 28 item 8: `kit dashboard` with a read-only --out gave a traceback. A read-only file system is
    simulated (the tests may run as root, whom chmod does not stop): creating or writing under ``ro`` fails with
    EROFS, as the kernel answers there; the CLI then exits 2 with one line naming the path, before serving."""
    import errno
    import os
    import tempfile
    from pathlib import Path

    ro = tmp_path / "ro"
    ro.mkdir()

    def under_ro(p) -> bool:
        return Path(p) == ro or ro in Path(p).parents

    real_mkstemp, real_mkdir, real_access = tempfile.mkstemp, Path.mkdir, os.access

    def mkstemp(*a, dir=None, **kw):
        if dir is not None and under_ro(dir):
            raise OSError(errno.EROFS, "Read-only file system", str(dir))
        return real_mkstemp(*a, dir=dir, **kw)

    def mkdir(self, *a, **kw):
        if under_ro(self) and not self.exists():
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *a, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    for out in (ro, ro / "new"):
        for extra in (["--print-command"], []):
            assert main(["dashboard", *extra, "--port", "0", "--out", str(out)]) == 2, (out, extra)
            err = capsys.readouterr().err
            assert err.startswith("kit dashboard: error: ") and err.count("\n") == 1 and str(ro) in err, err
            assert "Read-only file system" in err or "not writable" in err, err
    assert list(ro.iterdir()) == []
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if under_ro(p) else real_access(p, mode, **kw))
    assert main(["dashboard", "--print-command", "--out", str(ro)]) == 2  # what os.access says on a read-only mount
    assert "is not writable" in capsys.readouterr().err
