"""Which served run ``kit serve-bench`` makes: a concurrency sweep with fresh prompts per point (and the
shared-prefix fraction as a second axis), a ramp, multi-turn sessions, a trace replay, or an SLO search.

:class:`ServedMode` holds the choice (its fields are ``kit serve-bench``'s options, one source of defaults and
help); :func:`run_mode` runs it through the grid runner and returns the rows (and, for a search, its
:class:`kit.serve.slo.SearchResult`). Every mode stores its points in the same run directory layout, so a re-run
resumes.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from kit.cli import config_field, config_flag, config_with
from kit.errors import UserError
from kit.grid import RUN_OPTIONS, split_run_options
from kit.serve.limits import (
    MAX_CONCURRENCY,
    MAX_REQUESTS,
    MAX_THINK_TIME_S,
    MAX_TIME_SCALE,
    MAX_TURNS,
    check_number,
)
from kit.serve.load import LoadConfig
from kit.serve.schedule import RAMP_AXES, RAMP_STRATEGIES
from kit.serve.sessions import SessionBackend
from kit.serve.slo import AXES, SearchResult, slo_search
from kit.serve.sweep import RampBackend, ServedBackend, run_backend
from kit.serve.trace import TraceBackend


def fraction_list(text: str) -> list[float]:
    """argparse ``type=`` of ``--prefix-fraction``: a comma list of numbers in [0, 1] (argparse names the option)."""
    try:
        vals = [float(x) for x in str(text).replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of numbers like 0,0.5,0.9") from None
    if not vals or any(not 0.0 <= v <= 1.0 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: give fractions in [0, 1], e.g. 0,0.5,0.9")
    return list(dict.fromkeys(vals))


@dataclass
class ServedMode:
    """What kind of served run to make (the defaults: a concurrency sweep with fresh prompts)."""

    search: str | None = config_field(
        None,
        choices=AXES,
        help="find the largest concurrency (or request rate) meeting the --slo-*-ms targets for --slo-fraction of "
        "requests: bracket, then bisect, each probe a stored point (start: the first --concurrency, or "
        "--request-rate for a rate search, whose concurrency cap is the largest --concurrency)",
    )
    slo_fraction: float = config_field(0.9, help="fraction of requests that must meet every SLO (--search)")
    max_load: float = config_field(1024.0, help="--search doubles the load up to this")
    prefix_fraction: list = config_field(
        default_factory=lambda: [0.0],
        parse=fraction_list,
        help="comma list: share of each prompt common to its group of --prefix-group-size requests, a sweep "
        "axis (0: every prompt of the sweep distinct)",
    )
    prefix_group_size: int = config_field(8, help="requests per shared-prefix group")
    turns: int = config_field(
        1, help="turns per conversation; > 1 runs multi-turn sessions (--concurrency counts them)"
    )
    think_time_s: float = config_field(0.0, help="pause between a reply and the next turn (s)")
    trace: str | None = config_field(
        None, help="replay this Mooncake-format JSONL trace at its timestamps (open loop; --concurrency unused)"
    )
    time_scale: float = config_field(1.0, help="multiply the trace's time line (0.5 replays twice as fast)")
    ramp: str | None = config_field(
        None,
        choices=RAMP_AXES,
        help="one point whose load rises over its --num-requests measured requests, from --ramp-start to "
        "--ramp-end: the request rate (req/s; the largest --concurrency caps it) or the concurrency; each request "
        "records the load it was sent under",
    )
    ramp_start: float = config_field(1.0, help="first load of the --ramp (req/s or concurrency)")
    ramp_end: float = config_field(16.0, help="last load of the --ramp (req/s or concurrency)")
    ramp_strategy: str = config_field("linear", choices=RAMP_STRATEGIES, help="how the --ramp rises")

    def validate(self) -> ServedMode:
        """Check the values and that at most one mode is chosen; returns self.

        Raises:
            UserError: naming the option, the value and what is allowed.
        """
        for name, rule in MODE_RULES.items():  # each bad value named alone (NaN, a string, 2.5 turns ...)
            setattr(self, name, check_number(config_flag(ServedMode, name), getattr(self, name), **rule))
        chosen = (
            ("--search", self.search),
            ("--trace", self.trace),
            ("--turns", self.turns > 1),
            ("--ramp", self.ramp),
        )
        modes = [n for n, on in chosen if on]
        if len(modes) > 1:
            raise UserError(f"{' and '.join(modes)} cannot be combined; choose one")
        if self.ramp and self.ramp_end < self.ramp_start:
            raise UserError(f"--ramp-end {self.ramp_end:g} < --ramp-start {self.ramp_start:g}: a ramp rises")
        if self.ramp == "concurrency" and not (1 <= self.ramp_start and self.ramp_end <= MAX_CONCURRENCY):
            raise UserError(
                f"--ramp concurrency from {self.ramp_start:g} to {self.ramp_end:g}: concurrencies in [1, "
                f"{MAX_CONCURRENCY:,}]"
            )
        fr = self.prefix_fraction = (
            [self.prefix_fraction] if isinstance(self.prefix_fraction, float | int) else list(self.prefix_fraction)
        )
        for f in fr:
            check_number("--prefix-fraction", f, lo=0, hi=1)
        if (self.trace or self.turns > 1 or self.ramp) and fr != [0.0] or (self.search and len(fr) > 1):
            raise UserError(
                f"prefix_fraction={fr}: a sweep axis of the concurrency sweep (one value with --search; "
                "none with --trace, --turns or --ramp)"
            )
        return self


#: the range of every number of a :class:`ServedMode` (:class:`kit.serve.limits.NumberRule` fields)
MODE_RULES = {
    "turns": {"lo": 1, "hi": MAX_TURNS, "integer": True},
    "think_time_s": {"lo": 0, "hi": MAX_THINK_TIME_S, "meaning": "s"},
    "time_scale": {"lo": 0, "lo_open": True, "hi": MAX_TIME_SCALE},
    "prefix_group_size": {"lo": 1, "hi": MAX_REQUESTS, "integer": True},
    "slo_fraction": {"lo": 0, "lo_open": True, "hi": 1},
    "max_load": {"lo": 0, "lo_open": True, "hi": MAX_CONCURRENCY, "meaning": "concurrency or req/s"},
    "ramp_start": {"lo": 0, "lo_open": True, "hi": MAX_CONCURRENCY, "meaning": "req/s or a concurrency"},
    "ramp_end": {"lo": 0, "lo_open": True, "hi": MAX_CONCURRENCY, "meaning": "req/s or a concurrency"},
}


def run_mode(
    mode: ServedMode, cfg: LoadConfig, concurrencies: Sequence[int], out_dir: str | Path, **options
) -> tuple[pd.DataFrame, SearchResult | None]:
    """Run ``mode`` against the server of ``cfg``; returns ``(rows, search)``: this run's rows (the latest of each
    of its points, in order) and the search's result (None for the other modes).

    Args:
        concurrencies: the sweep's concurrencies (sessions: conversations in flight; search: the first is the
            start, the largest the cap of a rate search).
        options: ``tokenizer``, ``extra``, ``metadata``, ``model_error``, ``on_progress``, ``on_status``
            (:class:`kit.serve.sweep.ServedBackend`) and :func:`kit.grid.run_grid`'s options.

    Raises:
        UserError: an invalid mode or config, a model list that failed (``model_error``) for a search, a rate
            search without a finite ``request_rate``. KeyboardInterrupt: Ctrl-C, after finished points are saved.
    """
    mode.validate()
    concs = [int(c) for c in concurrencies]
    out = Path(out_dir)
    if mode.search:
        if options.get("model_error"):
            raise UserError(options["model_error"])
        options.pop("model_error", None)
        kw = {k: v for k, v in options.items() if k != "on_status"}
        if mode.search == "rate":
            if math.isinf(cfg.request_rate):
                raise UserError("--search rate starts at --request-rate: give a finite one (e.g. 1)")
            cfg, start = replace(cfg, max_concurrency=max(concs)), cfg.request_rate
        else:
            start = concs[0]
        res = slo_search(
            cfg,
            out,
            axis=mode.search,
            slo_fraction=mode.slo_fraction,
            start=start,
            max_load=mode.max_load,
            prefix_fraction=mode.prefix_fraction[0],
            **kw,
        )
        return res.rows, res
    run_options, backend_options = split_run_options(options)
    return run_backend(mode_backend(mode, cfg, concs, out, **backend_options), out, **run_options), None


def mode_backend(mode: ServedMode, cfg: LoadConfig, concs: list[int], out: Path, **backend_options) -> ServedBackend:
    """The served backend that runs ``mode`` (any mode but a search, whose probes are chosen as it goes).

    Raises:
        UserError: ``--request-rate`` with a rate ramp; a bad backend option (:class:`kit.serve.sweep.BackendOptions`).
    """
    if mode.trace:
        return TraceBackend(cfg, mode.trace, out, time_scale=mode.time_scale, **backend_options)
    if mode.turns > 1:
        return SessionBackend(cfg, concs, out, turns=mode.turns, think_time_s=mode.think_time_s, **backend_options)
    if mode.ramp:
        if mode.ramp == "rate" and math.isfinite(cfg.request_rate):
            raise UserError(
                f"--request-rate {cfg.request_rate:g} with --ramp rate: the ramp sets the rate (--ramp-start, "
                "--ramp-end); leave --request-rate unset"
            )
        ramp = {"axis": mode.ramp, "start": mode.ramp_start, "end": mode.ramp_end, "strategy": mode.ramp_strategy}
        return RampBackend(replace(cfg, max_concurrency=max(concs)), out, **ramp, **backend_options)
    fr, g = mode.prefix_fraction, mode.prefix_group_size
    return ServedBackend(cfg, concs, out, prefix_fractions=fr, group_size=g, **backend_options)


def front_door_configs(url: str, concurrency, out_dir, options: dict) -> tuple:
    """``(mode, cfg, concurrencies, run options)`` of a library call (:func:`serve_bench`,
    :func:`kit.serve.launched.launch_bench`), every value checked before any network work.

    Raises:
        UserError: a bad value (named, with what is allowed), an unknown option.
    """
    if out_dir is None or str(out_dir) == "":
        raise UserError(f"out_dir={out_dir!r}: give a directory for the results")
    concs = [concurrency] if isinstance(concurrency, int | float) else concurrency
    if not isinstance(concs, list | tuple) or not concs:
        raise UserError(f"concurrency={concurrency!r}: give an integer >= 1 or a list of them")
    concs = [check_number("concurrency", c, lo=1, hi=MAX_CONCURRENCY, integer=True) for c in concs]
    cfg, rest = config_with(LoadConfig, None, {"url": url, "max_concurrency": concs[0], **options})
    mode, rest = config_with(ServedMode, None, rest)
    allowed = set(FRONT_DOOR_OPTIONS) | set(RUN_OPTIONS)
    if set(rest) - allowed:
        raise UserError(
            f"unknown option(s) {sorted(set(rest) - allowed)}; give LoadConfig or ServedMode fields, "
            f"or one of {', '.join(sorted(allowed))}"
        )
    return mode, cfg.validate(), concs, rest


#: the served backend's options ``serve_bench`` takes (its other fields are set by the modes themselves)
FRONT_DOOR_OPTIONS = (
    "tokenizer",
    "extra",
    "metadata",
    "on_progress",
    "on_status",
    "server_profile",
    "server_profile_dir",
)


def serve_bench(
    url: str, concurrency: Sequence[int] = (1, 4, 16), out_dir: str | Path = "results/serve-bench", **options
) -> pd.DataFrame:
    """Benchmark an OpenAI-compatible endpoint from a notebook or script: what ``kit serve-bench`` runs.

    ``kit.serve_bench("http://127.0.0.1:8000", [1, 8], isl=128, osl=64, num_requests=32)`` sweeps concurrency with
    fresh prompts per point; ``turns=3``, ``trace=...``, ``ramp="rate"`` or ``search="concurrency"`` choose another
    mode (:class:`ServedMode`).

    Args:
        url: the server's base URL (a trailing ``/v1`` is accepted).
        concurrency: the concurrencies (sessions: conversations in flight; search: the first is the start).
        out_dir: the run directory (a re-run resumes).
        options: :class:`kit.serve.load.LoadConfig` fields (``isl``, ``osl``, ``num_requests``, ``request_rate``,
            SLOs ...), :class:`ServedMode` fields, the served backend's options (``tokenizer``, ``extra``, ...;
            ``server_profile=True`` brackets each point with the server's profile endpoints,
            :mod:`kit.serve.server_profile`) and :func:`kit.grid.run_grid`'s options (``resume``, ``progress``, ...).

    Returns: this run's rows (the latest of each of its points, in order); an SLO search's
    :class:`kit.serve.slo.SearchResult` is ``rows.attrs["search"]``.

    Raises:
        UserError: a bad value (named, with what is allowed), before any network work. KeyboardInterrupt: Ctrl-C,
            after the finished points are saved.
    """
    mode, cfg, concs, rest = front_door_configs(url, concurrency, out_dir, options)
    rows, search = run_mode(mode, cfg, concs, out_dir, **rest)
    if search is not None:  # a copy: search.rows in its own attrs would recurse in every pandas deepcopy
        rows = rows.copy()
        rows.attrs["search"] = search
    return rows
