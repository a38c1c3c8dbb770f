"""The load generator's self-check: is the client itself the bottleneck of a run?

A client whose event loop is late or whose CPU is saturated time-stamps chunks late and under-offers load, so
its figures describe the client, not the server. :class:`LoopProbe` runs beside a load point
(:func:`kit.serve.load.run_load_async`) and measures the event-loop lag (how late a 10 ms sleep wakes up) and the
client process's CPU use; a run above :data:`CLIENT_CPU_LIMIT` or :data:`LOOP_LAG_LIMIT_MS` is flagged
(``x_client_bound``, ``x_client_warning``). A run it cannot judge (no successful streamed request, too few
samples) is not flagged, and ``x_client_check`` says why.
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
#: requests and this many event-loop probe samples (10 ms each)
SELFCHECK_MIN_STREAMS = 1
SELFCHECK_MIN_LAG_SAMPLES = 5


class LoopProbe:
    """Event-loop lag (how late a 10 ms sleep wakes up) and process CPU over a run: the client self-check."""

    def __init__(self, interval_s: float = 0.01):
        self.interval = interval_s
        self.lags_ms: list[float] = []
        self._task = None

    async def _run(self):
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.lags_ms.append(max(0.0, (time.perf_counter() - t - self.interval) * 1000.0))

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
