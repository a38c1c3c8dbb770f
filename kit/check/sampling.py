"""Reference sampling ops in pure torch (any device, eager or ``torch.compile``), with their semantics written down.

These are the slow-but-obvious versions of the fused sampling kernels that serving engines import from
flashinfer, sgl_kernel or aiter. They exist so that a kernel can be checked against them
(:mod:`kit.check.harness`) and so that a missing kernel has a correct fallback
(:func:`kit.check.resolver.resolve_op`).

Shapes: ``probs`` / ``logits`` are ``(batch, vocab)``; per-row parameters (``top_k``, ``top_p``, ``min_p``,
``temperature``, ``uniform``) are a Python scalar (same for every row), a 0-d tensor, or a tensor of shape
``(batch,)``. Any other shape is a ``ValueError`` — a ``(batch, vocab)`` tensor would otherwise broadcast silently
(flashinfer #1634).

Semantics shared by every op (the choices are the kit's; each is tested):

* **Ties at the pivot are all kept.** A token is kept when its probability (logit) is ≥ the pivot value, so a
  top-k row with ties at the k-th value keeps more than k tokens. This makes every op independent of the order of
  the vocabulary and of the rows. Kernels that break ties by index differ only on such rows.
* **Disabled filters:** ``top_k = 0`` or ``top_k ≥ vocab`` keeps every token; ``top_p = 1`` keeps every token;
  ``min_p = 0`` keeps every token. A row that sums to 1 then comes back unchanged (up to rounding).
* ``top_p = 0`` keeps only the most probable token(s) (the limit p → 0⁺); ``min_p = 1`` likewise.
* **Renormalised outputs** are computed in float32 (float64 for float64 input) and returned in the input dtype.
  Probabilities need not sum to 1 on input: kept mass is divided by the row's kept total, and ``top_p`` is a
  fraction of the row's total.
* **A row containing NaN or ±inf** in ``probs`` (NaN in ``logits``) comes back all NaN: the fault stays visible
  and such a row is never silently sampled. Samplers return id ``-1`` for it.
* **A row whose probabilities are all 0** comes back all 0 (no division by zero); samplers return ``-1``.
* **A logits row that is all −inf** stays all −inf under :func:`top_k_mask_logits`; its softmax is all NaN
  (there is no token to choose), as with :func:`torch.softmax`.

Validation (``ValueError`` naming the argument and what is allowed): tensor types, 2-d shapes, floating dtypes,
per-row parameter shapes and integer/floating kinds always; the *values* of per-row tensors (k ≥ 0, p in [0, 1],
temperature > 0, uniform in [0, 1)) in eager mode only — under ``torch.compile`` a value check would need a
device-to-host sync and a graph break, so it is skipped there.
"""

from __future__ import annotations

import numbers

import torch

from kit.errors import UserError

__all__ = [
    "top_k_renorm_prob",
    "top_p_renorm_prob",
    "min_p_renorm_prob",
    "top_k_mask_logits",
    "apply_temperature",
    "softmax_with_temperature",
    "sampling_from_probs",
    "top_k_top_p_sampling_from_probs",
    "REFERENCE_OPS",
]


# ---------------------------------------------------------------------------------------------------------------
# validation
def _compiling() -> bool:
    return bool(torch.compiler.is_compiling())


def _check_matrix(x, name: str, what: str = "probabilities") -> None:
    if not isinstance(x, torch.Tensor):
        raise UserError(f"{name} must be a torch.Tensor of {what} with shape (batch, vocab); got {type(x).__name__}")
    if x.dim() != 2:
        raise UserError(f"{name} must have shape (batch, vocab); got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise UserError(f"{name} must be a floating tensor (float32, float16, bfloat16 or float64); got {x.dtype}")
    if x.shape[1] < 1:
        raise UserError(f"{name} must have vocab ≥ 1; got shape {tuple(x.shape)}")


def _per_row(v, name: str, batch: int, device, *, integer: bool, allowed: str) -> torch.Tensor:
    """A scalar / 0-d / (batch,) parameter as a (batch,) tensor (int64 if ``integer`` else float32)."""
    if isinstance(v, bool) or v is None:
        raise UserError(f"{name} must be {allowed}: a number or a tensor of shape ({batch},); got {v!r}")
    if isinstance(v, torch.Tensor):
        if v.dim() == 0:
            v = v.reshape(1).expand(batch)
        elif tuple(v.shape) != (batch,):
            raise UserError(
                f"{name} must be a scalar or a tensor of shape (batch,) = ({batch},); got shape {tuple(v.shape)}"
            )
        if integer and (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool):
            raise UserError(f"{name} must be an integer tensor (int32/int64); got {v.dtype}")
        if not integer and not v.is_floating_point():
            raise UserError(f"{name} must be a floating tensor; got {v.dtype}")
        if v.device != device:
            raise UserError(f"{name} is on {v.device} but the input is on {device}; put both on one device")
        return v.to(device=device, dtype=torch.int64 if integer else torch.float32)
    if integer:
        if not isinstance(v, numbers.Integral):
            raise UserError(
                f"{name} must be {allowed}: an int or an integer tensor of shape ({batch},); "
                f"got {type(v).__name__} {v!r}"
            )
        return torch.full((batch,), int(v), dtype=torch.int64, device=device)
    if not isinstance(v, numbers.Real):
        raise UserError(
            f"{name} must be {allowed}: a float or a float tensor of shape ({batch},); got {type(v).__name__} {v!r}"
        )
    return torch.full((batch,), float(v), dtype=torch.float32, device=device)


def _in_range(v, lo, hi, lo_open: bool = False, hi_open: bool = False):
    """Elementwise range test that works for Python numbers and tensors alike (NaN is never in range)."""
    a = (v > lo) if lo_open else (v >= lo)
    if hi is None:
        return a
    b = (v < hi) if hi_open else (v <= hi)
    return a & b


def _check_range(t: torch.Tensor, name: str, raw, allowed: str, lo, hi, lo_open=False, hi_open=False) -> None:
    """Raise ValueError if a value is out of range. Python scalars are checked in Python (no graph break under
    ``torch.compile``); tensors only in eager mode (a value check on a tensor needs a device-to-host sync)."""
    if not isinstance(raw, torch.Tensor):
        if not _in_range(raw, lo, hi, lo_open, hi_open):
            raise UserError(f"{name}={raw!r} is out of range; allowed: {allowed}")
        return
    if _compiling():
        return
    bad = (~_in_range(t, lo, hi, lo_open, hi_open)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise UserError(f"{name}[{i}]={t[i].item()!r} is out of range ({bad.numel()} bad value(s)); allowed: {allowed}")


def _k(top_k, batch, device) -> torch.Tensor:
    k = _per_row(top_k, "top_k", batch, device, integer=True, allowed="an integer ≥ 0 (0 = disabled)")
    _check_range(k, "top_k", top_k, "integers ≥ 0 (0 or ≥ vocab = keep every token)", 0, None)
    return k


def _p(top_p, name, batch, device) -> torch.Tensor:
    p = _per_row(top_p, name, batch, device, integer=False, allowed="a probability in [0, 1]")
    _check_range(p, name, top_p, "floats in [0, 1]", 0.0, 1.0)
    return p


def _work(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# filters
def _pivot_at(sorted_desc: torch.Tensor, n_keep: torch.Tensor) -> torch.Tensor:
    """Value of the ``n_keep``-th largest element per row (n_keep in 1..vocab), shape (batch, 1)."""
    idx = (n_keep.clamp(1, sorted_desc.shape[1]) - 1).unsqueeze(1)
    return sorted_desc.gather(1, idx)


def _renorm(x: torch.Tensor, keep: torch.Tensor, out_dtype) -> torch.Tensor:
    kept = torch.where(keep, x, torch.zeros_like(x))
    total = kept.sum(-1, keepdim=True)
    out = torch.where(total > 0, kept / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(kept))
    bad = ~torch.isfinite(x).all(-1, keepdim=True)
    out = torch.where(bad, torch.full_like(out, float("nan")), out)
    return out.to(out_dtype)


def _top_k_keep(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    vocab = x.shape[1]
    s = torch.sort(x, dim=-1, descending=True).values
    pivot = _pivot_at(s, k)
    disabled = ((k <= 0) | (k >= vocab)).unsqueeze(1)
    return disabled | (x >= pivot)


def _top_p_keep(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    s = torch.sort(x, dim=-1, descending=True).values
    total = s.sum(-1, keepdim=True)
    exclusive = torch.cumsum(s, dim=-1) - s  # mass strictly before each sorted position
    n_keep = (exclusive < p.unsqueeze(1).to(x.dtype) * total).sum(-1)
    pivot = _pivot_at(s, n_keep)
    disabled = (p >= 1).unsqueeze(1)
    return disabled | (x >= pivot)


def top_k_renorm_prob(probs: torch.Tensor, top_k) -> torch.Tensor:
    """Keep the ``top_k`` most probable tokens of each row and renormalise them to sum to 1.

    Args:
        probs: ``(batch, vocab)`` floating probabilities (need not be normalised).
        top_k: int, or integer tensor of shape ``(batch,)``; ``0`` or ``≥ vocab`` keeps every token.

    Returns:
        ``(batch, vocab)`` in ``probs.dtype``: kept tokens renormalised, the rest 0. Tokens tied with the k-th
        largest value are all kept. NaN/inf rows → all NaN; all-zero rows → all 0.

    Raises:
        ValueError: ``probs`` not a 2-d floating tensor; ``top_k`` not an int / integer tensor of shape
            ``(batch,)``; ``top_k < 0``.
    """
    _check_matrix(probs, "probs")
    k = _k(top_k, probs.shape[0], probs.device)
    x = _work(probs)
    return _renorm(x, _top_k_keep(x, k), probs.dtype)


def top_p_renorm_prob(probs: torch.Tensor, top_p) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most probable tokens whose mass reaches ``top_p``, renormalised.

    A token is kept when the mass of the tokens ranked strictly before it is ``< top_p × row total``; so the token
    whose mass *crosses* the threshold is kept (dropping it is the classic bug the harness demo plants).

    Args:
        probs: ``(batch, vocab)`` floating probabilities.
        top_p: float in [0, 1], or float tensor of shape ``(batch,)``. ``1`` keeps every token; ``0`` keeps only
            the most probable token(s).

    Returns:
        ``(batch, vocab)`` in ``probs.dtype``; ties at the pivot are all kept; NaN/inf rows → NaN; zero rows → 0.

    Raises:
        ValueError: bad ``probs``; ``top_p`` not a float / float tensor of shape ``(batch,)``, or outside [0, 1].
    """
    _check_matrix(probs, "probs")
    p = _p(top_p, "top_p", probs.shape[0], probs.device)
    x = _work(probs)
    return _renorm(x, _top_p_keep(x, p), probs.dtype)


def min_p_renorm_prob(probs: torch.Tensor, min_p) -> torch.Tensor:
    """Keep tokens with ``p ≥ min_p × max(p)`` in their row, renormalised (min-p sampling's filter).

    Args:
        probs: ``(batch, vocab)`` floating probabilities.
        min_p: float in [0, 1] or float tensor ``(batch,)``; ``0`` keeps every token, ``1`` only the maximum(s).

    Returns:
        ``(batch, vocab)`` in ``probs.dtype``. E.g. ``[0.9, 0, 0, 0.1]`` with min_p 0.8 → ``[1, 0, 0, 0]``,
        with 0.05 → unchanged (case S4; the rule is flashinfer's ``min_p_sampling_from_probs``).

    Raises:
        ValueError: bad ``probs``; ``min_p`` of the wrong kind/shape or outside [0, 1].
    """
    _check_matrix(probs, "probs")
    mp = _p(min_p, "min_p", probs.shape[0], probs.device)
    x = _work(probs)
    keep = x >= mp.unsqueeze(1).to(x.dtype) * x.max(-1, keepdim=True).values
    return _renorm(x, keep, probs.dtype)


def top_k_mask_logits(logits: torch.Tensor, top_k) -> torch.Tensor:
    """Set every logit below the row's k-th largest to −inf (top-k before softmax).

    Args:
        logits: ``(batch, vocab)`` floating logits (−inf allowed).
        top_k: int or integer tensor ``(batch,)``; ``0`` or ``≥ vocab`` leaves the row unchanged.

    Returns:
        ``(batch, vocab)`` in ``logits.dtype``; ties with the k-th value are kept; an all −inf row stays all −inf;
        a row containing NaN → all NaN.

    Raises:
        ValueError: ``logits`` not a 2-d floating tensor; bad ``top_k`` (kind, shape, < 0).
    """
    _check_matrix(logits, "logits", "logits")
    k = _k(top_k, logits.shape[0], logits.device)
    x = _work(logits)
    keep = _top_k_keep(x, k)
    out = torch.where(keep, logits, torch.full_like(logits, float("-inf")))
    nan_row = torch.isnan(logits).any(-1, keepdim=True)
    return torch.where(nan_row, torch.full_like(logits, float("nan")), out)


def _temperature(temperature, batch, device) -> torch.Tensor:
    t = _per_row(
        temperature,
        "temperature",
        batch,
        device,
        integer=False,
        allowed="a finite float > 0 (for greedy decoding use argmax, not temperature 0)",
    )
    _check_range(
        t,
        "temperature",
        temperature,
        "finite floats > 0 (for greedy decoding use argmax, not temperature 0)",
        0.0,
        float("inf"),
        lo_open=True,
        hi_open=True,
    )
    return t


def apply_temperature(logits: torch.Tensor, temperature) -> torch.Tensor:
    """Divide each row of logits by its temperature, once.

    Args:
        logits: ``(batch, vocab)`` floating logits.
        temperature: float > 0 or float tensor ``(batch,)`` of values > 0.

    Returns:
        ``(batch, vocab)`` logits / T, computed in float32, returned in ``logits.dtype``.

    Raises:
        ValueError: bad ``logits``; temperature ≤ 0, inf/NaN, or of the wrong shape.
    """
    _check_matrix(logits, "logits", "logits")
    t = _temperature(temperature, logits.shape[0], logits.device)
    x = _work(logits)
    return (x / t.to(x.dtype).unsqueeze(1)).to(logits.dtype)


def softmax_with_temperature(logits: torch.Tensor, temperature=1.0) -> torch.Tensor:
    """``softmax(logits / T)`` per row, temperature applied exactly once.

    Logits ``[2, 1, 0]`` at T = 2 → ``softmax([1, .5, 0]) = [.5065, .3072, .1863]``; dividing twice would give
    ``[.4192, .3265, .2543]`` (case S4, llama.cpp #7498).

    Args:
        logits: ``(batch, vocab)`` floating logits.
        temperature: float > 0 or float tensor ``(batch,)``.

    Returns:
        ``(batch, vocab)`` probabilities in ``logits.dtype`` (computed in float32). All −inf or NaN rows → NaN.

    Raises:
        ValueError: as :func:`apply_temperature`.
    """
    _check_matrix(logits, "logits", "logits")
    t = _temperature(temperature, logits.shape[0], logits.device)
    x = _work(logits)
    return torch.softmax(x / t.to(x.dtype).unsqueeze(1), dim=-1).to(logits.dtype)


# ---------------------------------------------------------------------------------------------------------------
# sampling
def _uniform(uniform, generator, batch, device) -> torch.Tensor:
    if uniform is None:
        return torch.rand(batch, generator=generator, device=device, dtype=torch.float32)
    if generator is not None:
        raise UserError("pass either uniform (explicit noise) or generator, not both")
    if not isinstance(uniform, torch.Tensor) or tuple(uniform.shape) != (batch,) or not uniform.is_floating_point():
        shape = tuple(uniform.shape) if isinstance(uniform, torch.Tensor) else type(uniform).__name__
        raise UserError(
            f"uniform must be a floating tensor of shape (batch,) = ({batch},) with values in [0, 1); got {shape}"
        )
    u = uniform.to(device=device, dtype=torch.float32)
    _check_range(u, "uniform", uniform, "floats in [0, 1)", 0.0, 1.0, hi_open=True)
    return u


def _inverse_cdf(q: torch.Tensor, u: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """First index whose cumulative mass exceeds ``u × total``; never a zero-probability token; -1 if invalid."""
    cdf = torch.cumsum(q, dim=-1)
    target = (u.to(q.dtype) * cdf[:, -1]).unsqueeze(1)
    idx = (cdf <= target).sum(-1)
    vocab = q.shape[1]
    positive = q > 0
    last_pos = (vocab - 1) - torch.flip(positive, dims=[1]).to(torch.int64).argmax(-1)
    idx = torch.minimum(idx, last_pos)
    return torch.where(valid, idx, torch.full_like(idx, -1))


def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k=0,
    top_p=1.0,
    *,
    uniform: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Sample one token id per row after top-k then top-p filtering (top-p acts on the top-k-renormalised row).

    Sampling is by inverse CDF: with noise ``u`` the id is the first token whose cumulative (filtered) mass exceeds
    ``u × total``. The same ``uniform`` gives the same ids in eager and compiled mode — compare those, or compare
    the filtered probabilities, never ids drawn from a generator (compiled code draws different random numbers,
    pytorch #118735; case S5).

    Args:
        probs: ``(batch, vocab)`` floating probabilities.
        top_k: as :func:`top_k_renorm_prob` (default 0 = off).
        top_p: as :func:`top_p_renorm_prob` (default 1 = off).
        uniform: optional ``(batch,)`` floats in [0, 1) — explicit noise, for reproducible checks.
        generator: optional :class:`torch.Generator` used when ``uniform`` is not given.

    Returns:
        ``(batch,)`` int64 token ids; ``-1`` for a row that has no token to sample (NaN/inf or all zero).

    Raises:
        ValueError: bad ``probs``, ``top_k``, ``top_p`` or ``uniform`` (shape, kind, range); both ``uniform`` and
            ``generator`` given.
    """
    _check_matrix(probs, "probs")
    batch, device = probs.shape[0], probs.device
    k = _k(top_k, batch, device)
    p = _p(top_p, "top_p", batch, device)
    u = _uniform(uniform, generator, batch, device)
    x = _work(probs)
    q = _renorm(x, _top_k_keep(x, k), x.dtype)
    q = _renorm(q, _top_p_keep(torch.nan_to_num(q, nan=0.0), p), x.dtype)
    valid = torch.isfinite(x).all(-1) & (q.sum(-1) > 0)
    return _inverse_cdf(torch.nan_to_num(q, nan=0.0), u, valid)


def sampling_from_probs(
    probs: torch.Tensor, *, uniform: torch.Tensor | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Sample one id per row from ``probs`` with no filtering (see :func:`top_k_top_p_sampling_from_probs`).

    Returns: ``(batch,)`` int64 ids, ``-1`` for rows with nothing to sample. Raises: ValueError as there.
    """
    return top_k_top_p_sampling_from_probs(probs, 0, 1.0, uniform=uniform, generator=generator)


#: canonical op name → the kit's reference implementation (what :func:`kit.check.resolver.resolve_op` falls back to)
REFERENCE_OPS = {
    "top_k_renorm_prob": top_k_renorm_prob,
    "top_p_renorm_prob": top_p_renorm_prob,
    "min_p_renorm_prob": min_p_renorm_prob,
    "top_k_mask_logits": top_k_mask_logits,
    "softmax_with_temperature": softmax_with_temperature,
    "top_k_top_p_sampling_from_probs": top_k_top_p_sampling_from_probs,
    "sampling_from_probs": sampling_from_probs,
}
