"""Deliberately wrong sampling ops, for demonstrations and for testing the checks themselves.

Not used by the kit: the how-to notebooks and the tests pass them to :func:`kit.check.harness.check_op` (or to
``kit qualify --op-impl OP=kit.check.planted:NAME``) to show what a failing check looks like: wrong probabilities
(:func:`top_p_renorm_prob_drops_crossing_token`) and a compiled path that differs from eager
(:func:`top_k_renorm_prob_wrong_when_compiled`).
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


def top_k_renorm_prob_wrong_when_compiled(probs: torch.Tensor, top_k) -> torch.Tensor:
    """A top-k that is right in eager mode and WRONG under ``torch.compile``: while compiling it keeps one token
    more than asked, so the compiled path differs from eager (what a graph-only code path with a bug looks like).

    Same signature as :func:`kit.check.sampling.top_k_renorm_prob`: ``probs`` ``(batch, vocab)``, ``top_k`` an int
    or a ``(batch,)`` tensor; returns ``(batch, vocab)`` in ``probs``'s dtype.
    """
    from kit.check.sampling import top_k_renorm_prob

    if torch.compiler.is_compiling():
        k = top_k + 1 if isinstance(top_k, int) else torch.where(top_k > 0, top_k + 1, top_k)
        return top_k_renorm_prob(probs, k)
    return top_k_renorm_prob(probs, top_k)
