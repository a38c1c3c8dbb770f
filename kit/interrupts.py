"""Ctrl-C that is never lost during a long run.

Python turns SIGINT into a ``KeyboardInterrupt`` raised wherever the main thread happens to be. When that is a
finaliser (``__del__`` run by the garbage collector, common while torch and tokenizer objects are freed), the
interpreter prints "Exception ignored in ..." and the run goes on as if nothing happened: the user pressed Ctrl-C
and the sweep kept measuring. :class:`InterruptGuard` records every SIGINT in a flag before raising, so a
swallowed interrupt still stops the run at the next point boundary (:meth:`InterruptGuard.check`), and it keeps
the swallowed one's traceback off the terminal.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

log = logging.getLogger("kit")


class InterruptGuard:
    """Context manager: while active, SIGINT sets :attr:`requested` and raises ``KeyboardInterrupt`` as usual.

    Installed only in the main thread and only over Python's default SIGINT handler (a notebook kernel's or an
    application's own handler is left alone; :meth:`check` is then a no-op unless :meth:`request` was called).

    Example::

        with InterruptGuard() as guard:
            for point in points:
                guard.check()        # raises KeyboardInterrupt if a Ctrl-C was swallowed earlier
                measure(point)
    """

    def __init__(self) -> None:
        self.requested = False
        self._installed = False
        self._prev_handler = None
        self._prev_term = None
        self._prev_hook = None

    def request(self) -> None:
        """Mark a stop as requested (the SIGINT handler calls this; tests may too)."""
        self.requested = True

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if a SIGINT arrived since the guard was entered (even a swallowed one)."""
        if self.requested:
            raise KeyboardInterrupt

    def _handler(self, signum, frame):
        self.request()
        raise KeyboardInterrupt

    def _unraisable(self, info) -> None:
        # a KeyboardInterrupt raised inside a finaliser: already recorded in the flag; say so in one line
        if info.exc_type is KeyboardInterrupt and self.requested:
            log.warning("interrupt received; stopping after the current point (Ctrl-C again to stop now)")
            return
        self._prev_hook(info)

    def __enter__(self) -> InterruptGuard:
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._prev_handler = signal.signal(signal.SIGINT, self._handler)
            # SIGTERM (kill, timeout, a cancelled CI job) stops the run like Ctrl-C: finished points are saved and
            # the point in flight is not mistaken for one the OS killed
            self._prev_term = None
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                self._prev_term = signal.signal(signal.SIGTERM, self._handler)
            self._prev_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._prev_handler)
            if self._prev_term is not None:
                signal.signal(signal.SIGTERM, self._prev_term)
            sys.unraisablehook = self._prev_hook
            self._installed = False
