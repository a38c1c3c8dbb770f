"""Repeat a whole grid N times (``kit sweep --runs N``) so a compare has independent samples, and the test hook
that slows decode on purpose.

:class:`RepeatedBackend` wraps any grid backend: its points are the inner grid's, once per replicate, interleaved
(replicate 1 of every point, then replicate 2 of every point, ...), so a slow drift of the machine spreads over
all points instead of biasing one. Each row carries ``x_point_key`` (the inner point's id: what a compare
matches on) and ``x_run_index`` (0-based replicate); its ``point_id`` is ``<inner id>-r<k>``, so resume works
per replicate.

Test hooks: with ``KIT_INJECT_DECODE_DELAY_MS=<ms>`` in the environment, ``kit sweep`` (and
:func:`run_sweep_runs` without an explicit runner) measures through :func:`delayed_runner`: every forward call
of the model sleeps that many ms first, inside the timed steps, so TPOT grows by about that much. With
``KIT_INJECT_DECODE_SLOWDOWN=<fraction>`` (0.10) every forward call then computes for that fraction of its own
duration more (a busy wait: slower code, not a pause), so every step, the fastest included, is that much slower.
Rows record them as ``x_injected_delay_ms`` and ``x_injected_slowdown``. They exist to show a CI gate catching a
slowdown (``benchmarks/history_gate.py``); never set them in a real run.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from kit.errors import UserError
from kit.grid import GridPoint, run_grid
from kit.results import ok_mask
from kit.store import latest_rows

#: environment variable of the test hook (ms of sleep before every forward call)
DELAY_ENV = "KIT_INJECT_DECODE_DELAY_MS"
#: environment variable of the proportional test hook (extra compute per forward call, a fraction of its duration)
SLOWDOWN_ENV = "KIT_INJECT_DECODE_SLOWDOWN"


class RepeatedBackend:
    """A grid backend that runs ``inner``'s grid ``runs`` times, interleaved (see the module docstring)."""

    def __init__(self, inner, runs: int):
        if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
            raise UserError(f"runs={runs!r} (--runs) must be an integer >= 1")
        self.inner, self.runs = inner, runs
        self.kind = inner.kind
        self.description = f"{inner.description} x{runs} runs"
        self.archive_globs = tuple(getattr(inner, "archive_globs", ()))

    def points(self) -> list[GridPoint]:
        base = self.inner.points()
        return [
            GridPoint(
                f"{p.point_id}-r{k}",
                {**p.columns, "x_point_key": p.point_id, "x_run_index": k},
                f"run {k + 1}/{self.runs} {p.label}",
                p,
            )
            for k in range(self.runs)
            for p in base
        ]

    def metadata(self) -> dict:
        return {**self.inner.metadata(), "repeat_runs": self.runs}

    def session(self):
        return self.inner.session()

    def measure(self, point: GridPoint) -> dict:
        return self.inner.measure(point.config)

    def after_failure(self) -> dict:
        return self.inner.after_failure()


@contextlib.contextmanager
def _slowed(model, delay_ms: float, slowdown: float = 0.0):
    orig, own = model.forward, model.__dict__.get("forward")

    @functools.wraps(orig)
    def slow(*a, **kw):
        if delay_ms:
            time.sleep(delay_ms / 1000.0)
        t0 = time.perf_counter()
        out = orig(*a, **kw)
        if slowdown:
            end = time.perf_counter() + slowdown * (time.perf_counter() - t0)
            while time.perf_counter() < end:  # compute, not sleep: the step is that much slower code
                pass
        return out

    model.forward = slow
    try:
        yield
    finally:
        if own is None:
            del model.forward  # back to the class's method
        else:
            model.forward = own


def delayed_runner(delay_ms: float, runner: Callable | None = None, slowdown: float = 0.0) -> Callable:
    """A sweep runner (``runner(model, point, device, seed) -> record``) that sleeps ``delay_ms`` ms before every
    forward call of the model (prefill, warm-up and timed steps alike), then computes ``slowdown`` times the call's
    own duration more (0.10: every step 10 % slower), and records ``x_injected_delay_ms`` and
    ``x_injected_slowdown``.

    Raises:
        UserError: ``delay_ms`` or ``slowdown`` not a finite number >= 0.
    """
    for name, v, env in (("delay", delay_ms, DELAY_ENV), ("slowdown", slowdown, SLOWDOWN_ENV)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise UserError(f"injected {name} {v!r} must be a number >= 0 ({env})")
    from kit.measure.engine import run_point

    inner = runner or run_point

    def run(model, point, device, seed):
        with _slowed(model, float(delay_ms), float(slowdown)):
            rec = inner(model, point, device, seed)
        return {**rec, "x_injected_delay_ms": float(delay_ms), "x_injected_slowdown": float(slowdown)}

    return run


def runner_from_env(env=None) -> Callable | None:
    """:func:`delayed_runner` when ``KIT_INJECT_DECODE_DELAY_MS`` or ``KIT_INJECT_DECODE_SLOWDOWN`` is set (the
    test hooks), else None.

    Raises: UserError: a value that is not a number."""
    env = env if env is not None else os.environ
    values = {}
    for name, unit in ((DELAY_ENV, "a number of ms"), (SLOWDOWN_ENV, "a fraction (0.10 = 10 % slower)")):
        text = env.get(name)
        if text:
            try:
                values[name] = float(text)
            except ValueError:
                raise UserError(f"{name}={text!r} must be {unit}") from None
    if not values:
        return None
    return delayed_runner(values.get(DELAY_ENV, 0.0), slowdown=values.get(SLOWDOWN_ENV, 0.0))


def run_sweep_runs(config, out_dir: str | Path, runs: int = 1, *, runner: Callable | None = None, **run_options):
    """:func:`kit.measure.sweep.run_sweep` repeated ``runs`` times, interleaved (:class:`RepeatedBackend`;
    ``runs=1`` is a plain sweep with the same point ids). ``runner`` defaults to the test hook's, when set.

    Returns: every row in ``out_dir`` (DataFrame). Raises: as ``run_sweep``; UserError for ``runs`` < 1.
    """
    from kit._io import check_out_dir
    from kit.measure.sweep import EngineBackend

    check_out_dir(out_dir)
    backend = EngineBackend(config, runner or runner_from_env(), work_dir=out_dir)
    if runs != 1:
        backend = RepeatedBackend(backend, runs)
    return run_grid(backend, out_dir, **run_options)


def log_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """``(median, low, high)`` of independent positive values: the median, and Student's t interval of their
    geometric mean (log scale; NaN bounds with fewer than 2 values)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x) and x > 0], float)
    if len(v) < 2:
        return (float(v[0]) if len(v) else math.nan), math.nan, math.nan
    from scipy import stats

    lg = np.log(v)
    half = float(stats.t.ppf(0.5 + confidence / 2, len(v) - 1)) * lg.std(ddof=1) / math.sqrt(len(v))
    return float(np.median(v)), math.exp(lg.mean() - half), math.exp(lg.mean() + half)


def replicate_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per point of a repeated sweep: runs ok, median decode tok/s and TPOT p50 over the runs, each with a 95 %
    interval (:func:`log_interval`)."""
    ok = df[ok_mask(df)] if len(df) else df
    key = ok["x_point_key"] if "x_point_key" in ok.columns else ok["point_id"]
    rows = []
    for _pk, g in ok.groupby(key, sort=False):
        r = g.iloc[0]
        tok = log_interval(g["decode_tok_s"])
        tp = log_interval(g["tpot_ms_p50"])
        rows.append(
            {
                "dtype": r["dtype"],
                "kv": r["context_len"],
                "B": r["concurrency"],
                "runs_ok": len(g),
                "decode_tok_s": f"{tok[0]:.0f}",
                "tok_s 95% CI": f"[{tok[1]:.0f}, {tok[2]:.0f}]" if tok[1] == tok[1] else "-",
                "tpot_p50_ms": f"{tp[0]:.2f}",
                "tpot 95% CI": f"[{tp[1]:.2f}, {tp[2]:.2f}]" if tp[1] == tp[1] else "-",
            }
        )
    return pd.DataFrame(rows)


def current_run_rows(df: pd.DataFrame, config, runs: int = 1) -> pd.DataFrame:
    """The latest row of each point of ``config`` and each of its ``runs`` replicates in a run directory's frame
    (:func:`kit.measure.sweep.current_rows` for ``runs=1``)."""
    from kit import hardware
    from kit.measure.sweep import current_rows, sweep_point_id

    if runs == 1:
        return current_rows(df, config)
    plat = hardware.detect(config.device).platform
    ids = {f"{sweep_point_id(config, dt, plat, p)}-r{k}" for dt, p in config.points() for k in range(runs)}
    return latest_rows(df, ids)


def median_replicates(df: pd.DataFrame) -> pd.DataFrame:
    """Per point of a repeated sweep, its median replicate (the row whose decode tok/s is the median of its ok
    runs; failed points keep their last row): one real row per point, for the standard plots."""
    if "x_point_key" not in df.columns or df.empty:
        return df
    ok = ok_mask(df)
    keep = []
    for _pk, g in df.groupby("x_point_key", sort=False):
        good = g[ok.loc[g.index]].sort_values("decode_tok_s")
        keep.append(good.index[(len(good) - 1) // 2] if len(good) else g.index[-1])
    return df.loc[keep]
