"""The simulated server's start-up: a port that is taken is a one-line error at once, not a hang and tracebacks."""

from __future__ import annotations

import time

import pytest

from kit.errors import UserError
from kit.serve.simserver import SimModel, SimServer, main


def test_a_taken_port_is_a_clear_error_at_once(capsys):
    with SimServer(SimModel()) as first:
        port = int(first.url.rsplit(":", 1)[1])
        t = time.perf_counter()
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}"):
            SimServer(SimModel()).start(port)
        with pytest.raises(SystemExit) as e:
            main(["--port", str(port)])
        assert time.perf_counter() - t < 5  # not the 10 s start-up wait
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err and len(err.splitlines()) == 1
