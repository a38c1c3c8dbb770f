"""Sampled frequencies: does a sampler draw ids with the right distribution?

Eager and compiled samplers draw different random numbers for the same seed (pytorch #118735), so their ids
cannot be compared draw by draw; their distributions can. :func:`frequency_check` draws many ids and applies
Pearson's χ² goodness-of-fit test against the probabilities; a draw of a zero-probability (or invalid) id fails
outright.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import scipy.stats
import torch

from kit.errors import UserError


@dataclass
class FrequencyResult:
    """Pearson χ² goodness-of-fit of sampled ids against ``probs``.

    Attributes:
        counts: draws per id (length vocab). expected: ``n_draws · p`` per id. chi2, dof, p_value: the test.
        alpha: significance level (passes when ``p_value ≥ alpha``). impossible: draws of a zero-probability or
            invalid id (fail the check outright). n_draws: ids drawn.
    """

    counts: list[int]
    expected: list[float]
    chi2: float
    dof: int
    p_value: float
    alpha: float
    impossible: int
    n_draws: int

    @property
    def passed(self) -> bool:
        return self.impossible == 0 and self.p_value >= self.alpha

    def __str__(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        return (
            f"frequency check {verdict}: n={self.n_draws}, counts={self.counts}, expected="
            f"{[round(e, 1) for e in self.expected]}, chi2={self.chi2:.3g} (dof {self.dof}), "
            f"p={self.p_value:.3g} (alpha {self.alpha:g}), impossible draws={self.impossible}"
        )


def frequency_check(
    sampler: Callable[[torch.Tensor], torch.Tensor], probs, n_draws: int = 1000, alpha: float = 1e-3
) -> FrequencyResult:
    """Draw ``n_draws`` ids with ``sampler`` and test them against ``probs`` (Pearson's χ² test).

    The sampler is called once on ``probs`` repeated ``n_draws`` times, shape ``(n_draws, vocab)``, and must
    return ``(n_draws,)`` ids. This is how eager and compiled samplers are compared: their random streams differ,
    their distributions must not (e.g. probs ``[.25, .25, .5]``, 1000 draws). p-value: ``scipy.stats.chi2.sf`` with
    ``dof`` = (ids of non-zero probability) − 1; 1.0 when there is a single such id.

    Args:
        sampler: ``(n_draws, vocab)`` probabilities → ``(n_draws,)`` ids.
        probs: 1-d probabilities (tensor or list; need not sum to 1).
        n_draws: ids to draw (≥ 1). alpha: significance level in (0, 1).

    Returns:
        A :class:`FrequencyResult`.

    Raises:
        UserError: probs not a 1-d floating tensor/list with a positive sum; n_draws < 1; alpha not in (0, 1);
            the sampler returns the wrong shape.
    """
    p = torch.as_tensor(probs, dtype=torch.float64) if not isinstance(probs, torch.Tensor) else probs
    if p.dim() != 1 or not p.is_floating_point() or not bool((p >= 0).all()) or float(p.sum()) <= 0:
        raise UserError(
            f"probs must be a 1-d floating tensor of non-negative values with a positive sum; got "
            f"{tuple(p.shape)} {p.dtype}"
        )
    if not isinstance(n_draws, int) or n_draws < 1:
        raise UserError(f"n_draws must be an int ≥ 1; got {n_draws!r}")
    if not 0 < alpha < 1:
        raise UserError(f"alpha must be in (0, 1); got {alpha!r}")
    ids = sampler(p.unsqueeze(0).expand(n_draws, -1).contiguous())
    if not isinstance(ids, torch.Tensor) or tuple(ids.shape) != (n_draws,):
        raise UserError(f"sampler must return ids of shape ({n_draws},); got {tuple(getattr(ids, 'shape', ()))}")
    ids = ids.cpu().long()
    v = p.numel()
    expected = (p.double().cpu() / p.double().sum()) * n_draws
    valid = (ids >= 0) & (ids < v)
    counts = torch.bincount(ids[valid], minlength=v).double()
    impossible = int((~valid).sum()) + int(counts[expected == 0].sum())
    m = expected > 0
    chi2 = float(((counts[m] - expected[m]) ** 2 / expected[m]).sum())
    dof = int(m.sum()) - 1
    pval = 1.0 if dof < 1 else float(scipy.stats.chi2.sf(chi2, dof))
    return FrequencyResult(
        [int(c) for c in counts.tolist()], expected.tolist(), chi2, dof, pval, alpha, impossible, n_draws
    )
