"""Fixtures of the served-view tests: the scripted SSE server (tests/sse_server.py) and a silent port."""

import pytest
from sse_server import SilentServer, start_in_thread


@pytest.fixture(scope="module")
def scripted():
    """The scripted SSE server in a background thread, one per test module."""
    srv = start_in_thread()
    yield srv
    srv.stop()


@pytest.fixture
def silent_server():
    """A port that accepts connections but never answers (``.pending()``: did a client connect?)."""
    srv = SilentServer()
    yield srv
    srv.close()
