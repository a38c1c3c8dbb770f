"""SLO search: the largest concurrency (or request rate) at which a server meets its latency targets for a given
fraction of requests.

A load *meets the SLO* when at least ``slo_fraction`` of its measured requests completed and met every given
target (``slo_ttft_ms``, ``slo_tpot_ms``, ``slo_e2el_ms`` of the :class:`kit.serve.load.LoadConfig`, inclusive,
:func:`kit.metrics.meets_slo`; a failed request does not meet it). The search probes ``start``, doubles the load
until a probe fails (the bracket), then bisects between the last load that met it and the first that did not:
to one request for concurrency, to ``rate_tolerance`` (relative) for a rate. The answer assumes latency grows
with load (the usual case); every probe is kept, so a non-monotone server shows in the probe table.

Each probe is a stored point of the grid runner in ``out_dir`` (:class:`kit.serve.sweep.ServedBackend`:
fresh prompts per probe, so a prefix cache does not serve a later probe the earlier prompts), so a search that is
stopped and started again on the same ``out_dir`` skips the probes already measured.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from kit import results as R
from kit.errors import UserError
from kit.grid import run_grid, split_run_options
from kit.serve.client import get_model_id
from kit.serve.load import LoadConfig
from kit.serve.loop import run_coro
from kit.serve.sweep import ServedBackend

log = logging.getLogger("kit")

#: search axes and the load each probe varies
AXES = ("concurrency", "rate")


def fraction_met(row: dict) -> float:
    """Fraction of a row's measured requests that completed and met every SLO: ``x_good_requests`` /
    (``completed`` + ``failed``); NaN when the row has no request or no SLO."""
    n = int(row.get("completed") or 0) + int(row.get("failed") or 0)
    good = row.get("x_good_requests")
    return float(good) / n if n and good is not None and not pd.isna(good) else math.nan


def _ms(x: float) -> str:
    return f"{x / 1000:g} s" if x >= 1000 else f"{x:g} ms"


def answer_line(cfg: LoadConfig, axis: str, fraction: float, answer, largest_probed) -> str:
    """The search's answer in one line, e.g. "this server meets TTFT ≤ 2 s and TPOT ≤ 50 ms for 90 % of
    requests up to concurrency 48"."""
    slos = [(n, v) for n, v in (("TTFT", cfg.slo_ttft_ms), ("TPOT", cfg.slo_tpot_ms), ("E2E latency", cfg.slo_e2el_ms))]
    what = " and ".join(f"{n} ≤ {_ms(v)}" for n, v in slos if v is not None)
    unit = "concurrency {}" if axis == "concurrency" else "{} requests/s"
    pct = f"{fraction * 100:g} %"
    if answer is None:
        return f"this server does not meet {what} for {pct} of requests even at {unit.format(f'{largest_probed:g}')}"
    more = " (the largest load probed; it may take more)" if answer == largest_probed else ""
    return f"this server meets {what} for {pct} of requests up to {unit.format(f'{answer:g}')}{more}"


@dataclass
class SearchResult:
    """The outcome of :func:`slo_search`: ``answer`` (largest load that met the SLO; None if none did),
    ``bracket`` (last load met, first load not met; None where unknown), ``line`` (the one-line answer),
    ``probes`` (one row per probe in the order run: load, fraction_met, met, verdict (``met``, ``missed``, or
    ``errors`` when more requests failed than the SLO fraction allows: the server failed, it was not slow; the
    search stops there and the line names it), failed, error, status, problems (the row's problem flags),
    client_bound, point_id) and ``rows`` (the probes' results rows)."""

    axis: str
    answer: float | None
    bracket: tuple
    line: str
    slo_fraction: float
    probes: pd.DataFrame
    rows: pd.DataFrame = field(repr=False)

    def to_json(self) -> dict:
        """``search`` of ``kit serve-bench --json``: axis, answer, bracket, line, fraction, SLOs and probes."""
        return {
            "axis": self.axis,
            "answer": self.answer,
            "bracket": list(self.bracket),
            "line": self.line,
            "slo_fraction": self.slo_fraction,
            "probes": self.probes.astype(object).where(self.probes.notna(), None).to_dict("records"),
        }


@dataclass
class SearchSpec:
    """How :func:`slo_search` searches.

    Attributes:
        axis: ``"concurrency"`` or ``"rate"`` (requests/s).
        slo_fraction: fraction of requests that must meet every SLO, in (0, 1].
        start: first load probed (concurrency >= 1, or req/s > 0); max_load: the bracket stops here.
        rate_tolerance: the rate search stops when (first failing − last meeting) / last meeting ≤ this.
        max_probes: probes at most (a search that hits it reports its best bracket so far).
        min_waves: a concurrency probe sends at least ``min_waves × concurrency`` measured requests (more than
            ``num_requests`` when needed): with fewer requests than the concurrency the load is never reached.
        prefix_fraction: shared-prefix fraction of each probe's workload (0: all prompts distinct).
    """

    axis: str = "concurrency"
    slo_fraction: float = 0.9
    start: float = 1
    max_load: float = 1024
    rate_tolerance: float = 0.1
    max_probes: int = 32
    min_waves: float = 2.0
    prefix_fraction: float = 0.0

    def check(self, cfg: LoadConfig) -> SearchSpec:
        """Returns self. Raises: UserError for an unknown axis, no SLO in ``cfg``, a fraction outside (0, 1], or
        start/max_load out of range."""
        if self.axis not in AXES:
            raise UserError(f"search axis {self.axis!r}; allowed: {list(AXES)}")
        if all(s is None for s in (cfg.slo_ttft_ms, cfg.slo_tpot_ms, cfg.slo_e2el_ms)):
            raise UserError("an SLO search needs at least one of slo_ttft_ms, slo_tpot_ms, slo_e2el_ms (--slo-*-ms)")
        if not 0 < self.slo_fraction <= 1:
            raise UserError(f"slo_fraction={self.slo_fraction}; must be in (0, 1] (0.9: 90 % of requests)")
        if not (0 < self.start <= self.max_load) or (self.axis == "concurrency" and self.start < 1):
            raise UserError(
                f"start={self.start}, max_load={self.max_load}; need 0 < start <= max_load (concurrency >= 1)"
            )
        return self


def slo_search(cfg: LoadConfig, out_dir: str | Path, **options) -> SearchResult:
    """Bracket, then bisect, an axis to the largest load meeting the SLOs of ``cfg`` for a fraction of requests
    (see the module text).

    Args:
        cfg: the load point; its SLO fields are the targets. For ``axis="rate"`` its ``max_concurrency`` caps
            the requests in flight (None: unbounded).
        out_dir: the run directory; every probe is stored there and found again by a later search.
        options: :class:`SearchSpec`'s fields (``axis``, ``slo_fraction``, ``start``, ``max_load`` ...), the
            served backend's options (``tokenizer``, ``extra``, ``metadata``, ``on_progress``,
            :class:`kit.serve.sweep.BackendOptions`) and :func:`kit.grid.run_grid`'s options (``resume``,
            ``progress``, ``on_point``, ...; ``resume=False`` archives the earlier files once, before the first
            probe).

    Raises:
        UserError: an unknown axis, no SLO in ``cfg``, a fraction outside (0, 1], start/max_load out of range, an
            invalid ``cfg``, or no model id. KeyboardInterrupt: Ctrl-C, after the finished probes are saved.
    """
    spec = SearchSpec(**{k: options.pop(k) for k in list(options) if k in SearchSpec.__dataclass_fields__})
    spec.check(cfg)
    cfg = cfg.validate()
    if not cfg.model:
        cfg = replace(cfg, model=run_coro(get_model_id(cfg.url, cfg.api_key_env, cfg.models_timeout_s)))
    search = Search(cfg, Path(out_dir), spec, options)
    lo, hi = search.bisect(*search.bracket())
    if spec.axis == "concurrency":  # loads are whole numbers of requests in flight
        lo, hi = (None if v is None else int(v) for v in (lo, hi))
    line = answer_line(cfg, spec.axis, spec.slo_fraction, lo, max(p["load"] for p in search.probes))
    if search.stopped:
        line += f"; the search stopped at {search.stopped}"
    return SearchResult(
        spec.axis, lo, (lo, hi), line, spec.slo_fraction, pd.DataFrame(search.probes), pd.DataFrame(search.rows)
    )


class Search:
    """The probes of one :func:`slo_search` (each a stored point of the served backend in ``out``)."""

    def __init__(self, cfg: LoadConfig, out: Path, spec: SearchSpec, options: dict):
        self.cfg, self.out, self.spec = cfg, out, spec
        self.run_options, self.backend_options = split_run_options(options)
        self.probes: list[dict] = []
        self.rows: list[dict] = []
        self.stopped: str | None = None  # the probe whose requests failed, named (the search ends there)

    def probe(self, load: float) -> bool:
        """Measure (or find stored) the point at ``load``; True when it met the SLOs for the fraction asked."""
        cfg, spec = self.cfg, self.spec
        if spec.axis == "concurrency":  # enough requests to hold the load for min_waves rounds
            n = max(int(cfg.num_requests or 0), math.ceil(spec.min_waves * load))
            c, concs = replace(cfg, num_requests=n), [int(load)]
        else:
            c, concs = replace(cfg, request_rate=float(load)), [int(cfg.max_concurrency or 10**6)]
        fr = [spec.prefix_fraction]
        backend = ServedBackend(c, concs, self.out, prefix_fractions=fr, **self.backend_options)
        df = run_grid(backend, self.out, **self.run_options)
        self.run_options["resume"] = True  # a non-resumed search archives the earlier files once
        pid = backend.points()[0].point_id
        row = df[df["point_id"] == pid].iloc[-1].to_dict()
        frac = fraction_met(row)
        met = bool(frac >= spec.slo_fraction)
        n, failed = int(row.get("completed") or 0) + int(row.get("failed") or 0), int(row.get("failed") or 0)
        verdict = "met" if met else "missed"
        if failed and failed > (1 - spec.slo_fraction) * n:  # the server failed requests: not a latency answer
            verdict = "errors"
            self.stopped = f"{spec.axis} {load:g}: {failed} of {n} requests failed ({row.get('error')})"
            log.warning("probe %s", self.stopped)
        if row.get("x_client_bound"):
            log.warning("probe %s=%g: %s", spec.axis, load, row.get("x_client_warning"))
        self.probes.append({"load": load, "fraction_met": frac, "met": met, "verdict": verdict, "failed": failed})
        self.probes[-1] |= {"error": row.get("error"), "status": row.get("status")}
        problems = "; ".join(R.row_problems(row)) or None
        self.probes[-1] |= {"problems": problems, "client_bound": row.get("x_client_bound"), "point_id": pid}
        self.rows.append(row)
        return met

    def bracket(self) -> tuple[float | None, float | None]:
        """Double the load from ``start`` until a probe fails (or ``max_load``): (last met, first failed)."""
        spec = self.spec
        lo, hi, load = None, None, float(int(spec.start) if spec.axis == "concurrency" else spec.start)
        while len(self.probes) < spec.max_probes:
            if not self.probe(load):
                return (lo, None) if self.stopped else (lo, load)
            lo = load
            if load >= spec.max_load:
                break
            load = min(load * 2, spec.max_load)
        return lo, hi

    def bisect(self, lo: float | None, hi: float | None) -> tuple[float | None, float | None]:
        """Halve the bracket to one request (concurrency) or ``rate_tolerance`` (rate)."""
        spec = self.spec
        while lo is not None and hi is not None and len(self.probes) < spec.max_probes and not self.stopped:
            if (spec.axis == "concurrency" and hi - lo <= 1) or (
                spec.axis == "rate" and (hi - lo) / lo <= spec.rate_tolerance
            ):
                break
            mid = float((lo + hi) // 2) if spec.axis == "concurrency" else (lo + hi) / 2
            lo, hi = (mid, hi) if self.probe(mid) else (lo, mid)
        return (lo, None) if self.stopped else (lo, hi)
