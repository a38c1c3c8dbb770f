"""What the tour's lessons share: :class:`TourContext` (the in-process model cache, device, model, dtype, the op
implementations to check) and the result helpers every lesson function returns through (:func:`result`, JSON-ready
numbers, formatting)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kit.errors import UserError
from kit.tour.generate import ModelCache

DEFAULT_MODEL = "tiny-llama"
DEFAULT_DTYPE = "float32"


@dataclass
class TourContext:
    """What the lessons share: the in-process model cache, the device, the in-process model and dtype the
    measuring lessons use unless told otherwise, the op implementations to check instead of
    the kit's pick (``{op: callable}``, e.g. a planted fault) and the compile backend of the op check."""

    models: ModelCache = field(default_factory=ModelCache)
    device: str = "cpu"
    model: str = DEFAULT_MODEL
    dtype: str = DEFAULT_DTYPE
    op_impls: dict = field(default_factory=dict)
    compile_backend: str | None = None

    def backend(self) -> str:
        """The op check's torch.compile backend: as set, else ``aot_eager`` on CPU (as ``kit qualify``) and
        ``inductor`` on a GPU."""
        return self.compile_backend or ("aot_eager" if self.device == "cpu" else "inductor")


# ------------------------------------------------------------------------------------------------ results
def json_ready(v):
    """``v`` with every non-finite float as None and numpy scalars as Python numbers (JSON has no NaN)."""
    if isinstance(v, dict):
        return {str(k): json_ready(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_ready(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            v = v.item()
        except (ValueError, TypeError):
            return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def finite(*values) -> bool:
    """Whether every value is a finite number."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def result(lesson: str, line: str, problems=(), **parts) -> dict:
    """A lesson's result: ``lesson``, ``ok`` (no problem), ``problems``, ``line`` and ``parts`` (numbers, chart,
    table), JSON-ready (:func:`json_ready`)."""
    return json_ready({"lesson": lesson, "ok": not problems, "problems": list(problems), "line": line, **parts})


def fmt(v, unit: str = "", digits: int = 2) -> str:
    """A number for the page: ``"12.34 ms"``; ``"n/a"`` when missing or not finite."""
    if not finite(v):
        return "n/a"
    return f"{v:,.{digits}f}{' ' + unit if unit else ''}"


def int_setting(name: str, v, lo: int, hi: int) -> int:
    """``v`` as an integer in ``lo``..``hi``.

    Raises:
        UserError: not an integer, or out of range (the message names ``name`` and the range).
    """
    try:
        i = int(v)
    except (TypeError, ValueError):
        raise UserError(f"{name}={v!r}: give an integer from {lo} to {hi}") from None
    if not lo <= i <= hi or float(v) != i:
        raise UserError(f"{name}={v!r}: give an integer from {lo} to {hi}")
    return i


def ladder(top: int, n: int = 4, lo: int = 1) -> list[int]:
    """``n`` sizes ending at ``top``, each half the next (at least ``lo``), distinct and ascending."""
    return sorted({max(lo, top >> k) for k in range(n)})
