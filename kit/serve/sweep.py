"""The served sweep: load points against one OpenAI-compatible server through the one grid runner, and
``kit serve-bench``.

:class:`ServedBackend` is the served backend of :func:`kit.grid.run_grid` (``kind = "openai"``): one grid
point per concurrency of a :class:`kit.serve.load.LoadConfig`, each measured by :func:`run_load_point`. The runner
owns everything around the points, the same as for the in-process sweep: each finished point's row is appended
(fsync'd) to ``OUT/points.jsonl`` and ``OUT/results.parquet`` before the next starts; a re-run on the same ``OUT``
skips points already recorded as ``ok`` (points whose every request failed, ``status = "error"``, are measured
again; a point an earlier run died on, ``killed``, only with ``retry_killed``); ``resume=False`` (``--no-resume``)
moves the earlier run's files, the detail files too, to ``OUT/previous/<time>/``; Ctrl-C stops after the finished
points are saved; one process writes ``OUT`` at a time.

Files in ``OUT`` besides the runner's: ``requests-<point_id>.jsonl``, one JSON line per request of that point
(warm-up ones flagged; the full error texts), written when the point's requests have finished. Rows concatenate
with in-process rows (:func:`kit.results.to_frame`) and plot with :func:`kit.view.plots.plot_served`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from urllib.parse import urlsplit

import pandas as pd

from kit import metrics as M
from kit._io import atomic_write_text, check_out_dir
from kit.errors import UserError
from kit.grid import GridPoint, run_grid, split_run_options
from kit.measure.power import PowerSampler
from kit.serve.aggregate import aggregate
from kit.serve.client import get_model_id
from kit.serve.limits import check_number
from kit.serve.load import LoadConfig, not_sent, run_coro, run_load_async
from kit.serve.progress import PointProgress
from kit.serve.redact import redact_url, scrub
from kit.serve.server_metrics import ServerMetricsWatch, client_output_tokens
from kit.serve.workload import RequestInput
from kit.store import run_metadata
from kit.validity import validity

log = logging.getLogger("kit")

#: ``kit serve-bench --concurrency`` when none is given
DEFAULT_CONCURRENCIES = (1, 4, 16)
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


def served_point_id(cfg: LoadConfig) -> str:
    """Stable key of a served load point (resume skips ids already finished): a readable prefix (endpoint,
    concurrency, request rate, ISL/OSL) and a hash of every other setting that changes what is measured or how the
    row is judged: the server (its URL as the kit shows it: scheme, host, port, path; no credentials), the model,
    ranges, request counts, warm-up, burstiness, seed, sampling, SLOs, extra body. The timeouts, the event-size
    cap and the API-key variable are not part of it (:data:`NOT_IN_POINT_ID`)."""
    rate = "inf" if math.isinf(cfg.request_rate) else f"{cfg.request_rate:g}"
    key = {k: v for k, v in asdict(cfg).items() if k not in NOT_IN_POINT_ID}
    key["url"] = redact_url(cfg.base_url)
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"openai-{cfg.endpoint}-c{cfg.max_concurrency or 'inf'}-r{rate}-isl{cfg.isl}-osl{cfg.osl}-{digest}"


def run_load_point(
    cfg: LoadConfig,
    out_dir: str | Path | None = None,
    tokenizer=None,
    workload: Sequence[RequestInput] | None = None,
    extra: dict | None = None,
    on_progress: Callable[[int, bool], None] | None = None,
    setup_error: str | None = None,
    point_id: str | None = None,
    on_status: Callable[[PointProgress], None] | None = None,
) -> dict:
    """Run one served load point and return its row; with ``out_dir``, also write its per-request detail file.

    Args:
        out_dir: directory for ``requests-<point_id>.jsonl`` (one JSON line per request, written atomically when
            the point's requests have finished; never over another run's file: a point measured again gets
            ``requests-<point_id>.2.jsonl`` ...); None writes nothing. Rows are stored by the grid runner
            (:func:`run_served_sweep`), not here.
        tokenizer: HF tokenizer (builds the prompts and counts tokens), a ``str -> int`` callable, or None.
        workload: explicit requests; default :func:`kit.serve.prefix.fresh_workload` of ``cfg`` and the point id.
        extra: columns merged into the row (e.g. ``accelerator``, ``n_gpus``); with ``n_gpus``, ``tok_s_per_gpu``.
        on_progress: see :func:`kit.serve.load.run_load_async`.
        setup_error: an error that already rules the point out (e.g. the model list could not be read): nothing
            is sent, and every planned request is recorded as failed with this text.
        point_id: the row's ``point_id`` (default :func:`served_point_id` of ``cfg``).
        on_status: see :func:`kit.serve.load.run_load_async` (progress: done, failed, in flight).

    Returns: the row (schema columns + ``x_`` extras). Never raises for server faults: a dead server (or one whose
    model list cannot be read) gives a row with ``status = "error"`` and every planned request in ``failed``.

    Raises:
        UserError: an invalid ``cfg`` or ``extra["n_gpus"]`` (not an integer >= 1); OutputPathError: ``out_dir`` is
            a file (all before any network work).
    """
    cfg.validate()
    if (extra or {}).get("n_gpus") is not None:
        check_number("n_gpus", extra["n_gpus"], lo=1, hi=1_000_000, integer=True, meaning="GPUs behind the server")
    pid = point_id or served_point_id(cfg)
    out = check_out_dir(out_dir) if out_dir is not None else None
    workload_is_fresh = workload is None
    if workload is None:  # prompts of this point only (no earlier point of a sweep sent them; case E8)
        from kit.serve.prefix import fresh_workload  # kit.serve.prefix imports this module

        workload = fresh_workload(cfg, pid, tokenizer)
    # bounded like the first byte of a request, so a server that never answers costs a moment, not minutes
    watch = ServerMetricsWatch(
        cfg.url,
        timeout_s=min(2.0, cfg.first_byte_timeout_s, cfg.models_timeout_s),
        enabled=cfg.server_metrics and not setup_error,
    )
    # power is the server's only when it runs on this host; elsewhere the columns say so
    source = "auto" if urlsplit(cfg.url).hostname in LOCAL_HOSTS else "none"
    with watch, PowerSampler(period_s=cfg.power_period_ms / 1000.0, source=source) as ps:
        if setup_error:
            records, info = not_sent(cfg, workload, setup_error)
        else:
            try:
                records, info = run_coro(run_load_async(cfg, workload, tokenizer, on_progress, on_status=on_status))
            except UserError as e:  # a set-up failure (e.g. a tokenizer that cannot count): a finished, failed point
                records, info = not_sent(cfg, workload, str(e))
    detail = write_detail(out, pid, records, cfg) if out is not None else None
    row = aggregate(records, cfg, info)
    row["point_id"] = pid
    row["x_detail_file"] = str(detail) if detail else None
    out_tok = client_output_tokens(records)
    in_tok = sum(int(r.get("input_tokens") or 0) for r in records if r.get("ok"))
    row.update(watch.columns(out_tok))
    row.update(ps.columns(out_tok, out_tok + in_tok, (extra or {}).get("x_tdp_w"), cfg.usd_per_kwh))
    row.update(extra or {})
    tps = row.get("output_tok_s")
    if row.get("n_gpus") and tps and not math.isnan(tps):
        row["tok_s_per_gpu"] = M.tok_s_per_gpu(tps, int(row["n_gpus"]))
    row.update(validity(row, unique_prompts=workload_is_fresh))
    return row


#: host names of this machine: a served point's power is sampled only when its server runs here
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


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


class ServedBackend:
    """The served backend of :func:`kit.grid.run_grid`: one :func:`run_load_point` per concurrency.

    Args:
        config: the load point (validated here); its ``max_concurrency`` is replaced by each concurrency.
        concurrencies: max requests in flight, one grid point each (integers >= 1).
        out_dir: where the per-request detail files go (the runner's ``out_dir``).
        tokenizer, workload, extra, on_progress: see :func:`run_load_point` (one workload for every point).
        metadata: merged into the run's JSON sidecar.
        model_error: the model list already failed (nothing is sent; every point records its requests failed).

    Without ``config.model`` the model id is listed once (``/v1/models``, waiting at most ``config.models_timeout_s``)
    when the points are first asked for; if that fails every point is recorded with all its requests failed.

    Raises:
        UserError: no concurrency, one < 1, or an invalid ``config``.
    """

    kind = "openai"
    #: the per-request detail files; a ``--no-resume`` run archives them with the results
    archive_globs = ("requests-*.jsonl",)

    def __init__(
        self,
        config: LoadConfig,
        concurrencies: Sequence[int],
        out_dir: str | Path,
        *,
        tokenizer=None,
        workload: Sequence[RequestInput] | None = None,
        extra: dict | None = None,
        metadata: dict | None = None,
        model_error: str | None = None,
        on_progress: Callable[[int, bool], None] | None = None,
        on_status: Callable[[PointProgress], None] | None = None,
    ):
        concs = list(dict.fromkeys(int(c) for c in concurrencies))  # each once, in the order given
        if not concs or min(concs) < 1:
            raise UserError(f"concurrencies={list(concurrencies)}; give one or more integers >= 1")
        self.config = config.validate()
        self.concurrencies = concs
        self.out_dir = Path(out_dir)
        self.tokenizer, self.workload, self.on_progress, self.on_status = tokenizer, workload, on_progress, on_status
        self.extra, self.extra_metadata, self.model_error = dict(extra or {}), dict(metadata or {}), model_error
        self.description = f"serve-bench {config.shown_url}"
        self._points: list[GridPoint] | None = None

    def resolve_model(self) -> str | None:
        """The served model id (``config.model``, else the first of ``/v1/models``, listed once); None when the
        listing failed (then :attr:`model_error` says why)."""
        if not self.config.model and not self.model_error:
            c = self.config
            try:
                self.config = replace(c, model=run_coro(get_model_id(c.url, c.api_key_env, c.models_timeout_s)))
            except UserError as e:
                self.model_error = str(e)
                log.warning("%s; no request is sent, every planned request is counted as failed", e)
        return self.config.model

    def points(self) -> list[GridPoint]:
        """One point per concurrency (the model id resolved first: it is part of each point's id)."""
        if self._points is None:
            self.resolve_model()
            self._points = []
            for c in (replace(self.config, max_concurrency=k) for k in self.concurrencies):
                cols = {
                    "model": c.model,
                    "device": "remote",
                    "concurrency": c.max_concurrency,
                    "isl": c.isl,
                    "osl": c.osl,
                    "request_rate": float(c.request_rate),
                    "x_endpoint": c.endpoint,
                    # the sharing the workload intends: none unless an explicit workload was given (unknown then)
                    "x_fresh_prompts": self.workload is None,
                    "x_prefix_hit_rate_intended": 0.0 if self.workload is None else None,
                    **self.extra,
                }
                self._points.append(GridPoint(served_point_id(c), cols, f"c={c.max_concurrency}", c))
        return self._points

    def metadata(self) -> dict:
        """Run metadata with the config (URL redacted, no secret in the extra body, without the API-key variable)
        and the concurrencies."""
        secrets = self.config.secrets()
        cfg = {k: v for k, v in asdict(self.config).items() if k != "api_key_env"}
        cfg["url"] = redact_url(self.config.url)
        cfg["extra_body"] = json.loads(scrub(json.dumps(cfg["extra_body"], default=str), secrets))
        return run_metadata(backend=self.kind, config=cfg, concurrencies=self.concurrencies, **self.extra_metadata)

    @contextlib.contextmanager
    def session(self):
        """Nothing to build: without an explicit workload each point draws its own fresh prompts
        (:func:`kit.serve.prefix.fresh_workload`, keyed by its point id), so a prefix cache cannot serve a later
        point the earlier points' prompts."""
        yield self

    def measure(self, point: GridPoint) -> dict:
        """The row of one load point (:func:`run_load_point`; writes its detail file)."""
        return run_load_point(
            point.config,
            self.out_dir,
            self.tokenizer,
            self.workload,
            self.extra,
            self.on_progress,
            self.model_error,
            point.point_id,
            self.on_status,
        )

    def after_failure(self) -> dict:
        """Nothing to free (the point ran on the server): no extra columns."""
        return {}


def run_served_sweep(cfg: LoadConfig, concurrencies: Sequence[int], out_dir: str | Path, **options) -> pd.DataFrame:
    """A concurrency sweep against one server through the grid runner (:class:`ServedBackend`,
    :func:`kit.grid.run_grid`: append-on-finish, resume, Ctrl-C).

    Args:
        resume: skip points already recorded as ok in ``out_dir``; False moves the earlier run's files (and its
            ``requests-*.jsonl``) to ``out_dir/previous/<time>/`` and measures every point again.
        progress: a progress bar and the resume notice.
        on_point: called after each measured point with (row, frame of every row so far).
        should_stop: polled before each point; True ends the sweep (finished points kept).
        retry_killed: measure again a point an earlier run died on (recorded ``killed``; skipped by default).
        tokenizer, workload, extra, metadata, model_error, on_progress, on_status: see :class:`ServedBackend` (every
            other keyword: :func:`kit.grid.run_grid`'s options above).

    Returns: this sweep's rows in the order of ``concurrencies`` (the latest row of each of its points, also
    those a resume skipped); every row of ``out_dir`` stays in ``out_dir/results.parquet``.

    Raises:
        UserError: no concurrency, one < 1, or an invalid ``cfg``; OutputPathError: ``out_dir`` is a file (both
            before any network work). KeyboardInterrupt: Ctrl-C, after the finished points are saved.
    """
    out = check_out_dir(out_dir)
    run_options, backend_options = split_run_options(options)
    backend = ServedBackend(cfg, concurrencies, out, **backend_options)
    df = run_grid(backend, out, **run_options)
    order = {p.point_id: i for i, p in enumerate(backend.points())}
    cur = df[df["point_id"].isin(order)].drop_duplicates("point_id", keep="last")
    return cur.iloc[cur["point_id"].map(order).argsort()].reset_index(drop=True)


# ---------------------------------------------------------------- CLI
