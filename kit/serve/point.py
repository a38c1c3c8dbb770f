"""One served point with every guarantee: a schedule's requests sent by the one loop, watched and judged.

:func:`measure_point` is what every served mode measures through (the concurrency sweep, a ramp, multi-turn
sessions, a trace replay, each probe of an SLO search). Around the loop (:func:`kit.serve.loop.run_schedule`) it
scrapes the server's ``/metrics`` before, during and after (:class:`kit.serve.server_metrics.ServerMetricsWatch`),
samples power when the server runs on this host (:class:`kit.measure.power.PowerSampler`), and then builds the
row: :func:`kit.serve.aggregate.aggregate` (latency percentiles with n, throughputs, goodput, failures, self-check),
the schedule's own columns, the steady-state window (:func:`kit.serve.steady.steady_columns`), the measured
concurrency, the server and power columns, the queueing verdict and the ITL-per-step note
(:func:`kit.validity.queueing_verdict`, :func:`kit.validity.itl_step_note`), and the validity verdict
(:func:`kit.validity.validity`; a schedule that promises unique prompts is checked for cache reuse however it was
started: the intended cached share is 0 unless the caller says otherwise). So a number is trustworthy or not by
the same rules whichever mode produced it.

Each point writes its per-request detail file ``requests-<point_id>.jsonl`` (one JSON line per request, warm-up
ones flagged, full error texts, secrets masked) when its requests have finished; :func:`read_detail` reads it back.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from urllib.parse import urlsplit

from kit import metrics as M
from kit._io import atomic_write_text, check_out_dir
from kit.errors import OutputPathError, UserError
from kit.measure.power import PowerSampler
from kit.serve.aggregate import aggregate
from kit.serve.limits import check_number
from kit.serve.load import LoadConfig
from kit.serve.loop import not_sent, run_coro, run_schedule
from kit.serve.redact import redact_url, scrub
from kit.serve.schedule import Arrivals
from kit.serve.server_metrics import ServerMetricsWatch, client_output_tokens
from kit.serve.steady import measured_concurrency, steady_columns
from kit.serve.workload import fresh_seed, fresh_workload
from kit.validity import itl_step_note, queueing_verdict, validity

#: LoadConfig fields that do not change what a point measures, so they are not part of its id
NOT_IN_POINT_ID = (
    "timeout_s",
    "stall_timeout_s",
    "first_byte_timeout_s",
    "models_timeout_s",
    "max_event_bytes",
    "api_key_env",
    "server_metrics",
    "power_period_ms",
    "usd_per_kwh",
)
#: how often the server's /metrics is scraped while a point runs (s): its gauges' maxima come from these samples
METRICS_PERIOD_S = 0.25
#: host names of this machine: a served point's power is sampled only when its server runs here
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def served_point_id(cfg: LoadConfig, server_key: str | None = None) -> str:
    """Stable key of a served load point (resume skips ids already finished): a readable prefix (endpoint,
    concurrency, request rate, ISL/OSL) and a hash of every other setting that changes what is measured or how the
    row is judged: the server (its URL as the kit shows it: scheme, host, port, path; no credentials; or
    ``server_key`` instead, for a server the kit launched: its configuration, since its port changes per launch),
    the model, ranges, request counts, warm-up, burstiness, seed, sampling, SLOs, extra body. The timeouts, the
    event-size cap and the API-key variable are not part of it (:data:`NOT_IN_POINT_ID`)."""
    rate = "inf" if math.isinf(cfg.request_rate) else f"{cfg.request_rate:g}"
    key = {k: v for k, v in asdict(cfg).items() if k not in NOT_IN_POINT_ID}
    key["url"] = server_key if server_key is not None else redact_url(cfg.base_url)
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"openai-{cfg.endpoint}-c{cfg.max_concurrency or 'inf'}-r{rate}-isl{cfg.isl}-osl{cfg.osl}-{digest}"


def measure_point(
    cfg: LoadConfig,
    schedule=None,
    *,
    out_dir: str | Path | None = None,
    point_id: str | None = None,
    tokenizer=None,
    extra: dict | None = None,
    setup_error: str | None = None,
    **hooks,
) -> dict:
    """Measure one served point and return its row (see the module text); with ``out_dir``, also write its
    detail file.

    Args:
        cfg: the server and the load settings.
        schedule: what to send when (:mod:`kit.serve.schedule`, :class:`kit.serve.sessions.SessionSchedule`,
            :class:`kit.serve.trace.TraceSchedule`); default: :meth:`kit.serve.schedule.Arrivals.from_config` with
            this point's fresh prompts (:func:`kit.serve.workload.fresh_workload`, keyed by the point id).
        out_dir: where ``requests-<point_id>.jsonl`` goes (never over an earlier file: a point measured again gets
            ``requests-<point_id>.2.jsonl`` ...); None writes nothing. Rows are stored by the grid runner.
        point_id: the row's ``point_id`` (default :func:`served_point_id` of ``cfg``).
        tokenizer: HF tokenizer (prompts and token counts), a ``str -> int`` callable, or None.
        extra: columns merged into the row (e.g. ``accelerator``, ``n_gpus``; with ``n_gpus``, ``tok_s_per_gpu``).
        setup_error: an error that already rules the point out (e.g. no model list): nothing is sent, every planned
            request is recorded as failed with this text.
        hooks: ``on_progress``, ``on_status`` (:func:`kit.serve.loop.run_schedule`).

    Returns: the row (schema columns + ``x_`` extras). Never raises for server faults: a dead server gives a row
    with ``status = "error"`` and every planned request in ``failed``. A detail file the disk refused is not
    written; the row says why (``x_detail_error``) and keeps every figure.

    Raises:
        UserError: an invalid ``cfg`` or ``extra["n_gpus"]`` (not an integer >= 1); OutputPathError: ``out_dir``
            is a file (all before any network work). TypeError: an unknown hook name.
    """
    cfg.validate()
    extra = dict(extra or {})
    if extra.get("n_gpus") is not None:
        check_number("n_gpus", extra["n_gpus"], lo=1, hi=1_000_000, integer=True, meaning="GPUs behind the server")
    if set(hooks) - {"on_progress", "on_status"}:
        raise TypeError(f"measure_point() got unknown hook(s) {sorted(set(hooks))}; hooks: on_progress, on_status")
    pid = point_id or served_point_id(cfg)
    if cfg.seed is None:  # a new seed for this point's prompts and arrivals (recorded as x_seed)
        cfg = replace(cfg, seed=fresh_seed())
    out = check_out_dir(out_dir) if out_dir is not None else None
    if schedule is None:  # prompts of this point only: no earlier point of a sweep sent them
        schedule = Arrivals.from_config(cfg, fresh_workload(cfg, pid, tokenizer))
    records, info, watched = watched_run(cfg, schedule, tokenizer, setup_error, hooks)
    detail, detail_error = None, None
    try:  # a full disk loses the detail file, never the measured row
        detail = write_detail(out, pid, records, cfg) if out is not None else None
    except OutputPathError as e:
        detail_error = str(e)
    row = aggregate(records, cfg, info) | schedule.columns(records)
    row |= steady_columns(records, schedule.steady) | measured_concurrency(records)
    row |= {"point_id": pid, "x_detail_file": str(detail) if detail else None, "x_schedule": schedule.kind}
    row["x_detail_error"] = detail_error
    out_tok = client_output_tokens(records)
    in_tok = sum(int(r.get("input_tokens") or 0) for r in records if r.get("ok"))
    row |= watched["watch"].columns(out_tok)
    row |= watched["power"].columns(out_tok, out_tok + in_tok, extra.get("x_tdp_w"), cfg.usd_per_kwh)
    row |= extra
    tps = row.get("output_tok_s")
    if row.get("n_gpus") and tps and not math.isnan(tps):
        row["tok_s_per_gpu"] = M.tok_s_per_gpu(tps, int(row["n_gpus"]))
    row |= queueing_verdict(row)
    row["x_itl_step_note"] = itl_step_note(row)
    if schedule.unique_prompts and row.get("x_prefix_hit_rate_intended") is None:
        row["x_prefix_hit_rate_intended"] = 0.0  # unique prompts: any cached share beyond the tolerance is reuse
    return row | validity(row, unique_prompts=schedule.unique_prompts)


def watched_run(cfg: LoadConfig, schedule, tokenizer, setup_error: str | None, hooks: dict):
    """``(records, run_info, {"watch", "power"})``: the schedule run by the loop inside the ``/metrics`` watch and
    the power sampler (power only when the server runs on this host; elsewhere the columns say so)."""
    # bounded like the first byte of a request, so a server that never answers costs a moment, not minutes
    watch = ServerMetricsWatch(
        cfg.url,
        period_s=METRICS_PERIOD_S,
        timeout_s=min(2.0, cfg.first_byte_timeout_s, cfg.models_timeout_s),
        enabled=cfg.server_metrics and not setup_error,
    )
    source = "auto" if urlsplit(cfg.url).hostname in LOCAL_HOSTS else "none"
    with watch, PowerSampler(period_s=cfg.power_period_ms / 1000.0, source=source) as ps:
        if setup_error:
            records, info = not_sent(cfg, schedule, setup_error)
        else:
            try:
                records, info = run_coro(run_schedule(cfg, schedule, tokenizer, **hooks))
            except UserError as e:  # a set-up failure (e.g. a tokenizer that cannot count): a finished, failed point
                records, info = not_sent(cfg, schedule, str(e))
    return records, info, {"watch": watch, "power": ps}


def write_detail(out_dir: Path, point_id: str, records: Sequence[dict], cfg: LoadConfig) -> Path:
    """Write a point's request records to a new ``requests-<point_id>[.n].jsonl`` (:func:`detail_path`), one JSON
    line each, error texts scrubbed of ``cfg``'s secrets; atomic. Returns its path."""
    path, secrets = detail_path(out_dir, point_id), cfg.secrets()
    lines = (json.dumps({**r, "error": scrub(r.get("error"), secrets)}, default=float) + "\n" for r in records)
    return atomic_write_text(path, "".join(lines))


def detail_path(out_dir: Path, point_id: str) -> Path:
    """``out_dir/requests-<point_id>.jsonl``, or the first free ``requests-<point_id>.<n>.jsonl`` (n = 2, 3 ...)
    when an earlier run wrote that one: a detail file is never overwritten."""
    path = out_dir / f"requests-{point_id}.jsonl"
    n = 2
    while path.exists():
        path, n = out_dir / f"requests-{point_id}.{n}.jsonl", n + 1
    return path


def read_detail(row: dict) -> list[dict]:
    """The request records of a served row (its ``x_detail_file``); [] when it has none."""
    path = row.get("x_detail_file")
    if not path or not Path(path).exists():
        return []
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
