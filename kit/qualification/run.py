"""Run a qualification: its items as one grid of the kit's grid runner (:func:`kit.grid.run_grid`, backend
``qualify``): each item is a point, recorded in ``OUT/items/points.jsonl`` the moment it finishes (fsync'd), so an
interrupt loses no finished item and a re-run resumes — items that passed or warned are kept, the others run (a
failed item is flagged, like an invalid point, and a skipped one may run now, so both are looked at again; their
own run directories resume what they finished). Each item runs under its share of what is left of the budget
(:data:`kit.qualification.config.ITEMS` weights): its grids stop starting points when the share is spent.

The history database and the comparison with the previous qualification are :mod:`kit.qualification.history`; the
report is :mod:`kit.qualification.report`; :func:`kit.qualification.node.qualify` runs all three.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path

import pandas as pd

from kit._io import check_out_dir
from kit.grid import GridPoint, run_grid
from kit.qualification import items_check, items_device, items_load
from kit.qualification.config import ITEM_TITLES, ITEMS, Plan, QualifyConfig, plan
from kit.qualification.context import THIS_RUN, ItemContext, skipped
from kit.qualification.verdicts import with_overrun

log = logging.getLogger("kit")

#: item name → the function that runs it (``ItemContext → ItemResult``)
RUNNERS = {
    "doctor": items_check.run_doctor_item,
    "ops": items_check.run_ops_item,
    "seed": items_load.run_seed_item,
    "served": items_load.run_served_item,
    "kv": items_load.run_kv_item,
    "comm": items_device.run_comm_item,
    "power": items_load.run_power_item,
    "calibrate": items_device.run_calibrate_item,
    "planner": items_device.run_planner_item,
}


def item_point_id(name: str, config: QualifyConfig, p: Plan) -> str:
    """Stable key of one item: its name, the plan's choices and every setting that changes what it measures or
    how it is judged (a re-run with other settings runs it again; the budget is not part of it)."""
    keep = ("model", "dtype", "isl", "osl", "concurrencies", "compile_backend", "compile_dtypes", "kv_cap", "platform")
    key = [name, {k: getattr(p, k) for k in keep}, config.url, config.served_model, config.launch, config.op_impls,
           config.compile_ops, config.kv_budget_gb, config.nnodes, dataclasses.asdict(config.thresholds)]  # fmt: skip
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def verdict_line(name: str, verdict: str, reason: str, kept: bool = False) -> str:
    """The terminal line of one item's verdict (``kept``: the verdict of an earlier run, kept on resume)."""
    return f"kit qualify: {name}: {verdict.upper()} — {reason}" + (" (kept from the earlier run)" if kept else "")


def earlier_runs(items_dir: Path) -> dict:
    """Item → the id of the run that recorded its latest row in ``items_dir`` (empty when nothing ran there)."""
    from kit.store import load_results

    if not (items_dir / "points.jsonl").exists():
        return {}
    df = load_results(items_dir)
    if df.empty or "x_item" not in df:
        return {}
    return {str(r["x_item"]): str(r["run_id"]) for _, r in df.iterrows()}  # later rows win


class QualifyBackend:
    """The grid backend of a qualification: one point per item (see the module docstring)."""

    kind = "qualify"

    def __init__(self, config: QualifyConfig, p: Plan, out: Path, echo=print):
        self.config, self.plan, self.out, self.echo = config, p, out, echo
        self.description = "qualify"
        self.end: float | None = None  # the budget clock starts when the first item starts (not at start-up)
        self._pending = list(config.items)
        self.origins = earlier_runs(out / "items") if config.resume else {}  # item → run kept, or THIS_RUN
        self.fresh: list[str] = []  # items measured in this run, in order

    def points(self) -> list[GridPoint]:
        p = self.plan
        cols = {"model": p.model, "dtype": p.dtype, "device": p.platform, "device_name": p.device_name,
                "accelerator": p.catalog_name, "n_gpus": p.n_devices}  # fmt: skip
        return [GridPoint(item_point_id(n, self.config, p), {**cols, "x_item": n}, n, n) for n in self.config.items]

    def metadata(self) -> dict:
        from kit.store import run_metadata

        cfg = {k: v for k, v in dataclasses.asdict(self.config).items() if k != "thresholds"}
        return run_metadata(kind="qualify", config=cfg, thresholds=dataclasses.asdict(self.config.thresholds),
                            plan={k: v for k, v in dataclasses.asdict(self.plan).items()})  # fmt: skip

    def session(self):
        return contextlib.nullcontext(self)

    def share_s(self, name: str) -> float:
        """``name``'s share of what is left of the budget: left × its weight / the weights of the items still to
        run (an item that finishes early leaves its time to the later ones). The budget clock starts at the first
        item's share, so start-up (imports, device detection) does not count."""
        todo = self._pending[self._pending.index(name) :] if name in self._pending else [name]
        if self.end is None:
            self.end = time.monotonic() + self.config.budget_s
        left = self.end - time.monotonic()
        return max(0.0, left * ITEMS[name] / sum(ITEMS[n] for n in todo))

    def measure(self, point: GridPoint) -> dict:
        name = point.config
        share = self.share_s(name)
        self._pending = self._pending[self._pending.index(name) + 1 :]
        self.fresh.append(name)
        self.origins[name] = THIS_RUN
        if share <= 0:
            res = skipped("the budget was spent before this item started (raise --budget, or re-run to resume)")
        else:
            self.echo(f"kit qualify: {name} ({ITEM_TITLES[name]}), share {share:.0f} s ...")
            ctx = ItemContext(name, self.config, self.plan, self.out, share, time.monotonic() + share, self.origins)
            t0 = time.monotonic()
            res = RUNNERS[name](ctx)
            res.verdict = with_overrun(res.verdict, time.monotonic() - t0, share, self.config.thresholds)
            res.figures["elapsed_s"] = round(time.monotonic() - t0, 1)
        v = res.verdict
        self.echo(verdict_line(name, v.verdict, v.reason))
        return {
            "status": "skipped" if v.verdict == "skip" else "ok",
            "error": v.reason if v.verdict == "fail" else None,
            "x_verdict": v.verdict,
            "x_reason": v.reason,
            "x_threshold": v.threshold,
            "x_share_s": round(share, 1),
            "x_elapsed_s": res.figures.get("elapsed_s"),
            "x_figures": json.dumps(res.figures, default=str),
            "x_plots": json.dumps(res.plots),
            "x_raw_dir": res.raw_dir,
            "x_headline": json.dumps(res.headline) if res.headline else None,
            "x_valid": v.verdict != "fail",
            "x_invalid_reasons": v.reason if v.verdict == "fail" else None,
        }

    def after_failure(self) -> dict:
        return {}


def item_rows(frame: pd.DataFrame, config: QualifyConfig, p: Plan) -> list[dict]:
    """One dict per item of ``config`` (in order) from the qualification's stored rows: ``item``, ``title``,
    ``verdict``, ``reason``, ``threshold``, ``share_s``, ``elapsed_s``, ``figures``, ``plots``, ``raw_dir``,
    ``headline``, ``run_id`` (the grid run that recorded it; :func:`run_items` adds ``kept``: the verdict of an
    earlier run, kept on resume); an item that raised is a ``fail`` naming the error,
    one with no row a ``skip``."""
    latest = {}
    for rec in json.loads(frame.to_json(orient="records")) if len(frame) else []:
        latest[rec.get("point_id")] = rec
    out = []
    for name in config.items:
        r = latest.get(item_point_id(name, config, p))
        base = {"item": name, "title": ITEM_TITLES[name], "figures": {}, "plots": {}, "raw_dir": None, "run_id": None,
                "headline": None, "share_s": None, "elapsed_s": None, "threshold": ""}  # fmt: skip
        if r is None:
            out.append({**base, "verdict": "skip", "reason": "not run (the qualification stopped before it)"})
        elif r.get("status") in ("error", "oom", "killed"):
            out.append({**base, "verdict": "fail", "reason": f"the item raised: {r.get('error')}",
                        "threshold": "the item runs to the end"})  # fmt: skip
        else:
            out.append({**base, "verdict": r["x_verdict"], "reason": r["x_reason"], "threshold": r["x_threshold"],
                        "run_id": r.get("run_id"),
                        "share_s": r.get("x_share_s"), "elapsed_s": r.get("x_elapsed_s"),
                        "figures": json.loads(r.get("x_figures") or "{}"),
                        "plots": json.loads(r.get("x_plots") or "{}"),
                        "raw_dir": r.get("x_raw_dir"),
                        "headline": json.loads(r["x_headline"]) if r.get("x_headline") else None})  # fmt: skip
    return out


def run_items(config: QualifyConfig, echo=print) -> tuple[Plan, list[dict], Path]:
    """Run (or resume) the items of ``config`` in ``config.out``; ``(plan, item rows, items directory)``.

    Raises:
        UserError / OutputPathError: bad settings (model, dtype, ISL/OSL, URL, ...) or output path, before any
            item runs. KeyboardInterrupt: after
            the finished items are saved.
    """
    config = config.validate()
    out = check_out_dir(config.out, "--out", "results/qualify")
    items_check.op_impls(config.op_impls)  # a bad --op-impl is a user error now, not a failed item later
    p = plan(config)
    items_load.check_workload(config, p)  # a bad model, dtype, ISL/OSL or --threads: a user error now
    for line in p.choices:
        echo(f"kit qualify: {line}")
    backend = QualifyBackend(config, p, out, echo)
    frame = run_grid(backend, out / "items", resume=config.resume, progress=False)
    items = item_rows(frame, config, p)
    for i in items:
        i["kept"] = i["item"] not in backend.fresh and i["run_id"] is not None
    return p, items, out / "items"
