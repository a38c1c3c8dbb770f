"""Published Kimi K3 points with their conditions (``kit/data/published_kimi_k3_points.csv``), predicted like for
like with the planner, and the leave-one-out latency scale.

Each row is one measured point: system, accelerator and GPUs, framework and version / image date, speculative
decoding (method, draft, acceptance when stated), ISL/OSL, concurrency, precision, parallelism, the metric
(``tpot_ms`` or ``tok_s_per_stream``), its value and its source (UNSURE conditions in ``flags``).
:func:`predict_anchor` predicts a row under its own conditions — attended context ISL + OSL/2, the row's
concurrency, speculative decoding as the stack runs it when the row ran it, NVFP4 as routed experts in nvfp4 — and
says whether the stack it used is like for like (same platform and framework). :func:`fit_latency_scale` fits one
factor on a stack's latency figures (per-layer floors, host time, all-reduce α) to other rows, for
leave-one-out predictions (``benchmarks/planner_vs_published.py``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import pandas as pd

from kit._io import data_path
from kit.errors import UserError
from kit.plan.config import PredictConfig
from kit.plan.roofline import predict_point
from kit.plan.stack import StackProfile, default_stack

ANCHOR_COLUMNS = (
    "system", "accelerator", "gpus", "framework", "version", "image_date", "spec_method", "spec_draft", "spec_accept",
    "isl", "osl", "concurrency", "precision", "parallelism", "metric", "value", "source", "flags",
)  # fmt: skip
METRICS = ("tpot_ms", "tok_s_per_stream")


def load_anchors(path=None) -> pd.DataFrame:
    """The published points (default ``kit/data/published_kimi_k3_points.csv``), checked, with a ``key`` column
    (``system | framework | spec | c<concurrency> | <isl>/<osl> | precision``).

    Raises:
        UserError: a missing column, an unknown metric, or a value / ISL / OSL / concurrency / GPUs that is not a
            positive number (names the row and value).
    """
    p = path or data_path("published_kimi_k3_points.csv")
    df = pd.read_csv(p, keep_default_na=False)
    missing = [c for c in ANCHOR_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{p}: missing column(s) {missing}; required: {list(ANCHOR_COLUMNS)}")
    for i, r in df.iterrows():
        where = f"{p} row {i + 2} ({r['system']})"
        if r["metric"] not in METRICS:
            raise UserError(f"{where}: metric={r['metric']!r}; allowed: {list(METRICS)}")
        for col in ("value", "isl", "osl", "concurrency", "gpus"):
            try:
                v = float(r[col])
            except (TypeError, ValueError):
                v = math.nan
            if not (v > 0 and math.isfinite(v)):
                raise UserError(f"{where}: {col}={r[col]!r} must be a number > 0")
    df["key"] = [
        f"{r.system} | {r.framework.split(' (')[0]} | {r.spec_method or 'none'} | c{r.concurrency} | {r.isl}/{r.osl}"
        f" | {r.precision.split(' ')[0]}"
        for r in df.itertuples()
    ]
    return df


def like_for_like(row, stack: StackProfile | None) -> str:
    """``"like for like (<version>)"`` when ``stack`` is the row's platform and framework, else
    ``"not like for like: ..."`` naming what differs."""
    if stack is None:
        return "no stack profile: plain roofline"
    diffs = []
    if stack.platform.lower() != str(row["accelerator"]).lower():
        diffs.append(f"platform {row['accelerator']} vs stack's {stack.platform}")
    fw = str(row["framework"])
    if fw.lower().startswith("not stated"):
        diffs.append("framework not stated")
    elif not fw.lower().startswith(stack.engine.lower()):
        diffs.append(f"framework {fw} vs stack's {stack.engine}")
    if diffs:
        return "not like for like: " + "; ".join(diffs)
    ver = str(row["version"])
    return "like for like" + (" (version not stated)" if ver.lower().startswith("not stated") else f" ({ver})")


def anchor_config(row, stack: StackProfile | None, **layout) -> tuple[PredictConfig, int, int]:
    """``(PredictConfig, concurrency, attended context)`` of a row under ``stack`` (``layout``: tp/pp/ep)."""
    wd = "default=bfloat16;routed_experts=nvfp4" if str(row["precision"]).upper().startswith("NVFP4") else None
    spec_on = str(row["spec_method"]).strip().lower() not in ("", "none")
    cfg = PredictConfig(
        str(row["accelerator"]), int(row["gpus"]), prefill=False, stack=stack if stack is not None else "none",
        speculative=spec_on and stack is not None, weight_dtypes=wd, **layout,
    )  # fmt: skip
    return cfg, int(row["concurrency"]), int(row["isl"]) + int(row["osl"]) // 2


def predict_anchor(row, stack: StackProfile | None = None, model: str = "kimi-k3", **layout) -> dict:
    """One row predicted under its conditions with ``stack`` (default: the accelerator's default profile).

    Returns:
        dict: ``predicted`` (in the row's metric), ``published``, ``ratio`` (predicted / published, both as time
        per token: above 1 the planner is too slow), ``tpot_ms``, ``dominant``, ``stack``, ``like_for_like``,
        ``spec_note`` and the planner row (``row``).
    """
    stack = stack if stack is not None else default_stack(str(row["accelerator"]))
    cfg, B, C = anchor_config(row, stack, **layout)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = predict_point(model, B, C, cfg)
    tpot = p["tpot_ms_p50"]
    pub = float(row["value"])
    pub_tpot = pub if row["metric"] == "tpot_ms" else 1000.0 / pub
    return {
        "predicted": tpot if row["metric"] == "tpot_ms" else 1000.0 / tpot,
        "published": pub,
        "ratio": tpot / pub_tpot,
        "tpot_ms": tpot,
        "dominant": p["x_dominant_term"],
        "stack": stack.name if stack is not None else None,
        "like_for_like": like_for_like(row, stack),
        "spec_note": p.get("x_spec_note"),
        "row": p,
    }


def scaled(stack: StackProfile, s: float) -> StackProfile:
    """``stack`` with its latency figures (per-layer floors, host time, all-reduce α) multiplied by ``s``."""
    a = stack.allreduce_alpha_us
    return replace(
        stack,
        name=f"{stack.name}×{s:.2f}",
        floors_us={c: v * s for c, v in stack.floors_us.items()},
        host_us=stack.host_us * s,
        allreduce_alpha_us=None if a is None else a * s,
    )


def fit_latency_scale(stack: StackProfile, rows: pd.DataFrame, model: str = "kimi-k3") -> float:
    """The factor on ``stack``'s latency figures (:func:`scaled`) that best predicts ``rows`` (least squares of
    log(predicted / published) over a log grid from 0.25 to 4, refined once); 1.0 when ``rows`` is empty."""
    if rows.empty:
        return 1.0

    def loss(s):
        st = scaled(stack, s)
        return sum(math.log(predict_anchor(r, st, model)["ratio"]) ** 2 for _, r in rows.iterrows())

    grid = [0.25 * 2 ** (i / 3) for i in range(13)]
    best = min(grid, key=loss)
    fine = [best * 2 ** (j / 18) for j in range(-3, 4)]
    return min(fine, key=loss)
