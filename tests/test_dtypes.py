"""kit.dtypes: the one dtype vocabulary."""

import pytest
import torch

from kit import dtypes
from kit.errors import UserError


def test_aliases_bytes_and_peak_figures():
    assert dtypes.canonical("BF16") == "bfloat16" and dtypes.canonical(torch.float16) == "float16"
    assert dtypes.canonical("float8_e4m3fnuz") == "fp8" and dtypes.canonical("e5m2") == "fp8"
    assert dtypes.bytes_per_element("fp32") == 4 and dtypes.bytes_per_element("fp8") == 1
    assert dtypes.bytes_per_element("mxfp4") == 4.25 / 8 and dtypes.bytes_per_element("nvfp4") == 4.5 / 8
    assert dtypes.peak_key("int8") == "fp8" and dtypes.peak_key("mxfp4") == "fp4"
    with pytest.raises(UserError, match="unknown dtype 'fp7'.*allowed"):
        dtypes.canonical("fp7")


def test_model_dtypes_map_to_torch_and_counted_formats_are_refused():
    assert [dtypes.to_torch(d) for d in dtypes.MODEL_DTYPES] == [torch.float32, torch.bfloat16, torch.float16]
    assert dtypes.to_torch(torch.bfloat16) is torch.bfloat16 and dtypes.name_of(torch.float32) == "float32"
    with pytest.raises(UserError, match="dtype 'fp8' cannot be used to run a model"):
        dtypes.to_torch("fp8")
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):  # a UserError is a ValueError
        dtypes.model_dtype("int4")


def test_no_other_module_defines_dtype_aliases():
    from pathlib import Path

    kit = Path(dtypes.__file__).parent
    offenders = [str(p) for p in kit.rglob("*.py") if p.name != "dtypes.py" and '"bf16": ' in p.read_text()]
    assert not offenders
