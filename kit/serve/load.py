"""The served load generator: its configuration, workloads, arrivals, one concurrency/rate-limited run, its row.

:class:`LoadConfig` describes one load point against an OpenAI-compatible server; :mod:`kit.serve.workload` makes
its requests and their arrival times; :func:`run_load_async` sends them with the streaming client
(:mod:`kit.serve.client`) under a concurrency cap and/or an arrival rate;
:func:`kit.serve.aggregate.aggregate` reduces the request records to one row of the shared results schema
(:mod:`kit.results`, ``backend = "openai"``), so a concurrency sweep against vLLM, SGLang or ``transformers serve``
plots beside an in-process sweep. The sweep over concurrencies, its files and ``kit serve-bench`` are
:mod:`kit.serve.sweep`. Every formula comes from :mod:`kit.metrics` (definitions in ``METRICS.md``, "Served").

Measuring choices (and the mistakes they avoid):

- ``t0`` is taken when the request is sent, *after* waiting for a concurrency slot; that wait is reported as
  ``client_queue_ms``. the connection pool (:class:`kit.serve.http1.StreamPool`) is unbounded, so no hidden
  queue sits between the semaphore and the socket.
- Failures are counted in ``failed`` with their text kept in the request records; they never abort a run and
  never hang it. That includes a point whose model id cannot be resolved (no ``model`` given and ``/v1/models``
  fails or times out): its requests are not sent (the API needs a model name, and guessing one would measure
  the wrong thing), and every planned request (warm-up and measured) is recorded as failed with the listing's
  error, so ``failed`` equals the planned request count (one, for a duration-only run).
- Self-check (:mod:`kit.serve.selfcheck`): an event-loop lag probe and the client's CPU use run beside the
  measured requests; a run where the client may be the bottleneck says so (``x_client_bound``) instead of
  publishing a client-bound number.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kit.cli import config_field
from kit.errors import UserError
from kit.serve.client import (
    DEFAULT_API_KEY_ENV,
    ENDPOINTS,
    get_model_id,
    request_body,
    request_headers,
    request_record,
    stream_request,
    token_counter,
)
from kit.serve.http1 import StreamPool
from kit.serve.limits import check_load_config, json_object_arg
from kit.serve.progress import STATUS_INTERVAL_S, PointProgress
from kit.serve.redact import endpoint_url, redact_url, scrub, secrets_of
from kit.serve.selfcheck import LoopProbe, selfcheck_skipped
from kit.serve.sse import MAX_EVENT_BYTES, StreamCapture
from kit.serve.workload import RequestInput, arrival_gaps_s


# ---------------------------------------------------------------- configuration
@dataclass
class LoadConfig:
    """One served load point: what to send, how fast, and how it is judged (a sweep varies ``max_concurrency``).

    Each field's help is also ``kit serve-bench``'s option (one source of defaults). The defaults are for a real
    server: the seed workload (1024 in / 400 out tokens), 64 measured requests after 2 warm-up ones, 600 s per
    request; tests and notebooks pass their small values explicitly. The API key is read from the environment
    variable ``api_key_env`` and never written to results or logs.
    """

    url: str = config_field(
        "", help="server base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)", cli=False
    )
    model: str | None = config_field(None, help="served model id (default: first of /v1/models)")
    endpoint: str = config_field(
        "completions",
        choices=tuple(sorted(ENDPOINTS)),
        help="API to call: " + ", ".join(f"{k}={v}" for k, v in sorted(ENDPOINTS.items())),
    )
    max_concurrency: int | None = config_field(
        1,
        cli=False,
        help="at most this many requests in flight (None: unbounded); a sweep sets it per point (--concurrency)",
    )
    request_rate: float = config_field(
        math.inf, help="requests/s offered, arrival gaps drawn with --burstiness (default inf: all at once)"
    )
    burstiness: float = config_field(1.0, help="Gamma shape b of the arrival gaps, Gamma(b, 1/(rate*b)); 1 = Poisson")
    seed: int = config_field(0, help="seed of prompts and arrival gaps")
    num_requests: int | None = config_field(64, help="measured requests per concurrency point")
    duration_s: float | None = config_field(
        None,
        help="stop sending after this many seconds (in-flight requests finish; --num-requests still caps the count)",
    )
    warmup_requests: int = config_field(2, flag="--warmup", help="warm-up requests per point (excluded)")
    isl: int = config_field(1024, help="input tokens per request")
    osl: int = config_field(400, help="output tokens per request (max_tokens)")
    isl_range: float = config_field(0.0, help="draw each request's ISL uniformly in isl*(1±r), 0 <= r < 1")
    osl_range: float = config_field(0.0, help="draw each request's OSL uniformly in osl*(1±r), 0 <= r < 1")
    ignore_eos: bool = config_field(
        False,
        help="ask the server to ignore EOS (vLLM, SGLang); an output length "
        "other than max_tokens is flagged either way",
    )
    timeout_s: float = config_field(600.0, help="total time one request may take, s")
    stall_timeout_s: float = config_field(60.0, help="longest silence within a stream, s")
    first_byte_timeout_s: float = config_field(
        60.0, help="longest wait for a response to start (its headers) after a request is sent, s"
    )
    models_timeout_s: float = config_field(30.0, help="longest wait for the /v1/models listing, s")
    max_event_bytes: int = config_field(
        MAX_EVENT_BYTES, help="largest SSE event (or unfinished line) accepted, bytes; a bigger one fails the request"
    )
    api_key_env: str = config_field(DEFAULT_API_KEY_ENV, help="environment variable with the API key")
    server_metrics: bool = config_field(True, help="scrape the server's /metrics before, during and after each point")
    power_period_ms: float = config_field(50.0, help="power sampling period when the server runs on this host, ms")
    usd_per_kwh: float | None = config_field(None, help="electricity price for the energy cost column, $/kWh")
    slo_ttft_ms: float | None = config_field(None, help="goodput SLO on TTFT (ms, inclusive; default: none)")
    slo_tpot_ms: float | None = config_field(None, help="goodput SLO on TPOT (ms, inclusive; default: none)")
    slo_e2el_ms: float | None = config_field(
        None, help="goodput SLO on end-to-end latency (ms, inclusive; default: none)"
    )
    temperature: float = config_field(0.0, help="sampling temperature sent with each request")
    continuous_usage: bool = config_field(
        False, help="ask for usage in every chunk (vLLM): exact tokens per chunk without a tokenizer"
    )
    extra_body: dict = config_field(
        default_factory=dict, parse=json_object_arg, help="JSON object merged into every request body"
    )

    def validate(self) -> LoadConfig:
        """Check every value (ranges in :mod:`kit.serve.limits`); returns self.

        Raises:
            UserError: naming the bad field, its value and what is allowed.
        """
        check_load_config(self, ENDPOINTS)
        return self

    @property
    def base_url(self) -> str:
        """``url`` without a trailing ``/`` or ``/v1`` (string form; :meth:`api_url` joins paths properly)."""
        u = str(self.url).rstrip("/")
        return u[:-3] if u.endswith("/v1") else u

    def api_url(self, path: str | None = None) -> str:
        """The URL of an API path (default: this config's streaming endpoint), query string kept."""
        return endpoint_url(self.url, path or ENDPOINTS[self.endpoint])

    @property
    def shown_url(self) -> str:
        """The base URL as the kit writes and prints it (:func:`kit.serve.redact.redact_url`)."""
        return redact_url(self.base_url)

    def secrets(self) -> list[str]:
        """The secret strings of this config (URL credentials, token query values, the API key)."""
        return secrets_of(self.url, self.api_key_env)

    def request_body(self, model: str, req: RequestInput) -> dict:
        """The JSON body of ``req`` under this config (:func:`kit.serve.client.request_body`)."""
        return request_body(
            self.endpoint,
            model,
            req,
            temperature=self.temperature,
            ignore_eos=self.ignore_eos,
            continuous_usage=self.continuous_usage,
            extra_body=self.extra_body,
        )

    def request_headers(self) -> dict:
        """The HTTP headers of every request (:func:`kit.serve.client.request_headers`; the key from
        ``api_key_env``, unless the URL carries credentials)."""
        return request_headers(self.api_key_env, self.url)


# ---------------------------------------------------------------- load generation
def _failed(i: int, warm: bool, req: RequestInput, error: str, sent_s: float, end_s: float, **extra) -> dict:
    """The record of a request that produced no capture (a client error, or not sent)."""
    return {
        "request_id": i,
        "warmup": warm,
        "ok": False,
        "error": error,
        "sent_s": sent_s,
        "end_s": end_s,
        "max_tokens": req.max_tokens,
        **extra,
    }


async def run_load_async(
    cfg: LoadConfig,
    workload: Sequence[RequestInput],
    tokenizer=None,
    on_progress: Callable[[int, bool], None] | None = None,
    *,
    on_status: Callable[[PointProgress], None] | None = None,
) -> tuple[list[dict], dict]:
    """Run one load point: warm-up requests, then the measured ones, under the concurrency cap and arrivals.

    Args:
        workload: requests, used in order and cyclically (warm-up ones first).
        tokenizer: HF tokenizer or ``str -> int`` callable for token counts (see
            :func:`kit.serve.client.request_record`).
        on_progress: called on the event loop as each request finishes, with (finished so far, ok?); keep it
            quick (a progress bar, a test's trigger).
        on_status: called every :data:`kit.serve.progress.STATUS_INTERVAL_S` and at the end with the point's
            :class:`kit.serve.progress.PointProgress` (done, failed, in flight; also while nothing finishes).

    Token counting (the tokenizer) happens after the run, so it never delays another stream's time stamps.
    Without ``cfg.model`` the model id is asked of ``/v1/models`` (waiting at most ``cfg.models_timeout_s``);
    when that fails nothing is sent and every planned request is returned as failed with the listing's error
    (``run_info`` then has ``setup_error``). When the first finished requests all time out the point stops early
    (:mod:`kit.serve.progress`): the requests not yet sent are failed records (``not_sent``) and ``run_info``
    has ``stopped_early``. Error texts and URLs carry no secret (:mod:`kit.serve.redact`).

    Returns:
        ``(records, run_info)``: every request's record (warm-up ones flagged) and the run facts
        (``duration_s``, model id, redacted URL, self-check figures).
    """

    cfg.validate()
    if not workload:
        raise UserError("workload is empty")
    count = token_counter(tokenizer)
    url, secrets = cfg.api_url(), tuple(cfg.secrets())
    model = cfg.model
    if not model:
        try:
            model = await get_model_id(cfg.url, cfg.api_key_env, cfg.models_timeout_s)
        except UserError as e:
            return not_sent(cfg, workload, str(e))
    headers = cfg.request_headers()
    sem = asyncio.Semaphore(int(cfg.max_concurrency)) if cfg.max_concurrency else None
    done: list[tuple] = []  # (request id, warm-up?, request, client queue ms, capture or error record)
    n_max = int(cfg.num_requests) if cfg.num_requests is not None else None
    state = PointProgress(None if n_max is None else n_max + cfg.warmup_requests, f"c={cfg.max_concurrency}")
    t_run = time.perf_counter()
    opts = {
        "first_byte_timeout_s": cfg.first_byte_timeout_s,
        "max_event_bytes": cfg.max_event_bytes,
        "secrets": secrets,
    }

    async def one(i: int, warm: bool) -> None:
        req = workload[i % len(workload)]
        t_q = time.perf_counter()
        state.waiting += 1
        sent = False
        try:
            if sem is not None:
                await sem.acquire()
            try:
                if state.stopped:  # stopped early while this one waited for a slot: not sent
                    now = time.perf_counter() - t_run
                    done.append((i, warm, req, 0.0, _failed(i, warm, req, state.stopped, now, now, not_sent=True)))
                    state.finished(False, state.stopped, was_sent=False)
                    return
                q_ms = (time.perf_counter() - t_q) * 1000.0
                state.sent()
                sent = True
                body = cfg.request_body(model, req)
                cap = await stream_request(session, url, body, headers, cfg.timeout_s, cfg.stall_timeout_s, **opts)
            finally:
                if sem is not None:
                    sem.release()
            done.append((i, warm, req, q_ms, cap))
            ok, err = cap.error is None, cap.error
        except Exception as e:  # noqa: BLE001 - a client bug must not abort the run either
            err = scrub(f"client error {type(e).__name__}: {e}", secrets)
            done.append((i, warm, req, 0.0, _failed(i, warm, req, err, t_q - t_run, time.perf_counter() - t_run)))
            ok = False
        state.finished(ok, err, was_sent=sent)
        if on_progress is not None:
            try:
                on_progress(len(done), ok)
            except Exception:  # noqa: BLE001 - a progress hook must not break the measurement
                pass

    async def ticker() -> None:
        while True:
            await asyncio.sleep(STATUS_INTERVAL_S)
            on_status(state)

    tick = asyncio.ensure_future(ticker()) if on_status is not None else None
    try:
        async with StreamPool() as session:
            # warm-up requests take the first slots of the same closed loop (the semaphore queues in order) and
            # hand over to the measured ones without the server draining in between (kit.serve.steady)
            warm = [asyncio.ensure_future(one(i, True)) for i in range(cfg.warmup_requests)]
            gaps = arrival_gaps_s(min(n_max or 10**9, 100_000), cfg.request_rate, cfg.burstiness, cfg.seed)
            probe = LoopProbe()
            probe.start()
            t_start = time.perf_counter()
            tasks: list = []
            pending: set = set()
            # open-ended (duration-only) runs keep at most this many requests waiting or in flight, so an
            # infinite rate cannot create unbounded tasks; counted runs create every arrival (queueing is measured)
            cap_pending = 2 * int(cfg.max_concurrency) if cfg.max_concurrency else 1024
            next_t = t_start
            k = 0
            while (n_max is None or k < n_max) and not state.stopped:
                gap = float(gaps[k % len(gaps)])
                assert math.isfinite(gap) and gap >= 0.0, f"arrival gap {gap!r} (rate and burstiness are checked)"
                next_t += gap
                delay = next_t - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if n_max is None:
                    while len(pending) >= cap_pending:
                        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if cfg.duration_s is not None and time.perf_counter() - t_start >= cfg.duration_s:
                    break
                t = asyncio.ensure_future(one(cfg.warmup_requests + k, False))
                tasks.append(t)
                if n_max is None:
                    pending.add(t)
                k += 1
                if k % 64 == 0:
                    await asyncio.sleep(0)
            if tasks or warm:
                await asyncio.gather(*warm, *tasks, return_exceptions=True)
            n_ok = sum(1 for _, w, _, _, c in done if not w and isinstance(c, StreamCapture) and c.error is None)
            n_streamed = sum(
                1
                for _, w, _, _, c in done
                if not w and isinstance(c, StreamCapture) and c.error is None and c.chunk_times
            )
            selfcheck = await probe.stop(n_streamed, n_ok)
    finally:
        if tick is not None:
            tick.cancel()
    if state.stopped and n_max is not None:  # the arrivals never created: recorded as not sent
        for i in range(cfg.warmup_requests + k, cfg.warmup_requests + n_max):
            req = workload[i % len(workload)]
            end = time.perf_counter() - t_run
            done.append((i, False, req, 0.0, _failed(i, False, req, state.stopped, end, end, not_sent=True)))
            state.done, state.failed = state.done + 1, state.failed + 1
    if on_status is not None:
        on_status(state)
    records = []
    for i, warm, req, q_ms, cap in sorted(done, key=lambda x: x[0]):
        if isinstance(cap, StreamCapture):
            try:
                rec = request_record(cap, req, count, t_run, q_ms, i, warm)
            except Exception as e:  # noqa: BLE001 - e.g. a tokenizer failure: keep the request, marked failed
                err = f"client error while counting tokens {type(e).__name__}: {e}"
                rec = _failed(i, warm, req, err, cap.t_send - t_run, cap.t_end - t_run)
        else:
            rec = cap
        records.append(rec)
    sent = [r for r in records if not r.get("warmup") and not r.get("not_sent")]
    duration = max(0.0, max(r["end_s"] for r in sent) - min(r["sent_s"] for r in sent)) if sent else 0.0
    info = {"duration_s": duration, "model": model, "url": redact_url(url), **selfcheck}
    if state.stopped:
        info["stopped_early"] = state.stopped
    return records, info


def not_sent(
    cfg: LoadConfig, workload: Sequence[RequestInput], error: str, url: str | None = None
) -> tuple[list[dict], dict]:
    """``(records, run_info)`` of a point none of whose requests could be sent (e.g. no model id): every planned
    request (the warm-up ones flagged) is a failed record with ``error`` (a duration-only run plans one measured
    request); ``run_info`` has ``setup_error`` and a self-check "not applied"."""
    n = cfg.warmup_requests + (int(cfg.num_requests) if cfg.num_requests is not None else 1)
    error = scrub(error, cfg.secrets())
    records = [
        {
            "request_id": i,
            "warmup": i < cfg.warmup_requests,
            "ok": False,
            "error": error,
            "http_status": None,
            "sent_s": 0.0,
            "end_s": 0.0,
            "not_sent": True,
            "max_tokens": workload[i % len(workload)].max_tokens if workload else cfg.osl,
        }
        for i in range(n)
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
    so time stamps stay prompt at high stream counts), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
