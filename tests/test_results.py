"""Results schema: round trip, validation, the append log surviving a torn write."""

import json
import math

import pandas as pd
import pytest

from kit import results
from kit.store import load_results, save_results


def _rec(**kw):
    base = {
        "backend": "engine",
        "status": "ok",
        "model": "tiny-llama",
        "dtype": "float32",
        "concurrency": 4,
        "context_len": 128,
        "tpot_ms_p50": 3.2,
        "tpot_n": 48,
        "decode_tok_s": 1250.0,
        "x_step_ms": [3.1, 3.3],
    }
    base.update(kw)
    return base


def test_round_trip_is_identical(tmp_path):
    df = results.to_frame(
        [
            _rec(),
            _rec(status="oom", error="OutOfMemoryError: boom", tpot_ms_p50=None),
            {"backend": "openai", "status": "ok", "request_rate": math.inf, "output_tok_s": 10.5},
            {"backend": "planner", "status": "ok", "assumptions": "eff_bw=0.8", "tp": 8},
        ]
    )
    assert list(df.columns[: len(results.COLUMN_NAMES)]) == list(results.COLUMN_NAMES)
    path = save_results(df, tmp_path / "r.parquet", {"model": "tiny-llama"})
    back = load_results(path)
    pd.testing.assert_frame_equal(df, back)
    assert back.attrs["metadata"]["model"] == "tiny-llama"
    side = json.loads((tmp_path / "r.json").read_text())
    assert side["schema_version"] == results.SCHEMA_VERSION


def test_validate_record():
    with pytest.raises(ValueError, match="unknown column.*'tok_per_sec'"):
        results.validate_record(_rec(tok_per_sec=1))
    with pytest.raises(ValueError, match="status='done'"):
        results.validate_record(_rec(status="done"))
    with pytest.raises(ValueError, match="backend='vllm'"):
        results.validate_record(_rec(backend="vllm"))


def test_schema_table_documents_every_column():
    t = results.schema_table()
    assert len(t) == len(results.COLUMNS) and t.meaning.str.len().min() > 5


def test_one_definition_of_ok_flagged_rows_are_never_ok():
    from kit.results import ok_mask, row_problems, to_frame, verdict

    df = to_frame(
        [
            {"backend": "engine", "status": "ok", "x_logits_finite": True},
            {"backend": "engine", "status": "ok", "x_logits_finite": False, "error": "non-finite logits"},
            {"backend": "engine", "status": "oom"},
            {"backend": "openai", "status": "ok", "x_valid": False},
            {"backend": "planner", "status": "ok"},  # no flag columns at all: ok
        ]
    )
    assert list(ok_mask(df)) == [True, False, False, False, True]
    assert list(verdict(df)) == ["ok", "flagged", "oom", "flagged", "ok"]
    assert row_problems(df.iloc[1]) and "non-finite" in row_problems(df.iloc[1])[0]
    assert row_problems({"x_logits_finite": None}) == [] and row_problems(df.iloc[0]) == []
    assert ok_mask(to_frame([])).empty
