"""The op resolver: find a named sampling op in the installed kernel libraries, or fall back to the kit's reference.

:func:`resolve_op` looks the op up in the kernel libraries serving engines use (flashinfer, sgl_kernel, aiter;
:data:`KERNEL_LIBRARIES`) or falls back to the kit's reference (:mod:`kit.check.sampling`). It returns a
:class:`ResolvedOp` (a callable plus where it came from), or raises :class:`OpNotFoundError` naming the op, the
symbols and every place tried. It never returns ``None`` (a ROCm build lacked ``top_k_renorm_prob``; an import guard
left ``None`` behind and the sampler crashed on the first request — sglang #32569). :func:`probe_library` reports
which listed ops one library exposes (``kit doctor``). The check harness that compares an op with the reference is
:mod:`kit.check.harness`.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kit.check import sampling as S
from kit.errors import KitError, UserError

log = logging.getLogger("kit")


@dataclass(frozen=True)
class KernelLibrary:
    """A kernel library to look ops up in.

    Attributes:
        name: short name (``"sgl_kernel"``).
        module: import path of the module holding the functions (``"flashinfer.sampling"``).
        symbols: canonical op name → attribute names tried in order (libraries renamed some, e.g. ``_prob`` →
            ``_probs``).
        adapters: op → function wrapping the raw symbol into the kit's signature (where the library's differs).
    """

    name: str
    module: str
    symbols: dict[str, tuple[str, ...]]
    adapters: dict[str, Callable] = field(default_factory=dict)


def _aiter_top_k(raw: Callable) -> Callable:
    """aiter's ``top_k_renorm_probs(probs, maybe_top_k_arr, top_k_val)`` → ``(probs, top_k)``."""

    def top_k_renorm_prob(probs, top_k):
        if isinstance(top_k, torch.Tensor):
            return raw(probs, top_k.to(torch.int32), 0)
        return raw(probs, None, int(top_k))

    return top_k_renorm_prob


#: The libraries serving engines take sampling kernels from, and the symbol names seen in their Python APIs
#: (flashinfer ``flashinfer/sampling.py``; sgl-kernel ``sgl_kernel/sampling.py``, re-exported by ``sgl_kernel``;
#: aiter ``aiter/ops/sampling.py``). vLLM is not listed: its sampler takes top-k/top-p from flashinfer or falls back
#: to torch. The renorm/mask ops share the kit's ``(probs, k_or_p)`` signature (aiter's via an adapter); the
#: sampling-from-probs symbols differ between libraries and versions (explicit noise vs generator) — wrap them
#: before :func:`kit.check.harness.check_op`.
KERNEL_LIBRARIES: tuple[KernelLibrary, ...] = (
    KernelLibrary(
        "flashinfer",
        "flashinfer.sampling",
        {
            "top_k_renorm_prob": ("top_k_renorm_probs", "top_k_renorm_prob"),
            "top_p_renorm_prob": ("top_p_renorm_probs", "top_p_renorm_prob"),
            "top_k_mask_logits": ("top_k_mask_logits",),
            "top_k_top_p_sampling_from_probs": ("top_k_top_p_sampling_from_probs",),
            "sampling_from_probs": ("sampling_from_probs",),
        },
    ),
    KernelLibrary(
        "sgl_kernel",
        "sgl_kernel",
        {
            "top_k_renorm_prob": ("top_k_renorm_prob", "top_k_renorm_probs"),
            "top_p_renorm_prob": ("top_p_renorm_prob", "top_p_renorm_probs"),
            "top_k_top_p_sampling_from_probs": ("top_k_top_p_sampling_from_probs",),
        },
    ),
    KernelLibrary(
        "aiter",
        "aiter.ops.sampling",
        {
            "top_k_renorm_prob": ("top_k_renorm_probs",),
            "top_k_top_p_sampling_from_probs": ("top_k_top_p_sampling_from_probs",),
        },
        adapters={"top_k_renorm_prob": _aiter_top_k},
    ),
)
REFERENCE = "kit.reference"


class OpNotFoundError(KitError, LookupError):
    """No implementation of an op was found (an environment condition, not a bug); ``.op``, ``.tried`` (one line
    per place tried)."""

    def __init__(self, op: str, tried: Sequence[str]):
        self.op, self.tried = op, list(tried)
        lines = "\n  ".join(self.tried) or "(no kernel library lists this op)"
        super().__init__(f"no implementation of op {op!r} found; tried:\n  {lines}")


@dataclass(frozen=True)
class ResolvedOp:
    """What :func:`resolve_op` found. Calling it calls ``fn``.

    Attributes:
        op: canonical op name; fn: the callable (kit signature); library: ``"flashinfer"`` … or
        ``"kit.reference"`` (:data:`REFERENCE`); where: ``module.symbol`` it came from; tried: every place looked at
        before it, with why it was skipped.
    """

    op: str
    fn: Callable
    library: str
    where: str
    tried: tuple[str, ...] = ()

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _import(module: str):
    """Import ``module``; return (module, None) or (None, reason). Never raises."""
    top = module.split(".")[0]
    try:
        if importlib.util.find_spec(top) is None:
            return None, f"not installed (no module {top!r})"
    except (ImportError, ValueError) as e:
        return None, f"not importable ({type(e).__name__}: {e})"
    try:
        return importlib.import_module(module), None
    except Exception as e:  # a broken build raises OSError/RuntimeError/AttributeError as often as ImportError
        return None, f"import failed ({type(e).__name__}: {e})"


def _lookup(mod, library: KernelLibrary, op: str):
    """(callable, symbol, None) or (None, None, [reasons per symbol])."""
    reasons = []
    for sym in library.symbols.get(op, ()):
        if not hasattr(mod, sym):
            reasons.append(f"{library.module}.{sym}: module imported but has no attribute {sym!r}")
            continue
        obj = getattr(mod, sym)
        if obj is None:
            reasons.append(f"{library.module}.{sym}: attribute is None (an import guard left None behind)")
        elif not callable(obj):
            reasons.append(f"{library.module}.{sym}: not callable ({type(obj).__name__})")
        else:
            adapt = library.adapters.get(op)
            return (adapt(obj) if adapt else obj), sym, None
    return None, None, reasons


def resolve_op(op: str, libraries: Sequence[KernelLibrary] | None = None, *, fallback: bool = True) -> ResolvedOp:
    """Find an implementation of ``op``: the first kernel library that exposes it, else the kit's reference.

    Args:
        op: canonical name, one of :data:`kit.check.sampling.REFERENCE_OPS` (e.g. ``"top_k_renorm_prob"``).
        libraries: where to look, in order (default :data:`KERNEL_LIBRARIES`). Pass your own
            :class:`KernelLibrary` to point at another module (a fork, a fake in tests).
        fallback: use :mod:`kit.check.sampling`'s reference when no library has the op.

    Returns:
        A :class:`ResolvedOp` (never ``None``) recording the library and every place tried before it.

    Raises:
        UserError: unknown op name (lists the known ones).
        OpNotFoundError: ``fallback=False`` and no library exposes it; the message names the missing symbol(s) and
            every module tried, with the reason each was skipped.
    """
    if op not in S.REFERENCE_OPS:
        raise UserError(f"unknown op {op!r}; known ops: {sorted(S.REFERENCE_OPS)}")
    tried: list[str] = []
    for b in KERNEL_LIBRARIES if libraries is None else libraries:
        if op not in b.symbols:
            continue
        mod, why = _import(b.module)
        if mod is None:
            syms = ", ".join(b.symbols[op])
            tried.append(f"{b.name}: {b.module}.{{{syms}}}: {why}")
            continue
        fn, sym, reasons = _lookup(mod, b, op)
        if fn is not None:
            return ResolvedOp(op, fn, b.name, f"{b.module}.{sym}", tuple(tried))
        tried.extend(f"{b.name}: {r}" for r in reasons)
    if fallback:
        log.debug("%s: no kernel library has it; using the kit reference (tried: %s)", op, "; ".join(tried))
        return ResolvedOp(
            op, S.REFERENCE_OPS[op], REFERENCE, f"kit.check.sampling.{S.REFERENCE_OPS[op].__name__}", tuple(tried)
        )
    tried.append(f"{REFERENCE}: kit.check.sampling.{op}: not used (fallback=False)")
    raise OpNotFoundError(op, tried)


def probe_library(library: KernelLibrary) -> dict:
    """Import one kernel library and report which of its listed ops it exposes (used by ``kit doctor``).

    Returns:
        ``{"name", "module", "importable", "version", "error", "ops": {op: "module.symbol" | None},
        "missing": [op, ...], "problems": [text naming each missing symbol]}``. Never raises.
    """
    out = {
        "name": library.name,
        "module": library.module,
        "importable": False,
        "version": None,
        "error": None,
        "ops": {},
        "missing": [],
        "problems": [],
    }
    mod, why = _import(library.module)
    if mod is None:
        out["error"] = why
        return out
    out["importable"] = True
    top = importlib.import_module(library.module.split(".")[0])
    out["version"] = str(getattr(top, "__version__", None) or "") or None
    for op in library.symbols:
        fn, sym, reasons = _lookup(mod, library, op)
        out["ops"][op] = f"{library.module}.{sym}" if fn is not None else None
        if fn is None:
            out["missing"].append(op)
            out["problems"].append(f"{library.name} ({library.module}) lacks {op}: " + "; ".join(reasons))
    return out
