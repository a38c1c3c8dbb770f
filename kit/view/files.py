"""Files the views make: PNG figures (atomically, through :func:`kit._io.atomic_write_with`, so a reader never sees
a truncated PNG and a failed write leaves neither a partial file nor a ``.tmp`` behind; a file-system error is one
:class:`kit.errors.OutputPathError` line naming the path) and file-name prefixes.
"""

from __future__ import annotations

import re
from pathlib import Path

from kit._io import atomic_write_with
from kit.errors import UserError

#: characters allowed in a file-name prefix (no path separators, no spaces)
_PREFIX_RE = re.compile(r"[A-Za-z0-9._+-]*")


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure as PNG at ``path`` (``dpi`` dots per inch) atomically, then close it.

    Raises: OutputPathError (see :func:`kit._io.atomic_write_with`).
    """
    import matplotlib.pyplot as plt

    try:
        return atomic_write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi))
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
