"""The tour's planning lessons: will it fit (:func:`kit.plan.fit.memory_fit`) and what a million tokens cost
(:func:`kit.plan.roofline.predict_grid`, :mod:`kit.plan.cost`). Each takes a :class:`kit.tour.context.TourContext`
and its controls' values and returns :func:`kit.tour.context.result`."""

from __future__ import annotations

import math

from kit.errors import UserError
from kit.tour.context import TourContext, finite, fmt, int_setting, result


# ------------------------------------------------------------------------------------------------ lessons 5-6
def will_it_fit(
    ctx: TourContext,
    model: str = "llama-3.1-70b",
    accelerator: str = "MI355X",
    n_gpus: int = 1,
    context: int = 8192,
    users: int = 32,
) -> dict:
    """The planner's memory breakdown per GPU (GB) of ``model`` on ``n_gpus`` × ``accelerator`` with ``users``
    sequences of ``context`` tokens (:func:`kit.plan.fit.memory_fit`: weights, reserve, the KV cache of those users,
    unused) beside the same at the most users that fit (:meth:`kit.plan.fit.FitResult.memory_parts`), plus the
    longest context at those users.

    Raises:
        UserError / UnknownNameError: an unknown model or accelerator, a context past the model's positions.
    """
    from kit.plan.config import PredictConfig
    from kit.plan.fit import memory_fit

    n = int_setting("n_gpus", n_gpus, 1, 1024)
    fit = memory_fit(model, int_setting("context", context, 1, 10**7), int_setting("users", users, 1, 10**6),
                     PredictConfig(accelerator=accelerator, n_gpus=n))  # fmt: skip
    most = fit.memory_parts()  # at the most users that fit at this context
    at_most = {"weights": most["weights"], "reserve": most["reserve"], "kv_cache": most["kv_at_max_users"],
               "unused": most["unused"]}  # fmt: skip
    need = fit.need_gb_per_gpu if fit.need_gb_per_gpu is not None else float("nan")
    kv = need - fit.weights_gb_per_gpu - fit.reserve_gb_per_gpu  # your users' KV cache (+ constant state), GB/GPU
    yours = {"weights": fit.weights_gb_per_gpu, "reserve": fit.reserve_gb_per_gpu, "kv_cache": kv,
             "unused": max(0.0, fit.mem_gb_per_gpu - need)}  # fmt: skip
    problems = [] if finite(*most.values(), *yours.values()) else ["non-finite memory figures"]
    line = (
        f"{fit.model} on {fit.n_gpus}×{fit.accelerator}: {'FITS' if fit.fits else 'DOES NOT FIT'} — weights "
        f"{fmt(fit.weights_gb_per_gpu, 'GB', 1)}/GPU, KV for {users} users × {context:,} tokens "
        f"{fmt(kv, 'GB', 1)}/GPU, "
        f"{fmt(need, 'GB', 1)} needed of {fmt(fit.usable_gb_per_gpu, 'GB', 1)} usable; at most "
        f"{fit.max_concurrency or 0:,} users at this context"
    )
    return result(
        "fit",
        line,
        problems,
        fits=bool(fit.fits),
        numbers={
            "fits": "yes" if fit.fits else "no",
            "weights per GPU": fmt(fit.weights_gb_per_gpu, "GB", 1),
            "KV bytes per token (whole model)": fmt(fit.kv_bytes_per_token, "B", 0),
            "needed per GPU": fmt(need, "GB", 1),
            "usable per GPU": fmt(fit.usable_gb_per_gpu, "GB", 1),
            "most users at this context": f"{fit.max_concurrency or 0:,}",
            "longest context at these users": f"{fit.max_context or 0:,} tokens",
        },
        chart={
            "kind": "stacked",
            "y": "GB per GPU",
            "bars": [
                {"label": f"{users:,} users", "parts": yours},
                {
                    "label": f"most users ({fit.max_concurrency or 0:,})",
                    "parts": at_most,
                },
            ],
            "limit": fit.mem_gb_per_gpu,
        },
        assumptions=fit.assumptions,
    )


def cost(
    ctx: TourContext,
    model: str = "llama-3.1-70b",
    interactivity: float = 50.0,
    context: int = 4096,
    n_gpus: int = 8,
    basis: str = "tco",
    prices: str = "",
    accelerators: str = "",
) -> dict:
    """$ per million output tokens at ``interactivity`` tok/s per user for every catalog accelerator with a price on
    ``basis`` (or in ``prices``): the planner's grid over concurrency 1..16384 at ``context`` tokens on ``n_gpus``
    (:func:`kit.plan.roofline.predict_grid`), costed by :func:`kit.plan.cost.add_cost_columns` and interpolated
    along each Pareto front (:func:`kit.plan.cost.at_interactivity`; outside a front's range, e.g. slower per user
    than the accelerator gets before its memory is full, the cost is missing and the table's note says why).
    ``prices``: your $/GPU-hour, ``"B300=5.5, MI355X=2"`` (they win over the catalog's). ``accelerators``: a
    comma list to compare (default: every one with a price).

    Raises:
        UserError: a bad ``prices`` item, a non-positive interactivity; what the planner raises.
    """
    from kit.catalog import load_catalog
    from kit.plan.config import PredictConfig
    from kit.plan.cost import add_cost_columns, at_interactivity, pareto_front
    from kit.plan.roofline import predict_grid

    target = float(interactivity)
    if not (math.isfinite(target) and target > 0):
        raise UserError(f"interactivity={interactivity!r}: give tok/s per user > 0")
    n = int_setting("n_gpus", n_gpus, 1, 1024)
    cat = load_catalog()
    mine = parse_prices(prices, cat)
    try:
        wanted = {cat.resolve(a.strip()) for a in str(accelerators or "").split(",") if a.strip()}
    except KeyError as e:
        raise UserError(f"accelerators={accelerators!r}: {e.args[0] if e.args else e}") from None
    concs = [2**k for k in range(15)]
    bars, fronts, rows = [], [], []
    for acc in cat.names:
        if acc == "CPU" or (acc not in mine and basis not in cat.bases_for(acc)) or (wanted and acc not in wanted):
            continue
        df = predict_grid(
            model, concs, [int_setting("context", context, 1, 10**7)], PredictConfig(accelerator=acc, n_gpus=n)
        )
        priced = add_cost_columns(df, basis=basis, usd_per_gpu_hr=mine.get(acc), accelerator=acc, n_gpus=n)
        at = at_interactivity(priced, [target]).iloc[0]
        usd, price = at.get("usd_per_mtok"), at.get("usd_per_gpu_hr")
        front = pareto_front(priced)
        xs = front["tok_s_per_stream"]
        note = (
            "" if finite(usd) or front.empty else f"outside its front ({xs.min():,.0f} to {xs.max():,.0f} tok/s/user)"
        )
        rows.append([acc, price, at["tok_s_per_gpu"], usd, "yours" if acc in mine else basis, note])
        bars.append({"label": acc, "value": usd})
        fronts.append({"name": acc, "points": front[["tok_s_per_stream", "tok_s_per_gpu"]].values.tolist()})
    got = [r for r in rows if finite(r[3])]
    problems = [] if got else [f"no accelerator reaches {target:g} tok/s per user with {model} on {n} GPUs"]
    best = min(got, key=lambda r: r[3]) if got else None
    line = (
        f"at {target:g} tok/s per user, {model} on {n} GPUs: cheapest {best[0]} at {fmt(best[3], '$/Mtok', 3)}"
        if best
        else problems[0]
    )
    return result(
        "cost",
        line,
        problems,
        numbers={r[0]: fmt(r[3], "$/Mtok", 3) for r in rows},
        chart={"kind": "bars", "y": f"$ per million tokens at {target:g} tok/s/user", "bars": bars},
        fronts={"kind": "line", "x": "tok/s per user", "y": "tok/s per GPU", "series": fronts, "log_x": True},
        table={"columns": ["accelerator", "$/GPU-hour", "tok/s/GPU", "$/Mtok", "price basis", "note"], "rows": rows},
    )


def parse_prices(text: str, catalog=None) -> dict[str, float]:
    """``"B300=5.5, MI355X=2"`` → ``{"B300": 5.5, "MI355X": 2.0}`` ($/GPU-hour; names resolved in the catalog).

    Raises:
        UserError: an item without ``=``, an unknown accelerator (lists the catalog's), a price not > 0.
    """
    from kit.catalog import load_catalog

    cat = catalog or load_catalog()
    out = {}
    for item in [p.strip() for p in str(text or "").replace(";", ",").split(",") if p.strip()]:
        name, sep, val = item.partition("=")
        try:
            acc = cat.resolve(name.strip())
        except KeyError:
            raise UserError(
                f"price {item!r}: unknown accelerator {name.strip()!r}; known: {', '.join(cat.names)}"
            ) from None
        try:
            usd = float(val)
        except ValueError:
            usd = float("nan")
        if not sep or not (math.isfinite(usd) and usd > 0):
            raise UserError(f"price {item!r}: write NAME=$/GPU-hour with a price > 0, e.g. B300=5.5")
        out[acc] = usd
    return out
