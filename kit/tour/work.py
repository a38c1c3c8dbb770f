"""Where the tour's blocking work runs: :class:`DaemonWorker` (the one torch thread: model loads, generations,
lesson measurements, one at a time) and :func:`in_daemon` (a blocking call awaited from the event loop: a launch's
wait, a server's stop). Both use daemon threads, so work under way never holds the process up after Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from concurrent.futures import Executor, Future


class DaemonWorker(Executor):
    """One daemon thread running the submitted calls in order. Unlike a ``ThreadPoolExecutor`` (whose threads the
    interpreter joins at exit), a call under way (a model load) cannot hold up the process after Ctrl-C."""

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        """Queue the call ``fn`` with the given arguments; its :class:`~concurrent.futures.Future` holds the result.

        Raises:
            RuntimeError: the worker is stopping (no new work is taken).
        """
        if self._closed:
            raise RuntimeError("the tour is stopping")
        f: Future = Future()
        self._q.put((f, fn, args, kwargs))
        return f

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            f, fn, args, kwargs = item
            if not f.set_running_or_notify_cancel():
                continue
            try:
                f.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - delivered to the caller through the future
                f.set_exception(e)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False, timeout: float | None = None) -> None:
        """No more calls; ``cancel_futures``: drop the queued ones; ``wait``: join the thread (at most
        ``timeout`` s)."""
        if not self._closed:
            self._closed = True
            if cancel_futures:
                with contextlib.suppress(queue.Empty):
                    while True:
                        self._q.get_nowait()[0].cancel()
            self._q.put(None)
        if wait:
            self._thread.join(timeout)


def in_daemon(fn, *args) -> asyncio.Future:
    """``fn(*args)`` in a daemon thread of its own, as an awaitable (a launch's wait, a server's stop: blocking
    calls that must neither block the event loop nor hold the process up at exit)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def done(ok, value):
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)

    def run():
        try:
            ok, v = True, fn(*args)
        except BaseException as e:  # noqa: BLE001 - delivered to the awaiting coroutine
            ok, v = False, e
        with contextlib.suppress(RuntimeError):  # the loop is closed: the tour stopped, nobody waits for it
            loop.call_soon_threadsafe(done, ok, v)

    threading.Thread(target=run, name="kit-tour-blocking", daemon=True).start()
    return fut
