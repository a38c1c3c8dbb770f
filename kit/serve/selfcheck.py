"""The load generator's self-check: is the client itself the bottleneck of a run?

A client whose event loop is late or whose CPU is saturated time-stamps chunks late and under-offers load, so
its figures describe the client, not the server. :class:`LoopProbe` runs beside a load point
(:func:`kit.serve.loop.run_schedule`) and measures the event-loop lag (how late a 10 ms sleep wakes up;
every 40 ms while the client is idle) and the client process's CPU use; a run above :data:`CLIENT_CPU_LIMIT`
or :data:`LOOP_LAG_LIMIT_MS` is flagged (``x_client_bound``, ``x_client_warning``). A run it cannot judge (no
successful streamed request, too few samples) is not flagged, and ``x_client_check`` says why.
"""

from __future__ import annotations

import asyncio
import time

from kit import metrics as M

#: self-check thresholds: client CPU (fraction of one core) and event-loop lag p99 (ms) above which a run is
#: flagged as possibly client-bound
CLIENT_CPU_LIMIT = 0.85
LOOP_LAG_LIMIT_MS = 10.0
#: the self-check is applied only with at least this many successful streamed (token-bearing) measured
#: requests and this many event-loop probe entries (each stands for 10 ms of the run, see LoopProbe)
SELFCHECK_MIN_STREAMS = 1
SELFCHECK_MIN_LAG_SAMPLES = 5


class LoopProbe:
    """Event-loop lag (how late a timer wakes up) and process CPU over a run: the client self-check.

    The probe's own wake-ups are not free: on a virtual machine a sleep and wake costs a process 20–35 µs of CPU,
    which at one paced stream (a chunk every 5 ms) was a third of the client's CPU. So it samples every
    ``interval_s`` (10 ms) while the client is busy and every ``idle_interval_s`` (40 ms) after an interval in
    which the client used less than ``idle_cpu_frac`` of a core and the timer was less than a quarter of
    :data:`LOOP_LAG_LIMIT_MS` late (an idle loop wakes on time, give or take uvloop's 1 ms timer resolution; a late
    or busy one switches back at once). ``lags_ms`` holds one entry per ``interval_s`` of run time, so its
    percentiles are time-weighted as with fixed 10 ms sampling: a 40 ms sample stands for four, the first three
    as late as the last on-time wake and the last one with its own lag (one stall counts once, as a fixed 10 ms
    probe would count it).

    Raises:
        ValueError: ``interval_s`` not > 0, or ``idle_interval_s`` not a whole multiple of it.
    """

    def __init__(self, interval_s: float = 0.01, idle_interval_s: float = 0.04, idle_cpu_frac: float = 0.05):
        ratio = idle_interval_s / interval_s if interval_s > 0 else float("nan")
        if not (interval_s > 0 and ratio >= 1 and abs(ratio - round(ratio)) < 1e-9):
            raise ValueError(
                f"interval_s={interval_s!r}, idle_interval_s={idle_interval_s!r}: need interval_s > 0 and "
                "idle_interval_s a whole multiple of it"
            )
        self.interval = interval_s
        self.idle_interval = idle_interval_s
        self.idle_cpu_frac = idle_cpu_frac
        self.lags_ms: list[float] = []
        self.n_wakes = 0
        self._task = None

    async def _run(self):
        interval, on_time = self.interval, 0.0
        while True:
            t, c = time.perf_counter(), time.process_time()
            await asyncio.sleep(interval)
            now = time.perf_counter()
            lag = max(0.0, (now - t - interval) * 1000.0)
            self.n_wakes += 1
            # the 10 ms samples this one stands for: the earlier ones as on time as the last on-time wake, the
            # last one this wake's lag (as a fixed 10 ms probe would see a stall that began late in the interval)
            self.lags_ms.extend([on_time] * (round(interval / self.interval) - 1) + [lag])
            idle = (time.process_time() - c) < self.idle_cpu_frac * (now - t) and lag < LOOP_LAG_LIMIT_MS / 4
            if lag < LOOP_LAG_LIMIT_MS / 4:
                on_time = lag
            interval = self.idle_interval if idle else self.interval

    def start(self) -> None:
        """Start sampling on the running event loop (call from inside it)."""
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, n_streamed: int | None = None, n_ok: int | None = None) -> dict:
        """Stop the probe; the figures, and the verdict unless ``n_streamed`` (successful measured requests that
        streamed text) or the probe's sample count is too small to judge (then ``x_client_check`` says why:
        no successful request at all, or ``n_ok`` successful ones that all came back empty)."""
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        wall = time.perf_counter() - self._wall0
        cpu = (time.process_time() - self._cpu0) / wall if wall > 0 else float("nan")
        lag = M.percentiles(self.lags_ms, (50, 99))
        lag_max = max(self.lags_ms) if self.lags_ms else float("nan")
        figures = {
            "x_client_cpu_frac": cpu,
            "x_loop_lag_ms_p50": lag["p50"],
            "x_loop_lag_ms_p99": lag["p99"],
            "x_loop_lag_ms_max": lag_max,
        }
        if n_streamed is not None and n_streamed < SELFCHECK_MIN_STREAMS:
            if n_ok:
                why = f"the {n_ok} successful requests streamed no text (empty completions), nothing to time"
            else:
                why = "no successful request (the client CPU and loop lag then reflect failures only)"
            return {**figures, **selfcheck_skipped(why)}
        if lag["n"] < SELFCHECK_MIN_LAG_SAMPLES:
            return {**figures, **selfcheck_skipped(f"too few samples (a {wall * 1000:.0f} ms run)")}
        bound, why = False, []
        if cpu > CLIENT_CPU_LIMIT:
            bound = True
            why.append(f"client CPU {cpu:.0%} of one core > {CLIENT_CPU_LIMIT:.0%}")
        if lag["n"] and lag["p99"] > LOOP_LAG_LIMIT_MS:
            bound = True
            why.append(f"event-loop lag p99 {lag['p99']:.1f} ms > {LOOP_LAG_LIMIT_MS:g} ms")
        return {
            **figures,
            "x_client_bound": bound,
            "x_client_warning": ("the client may be the bottleneck: " + "; ".join(why)) if why else None,
            "x_client_check": "client-bound" if bound else "ok",
        }


def selfcheck_skipped(reason: str) -> dict:
    """The self-check columns of a run it cannot judge: not flagged (``x_client_bound = False``), and why not."""
    return {"x_client_bound": False, "x_client_warning": None, "x_client_check": f"not applied: {reason}"}
