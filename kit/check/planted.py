"""A deliberately wrong sampling op, for demonstrations and for testing the check harness itself.

Not used by the kit: the how-to notebook and the tests pass it to :func:`kit.check.harness.check_op` to show what
a failing check looks like.
"""

from __future__ import annotations

import torch


def top_p_renorm_prob_drops_crossing_token(probs: torch.Tensor, top_p) -> torch.Tensor:
    """A deliberately WRONG top-p: keeps tokens whose *inclusive* cumulative mass is ≤ p, so the token that
    crosses the threshold is dropped (and a row whose top token alone exceeds p comes back all zero).

    Same signature as :func:`kit.check.sampling.top_p_renorm_prob`: ``probs`` ``(batch, vocab)``, ``top_p`` a
    float or a ``(batch,)`` tensor; returns ``(batch, vocab)`` in ``probs``'s dtype. No argument validation.
    """
    x = probs.float()
    p = top_p if isinstance(top_p, torch.Tensor) else torch.full((x.shape[0],), float(top_p))
    s, idx = torch.sort(x, -1, descending=True)
    keep_sorted = torch.cumsum(s, -1) <= p.to(x.device).unsqueeze(1) * s.sum(-1, keepdim=True)
    keep = torch.zeros_like(keep_sorted).scatter(1, idx, keep_sorted)
    kept = torch.where(keep, x, torch.zeros_like(x))
    total = kept.sum(-1, keepdim=True)
    return torch.where(total > 0, kept / total.clamp_min(1e-30), kept).to(probs.dtype)
