"""Execute the documentation notebooks once per test session, two at a time, with small parameters.

The doc tests (``test_notebooks_docs.py``) assert on the files each executed notebook wrote; the docs build
(``test_docs_build.py``) renders the executed copies with MyST-NB's execution switched off, so no notebook is
executed twice. Executed copies mirror ``notebooks/`` under ``EXEC_DIR/notebooks``; each notebook's ``out_dir``
is ``EXEC_DIR/out/<section>/<name>``.

Each notebook runs in a kernel of its own forked from a process that imported torch, transformers and the kit
once (``nbfork``: ~3 s of CPU saved per notebook); ``KIT_NB_FRESH_KERNELS=1`` runs them in fresh ``python3``
kernels instead, as a reader's Jupyter would.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbfork

from kit.view.notebooks import NOTEBOOK_DIR, run_notebook

#: seconds any one cell may run before the notebook fails
CELL_TIMEOUT_S = 300
#: notebooks executing at once (CI has 2 cores; each kernel is mostly one busy core)
WORKERS = int(os.environ.get("KIT_NB_WORKERS", "2"))

TINY_GRID = {"kv_lens": [16, 64], "concurrencies": [1, 2], "decode_steps": 4}
#: small parameters per notebook (relative to notebooks/); ``out_dir`` is always set by the runner.
SMALL: dict[str, dict] = {
    "tutorials/01-first-sweep.ipynb": {**TINY_GRID, "decode_steps": 3, "repeats": 1, "device": "cpu"},
    # kernel/dtype sanity set: one dtype, both modes (each compiled graph costs seconds on CPU)
    "how-to/check-a-sampling-op.ipynb": {"dtypes": ["float32"], "modes": ["eager", "compile"], "draws": 600},
    "how-to/is-this-machine-ready.ipynb": {"device": "cpu", "compile_check": False},
    # a node's qualification: a 1-minute budget, eager-only op checks, the items that need no server or ranks
    "how-to/qualify-a-new-node.ipynb": {
        "budget": "1m",
        "items": ["doctor", "ops", "seed", "power"],
        "compile_ops": 0,
    },
    "explanation/fp8-formats.ipynb": {},
    # planner and cost
    "how-to/will-this-model-fit.ipynb": {},
    "how-to/what-does-a-million-tokens-cost.ipynb": {"user_prices": {"MI355X": 2.0}, "planner_concurrencies": [1, 64]},
    "explanation/kv-cache-memory-gqa-vs-mla.ipynb": {"context_lens": [1024, 131072]},
    # starts `transformers serve` itself
    "how-to/benchmark-a-serving-endpoint.ipynb": {
        "concurrencies": [1, 4],
        "num_requests": 4,
        "warmup_requests": 1,
        "isl": 16,
        "osl": 8,
    },
    "tutorials/02-explore-with-the-panel.ipynb": {**TINY_GRID, "repeats": 1, "device": "cpu"},
    "how-to/sweep-kv-cache-length.ipynb": {"kv_lens": [16, 64, 256], "decode_steps": 4, "repeats": 1, "device": "cpu"},
    # one point: each TP point is a torchrun launch (2 ranks: ~10 CPU-s); tests/measure/test_tp.py sweeps two
    "how-to/run-a-tensor-parallel-sweep.ipynb": {
        "kv_lens": [16],
        "concurrencies": [2],
        "decode_steps": 2,
        "repeats": 1,
    },
    "how-to/stress-the-kv-cache.ipynb": {
        "start": 64,
        "max_context": 256,
        "decode_steps": 2,
        "repeats": 1,
        "check_context": 128,
        "far_probes": 2,
        "device": "cpu",
    },
    # two profiled points of one sweep (each a plain pass and a profiled pass of 3 steps), compared
    "how-to/why-is-this-point-slow.ipynb": {
        "kv_lens": [16, 256],
        "decode_steps": 3,
        "repeats": 1,
        "device": "cpu",
    },
    "how-to/find-the-concurrency-knee.ipynb": {
        "kv_lens": [16],
        "concurrencies": [1, 2, 4],
        "decode_steps": 4,
        "repeats": 1,
        "device": "cpu",
    },
    "how-to/track-performance-per-commit.ipynb": {**TINY_GRID, "repeats": 2, "runs": 2, "delay_ms": 20.0},
    "how-to/compare-dtypes.ipynb": {
        "kv_lens": [16],
        "concurrencies": [1, 2],
        "decode_steps": 4,
        "repeats": 1,
        "device": "cpu",
    },
    "how-to/compare-two-result-sets.ipynb": dict(TINY_GRID),
    "how-to/run-the-seed-workload.ipynb": {"scale": 1 / 64, "device": "cpu"},
    "how-to/load-a-local-checkpoint.ipynb": {**TINY_GRID, "repeats": 1, "device": "cpu"},
    "how-to/export-results-for-ci.ipynb": dict(TINY_GRID),
    "reference/accelerator-catalog.ipynb": {},
    "reference/model-presets.ipynb": {},
    "reference/metric-definitions.ipynb": {},
    "reference/results-schema.ipynb": {},
    "reference/front-door.ipynb": {},
    "explanation/why-decode-is-memory-bound.ipynb": {
        "kv_lens": [16, 128],
        "concurrencies": [1, 4],
        "decode_steps": 4,
        "repeats": 1,
        "device": "cpu",
    },
    "explanation/performance-per-dollar.ipynb": {"concurrencies": [1, 8, 64]},
    # 2 gloo ranks through torchrun; the planner-only explanation beside it
    "how-to/probe-the-interconnect.ipynb": {"max_bytes": 256, "iters": 3, "warmup": 1},
    "explanation/why-two-nodes-decode-slower.ipynb": {},
    # served workloads against the simulated server (kit.serve.simserver): the SLO search's known answer is 17
    "how-to/how-many-users-within-an-slo.ipynb": {
        "num_requests": 8,
        "isl": 16,
        "osl": 8,
        "slo_tpot_ms": 20.5,
        "max_concurrency": 64,
    },
    "how-to/shared-prefix-and-multi-turn.ipynb": {
        "concurrencies": [2],
        "prefix_fractions": [0.0, 0.5],
        "group_size": 4,
        "num_requests": 8,
        "isl": 64,
        "osl": 4,
        "turns": 2,
        "think_time_s": 0.05,
        "trace_requests": 6,
    },
    "reference/metric-conventions.ipynb": {"num_requests": 4, "concurrency": 2, "isl": 16, "osl": 17},
    # a fake pynvml (tests/fake_backends) and a scripted vLLM-style /metrics server with injected preemptions
    "how-to/energy-per-token-and-trust-checks.ipynb": {
        "power_source": "nvml",
        "power_library": "fake_pynvml",
        "library_path": str(Path(__file__).parent / "fake_backends"),
        "scripted_server": str(Path(__file__).parent / "metrics_server.py"),
        "concurrency": 2,
        "context_len": 16,
        "decode_steps": 8,
        "num_requests": 4,
    },
}

EXEC_DIR = Path(os.environ.get("KIT_NB_EXEC_DIR") or tempfile.mkdtemp(prefix="kit-notebooks-"))
if not os.environ.get("KIT_NB_EXEC_DIR"):  # keep it only when asked to (KIT_NB_EXEC_DIR=... to inspect the runs)
    atexit.register(shutil.rmtree, EXEC_DIR, ignore_errors=True)


@dataclass
class Executed:
    source: Path  # the committed notebook
    path: Path  # the executed copy
    out_dir: Path  # where the notebook wrote its files
    nb: object  # the executed nbformat node


_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_futures: dict[str, Future] = {}


def out_dir_of(rel: str) -> Path:
    return EXEC_DIR / "out" / rel.removesuffix(".ipynb")


def _run(rel: str, params: dict) -> Executed:
    src = NOTEBOOK_DIR / rel
    out = out_dir_of(rel)
    dest = EXEC_DIR / "notebooks" / rel
    kernel = {} if os.environ.get("KIT_NB_FRESH_KERNELS") == "1" else {"kernel_name": nbfork.kernel()}
    nb = run_notebook(src, dest, parameters={**params, "out_dir": str(out)}, cell_timeout_s=CELL_TIMEOUT_S, **kernel)
    return Executed(src, dest, out, nb)


def start_all(rels=None) -> None:
    """Queue every notebook in :data:`SMALL` (or ``rels``) for execution; returns at once."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="nbexec")
        for rel in rels or SMALL:
            if rel not in _futures:
                _futures[rel] = _pool.submit(_run, rel, SMALL.get(rel, {}))


def execute(rel: str) -> Executed:
    """The executed notebook ``rel`` (started with every other on first use); re-raises its execution error."""
    start_all()
    start_all([rel])
    return _futures[rel].result()
