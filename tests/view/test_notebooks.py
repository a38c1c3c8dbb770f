"""kit.view.notebooks (declared parameters, the papermill runner's refusals, strip, build) and one source of defaults
for the notebooks' sweep parameters. Nothing here starts a kernel."""

from __future__ import annotations

import ast
import dataclasses

import nbformat
import pytest

from kit.errors import UserError
from kit.measure.sweep import SweepConfig
from kit.view.notebooks import (
    NOTEBOOK_DIR,
    declared_parameters,
    list_notebooks,
    new_notebook,
    run_notebook,
    strip_outputs,
)

#: notebook parameter → SweepConfig field it sets (a singular name sets a one-item list)
SWEEP_PARAMETERS = {
    "model": "model",
    "dtype": "dtypes",
    "dtypes": "dtypes",
    "device": "device",
    "kv_lens": "kv_lens",
    "concurrency": "concurrencies",
    "concurrencies": "concurrencies",
    "decode_steps": "decode_steps",
    "warmup_steps": "warmup_steps",
    "repeats": "repeats",
    "kv_fill": "kv_fill",
    "seed": "seed",
}
SMALL_CPU = "a small CPU value, so the notebook runs in seconds on a laptop"
#: (notebook, parameter) whose default differs from SweepConfig() on purpose, and why. Anything else must agree.
DIFFERS = {
    ("tutorials/02-explore-with-the-panel.ipynb", "kv_lens"): SMALL_CPU + " (two runs, one stopped half-way)",
    ("tutorials/02-explore-with-the-panel.ipynb", "concurrencies"): SMALL_CPU,
    ("tutorials/02-explore-with-the-panel.ipynb", "decode_steps"): SMALL_CPU,
    ("tutorials/02-explore-with-the-panel.ipynb", "repeats"): SMALL_CPU,
    ("how-to/compare-dtypes.ipynb", "dtypes"): "the subject: every model dtype, the first is the baseline",
    ("how-to/compare-dtypes.ipynb", "kv_lens"): SMALL_CPU + " (three dtypes)",
    ("how-to/compare-dtypes.ipynb", "concurrencies"): SMALL_CPU + " (three dtypes)",
    ("how-to/compare-dtypes.ipynb", "decode_steps"): SMALL_CPU,
    ("how-to/compare-dtypes.ipynb", "repeats"): SMALL_CPU,
    ("how-to/compare-two-result-sets.ipynb", "kv_lens"): SMALL_CPU + " (two tiny runs when no set is given)",
    ("how-to/compare-two-result-sets.ipynb", "concurrencies"): SMALL_CPU + " (two tiny runs)",
    ("how-to/compare-two-result-sets.ipynb", "decode_steps"): SMALL_CPU + " (two tiny runs)",
    ("how-to/export-results-for-ci.ipynb", "kv_lens"): SMALL_CPU + " (a tiny run when no results are given)",
    ("how-to/export-results-for-ci.ipynb", "concurrencies"): SMALL_CPU + " (a tiny run)",
    ("how-to/export-results-for-ci.ipynb", "decode_steps"): SMALL_CPU + " (a tiny run)",
    ("how-to/find-the-concurrency-knee.ipynb", "kv_lens"): "the subject: one knee, at one KV length",
    ("how-to/find-the-concurrency-knee.ipynb", "concurrencies"): "the subject: a doubling grid up to 32",
    ("how-to/find-the-concurrency-knee.ipynb", "decode_steps"): SMALL_CPU + " (six concurrencies)",
    ("how-to/find-the-concurrency-knee.ipynb", "repeats"): SMALL_CPU + " (six concurrencies)",
    ("how-to/sweep-kv-cache-length.ipynb", "concurrency"): "the subject: TPOT against KV length at one concurrency",
    ("how-to/sweep-kv-cache-length.ipynb", "kv_fill"): "synthetic: long contexts without a prefill each",
    ("how-to/run-the-seed-workload.ipynb", "dtype"): "the seed workload's dtype",
    ("how-to/run-the-seed-workload.ipynb", "concurrencies"): "the seed workload's concurrencies (24 and 64)",
    ("how-to/run-the-seed-workload.ipynb", "repeats"): SMALL_CPU + " (concurrency 64)",
    ("how-to/load-a-local-checkpoint.ipynb", "kv_lens"): SMALL_CPU,
    ("how-to/load-a-local-checkpoint.ipynb", "concurrencies"): SMALL_CPU,
    ("how-to/load-a-local-checkpoint.ipynb", "decode_steps"): SMALL_CPU,
    ("how-to/load-a-local-checkpoint.ipynb", "repeats"): SMALL_CPU,
}
#: the notebooks of the panel / analysis set this test covers (the planner and serving notebooks set no sweep)
SWEEP_NOTEBOOKS = [
    "tutorials/01-first-sweep.ipynb",
    "tutorials/02-explore-with-the-panel.ipynb",
    "how-to/compare-dtypes.ipynb",
    "how-to/compare-two-result-sets.ipynb",
    "how-to/export-results-for-ci.ipynb",
    "how-to/find-the-concurrency-knee.ipynb",
    "how-to/sweep-kv-cache-length.ipynb",
    "how-to/run-the-seed-workload.ipynb",
    "how-to/load-a-local-checkpoint.ipynb",
]


@pytest.mark.parametrize("rel", SWEEP_NOTEBOOKS)
def test_notebook_sweep_defaults_agree_with_sweep_config(rel):
    """A sweep setting in a parameters cell is SweepConfig()'s default, or listed in DIFFERS with its reason."""
    d = SweepConfig()
    params = declared_parameters(NOTEBOOK_DIR / rel)
    for name, field in SWEEP_PARAMETERS.items():
        if name not in params:
            continue
        value = ast.literal_eval(params[name]["default"])
        default = getattr(d, field)
        agrees = value == default or (isinstance(default, list) and [value] == default)
        if (rel, name) in DIFFERS:
            assert not agrees, f"{rel}: {name} now agrees with SweepConfig; drop it from DIFFERS"
        else:
            assert agrees, f"{rel}: {name} = {value!r} but SweepConfig().{field} = {default!r}"


def test_differs_names_real_parameters():
    for rel, name in DIFFERS:
        assert rel in SWEEP_NOTEBOOKS and name in declared_parameters(NOTEBOOK_DIR / rel), (rel, name)


def test_first_tutorial_runs_the_sweep_config_defaults():
    """Tutorial 1 teaches `kit sweep`'s grid: every sweep parameter it declares is SweepConfig()'s."""
    params = declared_parameters(NOTEBOOK_DIR / "tutorials/01-first-sweep.ipynb")
    assert {"kv_lens", "concurrencies", "decode_steps", "repeats"} <= set(params)
    assert not [k for k in DIFFERS if k[0] == "tutorials/01-first-sweep.ipynb"]
    assert {f.name for f in dataclasses.fields(SweepConfig)} >= set(SWEEP_PARAMETERS.values())


def test_list_notebooks_and_declared_parameters(tmp_path):
    rels = list_notebooks()
    assert rels == sorted(rels) and "tutorials/01-first-sweep.ipynb" in rels
    assert all(not r.startswith("/") and r.endswith(".ipynb") for r in rels)
    params = declared_parameters(NOTEBOOK_DIR / "how-to/sweep-kv-cache-length.ipynb")
    assert params["kv_lens"]["inferred_type_name"] == "list" and params["out_dir"]["help"]
    bare = tmp_path / "bare.ipynb"
    nbformat.write(new_notebook([("md", "# x"), ("code", "1")]), str(bare))
    with pytest.raises(UserError, match="parameters"):
        declared_parameters(bare)


def test_run_notebook_refuses_an_undeclared_parameter_before_running(tmp_path):
    with pytest.raises(UserError, match=r"kv_len.*declared"):
        run_notebook(
            NOTEBOOK_DIR / "how-to/sweep-kv-cache-length.ipynb", tmp_path / "x.ipynb", parameters={"kv_len": [16]}
        )
    assert not (tmp_path / "x.ipynb").exists()


def test_new_notebook_and_strip_outputs(tmp_path):
    nb = new_notebook([("md", "# title"), ("code", "x")], parameters="out_dir: str = 'o'  # where")
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "code"]
    assert nb.cells[1].metadata["tags"] == ["parameters"] and nb.metadata["kernelspec"]["name"] == "python3"
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="hi")]
    nb.cells[2].execution_count = 3
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, str(path))
    assert strip_outputs(path) is True and strip_outputs(path) is False
    again = nbformat.read(str(path), as_version=4)
    assert again.cells[2].outputs == [] and again.cells[2].execution_count is None
    assert declared_parameters(path)["out_dir"]["help"] == "where"
