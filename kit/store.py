"""Results on disk: the Parquet + JSON round trip (:func:`save_results`, :func:`load_results`), the run's
metadata (:func:`run_metadata`), and a run directory: the append log, its lock, crash recovery.

Files of a run directory ``DIR``:

- ``points.jsonl``: the append log, one JSON object per finished point (ok, oom, error, killed), each line
  flushed and fsync'd before the next point starts, so a crash, Ctrl-C or ``kill -9`` loses nothing finished.
- ``results.parquet`` + ``results.json`` (the latest run's metadata, every run's metadata under ``runs``, and the
  schema): rewritten atomically after every point, so they are always loadable and always match the log.
- ``.kit.lock`` (+ ``.kit.lock.holder``): held by the one process writing the directory; a second writer gets
  a :class:`kit.errors.UserError` naming the holder (pid, host, command, start time). The lock is an OS file
  lock (``filelock``), released by the OS when its holder dies, even by ``kill -9``.
- ``.inflight.json``: the point being measured right now, and the log's size when it started. If the process
  dies while measuring (the kernel's OOM killer on host RAM, a segfault in a kernel library), the next run finds
  the marker and records that point as ``killed`` instead of retrying it first and dying again. The log is the
  truth: a point whose line reached the log after the marker was written finished (the process died after its
  line was fsync'd, e.g. while rewriting the Parquet file), and the marker is dropped without a ``killed`` record.
- a torn last line of ``points.jsonl`` (the process killed mid-write) is moved to ``points.jsonl.torn-N`` when
  the directory is opened, so the next record starts on a line of its own; unreadable lines are skipped with a
  warning naming file and line.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import platform
import subprocess
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from kit._io import atomic_write_bytes, atomic_write_with
from kit.errors import InputNotFoundError, OutputPathError, UserError
from kit.results import SCHEMA_VERSION, coerce, row_problems, to_frame, validate_record

log = logging.getLogger("kit")

LOG_NAME = "points.jsonl"
LOCK_NAME = ".kit.lock"
INFLIGHT_NAME = ".inflight.json"


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _os_error(path: Path, e: OSError) -> OutputPathError:
    """``e`` as one line naming ``path`` (an OutputPathError of the atomic writers already names its path)."""
    return e if isinstance(e, OutputPathError) else OutputPathError(f"cannot write {path}: {e.strerror or e}")


def read_log(path: str | Path) -> list[dict]:
    """Records of a ``points.jsonl`` log. A line that is not UTF-8, not JSON or not an object is skipped with a
    warning naming the file and line; a torn last line (no newline: killed mid-write) is skipped quietly (it is
    set aside when the directory is next opened for writing, see :func:`repair_log`)."""
    path = Path(path)
    out = []
    with open(path, "rb") as f:
        raw = f.read()
    lines = raw.split(b"\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        torn = i == len(lines)  # no newline after it
        try:
            rec = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if not torn:
                log.warning("%s:%d: unreadable line skipped (%s)", path, i, type(e).__name__)
            continue
        if not isinstance(rec, dict):
            log.warning("%s:%d: not a JSON object; skipped", path, i)
            continue
        missing = [k for k in ("point_id", "backend", "status") if not isinstance(rec.get(k), str)]
        if missing:  # not a record the kit wrote (edited by hand, or another file): never a row, least of all ok
            log.warning("%s:%d: not a kit point record (no string %s); skipped", path, i, ", ".join(missing))
            continue
        out.append(rec)
    return out


def append_line(path: Path, line: str) -> None:
    """Append ``line`` and a newline to ``path`` as one write, flushed and fsync'd before returning.

    Raises: OSError: the disk refused the write or the fsync (full disk, read-only, quota)."""
    with open(path, "ab") as f:
        f.write(line.encode("utf-8") + b"\n")
        f.flush()
        os.fsync(f.fileno())


def repair_log(path: Path) -> Path | None:
    """Move a torn last line of the log (bytes after the last newline) to ``<log>.torn-N`` and truncate the log
    after its last complete line, so the next append starts a line of its own. Returns the fragment's file."""
    if not path.exists():
        return None
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return None
        cut = data.rfind(b"\n") + 1
        n = 1
        while (frag := path.with_name(f"{path.name}.torn-{n}")).exists():
            n += 1
        atomic_write_bytes(frag, data[cut:])
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    log.warning(
        "%s: a torn last line (%d bytes, the process was killed while writing it) was moved to %s",
        path,
        len(data) - cut,
        frag.name,
    )
    return frag


@contextlib.contextmanager
def run_lock(out_dir: Path):
    """Hold the run directory's lock for the block.

    Raises:
        UserError: another process holds it (the message names that process).
        OutputPathError: the directory cannot be created or written.
    """
    from filelock import FileLock, Timeout

    holder = out_dir / (LOCK_NAME + ".holder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(out_dir / LOCK_NAME), timeout=0)
        lock.acquire()
    except Timeout:
        try:
            who = json.loads(holder.read_text())
            desc = f"pid {who.get('pid')} on {who.get('host')} since {who.get('since')}: {who.get('command')}"
        except (OSError, ValueError):
            desc = "another process"
        raise UserError(
            f"{out_dir} is being written by another kit run ({desc}); wait for it to finish or give "
            "another output directory"
        ) from None
    except OSError as e:  # the directory (when it could not be created) or the lock file
        raise _os_error(out_dir / LOCK_NAME if out_dir.is_dir() else out_dir, e) from None
    try:
        atomic_write_bytes(
            holder,
            json.dumps(
                {"pid": os.getpid(), "host": platform.node(), "since": _now(), "command": " ".join(sys.argv)[:300]}
            ).encode(),
        )
    except OSError as e:
        lock.release()
        raise _os_error(holder, e) from None
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            holder.unlink()
        lock.release()


def _git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except Exception:
        return None


def run_metadata(**extra) -> dict:
    """Versions, host and time for a run's JSON sidecar; ``extra`` (device, model, dtype, config...) is merged."""
    import torch
    import transformers

    from kit import __version__

    now = _dt.datetime.now(_dt.UTC)
    meta = {
        "schema_version": SCHEMA_VERSION,
        # unique per run: two runs started in the same second (tiny sweeps, CI jobs) are still two runs
        "run_id": f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}",
        "created_utc": now.isoformat(timespec="microseconds"),  # orders runs started in the same second
        "kit_version": __version__,
        "git_commit": _git_commit(),
        "torch_version": torch.__version__,
        "torch_cuda": getattr(torch.version, "cuda", None),
        "torch_hip": getattr(torch.version, "hip", None),
        "transformers_version": transformers.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    meta.update(extra)
    return meta


def save_results(
    df: pd.DataFrame, path: str | Path, metadata: dict | None = None, runs: list[dict] | None = None
) -> Path:
    """Write ``df`` to ``path`` (a ``.parquet`` file, or a directory → ``results.parquet``) + a JSON sidecar.

    The sidecar (same stem, ``.json``) holds ``metadata`` (the latest run's), ``runs`` (every run's metadata
    that wrote rows here, oldest first) and the schema. Both writes are atomic (the directory is created).

    Returns: the Parquet path.

    Raises:
        OutputPathError: the directory cannot be created or a file cannot be written (one line naming the path).
    """
    path = Path(path)
    if path.suffix != ".parquet":
        path = path / "results.parquet"
    df = coerce(df)
    atomic_write_with(path, lambda tmp: df.to_parquet(tmp, index=False))
    side = {
        "metadata": metadata or {},
        "runs": runs if runs is not None else ([metadata] if metadata else []),
        "schema_version": SCHEMA_VERSION,
        "columns": {c: str(t) for c, t in df.dtypes.items()},
    }
    atomic_write_bytes(path.with_suffix(".json"), json.dumps(side, indent=2, default=str).encode())
    return path


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"{path} is not a readable results Parquet file ({str(e).splitlines()[0][:200]})") from None


def load_results(path: str | Path) -> pd.DataFrame:
    """Load results written by :func:`save_results` or a run directory (Parquet, or the JSONL log if newer).

    ``df.attrs["metadata"]`` carries the sidecar's metadata (the latest run's), ``df.attrs["runs"]`` every run's.

    Raises:
        FileNotFoundError: nothing loadable at ``path``.
    """
    path = Path(path)
    if path.is_dir():
        pq, log = path / "results.parquet", path / "points.jsonl"
        if log.exists() and (not pq.exists() or log.stat().st_mtime > pq.stat().st_mtime + 1e-6):
            df = to_frame(read_log(log))
            side = path / "results.json"
        elif pq.exists():
            df, side = coerce(_read_parquet(pq)), pq.with_suffix(".json")
        else:
            raise InputNotFoundError(f"no results.parquet or points.jsonl in {path}")
    elif path.exists():
        df, side = coerce(_read_parquet(path)), path.with_suffix(".json")
    else:
        raise InputNotFoundError(f"results file {path} does not exist")
    if side.exists():
        try:
            doc = json.loads(side.read_text())
        except (OSError, ValueError):  # a damaged sidecar loses the metadata, never the rows
            doc = {}
        df.attrs["metadata"] = doc.get("metadata", {})
        df.attrs["runs"] = doc.get("runs") or ([df.attrs["metadata"]] if df.attrs["metadata"] else [])
    return df


def latest_rows(df: pd.DataFrame, point_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """The latest row of each point of ``df`` (rows are stored oldest first, so the last one under its
    ``point_id``), of only the points in ``point_ids`` when given; rows keep ``df``'s order and index.

    A run directory holds every earlier row too: an ``error`` measured again, a ``killed`` point retried, the points
    of another configuration or run written to the same directory."""
    if point_ids is not None:
        df = df[df["point_id"].isin(set(point_ids))]
    return df.drop_duplicates("point_id", keep="last")


class ResultStore:
    """Append-on-finish storage of one run directory (see the module docstring). Open it while holding
    :func:`run_lock` when writing; reading needs no lock.

    Raises:
        OutputPathError: ``out_dir`` exists and is a file, or cannot be written.
    """

    def __init__(self, out_dir: str | Path, metadata: dict | None = None):
        self.dir = Path(out_dir)
        if self.dir.exists() and not self.dir.is_dir():
            raise OutputPathError(
                f"output directory {str(self.dir)!r} exists and is a file; "
                "give a directory path (it will be created if missing)"
            )
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _os_error(self.dir, e) from None
        self.log = self.dir / LOG_NAME
        if self.log.exists() and not self.log.is_file():
            raise OutputPathError(f"{self.log} is not a file; this is not a kit run directory (give another --out)")
        self.metadata = metadata or {}
        repair_log(self.log)
        self._records = read_log(self.log) if self.log.exists() else []
        self.runs = self._earlier_runs()
        if self.metadata and self.metadata not in self.runs:
            self.runs.append(self.metadata)

    def _earlier_runs(self) -> list[dict]:
        side = self.dir / "results.json"
        try:
            doc = json.loads(side.read_text())
        except (OSError, ValueError):
            return []
        runs = doc.get("runs") or ([doc["metadata"]] if doc.get("metadata") else [])
        return [r for r in runs if isinstance(r, dict)]

    @property
    def records(self) -> list[dict]:
        return list(self._records)

    def finished_ids(self, statuses=("ok", "oom")) -> set[str]:
        """point_ids whose latest record has one of ``statuses`` (errors are retried on resume). An ``ok`` record
        that carries a problem flag (:data:`kit.results.PROBLEM_FLAGS`, e.g. a served point that failed its
        validity checks) does not count as finished: it is measured again, like an error."""
        latest = {r.get("point_id"): r for r in self._records}
        return {pid for pid, r in latest.items()
                if r.get("status") in statuses and not (r.get("status") == "ok" and row_problems(r))}  # fmt: skip

    def append(self, rec: dict) -> pd.DataFrame:
        """Validate, append to the log (flush + fsync), then refresh Parquet + sidecar; returns every row so far.

        Raises:
            UserError: the record does not fit the schema. OutputPathError: the disk refused the write.
        """
        rec = validate_record(dict(rec))
        rec.setdefault("timestamp", _now())
        line = json.dumps(rec, default=_json_default, allow_nan=True)
        try:
            append_line(self.log, line)
        except OSError as e:
            raise _os_error(self.log, e) from None
        self._records.append(json.loads(line))
        return self.flush()

    def flush(self) -> pd.DataFrame:
        """Rewrite results.parquet + results.json from every record so far; returns that frame."""
        df = self.frame()
        try:
            save_results(df, self.dir / "results.parquet", self.metadata, runs=self.runs)
        except OSError as e:
            raise _os_error(self.dir / "results.parquet", e) from None
        return df

    def frame(self) -> pd.DataFrame:
        return to_frame(self._records)

    # -------------------------------------------------------------- the point in flight
    def mark_started(self, point_id: str, columns: dict) -> None:
        """Note that ``point_id`` is being measured (cleared by :meth:`mark_finished`), with the log's size in bytes
        now (``log_bytes``: a record of the point at or after that offset means it finished).

        Raises:
            OutputPathError: the marker cannot be written (full disk, read-only directory): before measuring.
        """
        size = self.log.stat().st_size if self.log.exists() else 0
        doc = {"point_id": point_id, "columns": columns, "started": _now(), "pid": os.getpid(), "log_bytes": size}
        try:
            atomic_write_bytes(self.dir / INFLIGHT_NAME, json.dumps(doc, default=str).encode())
        except OSError as e:
            raise _os_error(self.dir / INFLIGHT_NAME, e) from None

    def mark_finished(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / INFLIGHT_NAME).unlink()

    def logged_since(self, offset: int) -> set[str]:
        """point_ids of the complete records that start at or after byte ``offset`` of the log; empty when the log
        is shorter than ``offset`` (it was archived or replaced since) or missing."""
        try:
            with open(self.log, "rb") as f:
                if f.seek(0, os.SEEK_END) < offset:
                    return set()
                f.seek(offset)
                raw = f.read()
        except FileNotFoundError:
            return set()
        ids = set()
        for line in raw.split(b"\n")[:-1]:  # the part after the last newline is not a complete record
            with contextlib.suppress(UnicodeDecodeError, ValueError):
                rec = json.loads(line.decode("utf-8"))
                if isinstance(rec, dict) and isinstance(rec.get("point_id"), str):
                    ids.add(rec["point_id"])
        return ids

    def recover_killed(self, backend: str, run_id: str | None = None) -> dict | None:
        """If an earlier run died while measuring a point, record that point as ``killed`` and return the record.

        The log is the truth: when a record of the marker's point reached the log after the marker was written
        (the process died after the line was fsync'd, before the marker was cleared), the point finished: the
        marker is dropped, None returned. Without ``log_bytes`` (an older kit's marker): a finished latest record.

        Call while holding :func:`run_lock` (a live writer's marker is never mistaken for a dead one's)."""
        marker = self.dir / INFLIGHT_NAME
        if not marker.exists():
            return None
        try:
            doc = json.loads(marker.read_text())
            since = doc.get("log_bytes")
            finished = doc["point_id"] in (self.logged_since(since) if isinstance(since, int) else self.finished_ids())
        except (ValueError, OSError, AttributeError, KeyError, TypeError):  # torn, unreadable or not a marker
            finished = True
        if finished:  # the log is the truth; a marker naming no unfinished point is dropped
            self.mark_finished()
            return None
        rec = {
            **(doc.get("columns") or {}),
            "point_id": doc.get("point_id"),
            "backend": backend,
            "run_id": run_id,
            "status": "killed",
            "error": f"the process died while measuring this point (started {doc.get('started')}, pid "
            f"{doc.get('pid')}): killed by the OS (out of host memory?) or crashed; skipped on resume "
            "unless --retry-killed (retry_killed=True)",
        }
        self.append(rec)
        self.mark_finished()
        log.warning(
            "%s: point %s was being measured when an earlier run died; recorded as killed",
            self.dir,
            doc.get("point_id"),
        )
        return rec


def _json_default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
    except ImportError:
        pass
    return str(o)
