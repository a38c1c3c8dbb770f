"""The served load generator: workloads, arrivals, concurrency/rate-limited runs, results rows, ``kit serve-bench``.

The served view of the kit (``backend = "openai"``): send streaming requests (:mod:`kit.serve.client`'s client) under
a concurrency cap and/or an arrival rate, and reduce each run to one row of the shared results schema
(:mod:`kit.results`), so a concurrency sweep against vLLM, SGLang or ``transformers serve`` plots beside an
in-process sweep. Every formula comes from :mod:`kit.metrics` (definitions in ``METRICS.md``, "Served").

Measuring choices (and the mistakes they avoid):

- ``t0`` is taken when the request is sent, *after* waiting for a concurrency slot; that wait is reported as
  ``client_queue_ms``. aiohttp's own connection pool is unbounded here (``limit=0``) so no hidden queue sits
  between the semaphore and the socket.
- Failures are counted in ``failed`` with their text kept in the detail file; they never abort a run and never
  hang it. That includes a point whose model id cannot be resolved (no ``model`` given and ``/v1/models``
  fails or times out): its requests are not sent (the API needs a model name, and guessing one would measure
  the wrong thing), and every planned request (warm-up and measured) is recorded as failed with the listing's
  error, so ``failed`` equals the planned request count (one, for a duration-only run).
- Self-check: an event-loop lag probe and the client's CPU use; a run where the client may be the bottleneck
  says so (``x_client_bound``) instead of publishing a client-bound number. Without a successful streamed
  request, or with too few probe samples, the check is not applied (``x_client_check`` says why): a client
  busy with instant failures is not a bottleneck of anything.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from kit._io import check_out_dir
from kit.errors import OutputPathError, UserError
from kit import metrics as M
from kit.cli import int_list_arg
from kit.measure.interrupts import InterruptGuard
from kit.serve.client import (DEFAULT_API_KEY_ENV, ENDPOINTS, LoadConfig, RequestInput, StreamCapture, _headers, _payload,
                      get_model_id, load_tokenizer, request_record, short_error, stream_request, token_counter)

#: ISL/OSL workload presets (tokens): the seed's 1024/400 and InferenceX-style 1k/1k, 1k/8k, 8k/1k.
WORKLOAD_PRESETS: dict[str, tuple[int, int]] = {
    "seed": (1024, 400),
    "1k/1k": (1024, 1024),
    "1k/8k": (1024, 8192),
    "8k/1k": (8192, 1024),
}
#: self-check thresholds: client CPU (fraction of one core) and event-loop lag p99 (ms) above which a run is
#: flagged as possibly client-bound
CLIENT_CPU_LIMIT = 0.85
LOOP_LAG_LIMIT_MS = 10.0
#: the self-check is applied only with at least this many successful streamed (token-bearing) measured
#: requests and this many event-loop probe samples (10 ms each)
SELFCHECK_MIN_STREAMS = 1
SELFCHECK_MIN_LAG_SAMPLES = 5
#: longest text of one distinct error in a row's ``error`` (the detail file keeps the full text)
ERROR_SUMMARY_CHARS = 200


# ---------------------------------------------------------------- workloads and arrivals
def build_workload(n: int, isl: int, osl: int, tokenizer=None, seed: int = 0, isl_range: float = 0.0,
                   osl_range: float = 0.0, as_token_ids: bool = False) -> list[RequestInput]:
    """``n`` random prompts of ~``isl`` tokens, each asking for ~``osl`` output tokens.

    With an HF tokenizer, prompts are random non-special token ids decoded to text and re-encoded (truncated to
    the target length), and ``input_tokens`` is the re-encoded length. With ``as_token_ids`` (or no tokenizer)
    the prompt is the token id list itself (``/v1/completions`` accepts it). Without a tokenizer and without
    ``as_token_ids``, the prompt is ``isl`` random words and ``input_tokens`` is None (unknown).

    Raises:
        ValueError: n, isl or osl < 1, or a range outside [0, 1).
    """
    if n < 1 or isl < 1 or osl < 1:
        raise UserError(f"n={n}, isl={isl}, osl={osl}; all must be >= 1")
    for name, r in (("isl_range", isl_range), ("osl_range", osl_range)):
        if not 0.0 <= r < 1.0:
            raise UserError(f"{name}={r}; must be in [0, 1)")
    rng = np.random.default_rng(seed)

    def draw(x: int, r: float) -> int:
        lo, hi = max(1, int(round(x * (1 - r)))), max(1, int(round(x * (1 + r))))
        return int(rng.integers(lo, hi + 1)) if hi > lo else x

    hf = tokenizer is not None and hasattr(tokenizer, "decode") and hasattr(tokenizer, "vocab_size")
    if hf:
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        vocab = np.array([i for i in range(int(tokenizer.vocab_size)) if i not in special])
    out = []
    for _ in range(n):
        li, lo_ = draw(isl, isl_range), draw(osl, osl_range)
        if hf:
            ids = [int(x) for x in rng.choice(vocab, size=li)]
            if as_token_ids:
                out.append(RequestInput(ids, li, lo_))
                continue
            text = tokenizer.decode(ids)
            re_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(re_ids) > li:
                text = tokenizer.decode(re_ids[:li])
                re_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(RequestInput(text, len(re_ids), lo_))
        elif as_token_ids:
            out.append(RequestInput([int(x) for x in rng.integers(1000, 20000, size=li)], li, lo_))
        else:
            words = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta"]
            out.append(RequestInput(" ".join(rng.choice(words, size=li)), None, lo_))
    return out


def arrival_gaps_s(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Gaps (s) before each of ``n`` requests: zeros for ``request_rate = inf``, else
    Gamma(shape=b, scale=1/(rate·b)) with burstiness b (b = 1: Poisson). Convention of vLLM's
    ``benchmarks/serve.py``; METRICS.md "Arrivals".

    Raises:
        ValueError: rate or burstiness not > 0.
    """
    if not (request_rate > 0) or not (burstiness > 0):
        raise UserError(f"request_rate={request_rate}, burstiness={burstiness}; both must be > 0")
    if math.isinf(request_rate):
        return np.zeros(n)
    rng = np.random.default_rng(seed + 7919)
    return rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)


# ---------------------------------------------------------------- load generation
class _LoopProbe:
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

    def start(self):
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, n_streamed: int | None = None) -> dict:
        """Stop the probe; the figures, and the verdict unless ``n_streamed`` (successful streamed requests)
        or the probe's sample count is too small to judge (then ``x_client_check`` says so)."""
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        wall = time.perf_counter() - self._wall0
        cpu = (time.process_time() - self._cpu0) / wall if wall > 0 else float("nan")
        lag = M.percentiles(self.lags_ms, (50, 99))
        lag_max = max(self.lags_ms) if self.lags_ms else float("nan")
        figures = {"x_client_cpu_frac": cpu, "x_loop_lag_ms_p50": lag["p50"], "x_loop_lag_ms_p99": lag["p99"],
                   "x_loop_lag_ms_max": lag_max}
        if n_streamed is not None and n_streamed < SELFCHECK_MIN_STREAMS:
            return {**figures, **_selfcheck_skipped("no successful streamed request (the client CPU and loop "
                                                    "lag then reflect failures only)")}
        if lag["n"] < SELFCHECK_MIN_LAG_SAMPLES:
            return {**figures, **_selfcheck_skipped(f"too few samples (a {wall * 1000:.0f} ms run)")}
        bound, why = False, []
        if cpu > CLIENT_CPU_LIMIT:
            bound = True
            why.append(f"client CPU {cpu:.0%} of one core > {CLIENT_CPU_LIMIT:.0%}")
        if lag["n"] and lag["p99"] > LOOP_LAG_LIMIT_MS:
            bound = True
            why.append(f"event-loop lag p99 {lag['p99']:.1f} ms > {LOOP_LAG_LIMIT_MS:g} ms")
        return {**figures, "x_client_bound": bound,
                "x_client_warning": ("the client may be the bottleneck: " + "; ".join(why)) if why else None,
                "x_client_check": "client-bound" if bound else "ok"}


def _selfcheck_skipped(reason: str) -> dict:
    """The self-check verdict of a run it cannot judge: not flagged, and why not."""
    return {"x_client_bound": False, "x_client_warning": None, "x_client_check": f"not applied: {reason}"}


def _failed_records(cfg: LoadConfig, workload: Sequence[RequestInput], error: str) -> list[dict]:
    """Records of a point whose requests could not be sent at all (e.g. no model id): every planned request
    (the warm-up ones flagged) failed with ``error``; a duration-only run plans one measured request."""
    n = cfg.warmup_requests + (int(cfg.num_requests) if cfg.num_requests is not None else 1)
    return [{"request_id": i, "warmup": i < cfg.warmup_requests, "ok": False, "error": error, "http_status": None,
             "sent_s": 0.0, "end_s": 0.0, "not_sent": True,
             "max_tokens": workload[i % len(workload)].max_tokens if workload else cfg.osl} for i in range(n)]


async def run_load_async(cfg: LoadConfig, workload: Sequence[RequestInput], tokenizer=None,
                         on_record: Callable[[dict], None] | None = None,
                         on_progress: Callable[[int, bool], None] | None = None) -> tuple[list[dict], dict]:
    """Run one load point: warm-up requests, then the measured ones, under the concurrency cap and arrivals.

    Args:
        workload: requests, used in order and cyclically (warm-up ones first).
        tokenizer: HF tokenizer or ``str -> int`` callable for token counts (see :func:`request_record`).
        on_record: called with each request's record after the run (e.g. to write the detail file).
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
        except ValueError as e:
            return _not_sent(cfg, workload, str(e), on_record, url)
    headers = _headers(cfg)
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
                cap = await stream_request(session, url, _payload(cfg, model, req), headers, cfg.timeout_s,
                                           cfg.stall_timeout_s)
            finally:
                if sem is not None:
                    sem.release()
            done.append((i, warm, req, q_ms, cap))
            ok = cap.error is None
        except Exception as e:  # noqa: BLE001 - a client bug must not abort the run either
            done.append((i, warm, req, 0.0, {
                "request_id": i, "warmup": warm, "ok": False, "error": f"client error {type(e).__name__}: {e}",
                "sent_s": t_q - t_run, "end_s": time.perf_counter() - t_run, "max_tokens": req.max_tokens}))
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
        probe = _LoopProbe()
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
        n_streamed = sum(1 for _, warm, _, _, cap in done if not warm and isinstance(cap, StreamCapture)
                         and cap.error is None and cap.chunk_times)
        selfcheck = await probe.stop(n_streamed)
    records = []
    for i, warm, req, q_ms, cap in sorted(done, key=lambda x: x[0]):
        if isinstance(cap, StreamCapture):
            try:
                rec = request_record(cap, req, count, t_run, q_ms, i, warm)
            except Exception as e:  # noqa: BLE001 - e.g. a tokenizer failure: keep the request, marked failed
                rec = {"request_id": i, "warmup": warm, "ok": False, "max_tokens": req.max_tokens,
                       "error": f"client error while counting tokens {type(e).__name__}: {e}",
                       "sent_s": cap.t_send - t_run, "end_s": cap.t_end - t_run}
        else:
            rec = cap
        records.append(rec)
        if on_record is not None:
            on_record(rec)
    measured = [r for r in records if not r.get("warmup")]
    if measured:
        t_first = min(r["sent_s"] for r in measured)
        t_last = max(r["end_s"] for r in measured)
        duration = max(0.0, t_last - t_first)
    else:
        duration = 0.0
    info = {"duration_s": duration, "model": model, "url": url, **selfcheck}
    return records, info


def _not_sent(cfg: LoadConfig, workload: Sequence[RequestInput], error: str,
              on_record: Callable[[dict], None] | None, url: str | None = None) -> tuple[list[dict], dict]:
    """``(records, run_info)`` of a point none of whose requests could be sent (see :func:`_failed_records`)."""
    records = _failed_records(cfg, workload, error)
    if on_record is not None:
        for rec in records:
            on_record(rec)
    info = {"duration_s": 0.0, "model": cfg.model, "url": url or cfg.base_url + ENDPOINTS[cfg.endpoint],
            "setup_error": error, "x_client_cpu_frac": None, "x_loop_lag_ms_p50": None, "x_loop_lag_ms_p99": None,
            "x_loop_lag_ms_max": None, **_selfcheck_skipped("no request was sent")}
    return records, info


def aggregate(records: Sequence[dict], cfg: LoadConfig, info: dict) -> dict:
    """One results-schema row (``backend = "openai"``) from a run's request records.

    Failed and warm-up requests are excluded from every latency statistic; failures are counted in ``failed``
    and the first distinct error texts kept in ``error``, each cut to one line (:func:`kit.serve.client.short_error`:
    an HTML error page becomes its title; the detail file keeps the full text). Formulas: :mod:`kit.metrics`
    (throughputs, goodput, SLOs, percentiles with n). Means of TTFT/TPOT/E2EL are per request; ITL pools the
    tokens of all requests.
    """
    meas = [r for r in records if not r.get("warmup")]
    ok = [r for r in meas if r.get("ok")]
    bad = [r for r in meas if not r.get("ok")]
    dur = float(info.get("duration_s") or 0.0)
    ttft = [r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]
    tpot = [r["tpot_ms"] for r in ok if r.get("tpot_ms") is not None]
    e2el = [r["e2el_ms"] for r in ok if r.get("e2el_ms") is not None]
    itl = [x for r in ok for x in r.get("itl_ms") or []]
    gaps = [x for r in ok for x in r.get("chunk_gaps_ms") or []]
    queue = [r.get("client_queue_ms") for r in meas if r.get("client_queue_ms") is not None]
    users = [r["tok_s_per_user"] for r in ok if r.get("tok_s_per_user")]
    in_tok = sum(int(r.get("input_tokens") or 0) for r in ok)
    out_tok = sum(int(r.get("output_tokens") or 0) for r in ok)
    thr = M.throughputs(len(ok), in_tok, out_tok, dur)
    n_good = sum(M.meets_slo(r.get("ttft_ms"), r.get("tpot_ms"), r.get("e2el_ms"), int(r.get("output_tokens") or 0),
                             cfg.slo_ttft_ms, cfg.slo_tpot_ms, cfg.slo_e2el_ms) for r in ok)
    any_slo = any(s is not None for s in (cfg.slo_ttft_ms, cfg.slo_tpot_ms, cfg.slo_e2el_ms))
    p_ttft, p_tpot, p_itl, p_e2el = (M.percentiles(v) for v in (ttft, tpot, itl, e2el))
    p_user = M.percentiles(users, (10, 50, 90))
    p_gap = M.percentiles(gaps, (50, 99))
    p_queue = M.percentiles(queue)
    errors = sorted({short_error(r.get("error"), ERROR_SUMMARY_CHARS) for r in bad})
    rate = float(cfg.request_rate)
    row = {
        "backend": "openai", "status": "ok" if ok else "error",
        "error": (f"{len(bad)} of {len(meas)} requests failed: " + " | ".join(errors[:3])) if bad else None,
        "model": info.get("model") or cfg.model, "device": "remote",
        "concurrency": cfg.max_concurrency, "isl": cfg.isl, "osl": cfg.osl, "request_rate": rate,
        "ttft_ms": p_ttft["p50"], "ttft_ms_p90": p_ttft["p90"], "ttft_ms_p99": p_ttft["p99"],
        "tpot_ms_p50": p_tpot["p50"], "tpot_ms_p90": p_tpot["p90"], "tpot_ms_p99": p_tpot["p99"],
        "tpot_ms_min": min(tpot) if tpot else None, "tpot_ms_mean": float(np.mean(tpot)) if tpot else None,
        "tpot_n": p_tpot["n"],
        "itl_ms_p50": p_itl["p50"], "itl_ms_p90": p_itl["p90"], "itl_ms_p99": p_itl["p99"], "itl_n": p_itl["n"],
        "e2el_ms_p50": p_e2el["p50"], "e2el_ms_p90": p_e2el["p90"], "e2el_ms_p99": p_e2el["p99"],
        "client_queue_ms_p50": p_queue["p50"],
        "tok_s_per_stream": M.tok_s_per_stream(p_tpot["p50"]) if tpot else None,
        "output_tok_s": thr["output_tok_s"], "total_tok_s": thr["total_tok_s"],
        "request_throughput": thr["request_throughput"],
        "goodput_rps": M.goodput_rps(n_good, dur) if any_slo else None,
        "completed": len(ok), "failed": len(bad), "duration_s": dur,
        "tok_s_basis": "output_tok_s",
        # extras
        "x_endpoint": cfg.endpoint, "x_url": info.get("url"), "x_seed": cfg.seed, "x_burstiness": cfg.burstiness,
        "x_warmup_requests": cfg.warmup_requests, "x_ignore_eos": cfg.ignore_eos,
        "x_ttft_n": p_ttft["n"], "x_e2el_n": p_e2el["n"],
        "x_ttft_ms_mean": float(np.mean(ttft)) if ttft else None,
        "x_e2el_ms_mean": float(np.mean(e2el)) if e2el else None,
        "x_itl_ms_mean": float(np.mean(itl)) if itl else None,
        "x_chunk_gap_ms_p50": p_gap["p50"], "x_chunk_gap_ms_p99": p_gap["p99"], "x_chunk_gap_n": p_gap["n"],
        "x_tokens_per_chunk_mean": (out_tok / sum(r.get("n_chunks") or 0 for r in ok))
        if ok and sum(r.get("n_chunks") or 0 for r in ok) else None,
        "x_tok_s_per_user_p10": p_user["p10"], "x_tok_s_per_user_p50": p_user["p50"],
        "x_tok_s_per_user_p90": p_user["p90"],
        "x_client_queue_ms_p99": p_queue["p99"],
        "x_input_tokens_total": in_tok, "x_output_tokens_total": out_tok,
        "x_output_tokens_estimated": sum(bool(r.get("output_tokens_estimated")) for r in ok),
        "x_osl_mismatch": sum(bool(r.get("osl_mismatch")) for r in ok),
        # completed with output tokens in usage but no token-bearing chunk (e.g. text a detokeniser withheld):
        # they count in throughput but have no TTFT/TPOT
        "x_requests_without_text": sum(1 for r in ok if not r.get("n_chunks") and (r.get("output_tokens") or 0) > 0),
        "x_tokens_per_chunk_source": ",".join(sorted({str(r.get("tokens_per_chunk_source")) for r in ok})) or None,
        "x_good_requests": n_good if any_slo else None,
        "x_slo_ttft_ms": cfg.slo_ttft_ms, "x_slo_tpot_ms": cfg.slo_tpot_ms, "x_slo_e2el_ms": cfg.slo_e2el_ms,
    }
    for k in ("x_client_cpu_frac", "x_loop_lag_ms_p50", "x_loop_lag_ms_p99", "x_loop_lag_ms_max", "x_client_bound",
              "x_client_warning", "x_client_check"):
        row[k] = info.get(k)
    return row


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


def _default_workload(cfg: LoadConfig, tokenizer=None) -> list[RequestInput]:
    """The requests a point sends when none are given: warm-up + measured (256 when unbounded), at most 1024
    distinct prompts (reused round-robin); token-id prompts on ``/v1/completions`` without a tokenizer."""
    n = (cfg.num_requests or 256) + cfg.warmup_requests
    return build_workload(min(n, 1024), cfg.isl, cfg.osl, tokenizer, cfg.seed, cfg.isl_range, cfg.osl_range,
                          as_token_ids=tokenizer is None and cfg.endpoint == "completions")


def point_id(cfg: LoadConfig) -> str:
    """Stable key of a served point's configuration."""
    rate = "inf" if math.isinf(cfg.request_rate) else f"{cfg.request_rate:g}"
    return (f"openai-{cfg.endpoint}-c{cfg.max_concurrency or 'inf'}-r{rate}-b{cfg.burstiness:g}-"
            f"isl{cfg.isl}-osl{cfg.osl}-s{cfg.seed}")


def run_point(cfg: LoadConfig, out_dir: str | Path | None = None, tokenizer=None,
              workload: Sequence[RequestInput] | None = None, store=None, extra: dict | None = None,
              on_progress: Callable[[int, bool], None] | None = None, setup_error: str | None = None) -> dict:
    """Run one served load point, write its per-request detail file, and return (and store) its row.

    Args:
        out_dir: directory for ``requests-<point_id>.jsonl`` (one JSON line per request, written when the
            point's requests have finished) and, when ``store`` is None, the results (``points.jsonl`` / ``results.parquet``).
        tokenizer: HF tokenizer (builds the prompts and counts tokens) or ``None``.
        workload: explicit requests; default :func:`build_workload` from ``cfg``.
        store: a :class:`kit.results.ResultStore` to append the row to.
        extra: columns merged into the row (e.g. ``accelerator``, ``n_gpus``, ``device_name``).
        on_progress: see :func:`run_load_async`.
        setup_error: an error that already rules the point out (e.g. :func:`run_sweep` could not list the
            models): nothing is sent, and every planned request is recorded as failed with this text.

    Returns: the row (a dict of schema columns + ``x_`` extras). Never raises for server faults: a dead server
    (or one whose model list cannot be read) gives a row with ``status="error"`` and every planned request
    counted in ``failed``.

    Raises:
        NotADirectoryError: ``out_dir`` exists and is a file (checked before any network work).
    """
    from kit import results as R

    cfg.validate()
    if out_dir is not None:
        check_out_dir(out_dir)
    if workload is None:
        workload = _default_workload(cfg, tokenizer)
    pid = point_id(cfg)
    detail = None
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        detail = out_dir / f"requests-{pid}.jsonl"
        detail.write_text("")
        if store is None:
            store = R.ResultStore(out_dir)
    fh = open(detail, "a") if detail else None

    def on_record(rec: dict) -> None:
        if fh:
            fh.write(json.dumps(rec, default=float) + "\n")
            fh.flush()

    try:
        if setup_error:
            records, info = _not_sent(cfg, workload, setup_error, on_record)
        else:
            try:
                records, info = run_coro(run_load_async(cfg, workload, tokenizer, on_record, on_progress))
            except ValueError as e:  # any other set-up failure: a finished, failed point
                records, info = _not_sent(cfg, workload, str(e), on_record)
    finally:
        if fh:
            fh.close()
    row = aggregate(records, cfg, info)
    row["point_id"] = pid
    row["x_detail_file"] = str(detail) if detail else None
    row.update(extra or {})
    if row.get("n_gpus") and row.get("output_tok_s") == row.get("output_tok_s") and row.get("output_tok_s"):
        row["tok_s_per_gpu"] = M.tok_s_per_gpu(row["output_tok_s"], int(row["n_gpus"]))
    if store is not None:
        store.append(row)
    return row


def run_sweep(cfg: LoadConfig, concurrencies: Sequence[int], out_dir: str | Path, tokenizer=None,
              extra: dict | None = None, metadata: dict | None = None, progress: bool = True,
              model_error: str | None = None) -> "Any":
    """A concurrency sweep against one server: one :func:`run_point` per value of ``concurrencies``.

    Rows are appended to ``out_dir`` as each point finishes (``points.jsonl``, ``results.parquet``), beside one
    detail file per point, so they concatenate with in-process rows via :func:`kit.results.to_frame`.
    Without ``cfg.model`` the model id is listed once (``/v1/models``, at most ``cfg.timeout_s``); if that fails
    (or ``model_error`` says it already did), every point is recorded with all its planned requests failed,
    without asking again.

    Returns: the results DataFrame of this sweep.

    Raises:
        ValueError: an empty list or a concurrency < 1.
        NotADirectoryError: ``out_dir`` exists and is a file (checked before any network work).
        KeyboardInterrupt: Ctrl-C; the points finished before it stay in ``out_dir``.
    """
    from dataclasses import replace

    from kit import results as R

    concs = [int(c) for c in concurrencies]
    if not concs or min(concs) < 1:
        raise UserError(f"concurrencies={list(concurrencies)}; give one or more integers >= 1")
    cfg.validate()
    check_out_dir(out_dir)
    if not cfg.model and not model_error:
        try:
            cfg = replace(cfg, model=run_coro(get_model_id(cfg.base_url, cfg.api_key_env, cfg.timeout_s)))
        except ValueError as e:
            model_error = str(e)
    meta = R.run_metadata(backend="openai", config={k: v for k, v in asdict(cfg).items() if k != "api_key_env"},
                          **(metadata or {}))
    store = R.ResultStore(out_dir, metadata=meta)
    workload = _default_workload(cfg, tokenizer)
    rows = []
    extra = {"run_id": meta["created_utc"], **(extra or {})}
    with InterruptGuard() as guard:
        for c in concs:
            guard.check()  # a Ctrl-C swallowed by a finaliser still stops the sweep between points
            row = run_point(replace(cfg, max_concurrency=c), out_dir, tokenizer, workload, store, extra,
                            setup_error=model_error)
            rows.append(row)
            if progress:
                print(summary_line(row), flush=True)
    return R.to_frame(rows)


def summary_line(row: dict) -> str:
    """A one-line text summary of a served row (concurrency, throughput, TTFT, TPOT, failures, self-check)."""
    def f(x, fmt=".1f"):
        return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

    s = (f"c={row.get('concurrency')} rate={row.get('request_rate')}: {f(row.get('output_tok_s'))} out tok/s, "
         f"{f(row.get('request_throughput'), '.2f')} req/s, TTFT p50 {f(row.get('ttft_ms'))} ms "
         f"(n={row.get('x_ttft_n')}), TPOT p50 {f(row.get('tpot_ms_p50'))} ms (n={row.get('tpot_n')}), "
         f"ITL p50 {f(row.get('itl_ms_p50'))} ms (n={row.get('itl_n')}), "
         f"completed {row.get('completed')}, failed {row.get('failed')}")
    if row.get("goodput_rps") is not None:
        s += f", goodput {f(row.get('goodput_rps'), '.2f')} req/s"
    if row.get("x_requests_without_text"):
        s += f"; {row['x_requests_without_text']} completed requests streamed no text (no TTFT)"
    if row.get("x_osl_mismatch"):
        s += f"; {row['x_osl_mismatch']} requests' output length != max_tokens"
    if row.get("x_client_warning"):
        s += f"; WARNING {row['x_client_warning']}"
    elif str(row.get("x_client_check") or "").startswith("not applied"):
        s += f"; client self-check {row['x_client_check']}"
    if row.get("error"):
        s += f"; ERROR {short_error(row['error'], 300)}"
    return s


# ---------------------------------------------------------------- CLI
#: argparse type of ``--concurrency``: a comma list of integers >= 1 (argparse names the option)
_concurrency_list = int_list_arg(minimum=1, example="1,4,16")


class _DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: …)" to an option's help unless its help already names a default, or the default is
    None / False (nothing to show)."""

    def _get_help_string(self, action):
        h = action.help or ""
        d = action.default
        if (not action.option_strings or d is None or d is False or d is argparse.SUPPRESS
                or "default" in h.lower()):
            return action.help
        return (h + " " if h else "") + "(default: %(default)s)"


def add_cli(subparsers) -> None:
    """``kit serve-bench``: a concurrency sweep against a running OpenAI-compatible server."""
    p = subparsers.add_parser(
        "serve-bench",
        description="Concurrency sweep against a running server; one results row per concurrency "
                    "(backend=openai) plus a per-request detail file. The API key is read from the environment "
                    f"variable named by --api-key-env (default {DEFAULT_API_KEY_ENV}).",
        formatter_class=_DefaultsHelpFormatter)
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="served model id (default: first of /v1/models)")
    p.add_argument("--endpoint", default="completions", choices=sorted(ENDPOINTS),
                   help="API to call: " + ", ".join(f"{k}={v}" for k, v in sorted(ENDPOINTS.items())))
    p.add_argument("--concurrency", type=_concurrency_list, default="1,4,16",
                   help="comma-separated max concurrency values")
    p.add_argument("--workload", default=None, choices=sorted(WORKLOAD_PRESETS),
                   help="ISL/OSL preset (overrides --isl/--osl): " +
                        ", ".join(f"{k}={v[0]}/{v[1]}" for k, v in WORKLOAD_PRESETS.items()))
    p.add_argument("--isl", type=int, default=1024, help="input tokens per request")
    p.add_argument("--osl", type=int, default=400, help="output tokens per request (max_tokens)")
    p.add_argument("--isl-range", type=float, default=0.0, help="draw ISL in isl*(1±r)")
    p.add_argument("--osl-range", type=float, default=0.0, help="draw OSL in osl*(1±r)")
    p.add_argument("--num-requests", type=int, default=64, help="measured requests per concurrency point")
    p.add_argument("--duration-s", type=float, default=None, help="stop sending after this many seconds")
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests per point (excluded)")
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (default inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="Gamma shape of arrival gaps (1 = Poisson)")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts and arrival gaps")
    p.add_argument("--ignore-eos", action="store_true", help="ask the server to ignore EOS (vLLM, SGLang)")
    p.add_argument("--continuous-usage", action="store_true",
                   help="ask for usage in every chunk (vLLM): exact tokens per chunk without a tokenizer")
    p.add_argument("--extra-body", default=None, help="JSON object merged into every request body")
    p.add_argument("--tokenizer", default=None,
                   help="local tokenizer path/id for prompts and token counts (default: try the model id)")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="total time one request (and the /v1/models look-up) may take")
    p.add_argument("--stall-timeout-s", type=float, default=60.0, help="longest silence within a stream")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput SLO on TTFT (ms; default: none)")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput SLO on TPOT (ms; default: none)")
    p.add_argument("--slo-e2el-ms", type=float, default=None,
                   help="goodput SLO on end-to-end latency (ms; default: none)")
    p.add_argument("--api-key-env", default=DEFAULT_API_KEY_ENV, help="environment variable with the API key")
    p.add_argument("--accelerator", default=None, help="catalog accelerator name for the rows (e.g. MI355X)")
    p.add_argument("--n-gpus", type=int, default=None, help="GPUs behind the server (for tok/s/GPU)")
    p.add_argument("--out", default="results/serve-bench", help="output directory")
    p.add_argument("--plot", action="store_true", help="also write serve-bench.png")
    p.set_defaults(func=_cli_main)


def _cli_main(args) -> int:
    check_out_dir(args.out)  # before any network work
    isl, osl = WORKLOAD_PRESETS[args.workload] if args.workload else (args.isl, args.osl)
    try:
        extra_body = json.loads(args.extra_body) if args.extra_body else {}
    except json.JSONDecodeError as e:
        raise UserError(f"--extra-body={args.extra_body!r} is not valid JSON: {e}") from e
    if not isinstance(extra_body, dict):
        raise UserError(f"--extra-body={args.extra_body!r} must be a JSON object")
    concs = args.concurrency  # argparse applies type= to the string default too
    cfg = LoadConfig(url=args.url, model=args.model, endpoint=args.endpoint, max_concurrency=concs[0],
                     request_rate=args.request_rate, burstiness=args.burstiness, seed=args.seed,
                     num_requests=args.num_requests, duration_s=args.duration_s, warmup_requests=args.warmup,
                     isl=isl, osl=osl, isl_range=args.isl_range, osl_range=args.osl_range,
                     ignore_eos=args.ignore_eos, timeout_s=args.timeout_s, stall_timeout_s=args.stall_timeout_s,
                     api_key_env=args.api_key_env, slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
                     slo_e2el_ms=args.slo_e2el_ms, continuous_usage=args.continuous_usage,
                     extra_body=extra_body).validate()
    tok = load_tokenizer(args.tokenizer) if args.tokenizer else None
    model_error = None
    if not cfg.model:  # listed once here (for the tokenizer too), not again by run_sweep
        try:
            cfg.model = run_coro(get_model_id(cfg.base_url, cfg.api_key_env, cfg.timeout_s))
        except ValueError as e:
            model_error = str(e)
            print(f"kit serve-bench: {e}; no request is sent, every planned request is counted as failed")
    if tok is None and not args.tokenizer and cfg.model:
        try:
            tok = load_tokenizer(cfg.model)
        except ValueError as e:
            print(f"kit serve-bench: no tokenizer ({e}); prompts are token ids, token counts per chunk assumed 1")
    extra = {k: v for k, v in (("accelerator", args.accelerator), ("n_gpus", args.n_gpus)) if v is not None}
    df = run_sweep(cfg, concs, args.out, tok, extra, model_error=model_error)
    print(f"results: {Path(args.out) / 'results.parquet'} ({len(df)} rows; per-request detail in "
          f"{Path(args.out)}/requests-*.jsonl)")
    if args.plot:
        from kit.view.plots import plot_served

        fig = plot_served(df)
        fig.savefig(Path(args.out) / "serve-bench.png", dpi=110)
        print(f"plot: {Path(args.out) / 'serve-bench.png'}")
    return 0 if (df["completed"].fillna(0) > 0).any() else 1
