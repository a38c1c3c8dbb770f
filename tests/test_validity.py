"""kit.validity: each check's reason, checks skipped when their inputs are missing, and the verdict counted by
kit.results (an invalid row is flagged, never ok)."""

import math

import pandas as pd
import pytest

from kit import results as R
from kit.validity import TOKEN_TOLERANCE, invalid_note, validity

CLEAN = {
    "backend": "openai",
    "status": "ok",
    "failed": 0,
    "x_server_preemptions": 0,
    "x_server_prefix_cache_hits": 0,
    "x_server_generation_tokens": 1000,
    "x_server_client_output_tokens": 1000,
    "x_server_output_tokens_diff_frac": 0.0,
    "x_client_bound": False,
    "x_osl_mismatch": 0,
    "x_throttled": False,
}


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"failed": 2}, "2 request(s) failed"),
        ({"x_server_preemptions": 3}, "3 preemption(s) during the point"),
        ({"x_server_preempted_requests_max": 1}, "1 preemption(s) during the point"),
        ({"x_server_prefix_cache_hits": 64}, "64 prefix-cache hit tokens although every prompt was unique"),
        (
            {"x_server_generation_tokens": 1011, "x_server_output_tokens_diff_frac": 0.011},
            "server counted 1011 output tokens, client 1000 (1.1 % apart, > 1 %)",
        ),
        ({"x_client_bound": True, "x_client_warning": "event loop lag p99 80 ms"}, "client-bound: event loop lag"),
        ({"x_osl_mismatch": 4}, "4 request(s) returned another output length than requested"),
        ({"x_logits_finite": False}, "non-finite logits"),
        ({"x_throttled": True, "x_throttle_fraction": 0.4}, "GPU throttled (clock low at the power limit) in 40 %"),
    ],
)
def test_each_reason_makes_the_row_invalid(change, reason):
    v = validity({**CLEAN, **change})
    assert v["x_valid"] is False and reason in v["x_invalid_reasons"]
    assert v["x_invalid_reasons"].count(";") == 0  # only that one
    df = R.to_frame([{**CLEAN, **change, **v}])
    assert list(R.verdict(df)) == ["flagged"]


def test_clean_row_is_valid_and_lists_its_checks():
    v = validity(CLEAN)
    assert v == {
        "x_valid": True,
        "x_invalid_reasons": None,
        "x_validity_checks": "failed,preemptions,prefix_cache,server_tokens,client_bound,osl,throttling",
    }
    assert invalid_note({**CLEAN, **v}) == ""
    assert list(R.verdict(R.to_frame([{**CLEAN, **v}]))) == ["ok"]


def test_tolerance_boundary_and_shared_prompts():
    at = {**CLEAN, "x_server_generation_tokens": 1010, "x_server_output_tokens_diff_frac": TOKEN_TOLERANCE}
    assert validity(at)["x_valid"] is True  # exactly 1 % is within
    hits = {**CLEAN, "x_server_prefix_cache_hits": 10}
    assert validity(hits, unique_prompts=False)["x_valid"] is True


def test_missing_inputs_skip_their_checks():
    """An in-process row (no server columns), NaN/NA values from a DataFrame: those checks are not applied."""
    row = pd.Series({"status": "ok", "x_logits_finite": True, "failed": math.nan, "x_throttled": pd.NA})
    v = validity(row)
    assert v == {"x_valid": True, "x_invalid_reasons": None, "x_validity_checks": "logits"}


def test_several_reasons_are_joined():
    v = validity({**CLEAN, "failed": 1, "x_server_preemptions": 2})
    assert v["x_invalid_reasons"] == (
        "1 request(s) failed; 2 preemption(s) during the point (KV cache full: requests recomputed)"
    )
    assert invalid_note({**CLEAN, **v}).startswith("INVALID: 1 request(s) failed; 2 preemption(s)")
