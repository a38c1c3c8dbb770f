"""What one item of a qualification gets (:class:`ItemContext`: the settings, the device's plan, its directory
and its share of the budget) and gives back (:class:`ItemResult`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from kit.qualification.config import Plan, QualifyConfig
from kit.qualification.verdicts import Verdict


@dataclass
class ItemContext:
    """One item's run: ``config``, ``plan``, ``out`` (the qualification's directory), ``share_s`` (its share of
    the budget, s), ``deadline`` (``time.monotonic()`` when the share is spent) and ``origins`` (item → ``"this
    run"`` for the items measured in this run so far, else the id of the earlier run whose verdict was kept)."""

    name: str
    config: QualifyConfig
    plan: Plan
    out: Path
    share_s: float
    deadline: float
    origins: dict = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        """The item's own run directory, ``OUT/<item>`` (created)."""
        d = self.out / self.name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def left_s(self) -> float:
        """Seconds left of the share (negative once spent)."""
        return self.deadline - time.monotonic()

    def should_stop(self) -> bool:
        """True once the share is spent: a grid then ends after its current point (finished points kept)."""
        return self.left_s() <= 0


@dataclass
class ItemResult:
    """What an item measured: its verdict, its figures (JSON-ready), its raw run directory, its plots (name →
    PNG path) and its headline figure (``{"name", "value", "unit", "higher_is_better"}``, compared across runs and
    nodes; None when it has none)."""

    verdict: Verdict
    figures: dict = field(default_factory=dict)
    raw_dir: str | None = None
    plots: dict = field(default_factory=dict)
    headline: dict | None = None


#: the origin of an item measured in this run (in ``ItemContext.origins``)
THIS_RUN = "this run"


def skipped(why: str) -> ItemResult:
    """The result of an item that did not run, saying why."""
    return ItemResult(Verdict("skip", why))


def headline(name: str, value, unit: str, higher_is_better: bool = True) -> dict | None:
    """A headline figure (None when ``value`` is missing)."""
    if value is None or value != value:
        return None
    return {"name": name, "value": float(value), "unit": unit, "higher_is_better": higher_is_better}
