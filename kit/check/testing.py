"""pytest helpers for a user's own test suite: parametrise over devices × dtypes and modes, assert an op matches
the kit's reference (named like :mod:`numpy.testing` / :mod:`torch.testing`).

.. code-block:: python

    from kit.check.testing import assert_matches_reference, device_dtype_params, mode_params

    @pytest.mark.parametrize("device,dtype", device_dtype_params())   # every visible device × fp32/bf16/fp16
    @pytest.mark.parametrize("mode", mode_params())                    # eager, compile
    def test_top_p(device, dtype, mode):
        assert_matches_reference("top_p_renorm_prob", my_top_p, device=device, dtype=dtype, mode=mode)

pytest is imported only by the functions that build ``pytest.param`` objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kit import hardware
from kit.check.harness import MODES, CheckReport, check_op, checked_dtype, checked_torch_dtype
from kit.dtypes import MODEL_DTYPES
from kit.errors import UserError


def available_devices() -> list[str]:
    """``["cpu"]`` plus ``"cuda"`` when a GPU is visible (ROCm builds also use ``"cuda"``)."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def supported_dtypes(device: str = "cpu", dtypes: Sequence = MODEL_DTYPES) -> list[str]:
    """The canonical names among ``dtypes`` that run a tiny matmul on ``device``.

    Raises:
        UserError: a dtype the checks do not run in (see :func:`kit.check.harness.checked_dtype`).
    """
    ok = []
    for d in dtypes:
        name = checked_dtype(d)
        try:
            hardware.check_dtype_supported(checked_torch_dtype(name), device)
            ok.append(name)
        except UserError:
            pass
    return ok


def device_dtype_params(dtypes: Sequence = MODEL_DTYPES, devices: Sequence[str] | None = None) -> list:
    """``pytest.param(device, dtype)`` for every device × dtype; unsupported pairs are marked skip with the reason.

    Use: ``@pytest.mark.parametrize("device,dtype", device_dtype_params())``. Ids read ``cpu-bfloat16``.
    """
    import pytest

    out = []
    for dev in devices or available_devices():
        ok = set(supported_dtypes(dev, dtypes))
        for d in dtypes:
            name = checked_dtype(d)
            marks = () if name in ok else (pytest.mark.skip(reason=f"{name} does not run on {dev}"),)
            out.append(pytest.param(dev, name, id=f"{dev}-{name}", marks=marks))
    return out


def mode_params(modes: Sequence[str] = MODES, compile_marks: Sequence = ()) -> list:
    """``pytest.param(mode)`` for eager / compile; ``compile_marks`` are added to the compile one (e.g. your
    suite's ``pytest.mark.slow``).

    Raises:
        UserError: a mode not in :data:`kit.check.harness.MODES`.
    """
    import pytest

    bad = [m for m in modes if m not in MODES]
    if bad:
        raise UserError(f"modes {bad!r} not allowed; use {MODES}")
    return [pytest.param(m, id=m, marks=tuple(compile_marks) if m == "compile" else ()) for m in modes]


def assert_matches_reference(
    op: str, impl: Callable | None = None, *, device: str = "cpu", dtype="float32", mode: str = "eager", **kwargs
) -> CheckReport:
    """One cell of :func:`kit.check.harness.check_op` as a test assertion.

    Raises:
        AssertionError: the check failed; the message is the report's summary (op, dtype, mode, input, first bad
            row, expected vs got).
        UserError: unknown op, dtype or mode (as :func:`~kit.check.harness.check_op`).

    Returns:
        The :class:`~kit.check.harness.CheckReport` when it passed.
    """
    report = check_op(op, impl, dtypes=(dtype,), modes=(mode,), device=device, **kwargs)
    if not report.passed:
        raise AssertionError(report.summary())
    return report
