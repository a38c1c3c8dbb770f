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
  ``client_queue_ms``. aiohttp's own connection pool is unbounded here (``limit=0``) so no hidden queue sits
  between the semaphore and the socket.
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

import argparse
import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kit.cli import config_field
from kit.errors import UserError
from kit.serve.client import (
    DEFAULT_API_KEY_ENV,
    ENDPOINTS,
    StreamCapture,
    get_model_id,
    request_body,
    request_headers,
    request_record,
    stream_request,
    token_counter,
)
from kit.serve.selfcheck import LoopProbe, selfcheck_skipped
from kit.serve.workload import RequestInput, arrival_gaps_s, build_workload


def json_object_arg(text: str) -> dict:
    """argparse ``type=`` of ``--extra-body``: a JSON object (argparse names the option in the message)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} must be a JSON object")
    return value


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
    timeout_s: float = config_field(600.0, help="total time one request (and the /v1/models look-up) may take, s")
    stall_timeout_s: float = config_field(60.0, help="longest silence within a stream")
    api_key_env: str = config_field(DEFAULT_API_KEY_ENV, help="environment variable with the API key")
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
        """Check the values; returns self.

        Raises:
            UserError: naming the bad field, its value and what is allowed.
        """
        if self.endpoint not in ENDPOINTS:
            raise UserError(f"endpoint={self.endpoint!r}; allowed: {sorted(ENDPOINTS)}")
        if not str(self.url).startswith(("http://", "https://")):
            raise UserError(f"url={self.url!r} must start with http:// or https://")
        if self.max_concurrency is not None and int(self.max_concurrency) < 1:
            raise UserError(f"max_concurrency={self.max_concurrency}; must be >= 1 or None (unbounded)")
        if not (self.request_rate > 0):
            raise UserError(f"request_rate={self.request_rate}; must be > 0 (inf = all at once)")
        if not (self.burstiness > 0):
            raise UserError(f"burstiness={self.burstiness}; must be > 0 (1 = Poisson)")
        if self.num_requests is None and self.duration_s is None:
            raise UserError("give num_requests or duration_s (or both)")
        if self.num_requests is not None and int(self.num_requests) < 1:
            raise UserError(f"num_requests={self.num_requests}; must be >= 1")
        if self.duration_s is not None and not (self.duration_s > 0):
            raise UserError(f"duration_s={self.duration_s}; must be > 0")
        for name in ("isl", "osl"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"{name}={getattr(self, name)}; must be >= 1 token")
        for name in ("isl_range", "osl_range"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise UserError(f"{name}={getattr(self, name)}; must be in [0, 1)")
        if self.warmup_requests < 0:
            raise UserError(f"warmup_requests={self.warmup_requests}; must be >= 0")
        if not (self.timeout_s > 0 and self.stall_timeout_s > 0):
            raise UserError(f"timeout_s={self.timeout_s}, stall_timeout_s={self.stall_timeout_s}; both must be > 0")
        if not isinstance(self.extra_body, dict):
            raise UserError(f"extra_body={self.extra_body!r} must be a dict (a JSON object)")
        return self

    @property
    def base_url(self) -> str:
        """``url`` without a trailing ``/`` or ``/v1``."""
        u = str(self.url).rstrip("/")
        return u[:-3] if u.endswith("/v1") else u

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
        ``api_key_env``)."""
        return request_headers(self.api_key_env)


# ---------------------------------------------------------------- workload of a point
def default_workload(cfg: LoadConfig, tokenizer=None) -> list[RequestInput]:
    """The requests a load point sends when none are given: warm-up + measured (256 when unbounded), at most 1024
    distinct prompts (reused round-robin); token-id prompts on ``/v1/completions`` without a tokenizer."""
    n = (cfg.num_requests or 256) + cfg.warmup_requests
    return build_workload(
        min(n, 1024),
        cfg.isl,
        cfg.osl,
        tokenizer,
        cfg.seed,
        cfg.isl_range,
        cfg.osl_range,
        as_token_ids=tokenizer is None and cfg.endpoint == "completions",
    )


# ---------------------------------------------------------------- load generation
async def run_load_async(
    cfg: LoadConfig,
    workload: Sequence[RequestInput],
    tokenizer=None,
    on_progress: Callable[[int, bool], None] | None = None,
) -> tuple[list[dict], dict]:
    """Run one load point: warm-up requests, then the measured ones, under the concurrency cap and arrivals.

    Args:
        workload: requests, used in order and cyclically (warm-up ones first).
        tokenizer: HF tokenizer or ``str -> int`` callable for token counts (see
            :func:`kit.serve.client.request_record`).
        on_progress: called on the event loop as each request finishes, with (finished so far, ok?); keep it
            quick (a progress bar, a test's trigger).

    Token counting (the tokenizer) happens after the run, so it never delays another stream's time stamps.
    Without ``cfg.model`` the model id is asked of ``/v1/models`` (waiting at most ``cfg.timeout_s``); when that
    fails nothing is sent and every planned request is returned as failed with the listing's error (``run_info``
    then has ``setup_error``).

    Returns:
        ``(records, run_info)``: every request's record (warm-up ones flagged) and the run facts
        (``duration_s``, model id, self-check figures).
    """
    import aiohttp

    cfg.validate()
    if not workload:
        raise UserError("workload is empty")
    count = token_counter(tokenizer)
    url = cfg.base_url + ENDPOINTS[cfg.endpoint]
    model = cfg.model
    if not model:
        try:
            model = await get_model_id(cfg.base_url, cfg.api_key_env, cfg.timeout_s)
        except UserError as e:
            return not_sent(cfg, workload, str(e), url)
    headers = cfg.request_headers()
    sem = asyncio.Semaphore(int(cfg.max_concurrency)) if cfg.max_concurrency else None
    done: list[tuple] = []  # (request id, warm-up?, request, client queue ms, capture or error record)
    t_run = time.perf_counter()

    def req_at(i: int) -> RequestInput:
        return workload[i % len(workload)]

    async def one(i: int, warm: bool) -> None:
        req = req_at(i)
        t_q = time.perf_counter()
        try:
            if sem is not None:
                await sem.acquire()
            try:
                q_ms = (time.perf_counter() - t_q) * 1000.0
                cap = await stream_request(
                    session, url, cfg.request_body(model, req), headers, cfg.timeout_s, cfg.stall_timeout_s
                )
            finally:
                if sem is not None:
                    sem.release()
            done.append((i, warm, req, q_ms, cap))
            ok = cap.error is None
        except Exception as e:  # noqa: BLE001 - a client bug must not abort the run either
            done.append(
                (
                    i,
                    warm,
                    req,
                    0.0,
                    {
                        "request_id": i,
                        "warmup": warm,
                        "ok": False,
                        "error": f"client error {type(e).__name__}: {e}",
                        "sent_s": t_q - t_run,
                        "end_s": time.perf_counter() - t_run,
                        "max_tokens": req.max_tokens,
                    },
                )
            )
            ok = False
        if on_progress is not None:
            try:
                on_progress(len(done), ok)
            except Exception:  # noqa: BLE001 - a progress hook must not break the measurement
                pass

    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector) as session:
        if cfg.warmup_requests:
            await asyncio.gather(*(one(i, True) for i in range(cfg.warmup_requests)))
        n_max = int(cfg.num_requests) if cfg.num_requests is not None else 10**9
        gaps = arrival_gaps_s(min(n_max, 100_000), cfg.request_rate, cfg.burstiness, cfg.seed)
        probe = LoopProbe()
        probe.start()
        t_start = time.perf_counter()
        tasks: list = []
        pending: set = set()
        # open-ended (duration-only) runs keep at most this many requests waiting or in flight, so an
        # infinite rate cannot create unbounded tasks; counted runs create every arrival (queueing is measured)
        cap_pending = 2 * int(cfg.max_concurrency) if cfg.max_concurrency else 1024
        next_t = t_start
        for k in range(n_max):
            next_t += float(gaps[k % len(gaps)])
            delay = next_t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if cfg.num_requests is None:
                while len(pending) >= cap_pending:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if cfg.duration_s is not None and time.perf_counter() - t_start >= cfg.duration_s:
                break
            t = asyncio.ensure_future(one(cfg.warmup_requests + k, False))
            tasks.append(t)
            if cfg.num_requests is None:
                pending.add(t)
            if len(tasks) % 64 == 0:
                await asyncio.sleep(0)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        n_streamed = sum(
            1
            for _, warm, _, _, cap in done
            if not warm and isinstance(cap, StreamCapture) and cap.error is None and cap.chunk_times
        )
        selfcheck = await probe.stop(n_streamed)
    records = []
    for i, warm, req, q_ms, cap in sorted(done, key=lambda x: x[0]):
        if isinstance(cap, StreamCapture):
            try:
                rec = request_record(cap, req, count, t_run, q_ms, i, warm)
            except Exception as e:  # noqa: BLE001 - e.g. a tokenizer failure: keep the request, marked failed
                rec = {
                    "request_id": i,
                    "warmup": warm,
                    "ok": False,
                    "max_tokens": req.max_tokens,
                    "error": f"client error while counting tokens {type(e).__name__}: {e}",
                    "sent_s": cap.t_send - t_run,
                    "end_s": cap.t_end - t_run,
                }
        else:
            rec = cap
        records.append(rec)
    measured = [r for r in records if not r.get("warmup")]
    if measured:
        t_first = min(r["sent_s"] for r in measured)
        t_last = max(r["end_s"] for r in measured)
        duration = max(0.0, t_last - t_first)
    else:
        duration = 0.0
    info = {"duration_s": duration, "model": model, "url": url, **selfcheck}
    return records, info


def not_sent(
    cfg: LoadConfig, workload: Sequence[RequestInput], error: str, url: str | None = None
) -> tuple[list[dict], dict]:
    """``(records, run_info)`` of a point none of whose requests could be sent (e.g. no model id): every planned
    request (the warm-up ones flagged) is a failed record with ``error`` (a duration-only run plans one measured
    request); ``run_info`` has ``setup_error`` and a self-check "not applied"."""
    n = cfg.warmup_requests + (int(cfg.num_requests) if cfg.num_requests is not None else 1)
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
        "url": url or cfg.base_url + ENDPOINTS[cfg.endpoint],
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
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()
