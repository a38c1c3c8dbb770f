"""Workloads of the served view: the requests a load point sends and when they arrive.

:class:`RequestInput` is one request (prompt and lengths); :func:`build_workload` draws ``n`` random prompts of a
target input length (ISL) asking for a target output length (OSL), optionally spread uniformly around them, with
an optional shared prefix per group of requests; :func:`fresh_workload` gives each point of a sweep prompts no
other point sends; :data:`WORKLOAD_PRESETS` names the usual ISL/OSL pairs; :func:`arrival_gaps_s` draws the gaps
between arrivals for a request rate and burstiness. The loop that sends them is :mod:`kit.serve.loop`.

Why fresh prompts per point: a sweep that sends the same prompts at every concurrency lets a server's prefix cache
serve every point after the first, so the sweep measures the cache, not the model (vLLM issue 54227 saw TTFT 49×
too low). A point's prompts are drawn from a seed derived from the sweep's seed and the point's key
(:func:`point_seed`), so they differ between points and are the same when a point is measured again.

Prompt lengths are exact when a tokenizer is known: a text prompt is decoded from random token ids, re-encoded, then
cut or extended until the server's count of it is ``isl`` (:func:`fit_prompt`; the tokens the server adds are
counted: a completions prompt's special tokens, a chat prompt's template around the one user message), since
decoding random ids and encoding the text again gives other tokens (5–7 % more on a byte-level BPE). Token-id
prompts are exact by construction; word prompts (no tokenizer) have a count only the server knows. Each request
keeps its target (``RequestInput.target_tokens``) beside the client's count, so a row can compare both with the
server's (:func:`kit.serve.aggregate.prompt_columns`).

A prefix-shared workload splits the requests into groups of ``group_size``; the first ``round(prefix_fraction ×
isl)`` tokens of every prompt in a group are the same (like a system prompt), the rest are the request's own. A
perfect prefix cache then serves :func:`intended_hit_rate` of the prompt tokens;
:func:`kit.serve.aggregate.achieved_hit_rate` is what the server reports
(``usage.prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kit.errors import UserError

if TYPE_CHECKING:  # the type only: kit.serve.load imports this module
    from kit.serve.load import LoadConfig

#: ISL/OSL workload presets (tokens): the seed's 1024/400 and InferenceX-style 1k/1k, 1k/8k, 8k/1k.
WORKLOAD_PRESETS: dict[str, tuple[int, int]] = {
    "seed": (1024, 400),
    "1k/1k": (1024, 1024),
    "1k/8k": (1024, 8192),
    "8k/1k": (8192, 1024),
}


@dataclass
class RequestInput:
    """One request of a workload: a prompt (text, or token ids for ``/v1/completions``) and its lengths (tokens).

    Attributes:
        input_tokens: the prompt tokens as the server will count them, by the client's tokenizer (special tokens
            and a chat template included); None when the client cannot count them.
        max_tokens: output tokens asked for.
        target_tokens: the prompt length the workload asked for (its ISL, drawn within the ISL range); None when
            the request was not built to a length (a conversation's history, a trace's text prompt).
    """

    prompt: str | list[int]
    input_tokens: int | None
    max_tokens: int
    target_tokens: int | None = None


#: token ids drawn for prompts without a tokenizer
ID_RANGE = (1000, 20000)
#: most distinct prompts one point draws (a longer run reuses them in order)
MAX_PROMPTS = 4096


def fresh_seed() -> int:
    """A new prompt seed (31 bits) for a run that pinned none: its prompts differ from every earlier run's, so a
    server's prefix cache cannot answer them from an earlier run."""
    return secrets.randbelow(2**31)


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


#: re-encodings :func:`fit_prompt` tries before it keeps the closest prompt it found (as vLLM 0.32's random
#: dataset does: ``vllm/benchmarks/datasets/datasets.py``, ``gen_prompt_decode_to_target_len(max_retry=10)``)
MAX_FIT_TRIES = 10


def prompt_counter(tokenizer, chat: bool):
    """``text -> (ids, n)``: the text's token ids without special tokens and its prompt tokens as the server counts
    them, for an HF tokenizer: a completions prompt with the tokenizer's special tokens (vLLM's
    ``add_special_tokens=True`` default), a chat prompt as the one user message rendered by the tokenizer's chat
    template and encoded without special tokens (what vLLM and SGLang do; a tokenizer without a template counts
    the message alone, and the server's count shows the difference)."""

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    if chat and getattr(tokenizer, "chat_template", None):

        def templated(text: str) -> tuple[list[int], int]:
            msgs = [{"role": "user", "content": text}]
            rendered = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            return encode(text), len(encode(rendered))

        return templated
    added = 0 if chat else int(getattr(tokenizer, "num_special_tokens_to_add", lambda: 0)())

    def plain(text: str) -> tuple[list[int], int]:
        ids = encode(text)
        return ids, len(ids) + added

    return plain


def fit_prompt(ids: list[int], target: int, tokenizer, count, draw) -> tuple[str, int]:
    """``(text, n)``: a text prompt that starts as ``ids`` decoded and whose server-side count (``count``:
    :func:`prompt_counter`) is ``target`` (``n``), or the closest found in :data:`MAX_FIT_TRIES` re-encodings. Each
    try cuts the text's ids past the target (the tokens the server adds beyond them are kept in the budget) or
    appends ``draw(k)`` new ids, and decodes again: decoding random ids and encoding the text merges or splits
    tokens, so one pass is not enough. The first ids are kept (a shared prefix stays shared)."""
    text = tokenizer.decode(ids)
    enc, n = count(text)
    best = (abs(n - target), text, n)
    for _ in range(MAX_FIT_TRIES):
        if n == target:
            break
        want = max(1, target - (n - len(enc)))  # the content's share of the target
        enc = enc[:want] if len(enc) > want else enc + draw(want - len(enc))
        text = tokenizer.decode(enc)
        enc, n = count(text)
        best = min(best, (abs(n - target), text, n), key=lambda b: b[0])
    return best[1], best[2]


def _as_request(ids: list[int], osl: int, tokenizer, vocab, as_token_ids: bool, fit=None) -> RequestInput:
    if as_token_ids:  # sent as ids: the server counts exactly these
        return RequestInput(ids, len(ids), osl, len(ids))
    if vocab is None:  # no tokenizer: one word per token, count unknown to the client
        return RequestInput(" ".join(f"w{i}" for i in ids), None, osl, len(ids))
    text, n = fit(ids)
    return RequestInput(text, n, osl, len(ids))


@dataclass(frozen=True)
class PromptSpec:
    """The lengths and sharing of a workload's prompts.

    Attributes:
        isl, osl: input and output tokens per request (>= 1).
        isl_range, osl_range: draw each request's lengths uniformly in ``x·(1 ± r)``, 0 <= r < 1 (the shared
            prefix keeps its nominal length; the request's own part makes up the rest).
        prefix_fraction: share of each prompt common to its group (0: every prompt its own), in [0, 1].
        group_size: requests per sharing group (>= 1).
        chat: the prompts go to ``/v1/chat/completions`` as one user message, so the chat template's tokens count
            toward ``isl`` (with a tokenizer that has a template).
    """

    isl: int
    osl: int
    isl_range: float = 0.0
    osl_range: float = 0.0
    prefix_fraction: float = 0.0
    group_size: int = 8
    chat: bool = False

    def check(self) -> PromptSpec:
        """Returns self. Raises: UserError naming a length or group size < 1, a fraction outside [0, 1], or a
        range outside [0, 1)."""
        if min(self.isl, self.osl, self.group_size) < 1:
            raise UserError(f"isl={self.isl}, osl={self.osl}, group_size={self.group_size}; all must be >= 1")
        if not 0.0 <= float(self.prefix_fraction) <= 1.0:
            raise UserError(f"prefix_fraction={self.prefix_fraction}; must be in [0, 1]")
        if not (0.0 <= self.isl_range < 1.0 and 0.0 <= self.osl_range < 1.0):
            raise UserError(f"isl_range={self.isl_range}, osl_range={self.osl_range}; both must be in [0, 1)")
        return self


def build_workload(
    n: int, spec: PromptSpec, tokenizer=None, seed: int = 0, as_token_ids: bool = False
) -> list[RequestInput]:
    """``n`` prompts of ``spec.isl`` tokens asking for ``spec.osl``; within each group of ``spec.group_size``
    consecutive requests the first ``round(prefix_fraction × isl)`` tokens are shared, the rest drawn per request.
    With an HF tokenizer, random non-special ids (decoded to text of exactly the target length as the server
    counts it, :func:`fit_prompt`, unless ``as_token_ids``); without one, ids in :data:`ID_RANGE` (sent as ids with
    ``as_token_ids``, else as words ``w<id>``, token count unknown). Each request's ``target_tokens`` is its drawn
    ISL. Prompts are distinct (redrawn on a clash) whenever the unshared part has at least one token.

    Raises:
        UserError: n < 1, or a bad ``spec`` (:meth:`PromptSpec.check`).
    """
    if int(n) < 1:
        raise UserError(f"n={n}; a workload needs at least one request")
    spec.check()
    rng = np.random.default_rng(seed)
    vocab = _vocab(tokenizer)

    def length(x: int, r: float) -> int:
        lo, hi = max(1, int(round(x * (1 - r)))), max(1, int(round(x * (1 + r))))
        return int(rng.integers(lo, hi + 1)) if hi > lo else x

    def draw(k: int) -> list[int]:
        if vocab is not None:
            return [int(x) for x in rng.choice(vocab, size=k)]
        return [int(x) for x in rng.integers(*ID_RANGE, size=k)]

    n_prefix = int(round(float(spec.prefix_fraction) * spec.isl))
    count = prompt_counter(tokenizer, spec.chat) if vocab is not None and not as_token_ids else None
    out, seen, prefix = [], set(), []
    for i in range(int(n)):
        if i % spec.group_size == 0:
            prefix = draw(n_prefix)
        target = length(spec.isl, spec.isl_range)
        own = max(0, target - n_prefix)
        ids = prefix + draw(own)
        while own and tuple(ids) in seen:
            ids = prefix + draw(own)
        seen.add(tuple(ids))
        fit = (lambda x, t=len(ids): fit_prompt(x, t, tokenizer, count, draw)) if count else None
        out.append(_as_request(ids, length(spec.osl, spec.osl_range), tokenizer, vocab, as_token_ids, fit))
    return out


def intended_hit_rate(n: int, prefix_fraction: float, group_size: int, first: int = 0) -> float:
    """Fraction of the prompt tokens of requests ``first`` … ``first + n − 1`` of :func:`build_workload`'s
    workload that a perfect prefix cache serves: every request of a group but its first (index a multiple of
    ``group_size``) finds the shared prefix, so f × #{i : i mod group_size ≠ 0} / n. ``first`` skips the warm-up
    requests, which come first."""
    hits = sum(1 for i in range(int(first), int(first) + int(n)) if i % int(group_size))
    return float(prefix_fraction) * hits / n if n else 0.0


def fresh_workload(
    cfg: LoadConfig, point_key: int | str, tokenizer=None, prefix_fraction: float = 0.0, group_size: int = 8
) -> list[RequestInput]:
    """The requests of one sweep point (warm-up + measured; 256 measured for a duration-only run; at most
    :data:`MAX_PROMPTS`), drawn from :func:`point_seed` of ``cfg.seed`` and ``point_key`` (the point's index or
    ``point_id``; ``cfg.seed`` None: a new seed per call), so no two points of a sweep send the same prompt;
    ``prefix_fraction`` > 0 shares prefixes within groups (:func:`build_workload`). Token-id prompts on
    ``/v1/completions`` without a tokenizer. Lengths ``cfg.isl`` / ``cfg.osl``, drawn within ``cfg.isl_range`` /
    ``cfg.osl_range`` when set; exact lengths as the server counts them on ``cfg.endpoint`` (a chat template's
    tokens included) when a tokenizer is given (:func:`fit_prompt`).

    Raises:
        UserError: see :func:`build_workload`.
    """
    n = min((cfg.num_requests or 256) + cfg.warmup_requests, MAX_PROMPTS)
    ids = tokenizer is None and cfg.endpoint == "completions"
    chat = cfg.endpoint == "chat"
    spec = PromptSpec(cfg.isl, cfg.osl, cfg.isl_range, cfg.osl_range, prefix_fraction, group_size, chat)
    seed = cfg.seed if cfg.seed is not None else fresh_seed()  # unpinned: prompts no earlier call drew
    return build_workload(n, spec, tokenizer, point_seed(seed, point_key), ids)


def arrival_gaps_s(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Gaps (s) before each of ``n`` requests: zeros for ``request_rate = inf``, else
    Gamma(shape=b, scale=1/(rate·b)) with burstiness b (b = 1: Poisson): mean 1/rate, variance 1/(rate²·b), so
    ``burstiness = inf`` gives gaps of exactly 1/rate. Convention of vLLM's ``benchmarks/serve.py``; docs/metrics.md,
    "Arrivals". Every gap returned is finite and >= 0.

    Raises:
        UserError: rate or burstiness NaN or not > 0 (each named).
    """
    for name, v in (("request_rate", request_rate), ("burstiness", burstiness)):
        if not (float(v) > 0):  # also NaN
            raise UserError(f"{name}={v!r}; must be > 0 (inf allowed)")
    if math.isinf(request_rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        return np.full(n, 1.0 / request_rate)
    rng = np.random.default_rng(seed + 7919)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    if not np.isfinite(gaps).all():  # e.g. a rate so small that 1/rate overflows
        raise UserError(f"request_rate={request_rate!r}, burstiness={burstiness!r} give non-finite arrival gaps")
    return gaps
