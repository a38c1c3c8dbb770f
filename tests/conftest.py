"""Shared test set-up: offline Hugging Face settings, a small shared tiny model, the work units of a parallel run
(pytest-xdist), Ctrl-C restored for the processes the tests start, one torch thread per test process and each test
file's garbage collection kept to its own objects."""

import functools
import gc
import json
import os
import re
import signal
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# test helpers beside this file (nbexec, sse_server) import by name from any test folder (--import-mode=importlib)
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402


def pytest_configure(config):
    """A suite started with SIGINT ignored (``cmd &`` from a script, nohup) would hand that to every process it
    starts, and the Ctrl-C tests would watch a sweep ignore Ctrl-C: restore Python's default handler.

    The controller (the only process without xdist) starts the real-engine tier's servers when the session selects
    ``tests/engine`` (:mod:`engine_server`), before the workers start, so they inherit where the servers are."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    import engine_server

    if not hasattr(config, "workerinput") and engine_server.ENV not in os.environ and engine_server.wanted(config):
        os.environ[engine_server.ENV] = json.dumps(engine_server.start_all())
        config._kit_engines_started = True


def pytest_unconfigure(config):
    """The controller stops the servers it started (their whole process groups)."""
    if getattr(config, "_kit_engines_started", False):
        import engine_server

        engine_server.stop_all()
        os.environ.pop(engine_server.ENV, None)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """One intra-op thread for torch in the test processes and all they start (xdist workers, started after this
    hook, kernels, CLI runs, servers; not the engine tier's servers, started before it): the suite already runs
    processes side by side (two workers, two notebook kernels), and an OpenMP team of 2 on 2 busy cores spins while
    its other thread waits for a core (a tiny-llama decode step: 50 ms of CPU instead of 3). What the kit chooses
    itself is unchanged (a sweep's threads follow the free cores; TP ranks get theirs from the kit)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


_frozen_for: list = [None]  # the test module whose start last froze the heap


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Each test file starts with what came before it collected and then frozen (``gc.freeze``): a full collection
    (the kit's ``gc.collect()`` between points, Python's own) then walks only what this file made, not a worker's
    whole heap (torch, pandas, every test module: ~0.15 s a collection, 10 s of the stress tests alone)."""
    module = getattr(item, "module", None)
    if module is not _frozen_for[0]:
        _frozen_for[0] = module
        gc.collect()
        gc.freeze()


def pytest_deselected(items):
    """``KIT_ALONE_LIST=FILE``: the node ids of the ``alone`` tests this session deselected (``-m "not alone"``) go to
    FILE, so the test command runs exactly those afterwards without collecting the whole suite again (written whole,
    then renamed: every xdist worker writes the same list)."""
    dest = os.environ.get("KIT_ALONE_LIST")
    alone = [item.nodeid for item in items if item.get_closest_marker("alone")]
    if dest and alone:
        tmp = f"{dest}.{os.getpid()}"
        Path(tmp).write_text("\n".join(sorted(alone)) + "\n")
        os.replace(tmp, dest)


@functools.cache
def _executes_notebooks(path: Path) -> bool:
    """Does the test file ``path`` use ``nbexec`` (the notebooks executed once per process)?"""
    return (
        path.suffix == ".py" and re.search(r"^(from nbexec import|import nbexec)", path.read_text(), re.M) is not None
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Work units under pytest-xdist (``-n``, as ``.ci/test.sh`` runs the suite): one per test file, so a module's
    fixtures (a server, a dashboard) start once; and one, ``notebooks``, for every file that uses ``nbexec``: its
    pool executes each notebook once per process, so split over workers every notebook would run on each. Units go
    out largest first (xdist's loadscope order), the notebooks first of all. ``--dist each`` is left as it is; any
    other ``--dist`` gets these units."""
    if config.getvalue("dist") == "each":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "notebooks" if _executes_notebooks(config.rootpath / path) else path

    return ByFile(config, log)


@pytest.fixture(scope="session")
def tiny_model():
    """The default preset built once per session on CPU in float32."""
    from kit.models import build_model

    return build_model("tiny-llama", "float32", "cpu")
