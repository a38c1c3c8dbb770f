"""kit.check.testing: the pytest helpers as a user's suite would use them."""

import pytest

from kit.check import sampling as S
from kit.check.planted import top_p_renorm_prob_drops_crossing_token
from kit.check.testing import (
    assert_matches_reference,
    available_devices,
    device_dtype_params,
    mode_params,
    supported_dtypes,
)


def my_top_k(probs, top_k):
    """Stand-in for a user's kernel."""
    return S.top_k_renorm_prob(probs, top_k)


@pytest.mark.parametrize("device,dtype", device_dtype_params())
def test_user_suite_style(device, dtype):
    rep = assert_matches_reference("top_k_renorm_prob", my_top_k, device=device, dtype=dtype)
    assert rep.passed


def test_helpers_shapes_and_failure_message():
    params = device_dtype_params(devices=["cpu"])
    assert [p.id for p in params] == ["cpu-float32", "cpu-bfloat16", "cpu-float16"]
    modes = mode_params(compile_marks=[pytest.mark.compile])
    assert [m.id for m in modes] == ["eager", "compile"] and modes[1].marks
    with pytest.raises(ValueError, match="modes"):
        mode_params(["graph"])
    with pytest.raises(AssertionError, match=r"op=top_p_renorm_prob dtype=bfloat16 mode=eager"):
        assert_matches_reference("top_p_renorm_prob", top_p_renorm_prob_drops_crossing_token, dtype="bf16")


def test_devices_and_dtypes_here():
    assert available_devices()[0] == "cpu"
    assert supported_dtypes("cpu") == ["float32", "bfloat16", "float16"]
    assert supported_dtypes("cpu", ["bf16", "float64"]) == ["bfloat16", "float64"]
    with pytest.raises(ValueError, match="is not checked"):
        supported_dtypes("cpu", ["int8"])
