"""The kit's exception hierarchy: what the command line shows as one line, and what it does not.

Every error the kit raises because of something a user gave it (a bad value, an unknown name, a missing input, an
output path that cannot be used, a server that would not start) is a :class:`KitError`. ``kit <command>`` prints
those as one line ``kit <command>: error: <message>`` and exits 2. Any other exception is a bug in the kit (or in
a library under it): the command lets it through with its traceback and exits 1, so a bug never looks like a
user's mistake.

Each subclass also derives from the built-in exception that code written before this hierarchy caught
(``ValueError``, ``KeyError``, ``FileNotFoundError``, ...), so ``except ValueError`` around a kit call keeps
working.
"""

from __future__ import annotations


class KitError(Exception):
    """Base of every error the kit raises on purpose (a user-facing condition, not a bug)."""


class UserError(KitError, ValueError):
    """A setting or value the user gave is not allowed; the message names the value and what is allowed."""


class UnknownNameError(UserError, KeyError):
    """A name (model preset, accelerator, reference model, price basis) that the kit does not know; the message
    lists the known ones. Also a ``KeyError``, printed without ``KeyError``'s quotes."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InputNotFoundError(KitError, FileNotFoundError):
    """A file or directory the user named as input (results, config, checkpoint, calibration, catalog CSV) does
    not exist or holds nothing the kit can read."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class OutputPathError(KitError, OSError):
    """An output path that cannot be used: a file where a directory is needed (or the reverse), or a directory
    that is not writable. Raised before any measuring starts."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ServerError(KitError, RuntimeError):
    """A server the kit started (an inference server, the dashboard) exited or never became ready."""


class ServerTimeoutError(ServerError, TimeoutError):
    """A server the kit started did not become ready in time."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
