"""The kernel/dtype sanity notebooks run under papermill with small parameters; the tests read the files they wrote.
They execute once per session through nbexec (two at a time), and the docs build renders those same copies."""

from __future__ import annotations

import json

import jsonschema
import pandas as pd
import pytest
from nbexec import execute, start_all

pytestmark = pytest.mark.slow

NOTEBOOKS = ["how-to/check-a-sampling-op.ipynb", "how-to/is-this-machine-ready.ipynb", "explanation/fp8-formats.ipynb"]


class _Executed:
    """Executed once per session by nbexec (parameters in nbexec.SMALL; shared with the docs build)."""

    def __init__(self, rel):
        self.rel = rel

    def result(self):
        return execute(self.rel).out_dir


@pytest.fixture(scope="module")
def executed():
    start_all(NOTEBOOKS)
    return {rel: _Executed(rel) for rel in NOTEBOOKS}


def test_check_a_sampling_op(executed):
    out = executed["how-to/check-a-sampling-op.ipynb"].result()
    s = json.loads((out / "summary.json").read_text())
    assert s["op"] == "top_p_renorm_prob" and s["passed"] is True and s["impl"] == "kit.reference"
    assert s["planted_bug_caught"] is True
    first = s["planted_first_failure"]
    assert first["op"] == "top_p_renorm_prob" and first["dtype"] == "float32" and first["mode"] == "eager"
    assert isinstance(first["first_bad_row"], int)
    assert set(s["frequency"]) == {"eager", "compile"} and all(f["passed"] for f in s["frequency"].values())
    good = pd.read_csv(out / "report.csv")
    bad = pd.read_csv(out / "planted_bug_report.csv")
    assert len(good) == len(bad) == 1 * 2 * 2  # dtypes × modes × inputs
    assert good["passed"].all() and set(good["mode"]) == {"eager", "compile"}
    assert not bad["passed"].any() and set(bad[bad["mode"] == "compile"]["status"]) == {"fail"}
    text = (out / "summary.txt").read_text()
    assert "mode=compile" in text and "first bad row=" in text


def test_is_this_machine_ready(executed):
    from kit.check.doctor import SCHEMA

    out = executed["how-to/is-this-machine-ready.ipynb"].result()
    report = json.loads((out / "doctor.json").read_text())
    jsonschema.validate(report, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert report["ok"] and report["device"]["platform"] == "cpu" and not report["compile"]["checked"]
    assert [b["name"] for b in report["libraries"]] == ["flashinfer", "sgl_kernel", "aiter"]
    assert "verdict: ready" in (out / "doctor.txt").read_text()


def test_fp8_formats(executed):
    out = executed["explanation/fp8-formats.ipynb"].result()
    same = pd.read_csv(out / "same_bytes.csv")
    read_as_fnuz = same["same byte read as e4m3fnuz"].tolist()
    assert read_as_fnuz[0] == 0.5 and pd.isna(read_as_fnuz[1]) and read_as_fnuz[2:] == [224.0, 0.25, -1.0]
    assert same["re-encoded fnuz × scale"].tolist() == [1.0, 0.0, 448.0, 0.5, -2.0]
    casts = pd.read_csv(out / "overflow_casts.csv").set_index(["format", "value"])
    assert casts.loc[("e4m3fn", 500.0), "clamp, then cast"] == 448.0
    assert casts.loc[("e4m3fnuz", 250.0), "clamp, then cast"] == 240.0
    formats = pd.read_csv(out / "formats.csv").set_index("format")
    assert formats.loc["e4m3fn", "max"] == 448 and formats.loc["e4m3fnuz", "max"] == 240
    grids = json.loads((out / "grids.json").read_text())
    assert grids["e4m3fn"]["max"] == 448 and grids["e4m3fnuz"]["max"] == 240
    assert (out / "fp8_grids.png").read_bytes()[:4] == b"\x89PNG"
