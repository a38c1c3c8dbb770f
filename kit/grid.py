"""The one grid runner: every sweep of the kit — in-process, served, planner predictions — runs through
:func:`run_grid`.

A *backend* knows how to turn one point of a grid into one results record (:mod:`kit.results` schema). The runner
owns everything around that, the same for every backend:

- **Persistence**: each finished point is appended to ``out_dir/points.jsonl`` (flushed and fsync'd) and
  ``results.parquet`` / ``results.json`` are rewritten before the next point starts, so an OOM, an exception, a
  dead server, Ctrl-C or ``kill -9`` never loses a finished point.
- **Resume**: points already recorded as ``ok`` or ``oom`` under the same ``point_id`` are skipped on a re-run
  (``error`` points are retried); ``resume=False`` moves the earlier files to ``out_dir/previous/<time>/``.
- **Failures**: ``torch.OutOfMemoryError`` (matched by type, never by message) is recorded as ``oom``; any other
  exception as ``error`` with its text (the traceback goes to the ``kit`` logger at DEBUG level); the grid goes
  on. The backend's :meth:`GridBackend.after_failure` runs *outside* the ``except`` block, when the exception's
  frames (and the tensors they hold; pytorch #27600) are gone. A write the disk refuses (full, over quota,
  read-only; the log, the Parquet rewrite, a backend's own file) stops the run with one line instead: every later
  point would fail the same way, and what is already in the log is kept.
- **The log is the truth**: a point is finished when its line is fsync'd to ``points.jsonl``; the in-flight marker
  only tells a point the process died on from one it finished (:meth:`kit.store.ResultStore.recover_killed`).
- **Ctrl-C**: a :class:`kit.interrupts.InterruptGuard` records every SIGINT, so one swallowed by a
  finaliser still stops the grid at the next point boundary; ``KeyboardInterrupt`` is re-raised after the
  finished points are saved. ``should_stop()`` (a panel's Stop button) ends the grid after the current point.
- **Progress**: a tqdm bar per grid; ``on_point(record, frame)`` after each point (live plots, widgets).

Adding a backend: implement :class:`GridBackend` (``kind``, ``points()``, ``metadata()``, ``session()``,
``measure(point)``, ``after_failure()``), then call ``run_grid(backend, out_dir)``. See
``docs/architecture.md``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from kit._io import check_out_dir
from kit.errors import OutputPathError
from kit.interrupts import InterruptGuard
from kit.store import ResultStore, run_lock

log = logging.getLogger("kit")

#: statuses a resumed grid does not measure again (errors are retried; ``killed`` points only when asked)
FINISHED_STATUSES = ("ok", "oom", "killed")
#: the text of torch's CPU allocator failure: a plain RuntimeError, so on CPU an out-of-memory is told by its
#: message (torch c10/core/impl/alloc_cpu.cpp); on CUDA/HIP it is a type (:func:`oom_error_type`)
CPU_ALLOC_FAILURE = "DefaultCPUAllocator: can't allocate memory"


def oom_error_type() -> type[BaseException]:
    """``torch.OutOfMemoryError`` (torch >= 2.5; ``torch.cuda.OutOfMemoryError`` before), a ``RuntimeError``
    subclass raised by CUDA and HIP allocators alike. torch is imported only when a grid runs."""
    import torch

    return getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation failure: ``torch.OutOfMemoryError`` (CUDA/HIP, by type), Python's
    ``MemoryError``, or torch's CPU allocator failure (:data:`CPU_ALLOC_FAILURE`, by message: it has no type)."""
    return isinstance(e, (oom_error_type(), MemoryError)) or (
        isinstance(e, RuntimeError) and CPU_ALLOC_FAILURE in str(e)
    )


@dataclass(frozen=True)
class GridPoint:
    """One point of a grid.

    Attributes:
        point_id: stable key of the point's configuration (resume skips ids already finished).
        columns: results columns known before measuring (model, dtype, concurrency, context_len, ...): they are
            in the row whatever happens, also for an ``oom`` or ``error`` point.
        label: short text for the progress bar (e.g. ``"bfloat16 kv=2048 B=16"``).
        config: the backend's own description of the point (a ``PointConfig``, a ``LoadConfig``, ...).
    """

    point_id: str
    columns: dict = field(default_factory=dict)
    label: str = ""
    config: Any = None


class GridBackend(Protocol):
    """What :func:`run_grid` needs of a backend: a grid of points and one record per point."""

    #: the ``backend`` column of its rows: ``engine`` | ``openai`` | ``planner`` (:data:`kit.results.BACKENDS`)
    kind: str
    #: what the progress bar calls the grid (e.g. ``"sweep tiny-llama"``)
    description: str
    #: optional: globs of the backend's own files in ``out_dir`` that a non-resumed run archives with the results
    archive_globs: tuple[str, ...]

    def points(self) -> list[GridPoint]:
        """Every point of the grid, in the order they are run."""

    def metadata(self) -> dict:
        """The run's metadata for the JSON sidecar (:func:`kit.store.run_metadata` plus the config)."""

    def session(self) -> AbstractContextManager:
        """A context held while the points run (set threads, start a client...); restored on any exit."""

    def measure(self, point: GridPoint) -> dict:
        """The record of one point (results columns + ``x_`` extras). May raise; the runner records it."""

    def after_failure(self) -> dict:
        """Called after a point raised, outside the ``except`` block: free memory; extra columns for the row."""


def archive_previous(out_dir: Path, globs: tuple[str, ...] = ()) -> Path | None:
    """Move an earlier run's files (``points.jsonl``, ``results.parquet``, ``results.json`` and any file matching
    ``globs``, e.g. a served sweep's ``requests-*.jsonl``) to ``out_dir/previous/<YYYYmmdd-HHMMSS>[.N]/`` so a
    non-resumed grid starts clean; returns that folder, or None when there was nothing to move."""
    old = [out_dir / n for n in ("points.jsonl", "results.parquet", "results.json") if (out_dir / n).exists()]
    if not old:
        return None
    old += [f for g in globs for f in sorted(out_dir.glob(g)) if f.is_file()]
    dest = out_dir / "previous" / time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while dest.exists():
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{n}")
        n += 1
    dest.mkdir(parents=True)
    for f in old:
        f.rename(dest / f.name)
    return dest


#: keyword options of :func:`run_grid` that the front ends (``run_sweep``, ``run_served_sweep``, ...) pass through
RUN_OPTIONS = ("resume", "progress", "on_point", "should_stop", "retry_killed")


def split_run_options(options: dict) -> tuple[dict, dict]:
    """``(run_grid options, the rest)`` of a front end's keyword arguments (:data:`RUN_OPTIONS`)."""
    run = {k: v for k, v in options.items() if k in RUN_OPTIONS}
    return run, {k: v for k, v in options.items() if k not in RUN_OPTIONS}


def failure_text(e: BaseException, limit: int = 1000) -> str:
    """``"TypeName: message"`` of a failed point, cut to ``limit`` characters (first line only for OOMs)."""
    return f"{type(e).__name__}: {e}"[:limit]


#: errno values of a file system that refuses writes (full, over quota, read-only): a point that hits one stops the
#: run, since every later point would hit it too
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def disk_stop(e: OSError, store: ResultStore) -> OutputPathError:
    """The one-line error that stops a run on a write the disk refused (``e``: an :class:`OutputPathError` of the
    store or a backend, or an OSError with one of :data:`DISK_ERRNOS`): what failed, and that every point already
    in the log is kept and a re-run resumes."""
    what = str(e) if isinstance(e, OutputPathError) else f"cannot write {e.filename or 'a file'}: {e.strerror or e}"
    return OutputPathError(
        f"{what}; the run stopped (the {len(store.records)} records in {store.log} are kept: make room or fix the "
        "path, then re-run the same command to resume)"
    )


def run_grid(
    backend: GridBackend,
    out_dir: str | Path,
    *,
    resume: bool = True,
    progress: bool = True,
    on_point: Callable[[dict, pd.DataFrame], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    retry_killed: bool = False,
) -> pd.DataFrame:
    """Run every point of ``backend`` not already finished in ``out_dir``; return every row stored there.

    Args:
        backend: a :class:`GridBackend`.
        out_dir: run directory (created; locked while the grid runs); checked before any work.
        resume: skip points recorded as ok/oom/killed; False archives earlier files and measures every point again.
        progress: show a tqdm progress bar (and the resume notice).
        on_point: called after each finished point with (record, frame of every row so far).
        should_stop: polled before each point; True ends the grid (finished points kept).
        retry_killed: measure again points an earlier run died on (recorded ``killed``; skipped by default, so a
            point that gets the process killed does not kill every re-run before the points after it).

    Returns:
        DataFrame of every row in ``out_dir`` (this grid's and earlier runs' of other settings); each row's
        ``backend`` column is ``backend.kind``.

    Raises:
        OutputPathError: ``out_dir`` cannot be a directory or cannot be written (before any work); or the disk
            refused a write mid-run (full, read-only: :func:`disk_stop`; the points already logged are kept).
        UserError: another process is writing ``out_dir``.
        KeyboardInterrupt: Ctrl-C, re-raised after the finished points are saved.
    """
    from tqdm.auto import tqdm

    store_dir = check_out_dir(out_dir)
    points = backend.points()
    with run_lock(store_dir), InterruptGuard() as guard, contextlib.ExitStack() as stack:
        store, run_id, todo = _open_store(backend, store_dir, points, resume, retry_killed)
        if len(todo) < len(points):
            msg = (
                f"resuming: {len(points) - len(todo)} of {len(points)} points already recorded in {store_dir}; "
                f"measuring the other {len(todo)} (--no-resume to measure all again)"
            )
            if progress:
                tqdm.write(msg)
            else:
                log.info(msg)
        bar = tqdm(total=len(todo), desc=backend.description, disable=not progress, unit="pt")
        stack.callback(bar.close)
        stack.enter_context(backend.session())
        # any way out of this process that runs code (Ctrl-C, SIGTERM, a bug) is not the OS killing a point: the
        # in-flight marker goes, and that point is measured again on resume (only a real kill leaves it behind)
        stack.callback(store.mark_finished)
        for point in todo:
            guard.check()  # a Ctrl-C swallowed by a finaliser during the last point still stops the grid here
            if should_stop is not None and should_stop():
                break
            bar.set_postfix_str(point.label)
            try:
                store.mark_started(point.point_id, point.columns)
                rec = _measure(backend, point)
                full = {"run_id": run_id, **point.columns, **rec, "point_id": point.point_id, "backend": backend.kind}
                frame = store.append(full)
            except OSError as e:  # a full or read-only disk (only those pass _measure): every later point would fail
                raise disk_stop(e, store) from None
            store.mark_finished()
            bar.update(1)
            if on_point is not None:
                on_point(full, frame)
        return store.frame()


def _open_store(
    backend: GridBackend, store_dir: Path, points: list[GridPoint], resume: bool, retry_killed: bool
) -> tuple[ResultStore, str | None, list[GridPoint]]:
    """``(store, run_id, points still to measure)``: earlier files archived unless resuming, points an earlier
    run died on recorded ``killed``, the results files rebuilt from the log."""
    if not resume:
        archive_previous(store_dir, tuple(getattr(backend, "archive_globs", ())))
    meta = backend.metadata()
    run_id = meta.get("run_id") or meta.get("created_utc")
    store = ResultStore(store_dir, meta)
    store.recover_killed(backend.kind, run_id)
    finished = tuple(s for s in FINISHED_STATUSES if s != "killed" or not retry_killed)
    done = store.finished_ids(finished) if resume else set()
    store.flush()  # results.parquet + results.json rebuilt from the log now, even when nothing is left to do
    return store, run_id, [p for p in points if p.point_id not in done]


def _measure(backend: GridBackend, point: GridPoint) -> dict:
    """The backend's record of ``point``; when it raises (Ctrl-C aside), status ``oom`` or ``error`` with the
    failure's text and the backend's :meth:`~GridBackend.after_failure` columns."""
    try:
        return backend.measure(point)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # recorded, the grid continues (unless the disk refuses writes: the run stops)
        if isinstance(e, OutputPathError) or (isinstance(e, OSError) and e.errno in DISK_ERRNOS):
            raise
        if is_out_of_memory(e):
            first = str(e).splitlines()[0][:300] if str(e) else "out of memory"
            failure = ("oom", f"{type(e).__name__}: {first}")
        else:
            log.debug("point %s (%s) failed", point.point_id, point.label, exc_info=True)
            failure = ("error", failure_text(e))
    # outside the except block: the exception and its frames are gone, so their tensors can be freed
    return {"status": failure[0], "error": failure[1], **(backend.after_failure() or {})}
