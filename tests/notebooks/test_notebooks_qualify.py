"""The how-to "qualify a new node" notebook, executed by papermill with a 1-minute budget (nbexec.SMALL);
assertions on the files it wrote (issue 24)."""

from __future__ import annotations

import json

import pytest
from nbexec import execute

pytestmark = pytest.mark.slow


def test_qualify_a_new_node():
    ex = execute("how-to/qualify-a-new-node.ipynb")
    s = json.loads((ex.out_dir / "qualify.json").read_text())
    assert [i["item"] for i in s["items"]] == ["doctor", "ops", "seed", "power"]
    assert s["exit_code"] == 0 and s["overall"] in ("pass", "warn")
    by = {i["item"]: i for i in s["items"]}
    assert by["ops"]["verdict"] == "pass" and "eager only" in by["ops"]["reason"]
    assert by["seed"]["verdict"] in ("pass", "warn") and by["power"]["verdict"] == "skip"
    assert (ex.out_dir / "index.html").read_text().count('<tr id="row-') == 4
    assert (ex.out_dir / "seed" / "points.jsonl").exists()
    shown = [o for c in ex.nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any("overall:" in o.get("text", "") for o in shown)
