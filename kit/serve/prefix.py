"""Fresh and prefix-shared workloads: every point of a sweep gets prompts no earlier point sent, unless the
workload asks for sharing, and then the sharing is stated.

Why: a sweep that sends the same prompts at every concurrency lets a server's prefix cache serve every point after
the first, so the sweep measures the cache, not the model (vLLM issue 54227 saw TTFT 49× too low). Here a point's
prompts are drawn from a seed derived from the sweep's seed and the point's key (:func:`point_seed`), so they
differ between points and are the same when a point is measured again.

A prefix-shared workload (:func:`build_prefix_workload`) splits the requests into groups of ``group_size``; the
first ``round(prefix_fraction × isl)`` tokens of every prompt in a group are the same (like a system prompt), the
rest are the request's own. A perfect prefix cache then serves :func:`intended_hit_rate` of the prompt tokens;
:func:`achieved_hit_rate` is what the server reports (``usage.prompt_tokens_details.cached_tokens``, OpenAI API;
vLLM with ``--enable-prompt-tokens-details``). :class:`FreshServedBackend` is the served backend of the grid
runner with fresh prompts per point and the prefix fraction as a sweep axis.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from kit.errors import UserError
from kit.grid import GridPoint
from kit.serve.load import LoadConfig
from kit.serve.sweep import ServedBackend, run_load_point, served_point_id
from kit.serve.workload import RequestInput

#: token ids drawn for prompts without a tokenizer (the range build_workload uses)
ID_RANGE = (1000, 20000)
#: most distinct prompts one point draws (a longer run reuses them in order)
MAX_PROMPTS = 4096


def point_seed(seed: int, key: int | str) -> int:
    """A 63-bit seed from a sweep's ``seed`` and a point's key (its index or ``point_id``): distinct keys give
    unrelated prompt streams; the same key gives the same prompts again."""
    digest = hashlib.sha1(json.dumps([int(seed), str(key)]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _vocab(tokenizer) -> np.ndarray | None:
    if tokenizer is None or not (hasattr(tokenizer, "decode") and hasattr(tokenizer, "vocab_size")):
        return None
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return np.array([i for i in range(int(tokenizer.vocab_size)) if i not in special])


def _as_request(ids: list[int], osl: int, tokenizer, vocab, as_token_ids: bool) -> RequestInput:
    if as_token_ids:
        return RequestInput(ids, len(ids), osl)
    if vocab is None:  # no tokenizer: one word per token, count unknown to the client
        return RequestInput(" ".join(f"w{i}" for i in ids), None, osl)
    text = tokenizer.decode(ids)
    return RequestInput(text, len(tokenizer(text, add_special_tokens=False)["input_ids"]), osl)


def build_prefix_workload(
    n: int,
    isl: int,
    osl: int,
    prefix_fraction: float = 0.0,
    group_size: int = 8,
    tokenizer=None,
    seed: int = 0,
    as_token_ids: bool = False,
    isl_range: float = 0.0,
    osl_range: float = 0.0,
) -> list[RequestInput]:
    """``n`` prompts of ``isl`` tokens asking for ``osl``; within each group of ``group_size`` consecutive
    requests the first ``round(prefix_fraction × isl)`` tokens are shared, the rest drawn per request. With an HF
    tokenizer, random non-special ids (decoded to text unless ``as_token_ids``); without one, ids in
    :data:`ID_RANGE` (sent as ids with ``as_token_ids``, else as words ``w<id>``, token count unknown). Prompts
    are distinct (redrawn on a clash) whenever the unshared part has at least one token. With ``isl_range`` /
    ``osl_range`` r each request's lengths are drawn uniformly in ``x·(1 ± r)`` (the shared prefix keeps its
    nominal length; the request's own part makes up the rest).

    Raises:
        UserError: n, isl, osl or group_size < 1, prefix_fraction outside [0, 1], or a range outside [0, 1).
    """
    if min(n, isl, osl, group_size) < 1:
        raise UserError(f"n={n}, isl={isl}, osl={osl}, group_size={group_size}; all must be >= 1")
    if not 0.0 <= float(prefix_fraction) <= 1.0:
        raise UserError(f"prefix_fraction={prefix_fraction}; must be in [0, 1]")
    if not (0.0 <= isl_range < 1.0 and 0.0 <= osl_range < 1.0):
        raise UserError(f"isl_range={isl_range}, osl_range={osl_range}; both must be in [0, 1)")
    rng = np.random.default_rng(seed)

    def length(x: int, r: float) -> int:
        lo, hi = max(1, int(round(x * (1 - r)))), max(1, int(round(x * (1 + r))))
        return int(rng.integers(lo, hi + 1)) if hi > lo else x

    vocab = _vocab(tokenizer)

    def draw(k: int) -> list[int]:
        if vocab is not None:
            return [int(x) for x in rng.choice(vocab, size=k)]
        return [int(x) for x in rng.integers(*ID_RANGE, size=k)]

    n_prefix = int(round(float(prefix_fraction) * isl))
    out, seen, prefix = [], set(), []
    for i in range(n):
        if i % group_size == 0:
            prefix = draw(n_prefix)
        own = max(0, length(isl, isl_range) - n_prefix)
        ids = prefix + draw(own)
        while own and tuple(ids) in seen:
            ids = prefix + draw(own)
        seen.add(tuple(ids))
        out.append(_as_request(ids, length(osl, osl_range), tokenizer, vocab, as_token_ids))
    return out


def intended_hit_rate(n: int, prefix_fraction: float, group_size: int, first: int = 0) -> float:
    """Fraction of the prompt tokens of requests ``first`` … ``first + n − 1`` of :func:`build_prefix_workload`'s
    workload that a perfect prefix cache serves: every request of a group but its first (index a multiple of
    ``group_size``) finds the shared prefix, so f × #{i : i mod group_size ≠ 0} / n. ``first`` skips the warm-up
    requests, which come first."""
    hits = sum(1 for i in range(int(first), int(first) + int(n)) if i % int(group_size))
    return float(prefix_fraction) * hits / n if n else 0.0


def achieved_hit_rate(records: Sequence[dict]) -> float | None:
    """Σ cached_tokens / Σ input_tokens over measured, completed requests whose record carries ``cached_tokens``
    (the server's ``usage.prompt_tokens_details.cached_tokens``); None when no record does."""
    rs = [r for r in records if r.get("ok") and not r.get("warmup") and r.get("cached_tokens") is not None]
    tot = sum(int(r.get("input_tokens") or 0) for r in rs)
    return sum(int(r["cached_tokens"]) for r in rs) / tot if rs and tot else None


def fresh_workload(
    cfg: LoadConfig, point_key: int | str, tokenizer=None, prefix_fraction: float = 0.0, group_size: int = 8
) -> list[RequestInput]:
    """The requests of one sweep point (warm-up + measured; 256 measured for a duration-only run; at most
    :data:`MAX_PROMPTS`), drawn from :func:`point_seed` of ``cfg.seed`` and ``point_key`` (the point's index or
    ``point_id``), so no two points of a sweep send the same prompt; ``prefix_fraction`` > 0 shares prefixes
    within groups (:func:`build_prefix_workload`). Token-id prompts on ``/v1/completions`` without a tokenizer.
    Lengths ``cfg.isl`` / ``cfg.osl``, drawn within ``cfg.isl_range`` / ``cfg.osl_range`` when set.

    Raises:
        UserError: see :func:`build_prefix_workload`.
    """
    n = min((cfg.num_requests or 256) + cfg.warmup_requests, MAX_PROMPTS)
    ids = tokenizer is None and cfg.endpoint == "completions"
    seed = point_seed(cfg.seed, point_key)
    return build_prefix_workload(
        n, cfg.isl, cfg.osl, prefix_fraction, group_size, tokenizer, seed, ids, cfg.isl_range, cfg.osl_range
    )


def read_detail(row: dict) -> list[dict]:
    """The request records of a served row (its ``x_detail_file``); [] when it has none."""
    path = row.get("x_detail_file")
    if not path or not Path(path).exists():
        return []
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


class FreshServedBackend(ServedBackend):
    """:class:`kit.serve.sweep.ServedBackend` with fresh prompts per point and the prefix fraction as a sweep
    axis: one point per (prefix fraction, concurrency), each with :func:`fresh_workload` keyed by its
    ``point_id``. Rows add ``x_prefix_fraction``, ``x_prefix_group_size``, ``x_prefix_hit_rate_intended``,
    ``x_prefix_hit_rate_achieved`` (None unless the server reports cached tokens) and ``x_fresh_prompts``.

    Args:
        prefix_fractions: fractions of each prompt shared within a group (each in [0, 1]).
        group_size: requests per sharing group (>= 1).
        kwargs: the arguments of :class:`kit.serve.sweep.ServedBackend` (``workload`` must be None).

    Raises:
        UserError: a fraction outside [0, 1], group_size < 1, an explicit workload, or ServedBackend's errors.
    """

    def __init__(self, config, concurrencies, out_dir, *, prefix_fractions=(0.0,), group_size: int = 8, **kw):
        if kw.get("workload") is not None:
            raise UserError("FreshServedBackend draws its own prompts per point; give no workload")
        fr = list(dict.fromkeys(float(f) for f in prefix_fractions))
        if not fr or any(not 0.0 <= f <= 1.0 for f in fr) or int(group_size) < 1:
            raise UserError(
                f"prefix_fractions={list(prefix_fractions)} (each in [0, 1]), group_size={group_size} (>= 1)"
            )
        super().__init__(config, concurrencies, out_dir, **kw)
        self.prefix_fractions, self.group_size = fr, int(group_size)

    def prefix_columns(self, frac: float, cfg: LoadConfig) -> dict:
        """The intended-sharing columns of a point (the hit rate over its measured requests)."""
        n = cfg.num_requests or 256
        return {
            "x_prefix_fraction": frac,
            "x_prefix_group_size": self.group_size,
            "x_prefix_hit_rate_intended": intended_hit_rate(n, frac, self.group_size, cfg.warmup_requests),
            "x_fresh_prompts": True,
        }

    def points(self) -> list[GridPoint]:
        """One point per (prefix fraction, concurrency); ids carry both."""
        if self._points is None:
            base = super().points()
            self._points = []
            for frac in self.prefix_fractions:
                for p in base:
                    c: LoadConfig = p.config
                    pid = f"{served_point_id(c)}-pf{frac:g}g{self.group_size}"
                    cols = {**p.columns, **self.prefix_columns(frac, c)}
                    self._points.append(GridPoint(pid, cols, f"{p.label} prefix={frac:g}", replace(c)))
        return self._points

    def session(self):
        """Nothing shared across points (each draws its own prompts)."""
        return contextlib.nullcontext(self)

    def measure(self, point: GridPoint) -> dict:
        """The row of one point: :func:`kit.serve.sweep.run_load_point` with this point's fresh workload."""
        frac = point.columns["x_prefix_fraction"]
        wl = fresh_workload(point.config, point.point_id, self.tokenizer, frac, self.group_size)
        extra = {**self.extra, **{k: v for k, v in point.columns.items() if k.startswith("x_prefix")}}
        row = run_load_point(
            point.config,
            self.out_dir,
            self.tokenizer,
            wl,
            extra,
            self.on_progress,
            self.model_error,
            point.point_id,
            self.on_status,
        )
        row["x_fresh_prompts"] = True
        row["x_prefix_hit_rate_achieved"] = achieved_hit_rate(read_detail(row))
        return row
