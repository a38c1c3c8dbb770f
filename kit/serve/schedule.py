"""Schedules of the served request loop: which request is sent when, and under what concurrency cap.

The one request loop (:func:`kit.serve.loop.run_schedule`) sends, times and records every request; a schedule
only says what to send next (:class:`Send`). So every kind of load — a closed loop at a concurrency, an open loop
at a request rate with burstiness, a ramp, multi-turn sessions (:class:`kit.serve.sessions.SessionSchedule`), a
trace replay (:class:`kit.serve.trace.TraceSchedule`) — gets the same guarantees from the loop and the point
around it (:func:`kit.serve.point.measure_point`): early stop, progress, the client self-check, the ``/metrics``
scrape, power, the steady window and the validity verdict.

A schedule is an object with:

- ``kind`` (``"closed"``, ``"open"``, ``"ramp"``, ``"sessions"``, ``"trace"``) and ``label`` (for progress lines);
- ``planned``: the requests it will send, warm-up ones included (None: open-ended, a duration run);
- ``sends(run)``: an async iterator of :class:`Send`, pulled by the loop one at a time when it is ready to send
  the next (``run`` is the loop's :class:`RunClock`: when the run started, early stop);
- ``planned_max_tokens()``: the ``max_tokens`` of every planned request (warm-up flag first), so a point that
  sends nothing records each planned request as failed;
- ``steady``: how its steady-state window is found (:class:`Steady`);
- ``unique_prompts``: whether its prompts promise no shared prefix (a prefix-cache hit then makes the row invalid);
- ``columns(records)``: the row's columns of this schedule (its load, its own statistics).

Ramps follow vLLM's ``benchmarks/serve.py`` (``--ramp-up-strategy linear|exponential``): the load of request
``i`` of ``n`` is interpolated at progress ``p = i / max(n − 1, 1)``, linearly (``start + (end − start)·p``) or
exponentially (``start·(end/start)^p``). vLLM ramps the request rate; AIPerf also ramps concurrency (over a
duration). Here either is ramped by request index, so a ramp's shape does not depend on how fast the server is.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kit.errors import UserError
from kit.serve.limits import MAX_PLAN_S
from kit.serve.progress import PointProgress
from kit.serve.workload import RequestInput, arrival_gaps_s, fresh_seed

if TYPE_CHECKING:  # annotations only
    from kit.serve.load import LoadConfig

#: ramp strategies (vLLM's ``--ramp-up-strategy``)
RAMP_STRATEGIES = ("linear", "exponential")
#: what a ramp varies
RAMP_AXES = ("rate", "concurrency")


@dataclass
class Send:
    """One request a schedule asks the loop to send.

    Attributes:
        request: the prompt and its lengths (tokens).
        at_s: when it is due, s after the run's start (None: as soon as the cap allows). The loop never sends it
            earlier; how late it was is the record's ``send_late_ms``.
        cap: at most this many of the run's requests in flight when it is sent (None: no cap). Requests wait for
            a slot in the order the schedule gave them.
        warmup: a warm-up request (excluded from every figure of the row).
        messages: the chat history to send instead of the prompt (multi-turn on ``/v1/chat/completions``).
        fields: extra fields of its record (``session_id``, ``turn``, ``offered_rate`` ...).
        on_done: called on the event loop when the request has ended, with its
            :class:`kit.serve.sse.StreamCapture` (None when it was not sent or the client failed); a multi-turn
            schedule builds the next turn from it. Keep it quick.
        skip: a reason not to send it (e.g. an earlier turn of its conversation failed): it is recorded as a
            failed request, not sent, with this text.
    """

    request: RequestInput
    at_s: float | None = None
    cap: int | None = None
    warmup: bool = False
    messages: list[dict] | None = None
    fields: dict = field(default_factory=dict)
    on_done: Callable[[object], None] | None = None
    skip: str | None = None


@dataclass
class RunClock:
    """What a schedule may ask of the running loop: when the run started (``t0``, ``time.perf_counter()`` s), and
    whether it stopped early (``stopped``: the reason from the loop's :class:`kit.serve.progress.PointProgress`,
    else None)."""

    t0: float = field(default_factory=time.perf_counter)
    progress: PointProgress | None = None

    @property
    def stopped(self) -> str | None:
        """The early-stop reason, or None while the run goes on."""
        return self.progress.stopped if self.progress is not None else None


@dataclass(frozen=True)
class Steady:
    """How a schedule's steady-state window is found (:func:`kit.serve.steady.steady_columns`).

    ``target``: the in-flight count that defines it (closed loop: the concurrency; sessions: conversations in
    progress, counted per ``unit`` field); None: the window runs from the first to the last measured send (an open
    loop). ``note``: set when the schedule has no steady state (a ramp), saying why.
    """

    target: int | None = None
    unit: str | None = None
    note: str | None = None


def ramp_values(start: float, end: float, n: int, strategy: str = "linear") -> np.ndarray:
    """The load of each of ``n`` requests of a ramp from ``start`` to ``end`` (vLLM's ramp-up: progress
    ``p = i / max(n − 1, 1)``; linear ``start + (end − start)·p``, exponential ``start·(end/start)^p``).

    Raises:
        UserError: an unknown strategy, a start or end not finite and > 0, or n < 1.
    """
    if strategy not in RAMP_STRATEGIES:
        raise UserError(f"ramp strategy {strategy!r}; choose one of {', '.join(RAMP_STRATEGIES)}")
    if not (math.isfinite(start) and math.isfinite(end) and start > 0 and end > 0):
        raise UserError(f"ramp from {start!r} to {end!r}: both must be finite and > 0")
    if int(n) < 1:
        raise UserError(f"a ramp needs at least one request, got n={n!r}")
    p = np.arange(int(n)) / max(int(n) - 1, 1)
    if strategy == "linear":
        return start + (end - start) * p
    return start * (end / start) ** p


class Arrivals:
    """A closed loop (``request_rate = inf``: every request due at once, ``cap`` in flight) or an open loop
    (arrival gaps Gamma(b, 1/(rate·b)), :func:`kit.serve.workload.arrival_gaps_s`; ``cap`` optional).

    Args:
        workload: the requests, used in order and cyclically (warm-up ones first).
        n: measured requests (None: open-ended, until the loop's ``duration_s``).
        warmup: warm-up requests, sent first at the same cap (they hand over to the measured ones without the
            server draining in between).
        cap: concurrency cap (None: unbounded).
        rate, burstiness, seed: the arrival process (rate in requests/s; inf: all at once).

    Raises:
        UserError: an empty workload, n or warmup < 0, a cap < 1.
    """

    def __init__(
        self,
        workload: Sequence[RequestInput],
        n: int | None,
        warmup: int = 0,
        cap: int | None = None,
        rate: float = math.inf,
        burstiness: float = 1.0,
        seed: int = 0,
    ):
        if not workload:
            raise UserError("workload is empty: give at least one request")
        if (n is not None and int(n) < 0) or int(warmup) < 0 or (cap is not None and int(cap) < 1):
            raise UserError(f"n={n!r}, warmup={warmup!r} (>= 0), cap={cap!r} (>= 1 or None)")
        self.workload, self.n, self.warmup = list(workload), None if n is None else int(n), int(warmup)
        self.cap, self.rate, self.burstiness, self.seed = None if cap is None else int(cap), rate, burstiness, seed
        self.kind = "closed" if math.isinf(rate) else "open"
        self.label = f"c={cap}" if self.kind == "closed" else f"rate={rate:g}/s c={cap}"
        self.planned = None if self.n is None else self.n + self.warmup
        self.unique_prompts = True
        self.steady = Steady(target=self.cap) if self.kind == "closed" else Steady()

    @classmethod
    def from_config(cls, cfg: LoadConfig, workload: Sequence[RequestInput], unique_prompts: bool = True) -> Arrivals:
        """The closed or open loop of a :class:`kit.serve.load.LoadConfig`: its ``num_requests``,
        ``warmup_requests``, ``max_concurrency``, ``request_rate``, ``burstiness`` and ``seed``. ``unique_prompts``:
        the workload promises distinct prompts (False for a workload given by the caller, whose sharing is unknown)."""
        sched = cls(
            workload,
            cfg.num_requests,
            cfg.warmup_requests,
            cfg.max_concurrency,
            cfg.request_rate,
            cfg.burstiness,
            cfg.seed if cfg.seed is not None else fresh_seed(),
        )
        sched.unique_prompts = unique_prompts
        return sched

    def request(self, i: int) -> RequestInput:
        """Request ``i`` of the run (warm-up ones first), taken cyclically from the workload."""
        return self.workload[i % len(self.workload)]

    def planned_max_tokens(self) -> list[tuple[bool, int]]:
        """``(warmup, max_tokens)`` of every planned request (one measured request for an open-ended run)."""
        n = self.warmup + (self.n if self.n is not None else 1)
        return [(i < self.warmup, self.request(i).max_tokens) for i in range(n)]

    def gaps(self) -> np.ndarray:
        """The arrival gaps (s) of the measured requests (zeros for a closed loop; at most 100,000, reused)."""
        return arrival_gaps_s(min(self.n or 10**9, 100_000) or 1, self.rate, self.burstiness, self.seed)

    async def sends(self, run: RunClock) -> AsyncIterator[Send]:
        """The warm-up requests (due at once), then the measured ones at their arrival times."""
        for i in range(self.warmup):
            yield Send(self.request(i), cap=self.cap, warmup=True)
        gaps, t, k = self.gaps(), 0.0, 0
        timed = self.kind == "open"
        while self.n is None or k < self.n:
            if self.n is None and run.stopped:
                return
            gap = float(gaps[k % len(gaps)])
            assert math.isfinite(gap) and gap >= 0.0, f"arrival gap {gap!r} (rate and burstiness are checked)"
            t += gap
            fields = {"offered_rate": self.rate} if timed else {}
            yield Send(self.request(self.warmup + k), at_s=t if timed else None, cap=self.cap, fields=fields)
            k += 1

    def columns(self, records: Sequence[dict]) -> dict:
        """Nothing beyond the config's columns (concurrency, request rate)."""
        return {}


class Ramp(Arrivals):
    """A load that rises within one run: the request rate (an open loop whose rate for request ``i`` is
    :func:`ramp_values`' ``i``-th value; gaps drawn as in :class:`Arrivals` at that rate) or the concurrency cap
    (request ``i`` waits until fewer than ``round(value_i)`` requests are in flight). Each record carries the load it
    was sent under (``offered_rate``; ``offered_concurrency``, the cap, as every record does) beside the measured
    in-flight count (``inflight_at_send``).

    Args:
        axis: ``"rate"`` (requests/s) or ``"concurrency"``.
        start, end: the ramp's first and last load (> 0; a concurrency is rounded to an integer >= 1).
        strategy: ``"linear"`` or ``"exponential"``.
        cap: for a rate ramp, an optional concurrency cap over the whole run.
        workload, n, warmup, burstiness, seed: as in :class:`Arrivals` (``n`` must be given; warm-up requests are
            sent at the start load).

    Raises:
        UserError: an unknown axis or strategy, start/end not finite and > 0, no ``n``.
    """

    def __init__(
        self,
        workload: Sequence[RequestInput],
        n: int,
        axis: str,
        start: float,
        end: float,
        strategy: str = "linear",
        **kw,
    ):
        if axis not in RAMP_AXES:
            raise UserError(f"ramp axis {axis!r}; choose one of {', '.join(RAMP_AXES)}")
        if n is None:
            raise UserError("a ramp needs a request count (--num-requests), not only a duration")
        super().__init__(workload, n, **kw)
        self.axis, self.start, self.end, self.strategy = axis, float(start), float(end), strategy
        self.values = ramp_values(self.start, self.end, self.n or 1, strategy)
        planned_s = float(np.sum(1.0 / self.values)) if axis == "rate" else 0.0
        if planned_s > MAX_PLAN_S:
            raise UserError(
                f"a rate ramp from {start:g} to {end:g} req/s over {self.n} requests would take "
                f"{planned_s / 86_400:.1f} days to send (at most {MAX_PLAN_S / 86_400:g}); raise the rates"
            )
        self.kind = "ramp"
        self.label = f"ramp {axis} {start:g}→{end:g} ({strategy})"
        self.steady = Steady(note=f"a ramp has no steady state: the {axis} changes with every request")

    def cap_at(self, i: int) -> int | None:
        """The concurrency cap of measured request ``i`` (a concurrency ramp's value, else the run's cap)."""
        return max(1, round(float(self.values[i]))) if self.axis == "concurrency" else self.cap

    async def sends(self, run: RunClock) -> AsyncIterator[Send]:
        """Warm-up requests at the start load, then request ``i`` under the ``i``-th load of the ramp."""
        first_cap = self.cap_at(0)
        for i in range(self.warmup):
            yield Send(self.request(i), cap=first_cap, warmup=True)
        if self.axis == "concurrency":
            for k in range(self.n or 0):
                yield Send(self.request(self.warmup + k), cap=self.cap_at(k))
            return
        rng = np.random.default_rng(self.seed + 7919)
        t = 0.0
        for k in range(self.n or 0):
            rate = float(self.values[k])
            b = self.burstiness
            gap = 1.0 / rate if math.isinf(b) else float(rng.gamma(shape=b, scale=1.0 / (rate * b)))
            assert math.isfinite(gap) and gap >= 0.0, f"arrival gap {gap!r} (rate and burstiness are checked)"
            t += gap
            yield Send(self.request(self.warmup + k), at_s=t, cap=self.cap, fields={"offered_rate": rate})

    def columns(self, records: Sequence[dict]) -> dict:
        """The ramp's columns: axis, start, end, strategy; the row's ``concurrency`` / ``request_rate`` are the
        ramp's end load (a concurrency ramp) or its cap and None (a rate ramp: the rate has no single value)."""
        out = {"x_ramp_axis": self.axis, "x_ramp_start": self.start, "x_ramp_end": self.end}
        out["x_ramp_strategy"] = self.strategy
        if self.axis == "concurrency":
            out["concurrency"] = self.cap_at((self.n or 1) - 1)
        else:
            out["request_rate"] = math.nan
        return out
