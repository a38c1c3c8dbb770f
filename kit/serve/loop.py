"""The one served request loop: it sends the requests of any schedule (:mod:`kit.serve.schedule`), times every
streamed event and records every request.

:func:`run_schedule` pulls :class:`kit.serve.schedule.Send` items one at a time, waits until each is due and a
slot under its concurrency cap is free (in the schedule's order), sends it with the streaming client
(:func:`kit.serve.client.stream_request`) and, after the run, turns each capture into a request record
(:func:`kit.serve.record.request_record`). The same loop serves the closed loop, the open loop, ramps, multi-turn
sessions and trace replays, so each of them gets:

- **early stop** (:mod:`kit.serve.progress`): when the first finished requests all time out, the rest are not
  sent; each planned request not sent is a failed record (``not_sent``), and ``run_info`` has ``stopped_early``;
- **progress**: an ``on_status`` callback every :data:`kit.serve.progress.STATUS_INTERVAL_S` and at the end, and
  ``on_progress`` as each request finishes;
- **the client self-check** (:class:`kit.serve.selfcheck.LoopProbe`): event-loop lag and client CPU beside the
  measured requests;
- **exact load figures**: each record has ``due_s`` (when the schedule wanted it sent), ``send_late_ms`` (how late
  it went), ``client_queue_ms`` (time waiting for a slot under the cap), ``offered_concurrency`` (the cap) and
  ``inflight_at_send`` (the client's requests in flight as it was sent, itself included).

Measuring choices (and the mistakes they avoid):

- ``t0`` of a request is taken when it is sent, after its slot wait; that wait is ``client_queue_ms``, counted
  from the request's due time (its arrival). The connection pool (:class:`kit.serve.http1.StreamPool`) is
  unbounded, so no hidden queue sits between the cap and the socket.
- A due request wakes :data:`SPIN_S` early and yields to the event loop until its time (the loop's timer rounds
  to whole milliseconds), so open-loop and trace sends are on time to a fraction of a millisecond.
- Failures never abort or hang a run: a client error is a failed record with its text (secrets masked,
  :mod:`kit.serve.redact`); a point whose model id cannot be listed sends nothing and records every planned
  request as failed with the listing's error (``run_info["setup_error"]``).
- Token counting (the tokenizer) happens after the run, so it never delays another stream's time stamps.
- The process's heap is frozen for the garbage collector during the run (``gc.freeze``): a full collection then
  scans only what the run allocates. In a process holding a large heap (a notebook kernel, a test runner) an
  unfrozen full collection stalled the event loop for ~60 ms mid-run, which the self-check rightly called
  client-bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kit.errors import UserError
from kit.serve.client import get_model_id, stream_request, token_counter
from kit.serve.http1 import StreamPool
from kit.serve.progress import STATUS_INTERVAL_S, PointProgress
from kit.serve.record import request_record
from kit.serve.redact import redact_url, scrub
from kit.serve.schedule import RunClock
from kit.serve.selfcheck import LoopProbe, selfcheck_skipped
from kit.serve.sse import StreamCapture

if TYPE_CHECKING:  # annotations only
    from kit.serve.load import LoadConfig
    from kit.serve.schedule import Send

#: a due request wakes this long before its time and yields to the event loop until it is due (s)
SPIN_S = 0.002
#: an open-ended run (a duration, no request count) with no concurrency cap keeps at most this many requests in
#: flight, so an infinite rate cannot create unbounded tasks
OPEN_ENDED_MAX_IN_FLIGHT = 1024


class Gate:
    """The concurrency cap of one run: requests enter in the order they ask, each under its own cap (a
    concurrency ramp raises it request by request). ``in_flight`` counts the requests inside."""

    def __init__(self):
        self.in_flight = 0
        self._freed = asyncio.Event()

    async def enter(self, cap: int | None) -> None:
        """Wait until fewer than ``cap`` requests are in flight (None: no wait), then count this one in."""
        while cap is not None and self.in_flight >= cap:
            self._freed.clear()
            await self._freed.wait()
        self.in_flight += 1

    def leave(self) -> None:
        """A request has ended: its slot is free."""
        self.in_flight -= 1
        self._freed.set()


async def sleep_until(t: float) -> None:
    """Return at ``time.perf_counter() >= t``: sleep to :data:`SPIN_S` before it, then yield to the loop."""
    await asyncio.sleep(max(0.0, t - time.perf_counter() - SPIN_S))
    while time.perf_counter() < t:
        await asyncio.sleep(0)


def failed_record(i: int, send: Send, error: str, sent_s: float, end_s: float, **extra) -> dict:
    """The record of a request that produced no capture (a client error, or not sent)."""
    rec = {"request_id": i, "warmup": send.warmup, "ok": False, "error": error, "sent_s": sent_s, "end_s": end_s}
    return {**rec, "max_tokens": send.request.max_tokens, **send.fields, **extra}


class RequestLoop:
    """One run of a schedule (see the module text); :meth:`run` is the coroutine, built by :func:`run_schedule`."""

    def __init__(self, cfg: LoadConfig, schedule, model: str, tokenizer=None, on_progress=None, on_status=None):
        self.cfg, self.schedule, self.model, self.tokenizer = cfg, schedule, model, tokenizer
        self.on_progress, self.on_status = on_progress, on_status
        self.url, self.headers, self.secrets = cfg.api_url(), cfg.request_headers(), tuple(cfg.secrets())
        self.limits = cfg.stream_limits()
        self.state = PointProgress(schedule.planned, schedule.label)
        self.gate = Gate()
        self.done: list[tuple] = []  # (request id, send, facts, capture or failed record)
        self.n_pulled = 0

    def record_not_sent(self, send: Send, why: str) -> None:
        """A pulled request that will not be sent (stopped early): a failed ``not_sent`` record."""
        now = time.perf_counter() - self.t0
        self.done.append((self.n_pulled, send, {}, failed_record(self.n_pulled, send, why, now, now, not_sent=True)))
        self.n_pulled += 1
        self.state.finished(False, why, was_sent=False)
        self.notify(send, None, False)

    def notify(self, send: Send, cap, ok: bool) -> None:
        """Tell the schedule (``on_done``) and the caller (``on_progress``) that a request ended."""
        for hook, args in ((send.on_done, (cap,)), (self.on_progress, (len(self.done), ok))):
            if hook is not None:
                try:
                    hook(*args)
                except Exception:  # noqa: BLE001 - a hook must not break the measurement
                    pass

    async def one(self, i: int, send: Send, facts: dict) -> None:
        """Send request ``i`` (its slot already taken), capture it, free the slot."""
        cfg, ok = self.cfg, False
        try:
            body = cfg.request_body(self.model, send.request)
            if send.messages is not None and cfg.endpoint == "chat":
                body["messages"] = list(send.messages)
            cap = await stream_request(self.pool, self.url, body, self.headers, self.limits)
            ok, err = cap.error is None, cap.error
        except Exception as e:  # noqa: BLE001 - a client bug must not abort the run either
            err = scrub(f"client error {type(e).__name__}: {e}", self.secrets)
            now = time.perf_counter() - self.t0
            cap = failed_record(i, send, err, facts["sent_s"], now)
        finally:
            self.gate.leave()
        self.done.append((i, send, facts, cap))
        self.state.finished(ok, err)
        self.notify(send, cap if isinstance(cap, StreamCapture) else None, ok)

    async def dispatch(self) -> list[asyncio.Task]:
        """Pull, wait for, and launch every send of the schedule; returns the launched tasks."""
        tasks: list[asyncio.Task] = []
        open_cap = OPEN_ENDED_MAX_IN_FLIGHT if self.schedule.planned is None else None
        async with contextlib.aclosing(self.schedule.sends(self.clock)) as pulled:
            async for send in pulled:
                if not await self.launch(send, open_cap, tasks):
                    break
        return tasks

    async def launch(self, send: Send, open_cap: int | None, tasks: list) -> bool:
        """Wait until ``send`` is due and has a slot, then start it (appended to ``tasks``), or record it as not
        sent (stopped early). False when the run's ``duration_s`` is over: nothing more is sent."""
        self.state.waiting += 1
        if self.state.stopped or send.skip:
            self.record_not_sent(send, self.state.stopped or send.skip)
            return True
        due = self.t0 + send.at_s if send.at_s is not None else None
        duration = self.cfg.duration_s
        if duration is not None and not send.warmup and (due or 0.0) - self.t0 >= duration:
            self.state.waiting -= 1  # due after the run's end: not waited for, not sent
            return False
        if due is not None:
            await sleep_until(due)
        if duration is not None and not send.warmup and time.perf_counter() - self.t0 >= duration:
            self.state.waiting -= 1
            return False
        await self.gate.enter(send.cap if send.cap is not None else open_cap)
        if self.state.stopped:  # stopped while it waited for a slot: not sent
            self.gate.leave()
            self.record_not_sent(send, self.state.stopped)
            return True
        now = time.perf_counter()
        self.state.sent()
        facts = {
            "client_queue_ms": (now - (due if due is not None else self.t0)) * 1000.0,
            "due_s": send.at_s,
            "offered_concurrency": send.cap,
            "inflight_at_send": self.gate.in_flight,
            "sent_s": now - self.t0,
        }
        tasks.append(asyncio.ensure_future(self.one(self.n_pulled, send, facts)))
        self.n_pulled += 1
        await asyncio.sleep(0)  # the request starts now (up to its first wait), not after the next send is pulled
        return True

    async def run(self) -> tuple[list[dict], dict]:
        """Run the schedule to its end; ``(records, run_info)`` (see :func:`run_schedule`)."""
        self.clock = RunClock(progress=self.state)
        self.t0 = self.clock.t0
        tick = asyncio.ensure_future(self.ticker()) if self.on_status is not None else None
        gc.freeze()  # a full collection then scans only what the run allocates, not the whole process's heap
        try:
            async with StreamPool() as self.pool:
                probe = LoopProbe()
                probe.start()
                tasks = await self.dispatch()
                if tasks:
                    await asyncio.gather(*tasks, return_exceptions=True)
                caps = [c for _, s, _, c in self.done if not s.warmup and isinstance(c, StreamCapture)]
                ok = [c for c in caps if c.error is None]
                selfcheck = await probe.stop(sum(1 for c in ok if c.chunk_times), len(ok))
        finally:
            gc.unfreeze()
            if tick is not None:
                tick.cancel()
        if self.on_status is not None:
            self.on_status(self.state)
        return self.records(), self.info(selfcheck)

    async def ticker(self) -> None:
        """``on_status`` every :data:`kit.serve.progress.STATUS_INTERVAL_S` while the run lasts."""
        while True:
            await asyncio.sleep(STATUS_INTERVAL_S)
            self.on_status(self.state)

    def records(self) -> list[dict]:
        """Every request's record, in request order (token counts taken now, after the run)."""
        count = token_counter(self.tokenizer)
        out = []
        for i, send, facts, cap in sorted(self.done, key=lambda x: x[0]):
            if isinstance(cap, StreamCapture):
                try:
                    rec = request_record(cap, send.request, count, self.t0, facts["client_queue_ms"], i, send.warmup)
                    rec = {**rec, **{k: v for k, v in facts.items() if k != "sent_s"}, **send.fields}
                    due = facts["due_s"]  # how late it really went: its send time stamp against its due time
                    rec["send_late_ms"] = (rec["sent_s"] - due) * 1000.0 if due is not None else None
                except Exception as e:  # noqa: BLE001 - e.g. a tokenizer failure: keep the request, marked failed
                    err = f"client error while counting tokens {type(e).__name__}: {e}"
                    rec = failed_record(i, send, err, cap.t_send - self.t0, cap.t_end - self.t0)
            else:
                rec = {**facts, **cap} if facts else cap
            out.append(rec)
        return out

    def info(self, selfcheck: dict) -> dict:
        """The run facts: ``duration_s`` (first measured send to last measured end), model, URL, self-check."""
        recs = [c for _, s, _, c in self.done if not s.warmup]
        spans = [(c.t_send - self.t0, c.t_end - self.t0) for c in recs if isinstance(c, StreamCapture)]
        spans += [(c["sent_s"], c["end_s"]) for c in recs if isinstance(c, dict) and not c.get("not_sent")]
        dur = max(0.0, max(e for _, e in spans) - min(s for s, _ in spans)) if spans else 0.0
        info = {"duration_s": dur, "model": self.model, "url": redact_url(self.url), **selfcheck}
        if self.state.stopped:
            info["stopped_early"] = self.state.stopped
        return info


async def run_schedule(
    cfg: LoadConfig,
    schedule,
    tokenizer=None,
    on_progress: Callable[[int, bool], None] | None = None,
    on_status: Callable[[PointProgress], None] | None = None,
) -> tuple[list[dict], dict]:
    """Run one load point: every request of ``schedule`` against the server of ``cfg`` (see the module text).

    Args:
        cfg: the server, endpoint, timeouts, sampling and ``duration_s`` (no measured request is sent after it).
        schedule: a schedule of :mod:`kit.serve.schedule` (or sessions, trace).
        tokenizer: HF tokenizer or ``str -> int`` callable for token counts (:func:`kit.serve.record.request_record`).
        on_progress: called as each request finishes with (finished so far, ok?); keep it quick.
        on_status: called every :data:`kit.serve.progress.STATUS_INTERVAL_S` and at the end with the point's
            :class:`kit.serve.progress.PointProgress` (done, failed, in flight; also while nothing finishes).

    Returns:
        ``(records, run_info)``: every request's record (request order; warm-up ones flagged) and the run facts
        (``duration_s``, model id, redacted URL, self-check figures; ``stopped_early``, ``setup_error``).

    Raises:
        UserError: an invalid ``cfg`` or tokenizer (before anything is sent).
    """
    cfg.validate()
    token_counter(tokenizer)  # a tokenizer that cannot count is refused before anything is sent
    model = cfg.model
    if not model:
        try:
            model = await get_model_id(cfg.url, cfg.api_key_env, cfg.models_timeout_s)
        except UserError as e:
            return not_sent(cfg, schedule, str(e))
    return await RequestLoop(cfg, schedule, model, tokenizer, on_progress, on_status).run()


def not_sent(cfg: LoadConfig, schedule, error: str, url: str | None = None) -> tuple[list[dict], dict]:
    """``(records, run_info)`` of a point none of whose requests could be sent (e.g. no model id): every planned
    request of ``schedule`` (``planned_max_tokens()``; warm-up ones flagged) is a failed record with ``error``;
    ``run_info`` has ``setup_error`` and a self-check "not applied"."""
    error = scrub(error, cfg.secrets())
    records = [
        {
            "request_id": i,
            "warmup": warm,
            "ok": False,
            "error": error,
            "http_status": None,
            "sent_s": 0.0,
            "end_s": 0.0,
            "not_sent": True,
            "max_tokens": max_tokens,
        }
        for i, (warm, max_tokens) in enumerate(schedule.planned_max_tokens())
    ]
    info = {
        "duration_s": 0.0,
        "model": cfg.model,
        "url": redact_url(url or cfg.api_url()),
        "setup_error": error,
        "x_client_cpu_frac": None,
        "x_loop_lag_ms_p50": None,
        "x_loop_lag_ms_p99": None,
        "x_loop_lag_ms_max": None,
        **selfcheck_skipped("no request was sent"),
    }
    return records, info


def run_coro(coro):
    """Run a coroutine to completion from sync code, also inside Jupyter (whose event loop is already running:
    then it runs on a fresh loop in a worker thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_on_new_loop(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:
        return ex.submit(_run_on_new_loop, coro).result()


def _run_on_new_loop(coro):
    """``coro`` on a new event loop: uvloop's when it is installed (a C event loop: fewer CPU µs per network read,
    so time stamps stay prompt at high stream counts), else asyncio's own.

    A Ctrl-C (or SIGTERM) raised while one of the run's side tasks (the loop probe, a scrape) holds the loop stops
    the run through the caller; that task's copy of the interrupt is not reported again as an unretrieved error."""
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.get_loop().set_exception_handler(_quiet_interrupts)
        return runner.run(coro)


def _quiet_interrupts(loop, context: dict) -> None:
    """The loop's exception handler: a task ended by KeyboardInterrupt or SystemExit is the stop the caller already
    handles; anything else goes to asyncio's default handler (logged with its traceback)."""
    if isinstance(context.get("exception"), (KeyboardInterrupt, SystemExit)):
        return
    loop.default_exception_handler(context)
