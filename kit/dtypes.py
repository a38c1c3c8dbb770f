"""One dtype vocabulary for the whole kit: names and aliases, bytes per element, the torch dtype, which peak-TFLOPS
figure of an accelerator applies, and which dtypes a model can be built and run in.

Canonical names: ``float32``, ``bfloat16``, ``float16`` (model dtypes: the in-process engine, the panel, the
kernel checks), and the storage/compute formats the planner counts: ``fp8`` (e4m3 or e5m2; 1 byte), ``int8``,
``mxfp4`` and ``nvfp4``. Block-scaled 4-bit formats include their scales (sources: OCP Microscaling Formats (MX)
v1.0 spec, 32-element blocks with one 8-bit E8M0 scale = 4.25 bits; NVIDIA NVFP4, 16-element blocks with one FP8
E4M3 scale = 4.5 bits, the per-tensor fp32 scale ignored).

torch is imported only by :func:`to_torch` / :func:`name_of`, so the planner can use this module without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.errors import UserError


@dataclass(frozen=True)
class DType:
    """One canonical dtype.

    Attributes:
        name: canonical name.
        bytes: bytes per element (fractional for block-scaled 4-bit formats, scales included).
        peak: the accelerator-catalog TFLOPS figure that applies to matmuls in this dtype (``float32``,
            ``bfloat16``, ``float16``, ``fp8`` or ``fp4``; int8 uses the fp8 figure).
        torch_attr: name of the ``torch`` dtype attribute a model can run in, or None for formats that are only
            counted (fp8 storage, 4-bit).
    """

    name: str
    bytes: float
    peak: str
    torch_attr: str | None = None


#: canonical name → :class:`DType`
DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("float32", 4.0, "float32", "float32"),
        DType("bfloat16", 2.0, "bfloat16", "bfloat16"),
        DType("float16", 2.0, "float16", "float16"),
        DType("fp8", 1.0, "fp8"),
        DType("int8", 1.0, "fp8"),
        DType("mxfp4", 4.25 / 8, "fp4"),
        DType("nvfp4", 4.5 / 8, "fp4"),
    )
}
#: alias → canonical name (lower case; ``torch.`` prefixes are stripped before lookup)
ALIASES: dict[str, str] = {
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e4m3fnuz": "fp8",
    "e4m3": "fp8",
    "fp8_e4m3": "fp8",
    "float8_e5m2": "fp8",
    "e5m2": "fp8",
}
#: dtypes a model is built and run in (in-process engine, panel, kernel checks), in display order
MODEL_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


def canonical(name) -> str:
    """Canonical name of a dtype name, alias or ``torch.dtype`` (``"bf16"`` → ``"bfloat16"``).

    Raises:
        UserError: unknown dtype (the message lists names and aliases).
    """
    s = str(name).strip().lower().removeprefix("torch.")
    s = ALIASES.get(s, s)
    if s not in DTYPES:
        raise UserError(f"unknown dtype {name!r}; allowed: {sorted(DTYPES)} (aliases: {sorted(ALIASES)})")
    return s


def bytes_per_element(name) -> float:
    """Bytes per element of a dtype (bfloat16 2, fp8 1, MXFP4 0.53125, NVFP4 0.5625).

    Raises:
        UserError: unknown dtype.
    """
    return DTYPES[canonical(name)].bytes


def peak_key(name) -> str:
    """The catalog TFLOPS figure that applies to ``name`` (see :class:`DType`). Raises UserError if unknown."""
    return DTYPES[canonical(name)].peak


def model_dtype(name) -> str:
    """Canonical name of a dtype a model can run in (one of :data:`MODEL_DTYPES`).

    Raises:
        UserError: unknown, or a format that is only counted (fp8, int8, 4-bit); the message lists the allowed.
    """
    try:
        c = canonical(name)
    except UserError:
        raise UserError(f"unknown dtype {name!r}; allowed: {list(MODEL_DTYPES)} (aliases fp32, bf16, fp16)") from None
    if c not in MODEL_DTYPES:
        raise UserError(f"dtype {name!r} cannot be used to run a model here; allowed: {list(MODEL_DTYPES)}")
    return c


def to_torch(name):
    """The ``torch.dtype`` of a model dtype name or alias (``"bf16"`` → ``torch.bfloat16``); a ``torch.dtype``
    passes through if it is a model dtype.

    Raises:
        UserError: not one of :data:`MODEL_DTYPES` (see :func:`model_dtype`).
    """
    import torch

    return getattr(torch, DTYPES[model_dtype(name)].torch_attr)


def name_of(dtype) -> str:
    """Canonical name of a ``torch.dtype`` or a name (``torch.bfloat16`` → ``"bfloat16"``).

    Raises:
        UserError: unknown dtype.
    """
    return canonical(dtype)
