"""Where a served load point stands while it runs (requests done, failed, in flight) and when it stops early.

:class:`PointProgress` is kept by :func:`kit.serve.loop.run_schedule` and handed to an ``on_status`` callback
every :data:`STATUS_INTERVAL_S` and at the end, so a front end can show progress even while nothing finishes
(a server that accepts connections and never answers). A point whose first :data:`EARLY_STOP_TIMEOUTS` finished
requests all timed out, with none succeeding, stops early: the requests not yet sent are recorded as failed
(not sent) and the row says why (``x_stopped_early``), instead of waiting one timeout per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

#: seconds between two ``on_status`` calls while a point runs
STATUS_INTERVAL_S = 2.0
#: a point stops early when its first this-many finished requests all timed out (none succeeded)
EARLY_STOP_TIMEOUTS = 3
#: how a timed-out request's error text starts (:func:`kit.serve.client.stream_request`)
TIMEOUT_PREFIX = "timeout:"


@dataclass
class PointProgress:
    """Counts of one load point (warm-up requests included): ``planned`` (None: open-ended), ``done``
    (finished, ok or not, sent or not), ``failed``, ``in_flight`` (sent, not finished), ``waiting`` (due, waiting for a
    concurrency slot), ``sent_done`` (finished requests that had been sent), ``timeouts``; ``stopped`` is the
    early-stop reason once it applies."""

    planned: int | None
    label: str = ""
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    waiting: int = 0
    timeouts: int = 0
    sent_done: int = 0
    stopped: str | None = None
    t_start: float = field(default_factory=time.perf_counter)

    def sent(self) -> None:
        """A request left its queue and was sent."""
        self.waiting -= 1
        self.in_flight += 1

    def finished(self, ok: bool, error: str | None, was_sent: bool = True) -> None:
        """A request finished (``was_sent``: it had been sent); applies the early-stop rule."""
        self.done += 1
        if was_sent:
            self.in_flight -= 1
            self.sent_done += 1
        else:
            self.waiting -= 1
        if not ok:
            self.failed += 1
            if str(error or "").startswith(TIMEOUT_PREFIX):
                self.timeouts += 1
        n = EARLY_STOP_TIMEOUTS if self.planned is None else min(EARLY_STOP_TIMEOUTS, self.planned)
        left = self.planned is None or self.done < self.planned  # nothing to stop once every request has ended
        none_ok = self.done == self.failed
        if self.stopped is None and left and none_ok and self.timeouts == self.sent_done >= n:
            self.stopped = (
                f"stopped early: the first {self.timeouts} requests all timed out (none completed); "
                "the requests not yet sent were not sent"
            )

    def line(self) -> str:
        """``"c=4: 12/64 done, 1 failed, 4 in flight, 8 waiting, 3 s"`` (planned counts warm-up requests)."""
        of = f"/{self.planned}" if self.planned is not None else ""
        s = f"{self.label + ': ' if self.label else ''}{self.done}{of} done, {self.failed} failed, "
        s += f"{self.in_flight} in flight"
        if self.waiting:
            s += f", {self.waiting} waiting"
        s += f", {time.perf_counter() - self.t_start:.0f} s"
        return s + (f"; {self.stopped}" if self.stopped else "")
