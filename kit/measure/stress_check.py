"""Correctness at length: a cached decode step attends to the whole context.

The stress measures decode steps against a static cache; its speed curve means something only if such a step
computes what the model computes without a cache. :func:`cached_vs_uncached` prefills ``C`` random tokens into a
static cache (in chunks, as the stress's ``kv_fill="prefill"`` does), decodes token ``C + 1`` against it, and
compares its logits with one uncached forward over the same ``C + 1`` tokens. A control says whether the check can
fail: the uncached logits over only the last half of the context differ from the full ones by far more than the
tolerance, so a cache that dropped early tokens would not pass.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from kit import dtypes
from kit._io import atomic_write_text
from kit.measure.engine import Forward, new_cache, prefill

log = logging.getLogger("kit")

#: dtype → (atol, rtol) for logits of a whole forward (many ops, two different attention paths: masked static
#: cache vs causal): looser than torch.testing.assert_close's one-op defaults. Measured on the CPU presets at 1,024
#: tokens: float32 max abs(diff) 1e-6 on logits of magnitude ~1; bfloat16 0 (same rounding on both paths).
LOGIT_TOL: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


def cached_vs_uncached(
    model, context_len: int, batch: int = 1, chunk: int = 256, device: str = "cpu", seed: int = 0
) -> dict:
    """Compare a cached decode step at ``context_len`` with an uncached forward over the same tokens.

    Args:
        model: a causal LM from :func:`kit.models.build_model` (its config must allow ``context_len + 1``).
        context_len: tokens in the cache before the decode step (the uncached forward sees ``context_len + 1``).
        chunk: prefill chunk (tokens).

    Returns:
        dict: ``context_len``, ``batch``, ``dtype``, ``max_abs_err`` (logits of the decoded token, cached vs
        uncached), ``atol``/``rtol`` (:data:`LOGIT_TOL`), ``ok`` (every logit within ``atol + rtol × |ref|``),
        ``argmax_equal``, ``control_max_abs_diff`` (uncached over the last half of the context vs the whole) and
        ``control_discriminates`` (the control differs by more than the tolerance).
    """
    dev = torch.device(device)
    name = dtypes.name_of(next(model.parameters()).dtype)
    atol, rtol = LOGIT_TOL[name]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, int(model.config.vocab_size), (batch, context_len + 1), generator=g).to(dev)
    pos = torch.arange(context_len + 1, device=dev).unsqueeze(0).expand(batch, -1)
    with torch.inference_mode():
        fwd = Forward(model)
        cache = new_cache(model, context_len + 1)
        prefill(fwd, ids[:, :context_len], pos, cache, chunk)
        cached = fwd(ids[:, context_len:], pos[:, context_len:], cache)[:, -1].float()
        del cache
        ref = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1].float()
        half = model(input_ids=ids[:, context_len // 2 :], use_cache=False, logits_to_keep=1).logits[:, -1].float()
    err = (cached - ref).abs()
    control = float((half - ref).abs().max())
    return {
        "context_len": context_len,
        "batch": batch,
        "dtype": name,
        "max_abs_err": float(err.max()),
        "atol": atol,
        "rtol": rtol,
        "ok": bool((err <= atol + rtol * ref.abs()).all()),
        "argmax_equal": bool((cached.argmax(-1) == ref.argmax(-1)).all()),
        "control_max_abs_diff": control,
        "control_discriminates": control > atol + rtol * float(ref.abs().max()),
    }


def run_check(backend, out_dir: Path) -> dict:
    """The stress's check: :func:`cached_vs_uncached` on ``backend``'s model at ``config.check_context`` (batch
    1), written to ``out_dir/correctness.json``; a failure is logged as a warning (the speed curve is then not of
    a cache that attends to the whole context)."""
    cfg = backend.config
    res = cached_vs_uncached(backend.get_model(), cfg.check_context, device=backend.info.device, seed=cfg.seed)
    atomic_write_text(Path(out_dir) / "correctness.json", json.dumps(res, indent=2))
    level = logging.INFO if res["ok"] else logging.WARNING
    log.log(
        level,
        "cached decode vs uncached forward at %d tokens: max abs(diff) %.3g (tolerance %g + %g x |ref|): %s",
        res["context_len"],
        res["max_abs_err"],
        res["atol"],
        res["rtol"],
        "equal" if res["ok"] else "DIFFERENT",
    )
    return res
