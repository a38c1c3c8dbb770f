"""fp8 helpers: the fp8 formats, the native e4m3 format of a device, a saturating cast, e4m3fn → e4m3fnuz.

:data:`FP8_FORMAT_INFO` (one :class:`Fp8Format` per torch fp8 dtype), :func:`fp8_dtype`, :func:`fp8_format_for`,
:func:`to_fp8` (clamp to the format's max before casting: on PyTorch CPU, 500 → e4m3fn saturates to 448 but
250 → e4m3fnuz is NaN; pytorch #150756), :func:`e4m3fn_to_e4m3fnuz` (re-encode OCP-fp8 data for an MI300-series
device without changing its values) and :func:`positive_values` (every positive finite value of a format).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kit.errors import UserError


@dataclass(frozen=True)
class Fp8Format:
    """One fp8 format.

    Attributes:
        name: the kit's name (``"e4m3fn"``).
        torch_attr: the ``torch`` dtype attribute (``"float8_e4m3fn"``).
        max: largest finite value.
        used_by: which devices compute in it.
    """

    name: str
    torch_attr: str
    max: float
    used_by: str


#: format name → :class:`Fp8Format`. Sources: OCP 8-bit floating point spec (e4m3fn max 448, e5m2 max 57344);
#: AMD MI300 ISA / ROCm docs (fnuz variants: no negative zero, NaN = 0x80, e4m3fnuz max 240);
#: ROCm/TransformerEngine PR #485.
FP8_FORMAT_INFO: dict[str, Fp8Format] = {
    f.name: f
    for f in (
        Fp8Format("e4m3fn", "float8_e4m3fn", 448.0, "OCP FP8: NVIDIA Hopper/Blackwell, AMD MI355X (gfx950)"),
        Fp8Format("e4m3fnuz", "float8_e4m3fnuz", 240.0, "AMD MI300 series (gfx942)"),
        Fp8Format("e5m2", "float8_e5m2", 57344.0, "OCP FP8 (gradients/KV cache): NVIDIA, gfx950"),
        Fp8Format("e5m2fnuz", "float8_e5m2fnuz", 57344.0, "AMD MI300 series (gfx942)"),
    )
}


def fp8_dtype(fmt: str) -> torch.dtype:
    """torch dtype of an fp8 format name (a key of :data:`FP8_FORMAT_INFO`).

    Raises:
        UserError: unknown name, or this torch has no such dtype.
    """
    if fmt not in FP8_FORMAT_INFO:
        raise UserError(f"unknown fp8 format {fmt!r}; allowed: {sorted(FP8_FORMAT_INFO)}")
    attr = FP8_FORMAT_INFO[fmt].torch_attr
    dt = getattr(torch, attr, None)
    if dt is None:
        raise UserError(f"torch {torch.__version__} has no torch.{attr}")
    return dt


def fp8_format_for(platform: str, gfx_arch: str | None = None) -> str:
    """The native e4m3 format of a device: ``"e4m3fnuz"`` on gfx942 (MI300X/MI325X), else ``"e4m3fn"``
    (NVIDIA, gfx950 MI355X, and CPU).

    Args:
        platform: one of :data:`kit.hardware.PLATFORMS` (``"cpu"``, ``"cuda"``, ``"rocm"``).
        gfx_arch: the AMD gfx architecture (``"gfx942"``), or None.

    Source: ROCm precision-support docs (gfx942 computes FNUZ fp8; gfx950 OCP fp8).
    """
    if platform == "rocm" and (gfx_arch or "").startswith("gfx94"):
        return "e4m3fnuz"
    return "e4m3fn"


def to_fp8(x: torch.Tensor, fmt: str = "e4m3fn", scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """Cast ``x / scale`` to an fp8 format after clamping to the format's finite range.

    PyTorch's cast does not saturate consistently (500 → e4m3fn gives 448 on CPU, but 250 → e4m3fnuz gives NaN):
    clamp first (pytorch #150756). NaN stays NaN.

    Args:
        x: floating tensor, any shape. fmt: a key of :data:`FP8_FORMAT_INFO`. scale: divisor applied before the cast.

    Returns: tensor of the fp8 dtype, same shape. Raises: UserError for a non-floating ``x`` or unknown format.
    """
    dt = fp8_dtype(fmt)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise UserError(f"x must be a floating tensor; got {getattr(x, 'dtype', type(x).__name__)}")
    m = torch.finfo(dt).max
    return (x.float() / scale).clamp(-m, m).to(dt)


def e4m3fn_to_e4m3fnuz(q: torch.Tensor, scale: float | torch.Tensor = 1.0) -> tuple[torch.Tensor, object]:
    """Re-encode e4m3fn-quantised data (e.g. an OCP-fp8 checkpoint) for an e4m3fnuz device (MI300, gfx942)
    without changing the dequantised values ``q.float() * scale``.

    The same bits read as e4m3fnuz are worth half (exponent bias 8 instead of 7), so the scale doubles; the bits
    of −0 (0x80) are NaN in e4m3fnuz and become +0; e4m3fn NaN (0x7F/0xFF) would read as ±240 and becomes the
    fnuz NaN (0x80). (The same idea as the ROCm weight-loading path of serving engines, e.g. vLLM's
    ``normalize_e4m3fn_to_e4m3fnuz``, which handles the −0 case.)

    Args:
        q: tensor of dtype ``torch.float8_e4m3fn``, any shape. scale: its dequantisation scale (float or tensor).

    Returns: ``(q_fnuz, scale * 2)``. Raises: UserError if ``q`` is not float8_e4m3fn.
    """
    if not isinstance(q, torch.Tensor) or q.dtype != torch.float8_e4m3fn:
        raise UserError(f"q must be a torch.float8_e4m3fn tensor; got {getattr(q, 'dtype', type(q).__name__)}")
    bits = q.view(torch.uint8)
    nan = (bits & 0x7F) == 0x7F
    bits = torch.where(bits == 0x80, torch.zeros_like(bits), bits)
    bits = torch.where(nan, torch.full_like(bits, 0x80), bits)
    return bits.view(torch.float8_e4m3fnuz), scale * 2


def positive_values(fmt: str) -> torch.Tensor:
    """Every positive finite value of an fp8 format, ascending: all 256 byte patterns decoded, NaN/inf, zero and
    negatives dropped (e4m3fn: 126 values, 2⁻⁹ … 448; e4m3fnuz: 127 values, 2⁻¹⁰ … 240). float32, 1-d.

    Raises:
        UserError: unknown format (see :func:`fp8_dtype`).
    """
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8_dtype(fmt)).float()
    return torch.unique(v[torch.isfinite(v) & (v > 0)])
