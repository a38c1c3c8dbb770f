"""Inputs for the op checks: generated batches and named edge-case batches, one generator per op.

Each generator takes ``(dtype, device, generator)`` and returns ``[Case("generated", ...), Case("edge", ...)]``:
six rows of 48 distinct probabilities (or logits) with per-row parameters placed so the kept set is unambiguous at
the dtype's precision, then one batch of 8-token rows whose labels name the edge they probe (``k=0 (disabled)``,
``ties at pivot``, ``all-zero row``, ``NaN row``, …). :mod:`kit.check.harness` pairs each generator with its
reference in :data:`kit.check.harness.OP_CHECKS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Case:
    """One input to an op: ``args[0]`` is the ``(batch, vocab)`` tensor; ``rows`` labels each row (edge cases)."""

    name: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    rows: list[str] | None = None


def _distinct_probs(batch: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Rows of distinct probabilities that stay distinct after rounding to bfloat16 (vocab ≤ 64): each row is
    ``j / sum(j)`` for ``vocab`` distinct integers ``j`` in 1..2·vocab (neighbours differ by > 2⁻⁷ relative)."""
    j = torch.stack([torch.randperm(2 * vocab, generator=g)[:vocab] + 1 for _ in range(batch)]).double()
    return j / j.sum(-1, keepdim=True)


def _mid_thresholds(probs: torch.Tensor, g: torch.Generator, cumulative: bool) -> torch.Tensor:
    """Per-row thresholds placed midway between two neighbouring sorted values (cumulative mass for top-p, ratio to
    the max for min-p), among the top third, so the kept set is unambiguous at the dtype's precision."""
    x = probs.double()
    s = torch.sort(x, -1, descending=True).values
    v = torch.cumsum(s, -1) / s.sum(-1, keepdim=True) if cumulative else s / s[:, :1]
    r = torch.randint(0, max(1, x.shape[1] // 3), (x.shape[0], 1), generator=g)
    return ((v.gather(1, r) + v.gather(1, r + 1)) / 2).squeeze(1).float()


def _edge(rows: list[tuple[str, list[float], object]], dtype, device, vocab: int = 8):
    """(labels, ``(len(rows), vocab)`` tensor zero-padded, per-row parameters) of ``(label, values, param)`` rows."""
    labels = [r[0] for r in rows]
    x = torch.tensor([r[1] + [0.0] * (vocab - len(r[1])) for r in rows], dtype=torch.float64)
    return labels, x.to(dtype=dtype, device=device), [r[2] for r in rows]


NAN, INF, NINF = float("nan"), float("inf"), float("-inf")
_BASE = [0.05, 0.3, 0.1, 0.2, 0.15, 0.05, 0.1, 0.05]
_TIES = [0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05]
_ONEHOT = [0, 1, 0, 0, 0, 0, 0, 0]
_ZERO = [0.0] * 8
_NANROW = [NAN, 0.5, 0.25, 0.25]


def top_k_cases(dtype, device, g: torch.Generator) -> list[Case]:
    """Inputs ``(probs, top_k)`` for ``top_k_renorm_prob``: generated (6 × 48) and edge (9 × 8) batches."""
    p = _distinct_probs(6, 48, g).to(dtype=dtype, device=device)
    k = torch.randint(1, 48, (6,), generator=g).to(device)
    labels, x, ks = _edge(
        [
            ("k=0 (disabled)", _BASE, 0),
            ("k=vocab", _BASE, 8),
            ("k=2**30", _BASE, 2**30),
            ("k=1", _BASE, 1),
            ("ties at pivot, k=2", _TIES, 2),
            ("one-hot, k=2", _ONEHOT, 2),
            ("all-zero row", _ZERO, 3),
            ("NaN row", _NANROW, 3),
            ("inf row", [INF, 0.5], 3),
        ],
        dtype,
        device,
    )
    return [Case("generated", (p, k)), Case("edge", (x, torch.tensor(ks, device=device)), rows=labels)]


def top_p_cases(dtype, device, g: torch.Generator) -> list[Case]:
    """Inputs ``(probs, top_p)`` for ``top_p_renorm_prob``: generated (6 × 48) and edge (8 × 8) batches."""
    p = _distinct_probs(6, 48, g).to(dtype=dtype, device=device)
    tp = _mid_thresholds(p, g, cumulative=True).to(device)
    labels, x, ps = _edge(
        [
            ("p=0", _BASE, 0.0),
            ("p=1", _BASE, 1.0),
            ("p=1e-6", _BASE, 1e-6),
            ("mass exactly p", [0.5, 0.25, 0.125, 0.125], 0.5),
            ("ties at pivot, p=.3", _TIES, 0.3),
            ("one-hot, p=.9", _ONEHOT, 0.9),
            ("all-zero row", _ZERO, 0.5),
            ("NaN row", _NANROW, 0.5),
        ],
        dtype,
        device,
    )
    return [Case("generated", (p, tp)), Case("edge", (x, torch.tensor(ps, device=device)), rows=labels)]


def min_p_cases(dtype, device, g: torch.Generator) -> list[Case]:
    """Inputs ``(probs, min_p)`` for ``min_p_renorm_prob``: generated (6 × 48) and edge (8 × 8) batches."""
    p = _distinct_probs(6, 48, g).to(dtype=dtype, device=device)
    mp = _mid_thresholds(p, g, cumulative=False).to(device)
    labels, x, ps = _edge(
        [
            ("min_p=0", _BASE, 0.0),
            ("min_p=1", _BASE, 1.0),
            ("min_p=.8", [0.9, 0, 0, 0.1], 0.8),
            ("min_p=.05", [0.9, 0, 0, 0.1], 0.05),
            ("ties at pivot", _TIES, 1.0),
            ("one-hot", _ONEHOT, 0.5),
            ("all-zero row", _ZERO, 0.5),
            ("NaN row", _NANROW, 0.5),
        ],
        dtype,
        device,
    )
    return [Case("generated", (p, mp)), Case("edge", (x, torch.tensor(ps, device=device)), rows=labels)]


def mask_logits_cases(dtype, device, g: torch.Generator) -> list[Case]:
    """Inputs ``(logits, top_k)`` for ``top_k_mask_logits``: generated (6 × 48 log-probs) and edge (8 × 8)."""
    lg = _distinct_probs(6, 48, g).log().to(dtype=dtype, device=device)
    k = torch.randint(1, 48, (6,), generator=g).to(device)
    labels, x, ks = _edge(
        [
            ("k=0 (disabled)", _BASE, 0),
            ("k=vocab", _BASE, 8),
            ("k=1", _BASE, 1),
            ("ties at pivot, k=2", _TIES, 2),
            ("all -inf row", [NINF] * 8, 2),
            ("2 finite, k=3", [1.0, 2.0] + [NINF] * 6, 3),
            ("large logits", [1e4, -1e4, 3e3], 2),
            ("NaN row", _NANROW, 2),
        ],
        dtype,
        device,
    )
    return [Case("generated", (lg, k)), Case("edge", (x, torch.tensor(ks, device=device)), rows=labels)]


def temperature_cases(dtype, device, g: torch.Generator) -> list[Case]:
    """Inputs ``(logits, temperature)`` for ``softmax_with_temperature``: generated (6 × 48) and edge (7 × 8)."""
    lg = (torch.randn(6, 48, generator=g, dtype=torch.float64) * 3).to(dtype=dtype, device=device)
    t = (0.5 + 1.5 * torch.rand(6, generator=g)).to(device)
    labels, x, ts = _edge(
        [
            ("T=1", _BASE, 1.0),
            ("[2,1,0] T=2", [2.0, 1.0, 0.0] + [NINF] * 5, 2.0),
            ("T=0.5", _BASE, 0.5),
            ("T=100", _BASE, 100.0),
            ("all -inf row", [NINF] * 8, 1.0),
            ("large logits", [1e4, 0.0, -1e4], 1.0),
            ("NaN row", _NANROW, 1.0),
        ],
        dtype,
        device,
    )
    return [Case("generated", (lg, t)), Case("edge", (x, torch.tensor(ts, device=device)), rows=labels)]


def sampling_cases(dtype, device, g: torch.Generator) -> list[Case]:
    """Inputs ``(probs, top_k, top_p)`` with ``uniform=`` noise for ``top_k_top_p_sampling_from_probs``:
    generated (6 × 48) and edge (8 × 8, including u = 0 and u just below 1) batches."""
    p = _distinct_probs(6, 48, g).to(dtype=dtype, device=device)
    k = torch.randint(1, 48, (6,), generator=g).to(device)
    tp = (0.3 + 0.7 * torch.rand(6, generator=g)).to(device)
    u = torch.rand(6, generator=g).to(device)
    rows = [
        ("u=0", _BASE, 0, 1.0, 0.0),
        ("u→1", _BASE, 0, 1.0, 0.99999994),
        ("one-hot", _ONEHOT, 0, 1.0, 0.7),
        ("all-zero row", _ZERO, 0, 1.0, 0.5),
        ("NaN row", _NANROW, 0, 1.0, 0.5),
        ("k=1", _BASE, 1, 1.0, 0.9),
        ("p=0", _BASE, 0, 0.0, 0.9),
        ("ties, k=2", _TIES, 2, 1.0, 0.5),
    ]
    labels, x, _ = _edge([(r[0], r[1], None) for r in rows], dtype, device)
    ek = torch.tensor([r[2] for r in rows], device=device)
    ep = torch.tensor([r[3] for r in rows], device=device)
    eu = torch.tensor([r[4] for r in rows], dtype=torch.float32, device=device)
    return [Case("generated", (p, k, tp), {"uniform": u}), Case("edge", (x, ek, ep), {"uniform": eu}, rows=labels)]


def plain_sampling_cases(dtype, device, g: torch.Generator) -> list[Case]:
    """Inputs ``(probs,)`` with ``uniform=`` noise for ``sampling_from_probs`` (the rows of
    :func:`sampling_cases` without the filters)."""
    return [Case(c.name, c.args[:1], c.kwargs, c.rows) for c in sampling_cases(dtype, device, g)]
