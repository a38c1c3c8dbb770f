"""The load generator's self-check: is the client itself the bottleneck of a run?

A client whose event loop is late or whose CPU is saturated time-stamps chunks late and under-offers load, so
its figures describe the client, not the server. :class:`LoopProbe` runs beside a load point
(:func:`kit.serve.loop.run_schedule`) and measures the event-loop lag (how late a 10 ms sleep wakes up;
every 40 ms while the client is idle) and the client process's CPU use.

A late loop has two causes the verdict keeps apart. The client's own work (callbacks that run long, a saturated
core, the garbage collector, another thread of the client holding the interpreter) makes it *client-bound*
(``x_client_bound``, ``x_client_warning``): its CPU above :data:`CLIENT_CPU_LIMIT`, or the part of the lag that is
its own above :data:`LOOP_LAG_LIMIT_MS` (p99) and at least :data:`OWN_LAG_SHARE` of the lag. Other processes
holding the CPUs (a busy machine) make the loop thread wait in the scheduler's run queue: that is *machine
contention* (``x_machine_contention``, ``x_contention_warning``), named as its own reason. On Linux each wake reads
the loop thread's run-queue wait (``/proc/thread-self/schedstat``, second field, ns): a wake's own lag is its lag
minus the time it waited for a CPU. Without that file, a late loop with the client under
:data:`CONTENTION_CPU_FRAC` of a core on a machine loaded above one runnable task per core is taken as contention.
Either way the time stamps are late, so both make a row invalid (:mod:`kit.validity`); only the first says the
client is too slow. A run it cannot judge (no successful streamed request, too few samples) is not flagged, and
``x_client_check`` says why.
"""

from __future__ import annotations

import asyncio
import os
import time

from kit import metrics as M

#: self-check thresholds: client CPU (fraction of one core) and event-loop lag p99 (ms) above which a run is
#: flagged as possibly client-bound
CLIENT_CPU_LIMIT = 0.85
LOOP_LAG_LIMIT_MS = 10.0
#: the self-check is applied only with at least this many successful streamed (token-bearing) measured
#: requests and this many event-loop probe entries (each stands for 10 ms of the run, see LoopProbe), or a run
#: long enough for them (fewer entries then mean the probe woke late)
SELFCHECK_MIN_STREAMS = 1
SELFCHECK_MIN_LAG_SAMPLES = 5
#: without run-queue statistics: a late loop is machine contention when the client used less than this fraction of
#: one core and the 1-minute load average per usable core was above 1 (a light client does not lag by itself)
CONTENTION_CPU_FRAC = 0.5
#: the client's own lag counts as client-bound only when it is at least this share of the whole lag (p99s): on a
#: machine whose other processes keep the loop waiting for hundreds of ms, the backlog of chunks it then works
#: through is a few ms of its own lag, caused by the wait, not by the client
OWN_LAG_SHARE = 0.25
#: the loop thread's scheduler statistics (Linux): time on a CPU, time waiting in the run queue (ns), time slices
SCHEDSTAT = "/proc/thread-self/schedstat"


def open_schedstat() -> int | None:
    """A file descriptor on the calling thread's :data:`SCHEDSTAT`, or None where there is none (not Linux, a
    kernel without scheduler statistics)."""
    try:
        fd = os.open(SCHEDSTAT, os.O_RDONLY)
    except OSError:
        return None
    if run_queue_wait_ms(fd) is None:
        os.close(fd)
        return None
    return fd


def run_queue_wait_ms(fd: int | None) -> float | None:
    """The thread's time waiting for a CPU so far (ms; schedstat's second field), or None when unreadable."""
    if fd is None:
        return None
    try:
        return int(os.pread(fd, 128, 0).split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None


def machine_load() -> float | None:
    """The 1-minute load average per CPU this process may use (runnable tasks per core; > 1: tasks wait for a
    CPU), or None where the system does not say."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0] / max(1, cores)
    except (AttributeError, OSError):
        return None


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
    probe would count it). ``own_lags_ms`` is the same with each lag less the time the loop thread waited in the
    run queue during that sleep (the client's own part; equal to ``lags_ms`` where the wait is unknown) and
    ``wait_ms`` the run-queue wait over the run (None where unknown).

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
        self.own_lags_ms: list[float] = []
        self.wait_ms: float | None = None
        self.n_wakes = 0
        self._task = None
        self._fd: int | None = None

    async def _run(self):
        try:
            await self._sample()
        finally:  # stopped, or the loop closed under it: the schedstat file is closed either way
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    async def _sample(self):
        interval, on_time = self.interval, 0.0
        wait0 = run_queue_wait_ms(self._fd)
        while True:
            t, c = time.perf_counter(), time.process_time()
            await asyncio.sleep(interval)
            now = time.perf_counter()
            lag = max(0.0, (now - t - interval) * 1000.0)
            wait = run_queue_wait_ms(self._fd)
            waited = wait - wait0 if wait is not None and wait0 is not None else 0.0
            wait0 = wait
            self.n_wakes += 1
            # the 10 ms samples this one stands for: the earlier ones as on time as the last on-time wake, the
            # last one this wake's lag (as a fixed 10 ms probe would see a stall that began late in the interval)
            fill = [on_time] * (round(interval / self.interval) - 1)
            self.lags_ms.extend(fill + [lag])
            self.own_lags_ms.extend(fill + [max(0.0, lag - waited)])
            idle = (time.process_time() - c) < self.idle_cpu_frac * (now - t) and lag < LOOP_LAG_LIMIT_MS / 4
            if lag < LOOP_LAG_LIMIT_MS / 4:
                on_time = lag
            interval = self.idle_interval if idle else self.interval

    def start(self) -> None:
        """Start sampling on the running event loop (call from inside it)."""
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._fd = open_schedstat()  # this thread's: the loop's
        self._wait0 = run_queue_wait_ms(self._fd)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, n_streamed: int | None = None, n_ok: int | None = None) -> dict:
        """Stop the probe; the figures, and the verdict unless ``n_streamed`` (successful measured requests that
        streamed text) or the probe's sample count is too small to judge (then ``x_client_check`` says why:
        no successful request at all, or ``n_ok`` successful ones that all came back empty)."""
        wait = run_queue_wait_ms(self._fd)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        wall = time.perf_counter() - self._wall0
        cpu = (time.process_time() - self._cpu0) / wall if wall > 0 else float("nan")
        self.wait_ms = wait - self._wait0 if wait is not None and self._wait0 is not None else None
        lag = M.percentiles(self.lags_ms, (50, 99))
        own = M.percentiles(self.own_lags_ms, (99,))
        figures = {
            "x_client_cpu_frac": cpu,
            "x_loop_lag_ms_p50": lag["p50"],
            "x_loop_lag_ms_p99": lag["p99"],
            "x_loop_lag_ms_max": max(self.lags_ms) if self.lags_ms else float("nan"),
            "x_loop_lag_own_ms_p99": own["p99"] if self.wait_ms is not None else None,
            "x_client_run_queue_frac": self.wait_ms / 1000.0 / wall if self.wait_ms is not None and wall > 0 else None,
            "x_machine_load_per_core": machine_load(),
        }
        if n_streamed is not None and n_streamed < SELFCHECK_MIN_STREAMS:
            if n_ok:
                why = f"the {n_ok} successful requests streamed no text (empty completions), nothing to time"
            else:
                why = "no successful request (the client CPU and loop lag then reflect failures only)"
            return {**figures, **selfcheck_skipped(why)}
        # too short to judge; a run long enough for the samples that has fewer woke late itself (judged)
        if lag["n"] < SELFCHECK_MIN_LAG_SAMPLES and (not lag["n"] or wall < SELFCHECK_MIN_LAG_SAMPLES * self.interval):
            return {**figures, **selfcheck_skipped(f"too few samples (a {wall * 1000:.0f} ms run)")}
        return {**figures, **selfcheck_verdict(figures)}


def selfcheck_verdict(f: dict) -> dict:
    """Client-bound or machine contention (see the module text) from :meth:`LoopProbe.stop`'s figures: the
    ``x_client_bound``, ``x_client_warning``, ``x_machine_contention``, ``x_contention_warning`` and
    ``x_client_check`` columns."""
    cpu, lag, own, load = (
        f["x_client_cpu_frac"],
        f["x_loop_lag_ms_p99"],
        f["x_loop_lag_own_ms_p99"],
        f.get("x_machine_load_per_core"),
    )
    late = lag > LOOP_LAG_LIMIT_MS
    if own is None:  # no run-queue figures: a light client on a loaded machine is not lagging by itself
        busy_machine = load is not None and load > 1.0
        own = 0.0 if late and cpu < CONTENTION_CPU_FRAC and busy_machine else lag
    why = []
    if cpu > CLIENT_CPU_LIMIT:
        why.append(f"client CPU {cpu:.0%} of one core > {CLIENT_CPU_LIMIT:.0%}")
    own_bound = own > LOOP_LAG_LIMIT_MS and own >= OWN_LAG_SHARE * lag
    if own_bound:
        mine = "" if own == lag else f" (its own part: {own:.1f} ms; the rest waiting for a CPU)"
        why.append(f"event-loop lag p99 {lag:.1f} ms > {LOOP_LAG_LIMIT_MS:g} ms{mine}")
    contention = late and not own_bound
    warning = None
    if contention:
        queue = f.get("x_client_run_queue_frac")
        waited = f", waiting for a CPU {queue:.0%} of the run" if queue is not None else ""
        loaded = f" (load {load:.1f} runnable tasks per core)" if load is not None else ""
        warning = (
            f"machine contention: the client's event loop woke up late (lag p99 {lag:.1f} ms > "
            f"{LOOP_LAG_LIMIT_MS:g} ms{waited}) while the client used {cpu:.0%} of one core: other processes held "
            f"the CPUs{loaded}, so time stamps are late; run on a quieter machine or pin the client to a free core"
        )
    check = "client-bound" if why else "machine contention" if contention else "ok"
    return {
        "x_client_bound": bool(why),
        "x_client_warning": ("the client may be the bottleneck: " + "; ".join(why)) if why else None,
        "x_machine_contention": contention,
        "x_contention_warning": warning,
        "x_client_check": check,
    }


def selfcheck_skipped(reason: str) -> dict:
    """The self-check columns of a run it cannot judge: not flagged (``x_client_bound = False``), and why not."""
    return {
        "x_client_bound": False,
        "x_client_warning": None,
        "x_machine_contention": False,
        "x_contention_warning": None,
        "x_client_check": f"not applied: {reason}",
    }
