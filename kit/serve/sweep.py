"""The served sweep: load points against one OpenAI-compatible server through the one grid runner.

:class:`ServedBackend` is the served backend of :func:`kit.grid.run_grid` (``kind = "openai"``): one grid point per
(shared-prefix fraction, concurrency) of a :class:`kit.serve.load.LoadConfig`, each a closed or open loop
(:class:`kit.serve.schedule.Arrivals`) with prompts of its own (:func:`kit.serve.workload.fresh_workload`), measured
by :func:`kit.serve.point.measure_point`. :class:`RampBackend` is one point whose load rises within the run; the
multi-turn and trace backends (:mod:`kit.serve.sessions`, :mod:`kit.serve.trace`) are subclasses that only make
other schedules, so every served mode is measured, judged and stored the same way.

The runner owns everything around the points, the same as for the in-process sweep: each finished point's row is
appended (fsync'd) to ``OUT/points.jsonl`` and ``OUT/results.parquet`` before the next starts; a re-run on the same
``OUT`` skips points already recorded as ``ok`` (points whose every request failed, ``status = "error"``, are
measured again; a point an earlier run died on, ``killed``, only with ``retry_killed``); ``resume=False``
(``--no-resume``) moves the earlier run's files, the detail files too, to ``OUT/previous/<time>/``; Ctrl-C stops
after the finished points are saved; one process writes ``OUT`` at a time. Rows concatenate with in-process rows
(:func:`kit.results.to_frame`) and plot with :func:`kit.view.plots.plot_served`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd

from kit._io import check_out_dir
from kit.errors import OutputPathError, UserError
from kit.grid import GridPoint, run_grid, split_run_options
from kit.serve.client import auth_headers, get_model_id
from kit.serve.load import LoadConfig
from kit.serve.loop import run_coro
from kit.serve.point import measure_point, served_point_id
from kit.serve.progress import PointProgress
from kit.serve.redact import redact_url, scrub
from kit.serve.schedule import RAMP_AXES, RAMP_STRATEGIES, Arrivals, Ramp
from kit.serve.server_profile import ServerProfile
from kit.serve.workload import RequestInput, fresh_seed, fresh_workload, intended_hit_rate
from kit.store import latest_rows, run_metadata

log = logging.getLogger("kit")

#: ``kit serve-bench --concurrency`` when none is given
DEFAULT_CONCURRENCIES = (1, 4, 16)


class ServedBackend:
    """The served backend of :func:`kit.grid.run_grid`: one point per (prefix fraction, concurrency).

    Args:
        config: the load point (validated here); its ``max_concurrency`` is replaced by each concurrency.
        concurrencies: max requests in flight, one grid point each (integers >= 1).
        out_dir: where the per-request detail files go (the runner's ``out_dir``).
        tokenizer: HF tokenizer (builds the prompts and counts tokens), a ``str -> int`` callable, or None.
        workload: explicit requests for every point (their sharing is unknown: the prefix-cache check is off);
            default: fresh prompts per point.
        prefix_fractions: share of each prompt common to its group of ``group_size`` requests, a sweep axis
            (each in [0, 1]; 0: every prompt distinct). Rows add ``x_prefix_fraction``, ``x_prefix_group_size``,
            ``x_prefix_hit_rate_intended``.
        extra: columns merged into every row (e.g. ``accelerator``, ``n_gpus``).
        metadata: merged into the run's JSON sidecar.
        model_error: the model list already failed (nothing is sent; every point records its requests failed).
        on_progress, on_status: progress hooks (:func:`kit.serve.loop.run_schedule`).
        server_profile: ask the server to profile each point (:mod:`kit.serve.server_profile`: ``/start_profile``
            before its first request, ``/stop_profile`` after its last; ``x_server_profile*`` columns; the points'
            ids differ from unprofiled ones). server_profile_dir: where the server writes its traces, when known: the
            folder the kit asked a server it launched to use (``server_profile_launched`` True), else the folder the
            user said (``--server-profile-dir``).

    Without ``config.model`` the model id is listed once (``/v1/models``, waiting at most ``config.models_timeout_s``)
    when the points are first asked for; if that fails every point is recorded with all its requests failed.

    Raises:
        UserError: no concurrency, one < 1, a fraction outside [0, 1], group_size < 1, or an invalid ``config``.
    """

    kind = "openai"
    #: the per-request detail files; a ``--no-resume`` run archives them with the results
    archive_globs = ("requests-*.jsonl",)

    def __init__(self, config: LoadConfig, concurrencies: Sequence[int], out_dir: str | Path, **options):
        concs = list(dict.fromkeys(int(c) for c in concurrencies))  # each once, in the order given
        if not concs or min(concs) < 1:
            raise UserError(f"concurrencies={list(concurrencies)}; give one or more integers >= 1")
        o = BackendOptions(**options).check()
        self.config, self.concurrencies, self.out_dir, self.options = config.validate(), concs, Path(out_dir), o
        self.tokenizer, self.workload, self.model_error = o.tokenizer, o.workload, o.model_error
        self.extra = dict(o.extra or {})
        if o.server_profile:  # a profiled point is not the unprofiled one: its own id, never resumed from it
            o.server_key = f"{o.server_key if o.server_key is not None else redact_url(config.base_url)} +profile"
        # one prompt seed for this run: the given one, else a new one (ids do not include it, so a re-run resumes)
        self.seed = self.config.seed if self.config.seed is not None else fresh_seed()
        self.description = f"serve-bench {config.shown_url}"
        self.disk_error: OutputPathError | None = None
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

    def base_columns(self, c: LoadConfig) -> dict:
        """The columns every point of ``c`` knows before it is measured."""
        return {
            "model": c.model,
            "device": "remote",
            "concurrency": c.max_concurrency,
            "isl": c.isl,
            "osl": c.osl,
            "request_rate": float(c.request_rate),
            "x_endpoint": c.endpoint,
            "x_fresh_prompts": self.workload is None,
            **self.extra,
        }

    def points(self) -> list[GridPoint]:
        """One point per (prefix fraction, concurrency); the model id is resolved first (it is part of each id)."""
        if self._points is None:
            self.resolve_model()
            g, self._points = self.options.group_size, []
            for frac in self.options.prefix_fractions:
                for c in (replace(self.config, max_concurrency=k) for k in self.concurrencies):
                    pid = served_point_id(c, self.options.server_key) + (f"-pf{frac:g}g{g}" if frac else "")
                    cols = self.base_columns(c) | self.prefix_columns(frac, c)
                    label = f"c={c.max_concurrency}" + (f" prefix={frac:g}" if frac else "")
                    self._points.append(GridPoint(pid, cols, label, replace(c, seed=self.seed)))
        return self._points

    def prefix_columns(self, frac: float, c: LoadConfig) -> dict:
        """The intended-sharing columns of a point (the hit rate over its measured requests; unknown for an
        explicit workload)."""
        if self.workload is not None:
            return {"x_prefix_fraction": None, "x_prefix_group_size": None, "x_prefix_hit_rate_intended": None}
        n, g = c.num_requests or 256, self.options.group_size
        return {
            "x_prefix_fraction": frac,
            "x_prefix_group_size": g,
            "x_prefix_hit_rate_intended": intended_hit_rate(n, frac, g, c.warmup_requests),
        }

    def schedule_for(self, point: GridPoint):
        """The point's closed or open loop, with its own fresh prompts (or the explicit workload)."""
        c: LoadConfig = point.config
        frac = point.columns.get("x_prefix_fraction") or 0.0
        if self.workload is not None:
            return Arrivals.from_config(c, self.workload, unique_prompts=False)
        wl = fresh_workload(c, point.point_id, self.tokenizer, frac, self.options.group_size)
        return Arrivals.from_config(c, wl, unique_prompts=frac == 0)

    def metadata(self) -> dict:
        """Run metadata with the config (URL redacted, no secret in the extra body, without the API-key variable)
        and the concurrencies."""
        secrets = self.config.secrets()
        cfg = {k: v for k, v in asdict(self.config).items() if k != "api_key_env"}
        cfg["url"] = redact_url(self.config.url)
        cfg["extra_body"] = json.loads(scrub(json.dumps(cfg["extra_body"], default=str), secrets))
        extra = self.options.metadata or {}
        cfg["seed"] = self.seed
        return run_metadata(backend=self.kind, config=cfg, concurrencies=self.concurrencies, **extra)

    @contextlib.contextmanager
    def session(self):
        """Nothing to build: each point draws its own prompts (keyed by its point id), so a prefix cache cannot
        serve a later point the earlier points' prompts."""
        yield self

    def measure(self, point: GridPoint) -> dict:
        """The row of one point: :func:`kit.serve.point.measure_point` of :meth:`schedule_for` (writes its detail
        file). Every served mode measures through here. When the disk refused a point's detail file, that point's
        row is kept (``x_detail_error``) and the next point raises the error instead of sending requests: the grid
        stops the run, keeping what finished.

        Raises:
            OutputPathError: the disk refused the previous point's detail file."""
        if self.disk_error is not None:  # the disk refused the last point's detail file: stop before sending more
            raise self.disk_error
        extra = self.extra | {k: v for k, v in point.columns.items() if k.startswith("x_")}
        profile = None
        if self.options.server_profile and not self.model_error:  # exactly around this point's requests
            c: LoadConfig = point.config
            profile = ServerProfile(c.url, auth_headers(c.api_key_env, c.url), self.options.server_profile_dir,
                                    launched=self.options.server_profile_launched)  # fmt: skip
            profile.start()
        row = measure_point(
            point.config,
            self.schedule_for(point),
            out_dir=self.out_dir,
            point_id=point.point_id,
            tokenizer=self.tokenizer,
            extra=extra,
            setup_error=self.model_error,
            on_progress=self.options.on_progress,
            on_status=self.options.on_status,
        )
        if profile is not None:
            row |= profile.stop()
        if row.get("x_detail_error"):
            self.disk_error = OutputPathError(row["x_detail_error"])
        return row

    def after_failure(self) -> dict:
        """Nothing to free (the point ran on the server): no extra columns."""
        return {}


@dataclass
class BackendOptions:
    """The options every served backend takes besides its config (see :class:`ServedBackend`)."""

    tokenizer: object = None
    workload: Sequence[RequestInput] | None = None
    prefix_fractions: Sequence[float] = (0.0,)
    group_size: int = 8
    extra: dict | None = None
    metadata: dict | None = None
    model_error: str | None = None
    server_key: str | None = None
    on_progress: Callable[[int, bool], None] | None = None
    on_status: Callable[[PointProgress], None] | None = None
    server_profile: bool = False
    server_profile_dir: str | None = None
    server_profile_launched: bool = False

    def check(self) -> BackendOptions:
        """Returns self, fractions de-duplicated. Raises: UserError naming a fraction outside [0, 1], a group size
        < 1, or fractions given with an explicit workload."""
        fr = list(dict.fromkeys(float(f) for f in self.prefix_fractions))
        if not fr or any(not 0.0 <= f <= 1.0 for f in fr) or int(self.group_size) < 1:
            raise UserError(
                f"prefix_fractions={list(self.prefix_fractions)} (each in [0, 1]), group_size={self.group_size} (>= 1)"
            )
        if self.workload is not None and fr != [0.0]:
            raise UserError(f"prefix_fractions={fr} with an explicit workload: the workload's sharing is its own")
        self.prefix_fractions, self.group_size = fr, int(self.group_size)
        return self


class RampBackend(ServedBackend):
    """One stored point whose load rises within the run (:class:`kit.serve.schedule.Ramp`): the request rate or the
    concurrency from ``start`` to ``end``, linearly or exponentially over the measured requests. Rows add
    ``x_ramp_axis``, ``x_ramp_start``, ``x_ramp_end``, ``x_ramp_strategy``; each request's record has the load it
    was sent under (``offered_rate`` / ``offered_concurrency``) and the measured ``inflight_at_send``.

    Args:
        config: the load settings; for a rate ramp its ``max_concurrency`` caps the whole run (None: no cap).
        axis, start, end, strategy: the ramp (``"rate"`` in requests/s or ``"concurrency"``; ``"linear"`` or
            ``"exponential"``).
        options: :class:`BackendOptions` (one prefix fraction at most).

    Raises:
        UserError: an unknown axis or strategy, start/end not finite and > 0, no ``num_requests``, or the base
            class's errors.
    """

    def __init__(self, config, out_dir, *, axis: str, start: float, end: float, strategy="linear", **options):
        if axis not in RAMP_AXES or strategy not in RAMP_STRATEGIES:
            raise UserError(
                f"ramp axis {axis!r} (one of {', '.join(RAMP_AXES)}), strategy {strategy!r} "
                f"(one of {', '.join(RAMP_STRATEGIES)})"
            )
        super().__init__(config, [config.max_concurrency or 1], out_dir, **options)
        self.axis, self.start, self.end, self.strategy = axis, float(start), float(end), strategy
        if config.num_requests is None:
            raise UserError("a ramp needs a request count (--num-requests), not only a duration")
        probe = [RequestInput("", None, 1)]  # bad values (or a ramp that would take days) refused now
        Ramp(probe, int(config.num_requests), axis, self.start, self.end, strategy)

    def points(self) -> list[GridPoint]:
        """The ramp's one point (its id: the config and the ramp)."""
        if self._points is None:
            base = super().points()[0]
            ramp = f"-ramp-{self.axis}{self.start:g}-{self.end:g}-{self.strategy}"
            cols = base.columns | {"x_ramp_axis": self.axis, "x_ramp_start": self.start, "x_ramp_end": self.end}
            cols["x_ramp_strategy"] = self.strategy
            label = f"ramp {self.axis} {self.start:g}→{self.end:g}"
            self._points = [GridPoint(base.point_id + ramp, cols, label, base.config)]
        return self._points

    def schedule_for(self, point: GridPoint):
        """The ramp over this point's fresh prompts."""
        c: LoadConfig = point.config
        wl = self.workload or fresh_workload(c, point.point_id, self.tokenizer)
        cap = c.max_concurrency if self.axis == "rate" else None
        kw = {"warmup": c.warmup_requests, "cap": cap, "burstiness": c.burstiness, "seed": c.seed}
        sched = Ramp(wl, c.num_requests, self.axis, self.start, self.end, self.strategy, **kw)
        sched.unique_prompts = self.workload is None
        return sched


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
        options: also :class:`BackendOptions`' fields (tokenizer, workload, prefix_fractions, extra, ...).

    Returns: this sweep's rows in the order of its points (the latest row of each, also those a resume skipped);
    every row of ``out_dir`` stays in ``out_dir/results.parquet``.

    Raises:
        UserError: no concurrency, one < 1, or an invalid ``cfg``; OutputPathError: ``out_dir`` is a file (both
            before any network work). KeyboardInterrupt: Ctrl-C, after the finished points are saved.
    """
    out = check_out_dir(out_dir)
    run_options, backend_options = split_run_options(options)
    return run_backend(ServedBackend(cfg, concurrencies, out, **backend_options), out, **run_options)


def run_backend(backend, out: Path, **run_options) -> pd.DataFrame:
    """Run a served backend's grid in ``out``; its points' latest rows, in the order of its points."""
    df = run_grid(backend, out, **run_options)
    order = {p.point_id: i for i, p in enumerate(backend.points())}
    cur = latest_rows(df, order)
    return cur.iloc[cur["point_id"].map(order).argsort()].reset_index(drop=True)
