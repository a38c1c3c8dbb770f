"""Files and places: atomic writes, output-path checks, the shipped data files, the cache directory, a free port.

Every file the kit writes as a whole (Parquet, JSON sidecars, calibrations, doctor reports, exports, figures) goes
through :func:`atomic_write_with` (or its :func:`atomic_write_bytes` / :func:`atomic_write_text`): a uniquely named
temporary file beside the target (same directory, so the rename never crosses file systems), fsync'd, then
:func:`os.replace`; a reader sees the old file or the new one, never half of one, the temporary file is removed on
any failure, and a file-system error is one :class:`kit.errors.OutputPathError` line naming the path. Append logs
(``points.jsonl``) are written by :class:`kit.store.ResultStore`, a line at a time with fsync.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from importlib import resources
from pathlib import Path

from kit.errors import OutputPathError

#: environment variable that overrides :func:`cache_dir`
CACHE_DIR_ENV = "KIT_CACHE_DIR"


def check_out_file(path: str | Path, what: str = "--out", example: str = "out.json") -> Path:
    """Validate an output *file* path before any work: not a directory, and its parent is a directory or can be
    created (the nearest existing ancestor is a writable directory). Creates nothing.

    Args:
        what: how the path is named in messages (an option such as ``--out``).
        example: a file name shown in the message when ``path`` is a directory.

    Raises:
        OutputPathError: ``path`` is a directory, an ancestor is a file, or the nearest existing ancestor is not
            writable or on a full file system.
    """
    if not str(path).strip():
        raise OutputPathError(f"{what} is empty; give a file path (e.g. {example})")
    p = Path(path).expanduser()
    if p.is_dir():
        raise OutputPathError(f"{what} {path} is a directory; give a file path (e.g. {p / example})")
    anc = p.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise OutputPathError(f"{what} {path}: {anc} is a file, not a directory")
    _check_writable(anc, what, path)
    return p


def _check_writable(directory: Path, what: str, path) -> None:
    """An output ``path`` whose nearest existing directory is ``directory`` can be written: the directory is
    writable by this process (``access(2)``: permissions, and a read-only mount even for root) and its file
    system has free space (``statvfs``; root counts the blocks reserved for it).

    Raises:
        OutputPathError: not writable, or no free space (one line naming ``what``, ``path`` and the directory).
    """
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputPathError(f"{what} {path}: directory {directory} is not writable")
    try:
        st = os.statvfs(directory)
    except OSError:  # a file system that does not say: the write itself will tell
        return
    if (st.f_bfree if os.geteuid() == 0 else st.f_bavail) == 0 and st.f_blocks > 0:
        raise OutputPathError(f"{what} {path}: the file system of {directory} is full; free space or give another path")


def check_out_dir(path: str | Path, what: str = "output directory", example: str = "results/my-run") -> Path:
    """Validate an output *directory* before any work: not empty, not a file, no ancestor is a file, and the
    nearest existing one can be written (permissions, read-only mount, full disk). Creates nothing.

    Raises:
        OutputPathError: the path is empty, it (or a parent) exists and is not a directory, or the nearest existing
            directory is not writable or its file system is full.
    """
    if not str(path).strip():
        raise OutputPathError(f"{what} is empty; give a directory for the results (e.g. {example})")
    d = Path(path).expanduser()
    for q in (d, *d.parents):
        if q.exists():
            if not q.is_dir():
                where = "" if q == d else f" (its parent {str(q)!r})"
                raise OutputPathError(
                    f"{what} {str(d)!r}{where} exists and is a file; give a directory path (it is created if missing)"
                )
            _check_writable(q, what, str(d))
            break
    return d


def _file_mode() -> int:
    """0666 minus this process's umask: the mode ``open()`` would give a new file."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_with(path: str | Path, write) -> Path:
    """Atomically create ``path`` with ``write(tmp_path)``, a callable that writes a file by name (e.g.
    ``DataFrame.to_parquet``, ``Figure.savefig``): a uniquely named temporary file beside ``path`` (same directory,
    so the rename never crosses file systems; the mode ``open()`` would give), fsync'd, then :func:`os.replace`.
    The temporary file is removed on any failure. Creates the parent directory. Returns the path.

    Raises:
        OutputPathError: the directory cannot be created or written, the disk is full, the name is too long: one
            line, ``cannot write PATH: REASON``. Other exceptions of ``write`` propagate unchanged.
    """
    p = Path(path)
    tmp = None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        os.close(fd)
        os.chmod(tmp, _file_mode())  # mkstemp makes 0600; results are meant to be shared like any file written here
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, p)
        tmp = None
    except OutputPathError:
        raise
    except OSError as e:
        raise OutputPathError(f"cannot write {p}: {e.strerror or e}") from e
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return p


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """:func:`atomic_write_with` of ``data``. Returns the path. Raises: OutputPathError (one line naming the path)."""
    return atomic_write_with(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: str | Path, text: str, what: str = "--out", example: str = "out.json") -> Path:
    """Check ``path`` with :func:`check_out_file`, then write ``text`` (UTF-8) atomically
    (:func:`atomic_write_with`). Returns the path. The one text writer of the kit.

    Raises:
        OutputPathError: see :func:`check_out_file` (``what`` and ``example`` name the path in its messages) and
            :func:`atomic_write_with`.
    """
    return atomic_write_bytes(check_out_file(path, what, example), text.encode("utf-8"))


def data_path(name: str) -> Path:
    """Path of a file shipped in ``kit/data/`` (``accelerators.csv``, ``prices.csv``, ``models.csv``, ...)."""
    return Path(str(resources.files("kit") / "data" / name))


def cache_dir() -> Path:
    """The kit's cache directory (calibrations): ``$KIT_CACHE_DIR`` if set, else the platform's user cache
    directory for ``kit`` (``platformdirs.user_cache_dir``; ``~/.cache/kit`` or ``$XDG_CACHE_HOME/kit`` on Linux).
    Not created here."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    import platformdirs

    return Path(platformdirs.user_cache_dir("kit", appauthor=False))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (bind to port 0, read it back, close)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
