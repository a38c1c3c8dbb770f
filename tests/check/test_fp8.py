"""kit.check.fp8: the same byte in e4m3fn and e4m3fnuz, clamp-then-cast (F1), re-encoding an e4m3fn checkpoint for
e4m3fnuz, the native format per platform, the format table and the grids of representable values."""

import pytest
import torch

from kit.check.fp8 import FP8_FORMAT_INFO, e4m3fn_to_e4m3fnuz, fp8_dtype, fp8_format_for, positive_values, to_fp8
from kit.check.harness import compiled_call


def test_f1_fp8_bytes_and_clamping():
    x = torch.tensor([1, -0.0, 448, 0.5, -2])
    as_fnuz = to_fp8(x, "e4m3fn").view(torch.float8_e4m3fnuz).float()
    torch.testing.assert_close(as_fnuz, torch.tensor([0.5, float("nan"), 224, 0.25, -1]), equal_nan=True)
    assert to_fp8(torch.tensor([500.0]), "e4m3fn").float().item() == 448.0
    assert to_fp8(torch.tensor([250.0]), "e4m3fnuz").float().item() == 240.0  # raw cast gives NaN here
    assert to_fp8(torch.tensor([-1e6]), "e4m3fnuz").float().item() == -240.0
    assert torch.isnan(to_fp8(torch.tensor([float("nan")]), "e4m3fn").float()).all()
    assert fp8_format_for("rocm", "gfx942") == "e4m3fnuz"
    assert fp8_format_for("rocm", "gfx950") == "e4m3fn" and fp8_format_for("cuda") == "e4m3fn"
    with pytest.raises(ValueError, match="unknown fp8 format 'e4m3'"):
        to_fp8(x, "e4m3")
    with pytest.raises(ValueError, match="x must be a floating tensor"):
        to_fp8(torch.tensor([1, 2]), "e4m3fn")


def test_f1_kind_e4m3fn_checkpoint_to_fnuz_keeps_values():
    x = torch.tensor([1, -0.0, 448, 0.5, -2, 3.25e-3, -100, float("nan")])
    q = to_fp8(x, "e4m3fn")
    q2, s2 = e4m3fn_to_e4m3fnuz(q, 0.5)
    assert q2.dtype == torch.float8_e4m3fnuz and s2 == 1.0
    torch.testing.assert_close(q2.float() * s2, q.float() * 0.5, equal_nan=True)  # -0 → +0 compares equal
    with pytest.raises(ValueError, match="float8_e4m3fn tensor"):
        e4m3fn_to_e4m3fnuz(x)


def test_format_table_matches_torch():
    assert set(FP8_FORMAT_INFO) == {"e4m3fn", "e4m3fnuz", "e5m2", "e5m2fnuz"}
    for name, f in FP8_FORMAT_INFO.items():
        assert f.name == name and fp8_dtype(name) is getattr(torch, f.torch_attr)
        assert torch.finfo(fp8_dtype(name)).max == f.max
    with pytest.raises(ValueError, match="unknown fp8 format 'fp8'; allowed"):
        fp8_dtype("fp8")


def test_positive_values_grids():
    fn, fnuz = positive_values("e4m3fn"), positive_values("e4m3fnuz")
    assert (fn.numel(), fn.min().item(), fn.max().item()) == (126, 2.0**-9, 448.0)
    assert (fnuz.numel(), fnuz.min().item(), fnuz.max().item()) == (127, 2.0**-10, 240.0)
    assert bool((fn[1:] > fn[:-1]).all())  # ascending, distinct


def _fp8_both(x):
    return to_fp8(x, "e4m3fn").float(), to_fp8(x, "e4m3fnuz").float()


@pytest.mark.compile
def test_f1_fp8_clamp_then_cast_compiled():
    x = torch.tensor([1.0, -2.0, 0.5, 500.0, 250.0, -1e4])
    (fn_c, fnuz_c), (fn_e, fnuz_e) = compiled_call(_fp8_both, x), _fp8_both(x)
    torch.testing.assert_close(fn_c, fn_e)
    torch.testing.assert_close(fnuz_c, fnuz_e)
    assert fn_c.tolist()[3:] == [448.0, 256.0, -448.0] and fnuz_c.tolist()[3:] == [240.0, 240.0, -240.0]
