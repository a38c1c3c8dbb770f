"""The machine noise a side of a compare ran under, and whether BASE and HEAD ran under the same.

A shared machine slows a measurement by taking its cores away: another job on the core of a decode thread makes
most steps wait for it, so TPOT p50 grows (2-3x on a shared 2-core box) while the fastest steps, the ones that ran
alone, keep their speed. The rows already carry what shows this:

- the **step ratio** of an in-process row: the median of its timed decode steps over the fastest one (TPOT p50 /
  TPOT min, the figure of :func:`kit.measure.sweep.noise_warning`). A quiet CPU gives about 1.1, a GPU less; a busy
  one 1.5-4. A slower kernel moves the median and the fastest step alike and leaves the ratio alone, so the ratio
  tells noise from a slowdown. A side's step ratio is the geometric mean over its ok in-process rows: a load that
  hit a few of its rows raises it (a median would hide them).
- ``x_threads``: the torch threads a CPU sweep used, one per core free when it started
  (:func:`kit.hardware.cpu_threads_for_timing`): two sides with different thread counts ran different programs.
- the cores busy with other work when the sweep started (read from ``x_threads_reason``; absent with ``--threads``).
  A neighbour that shares the core of a long forward (a prefill of tens of ms) halves it while short decode steps
  still fit between its time slices, and one on another core slows every step alike (shared caches, memory): the
  step ratio misses both, this start-up sample (0.3 s) sees them.

:func:`noise_problem` says why two sides cannot be compared, or None: different thread counts, a side that started
with :data:`BUSY_SHIFT` or more cores busy with other work than the other, step ratios more than
:data:`SHIFT_RATIO` apart, or either side noisy (step ratio above :data:`NOISY_RATIO`: its p50 carries a share of
waiting the ±3 % band cannot see past). ``kit history compare`` then answers **inconclusive** (exit
:data:`INCONCLUSIVE_EXIT`) instead of a pass. Noise only ever makes the side it hits look slower, so a verdict is
inconclusive only when the noise points its way (``direction``): a regression when HEAD was the noisier (or busy)
side, an improvement when BASE was; a HEAD slower than a noisier BASE is slower still. (A slower step that adds a
fixed time, as the kit's ``KIT_INJECT_DECODE_DELAY_MS`` hook does, lowers the ratio: that is no noise on HEAD.)
Served rows carry no step ratio (their per-request spread is the server's load, not the machine's); a side without
in-process rows has unknown noise, never a problem.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: exit code of ``kit history compare`` when BASE and HEAD ran under different machine noise
INCONCLUSIVE_EXIT = 3
#: a side whose median step / fastest step exceeds this ran on a busy machine (quiet CPU ~1.1, busy 1.5-4)
NOISY_RATIO = 1.25
#: two sides whose step ratios differ by more than this factor ran under different noise
SHIFT_RATIO = 1.10
#: a side that started with this many more cores busy with other work than the other ran under more load
BUSY_SHIFT = 1.0
#: what to do about an inconclusive compare (printed with it)
ADVICE = (
    "re-run BASE and HEAD on a quiet runner (no other jobs; `kit sweep` warns 'busy machine'), or pin --threads on "
    "a shared one, with more runs each (--runs 5) so the intervals cover the machine's drift"
)

_BUSY = re.compile(r"\(([0-9.]+) cores busy")


def busy_cores(reason) -> float | None:
    """Cores busy with other work when a CPU sweep started, from its ``x_threads_reason`` (the text of
    :func:`kit.hardware.cpu_threads_for_timing`): ``"... (1.8 cores busy with other work)"`` → 1.8, ``"... all free
    at the start"`` → 0.0; None when the text says neither (``--threads``, a GPU row, an older kit)."""
    if not isinstance(reason, str):
        return None
    m = _BUSY.search(reason)
    if m:
        return float(m[1])
    return 0.0 if "all free" in reason else None


@dataclass(frozen=True)
class SideNoise:
    """The machine noise of one side: ``step_ratio`` (geometric mean over its in-process rows of median step /
    fastest step; NaN when none), ``rows`` (the rows it is made of), ``threads`` (distinct ``x_threads``) and
    ``busy_cores`` (the most cores busy with other work at a sweep's start; None when unknown)."""

    step_ratio: float
    rows: int
    threads: tuple
    busy_cores: float | None

    def text(self) -> str:
        """One line, e.g. ``"steps 1.09x the fastest (12 rows), 1 thread(s), 1.0 core(s) busy at start"``."""
        bits = [f"steps {self.step_ratio:.2f}x the fastest ({self.rows} rows)" if self.rows else "no step times"]
        if self.threads:
            bits.append(f"{'/'.join(str(t) for t in self.threads)} thread(s)")
        if self.busy_cores is not None:
            bits.append(f"{self.busy_cores:.1f} core(s) busy at start")
        return ", ".join(bits)

    def as_dict(self) -> dict:
        ratio = self.step_ratio if math.isfinite(self.step_ratio) else None
        return {"step_ratio": ratio, "rows": self.rows, "threads": list(self.threads), "busy_cores": self.busy_cores}


def _row_field(row_json, key):
    try:
        return json.loads(row_json).get(key) if isinstance(row_json, str) else None
    except ValueError:
        return None


def side_noise(rows: pd.DataFrame, smp: pd.DataFrame) -> SideNoise:
    """:class:`SideNoise` of one side: ``rows`` in the history's ``rows`` shape (``row_json`` read for
    ``x_threads`` and ``x_threads_reason`` when present), ``smp`` its raw samples (``tpot_ms`` steps)."""
    engine = rows[rows.backend == "engine"] if "backend" in rows else rows.iloc[:0]
    steps = smp[(smp.metric == "tpot_ms") & smp.row_key.isin(engine.row_key)]
    ratios = []
    for _, v in steps.groupby("row_key")["value"]:
        v = v[np.isfinite(v) & (v > 0)]
        if len(v) >= 2:
            ratios.append(float(np.median(v) / v.min()))
    threads, busy = set(), []
    for js in engine.get("row_json", pd.Series(dtype=object)):
        t = _row_field(js, "x_threads")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
            threads.add(int(t))
        b = busy_cores(_row_field(js, "x_threads_reason"))
        if b is not None:
            busy.append(b)
    ratio = float(np.exp(np.mean(np.log(ratios)))) if ratios else math.nan
    return SideNoise(ratio, len(ratios), tuple(sorted(threads)), max(busy) if busy else None)


def noise_problem(base: SideNoise, head: SideNoise, direction: str | None = None) -> str | None:
    """Why BASE and HEAD cannot be compared for speed (one sentence naming both sides' figures), or None.

    Args:
        direction: None: any difference (different thread counts, :data:`BUSY_SHIFT` more cores busy at the start,
            step ratios more than :data:`SHIFT_RATIO` apart, a side noisier than :data:`NOISY_RATIO`): can a pass be
            trusted? ``"worse"``: only noise that makes
            HEAD look slower (HEAD the noisier or a busy side, or other thread counts): can a regression be
            trusted? ``"better"``: the mirror, for an improvement.

    Unknown noise (no in-process rows on a side) is no problem. Raises: ValueError for another ``direction``.
    """
    if direction not in (None, "worse", "better"):
        raise ValueError(f"direction={direction!r}; allowed: None, 'worse', 'better'")
    sides = f"BASE {base.text()}; HEAD {head.text()}"
    if base.threads and head.threads and base.threads != head.threads:
        return f"BASE and HEAD ran with different torch thread counts ({sides})"
    slower = {"worse": ("HEAD",), "better": ("BASE",), None: ("BASE", "HEAD")}[direction]
    busy = {"BASE": base.busy_cores, "HEAD": head.busy_cores}
    if None not in busy.values():
        more = [n for n in slower if busy[n] - busy["HEAD" if n == "BASE" else "BASE"] >= BUSY_SHIFT]
        if more:
            return f"{more[0]} started with {BUSY_SHIFT:g}+ more cores busy with other work than the other ({sides})"
    if not (math.isfinite(base.step_ratio) and math.isfinite(head.step_ratio)):
        return None
    ratio = {"BASE": base.step_ratio, "HEAD": head.step_ratio}
    noisy = [n for n in slower if ratio[n] > NOISY_RATIO]
    if noisy:
        return f"{' and '.join(noisy)} ran on a busy machine (median step above {NOISY_RATIO:g}x the fastest: {sides})"
    shift = max(ratio[n] / ratio["HEAD" if n == "BASE" else "BASE"] for n in slower)
    if shift > SHIFT_RATIO:
        return f"BASE and HEAD ran under different machine noise (step ratios {shift:.2f}x apart: {sides})"
    return None
