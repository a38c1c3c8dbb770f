"""A qualification in the history database (:mod:`kit.track.db`): one row per item (backend ``qualify``), and the
comparison of this qualification with the previous one stored for the same device."""

from __future__ import annotations

import json
from pathlib import Path

from kit.errors import KitError
from kit.track.db import Provenance, add_run, git_provenance, list_runs, load_rows


def provenance() -> Provenance:
    """The commit of the stack under test: the kit's own git checkout (branch, dirty flag, tag), else the commit
    recorded in the run metadata's way, else ``"unknown"``."""
    try:
        return git_provenance(Path(__file__).resolve().parents[2])
    except KitError:
        from kit.store import run_metadata

        return Provenance(run_metadata().get("git_commit") or "unknown")


def _item_states(db: str | Path, run_keys: list[str]) -> dict:
    """``{item: {"verdict", "headline"}}`` of the qualify rows of ``run_keys`` (the latest row per item)."""
    rows = load_rows(db, run_keys)
    rows = rows[rows["backend"] == "qualify"].sort_values("created_utc") if len(rows) else rows
    out = {}
    for js in rows.get("row_json", []):
        r = json.loads(js)
        out[r.get("x_item")] = {"verdict": r.get("x_verdict"),
                                "headline": json.loads(r["x_headline"]) if r.get("x_headline") else None}  # fmt: skip
    return out


def compare_previous(db: str | Path, current_keys: list[str], device_name: str) -> dict | None:
    """This qualification (runs ``current_keys``) against the previous qualification of the same device in
    ``db``: ``{"previous": {run_key, commit, created_utc}, "items": [{item, before, now, headline, before_value,
    now_value, change}], "text": one line}``; None when there is no earlier qualification.

    ``change`` is ``now / before - 1`` of the item's headline figure (positive is better when the figure's
    ``higher_is_better``)."""
    runs = list_runs(db)
    q = runs[runs["backends"].fillna("").str.contains("qualify") & ~runs["run_key"].isin(current_keys)]
    same = q[q["device_name"] == device_name]
    q = same if len(same) else q
    if q.empty:
        return None
    prev = q.sort_values("created_utc").iloc[-1]
    before, now = _item_states(db, [prev["run_key"]]), _item_states(db, current_keys)
    items, changed = [], []
    for name, cur in now.items():
        old = before.get(name)
        if old is None:
            continue
        hb, hn = old.get("headline"), cur.get("headline")
        bv, nv = (hb or {}).get("value"), (hn or {}).get("value")
        change = nv / bv - 1 if bv and nv is not None else None
        items.append({"item": name, "before": old["verdict"], "now": cur["verdict"],
                      "headline": (hn or hb or {}).get("name"), "before_value": bv, "now_value": nv,
                      "change": change})  # fmt: skip
        if old["verdict"] != cur["verdict"]:
            changed.append(f"{name} {old['verdict']} -> {cur['verdict']}")
    head = f"compared with the previous qualification ({prev['created_utc']}, commit {str(prev['commit'])[:12]})"
    text = head + (": " + "; ".join(changed) if changed else ": no verdict changed")
    return {"previous": {"run_key": prev["run_key"], "commit": prev["commit"], "created_utc": prev["created_utc"]},
            "items": items, "text": text}  # fmt: skip


def record(db: str | Path, items_dir: str | Path, device_name: str, run_ids) -> dict:
    """Add the qualification's item rows in ``items_dir`` to ``db`` (rows already there are kept once) and compare
    this qualification — the grid runs ``run_ids`` its items were recorded by (a resumed one spans several) — with
    the previous one: ``{"added": add_run's answer, "comparison": compare_previous's (or None)}``.

    Raises:
        UserError / OutputPathError: the database cannot be created, is locked or damaged.
    """
    added = add_run(db, items_dir, provenance())
    runs = list_runs(db)
    current = list(runs[runs["run_id"].isin([r for r in run_ids if r])]["run_key"])
    return {"added": added, "comparison": compare_previous(db, current, device_name)}
