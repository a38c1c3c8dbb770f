"""Fixtures of the real-engine tier: the vLLM servers the session started (:mod:`engine_server`), each waited for
(bounded) when a test first needs it. A tier that could not be set up (no AVX-512, a failed install) skips with
the set-up's reason; a server that was set up but does not come up fails the tests that need it, with its log."""

import pytest
from engine_server import from_env, setup_outcome

from kit.serve.launch import http_status

#: seconds a server may take to come up: vLLM on CPU imports, compiles and warms up in ~40-90 s on 2 idle cores,
#: more while the rest of the suite runs beside it
READY_TIMEOUT_S = 420.0


def engine(name: str) -> dict:
    """The server ``name`` once it answers ``/health``: ``{"url", "checkpoint", "log", "settings"}``."""
    import time

    info = from_env().get(name)
    if info is None:
        pytest.skip(f"real-engine servers not started in this session ({setup_outcome().get('skip', 'run the suite')})")
    if "skip" in info:
        pytest.skip(f"real-engine tier skipped: {info['skip']}")
    t0 = time.monotonic()
    while http_status(info["url"] + "/health", 2.0) != 200:
        if time.monotonic() - t0 > READY_TIMEOUT_S:
            tail = open(info["log"], errors="replace").read()[-3000:]
            pytest.fail(f"vLLM server {name} not ready after {READY_TIMEOUT_S:g} s; log {info['log']}:\n{tail}")
        time.sleep(1.0)
    return info


@pytest.fixture(scope="session")
def vllm_main():
    """vLLM with automatic prefix caching, up to 16 sequences at a time, fp32, max model length 1,024."""
    return engine("main")


@pytest.fixture(scope="session")
def vllm_small():
    """vLLM with 2 sequences at a time and n-gram speculative decoding (3 draft tokens), fp32."""
    return engine("small")


@pytest.fixture(scope="session")
def tokenizer(vllm_main):
    """The tier checkpoint's tokenizer (both servers serve the same checkpoint)."""
    from kit.serve.client import load_tokenizer

    return load_tokenizer(vllm_main["checkpoint"])
