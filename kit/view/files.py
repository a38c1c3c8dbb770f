"""Writing what the views make (PNGs, CSV/JSON/Markdown exports): atomically, with one-line errors.

Every file goes through :func:`kit._io.atomic_write_with` (a unique temporary file beside the target, fsync,
rename), so a reader never sees a truncated PNG or half a CSV, and a failed write leaves neither a partial file nor
a ``.tmp`` behind. A file-system error (disk full, read-only directory, a name too long) becomes one
:class:`kit.errors.OutputPathError` line naming the path.
"""

from __future__ import annotations

import re
from pathlib import Path

from kit._io import atomic_write_with
from kit.errors import OutputPathError, UserError

#: characters allowed in a file-name prefix (no path separators, no spaces)
_PREFIX_RE = re.compile(r"[A-Za-z0-9._+-]*")


def write_atomic(path: str | Path, write) -> Path:
    """Create ``path`` atomically with ``write(tmp_path)`` (a callable writing a file by name). Returns the path.

    Raises:
        OutputPathError: the directory cannot be made or written, the disk is full, the name is too long; the
            message is ``cannot write PATH: REASON``.
    """
    p = Path(path)
    try:
        return atomic_write_with(p, write)
    except OSError as e:
        raise OutputPathError(f"cannot write {p}: {e.strerror or e}") from e


def write_text_atomic(path: str | Path, text: str) -> Path:
    """:func:`write_atomic` of UTF-8 ``text``. Raises: OutputPathError (see :func:`write_atomic`)."""
    return write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure as PNG at ``path`` (``dpi`` dots per inch) atomically, then close it.

    Raises: OutputPathError (see :func:`write_atomic`).
    """
    import matplotlib.pyplot as plt

    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi))
    finally:
        plt.close(fig)


def check_prefix(prefix: str) -> str:
    """A file-name prefix for a set of outputs (e.g. a model's name, so a second model's plots in the same out dir
    do not overwrite the first's): letters, digits and ``. _ + -`` only; returned unchanged.

    Raises: UserError naming the prefix and what is allowed.
    """
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise UserError(f"file-name prefix {prefix!r}: use letters, digits and . _ + - only (no / or spaces)")
    return prefix


def prefix_for(name: str) -> str:
    """A file-name prefix from a model preset or checkpoint path: its last path part, every character outside
    ``A-Za-z0-9._+-`` replaced by ``-``, then ``_`` (``"models/Llama 3"`` -> ``"Llama-3_"``; ``""`` -> ``""``)."""
    base = Path(str(name).rstrip("/")).name
    return re.sub(r"[^A-Za-z0-9._+-]", "-", base) + "_" if base else ""
