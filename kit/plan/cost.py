"""Cost per token for any result rows (measured, served or planned), and comparisons at equal interactivity.

Formulas live once in :mod:`kit.metrics` (``docs/metrics.md``, Cost):
``usd_per_mtok = usd_per_gpu_hr × n_gpus / (tok_s × 3600) × 1e6``, ``tok_per_usd = tok_s × 3600 /
(usd_per_gpu_hr × n_gpus)``, ``tok_s_per_gpu = tok_s / n_gpus``. Every row records the price, its *basis* (``tco``
owning cost, ``assumed-rental``, ``on-demand``, or ``user``) and which throughput column the cost used
(``tok_s_basis``: ``decode_tok_s`` / ``output_tok_s`` count output tokens; ``total_tok_s`` counts input + output).

Comparing systems: a bigger batch buys tok/s/GPU with tok/s/user. Compare systems at the *same interactivity*
(tok/s/user) along each one's Pareto front of tok/s/GPU vs tok/s/user, not at the same concurrency.
:func:`at_interactivity` interpolates along the front with :func:`numpy.interp` (piecewise linear between front
points: monotone, never overshoots, never extrapolates — outside a front's range the answer is NaN).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kit import metrics
from kit._io import data_path
from kit.catalog import DEFAULT_BASIS, Catalog, Price, load_catalog
from kit.errors import UserError
from kit.results import ok_mask, to_frame

TOK_S_COLUMNS = ("decode_tok_s", "output_tok_s", "total_tok_s")


def get_price(
    accelerator: str,
    basis: str | None = DEFAULT_BASIS,
    usd_per_gpu_hr: float | None = None,
    catalog: Catalog | None = None,
) -> Price:
    """The $/GPU-hour of ``accelerator`` on ``basis``, or the user's ``usd_per_gpu_hr`` (basis ``"user"`` unless
    another basis name is given with it).

    Raises:
        KeyError: unknown accelerator, or no price on that basis (names the bases that exist).
        ValueError: ``usd_per_gpu_hr`` not > 0.
    """
    cat = catalog or load_catalog()
    if usd_per_gpu_hr is not None:
        if not float(usd_per_gpu_hr) > 0:
            raise UserError(f"usd_per_gpu_hr={usd_per_gpu_hr!r} must be > 0")
        try:
            name = cat.resolve(accelerator) if accelerator else "?"
        except KeyError:  # a user price needs no catalog entry (e.g. a local CPU or an unlisted GPU)
            name = str(accelerator)
        b = basis if basis and basis != DEFAULT_BASIS else "user"
        return Price(name, float(usd_per_gpu_hr), b, "set by user")
    return cat.price(accelerator, basis or DEFAULT_BASIS)


def add_cost_columns(
    df: pd.DataFrame,
    basis: str | None = DEFAULT_BASIS,
    usd_per_gpu_hr: float | None = None,
    accelerator: str | None = None,
    tok_s_col: str = "decode_tok_s",
    n_gpus: int | None = None,
    catalog: Catalog | None = None,
    missing_price: str = "raise",
) -> pd.DataFrame:
    """A copy of ``df`` with ``usd_per_gpu_hr``, ``price_basis``, ``tok_s_per_gpu``, ``usd_per_mtok``,
    ``tok_per_usd`` and ``tok_s_basis`` filled for every row.

    Args:
        basis: price basis in the catalog (``tco``, ``assumed-rental``, ``on-demand``); see ``Catalog.bases``.
        usd_per_gpu_hr: override the price for every row (basis recorded as ``"user"``).
        accelerator: use this catalog accelerator instead of each row's ``accelerator`` column.
        tok_s_col: throughput column the cost is per (``decode_tok_s``, ``output_tok_s`` or ``total_tok_s``).
        n_gpus: GPUs per row when the frame has no ``n_gpus`` (default 1).
        missing_price: ``"raise"`` (default) or ``"nan"``: a row without an accelerator or without a catalog price
            on ``basis`` keeps its speed columns and gets NaN cost columns (price basis empty), other rows keep
            their prices.

    Raises:
        ValueError: unknown ``tok_s_col``; a row without an accelerator and no override.
        KeyError: no price for a row's accelerator on ``basis`` (the message lists the bases it has).
    """
    if tok_s_col not in TOK_S_COLUMNS:
        raise UserError(f"tok_s_col={tok_s_col!r}; allowed: {TOK_S_COLUMNS}")
    if missing_price not in ("raise", "nan"):
        raise UserError(f"missing_price={missing_price!r}; allowed: 'raise', 'nan'")
    cat = catalog or load_catalog()
    out = df.copy()
    if tok_s_col not in out.columns:
        out[tok_s_col] = np.nan
    prices, bases, per_gpu, per_m, per_usd = [], [], [], [], []
    for _, r in out.iterrows():
        acc = accelerator or (r.get("accelerator") if pd.notna(r.get("accelerator")) else None)
        if acc is None and usd_per_gpu_hr is None:
            if missing_price == "raise":
                raise UserError("a row has no accelerator: pass accelerator=... or usd_per_gpu_hr=...")
            p = Price("?", float("nan"), None)
        elif acc is None:
            p = Price("?", float(usd_per_gpu_hr), "user")
        else:
            try:
                p = get_price(acc, basis, usd_per_gpu_hr, cat)
            except KeyError:
                if missing_price == "raise":
                    raise
                p = Price(str(acc), float("nan"), None)
        n = r.get("n_gpus") if "n_gpus" in out.columns and pd.notna(r.get("n_gpus")) else (n_gpus or 1)
        tok_s = r.get(tok_s_col)
        tok_s = float(tok_s) if tok_s is not None and pd.notna(tok_s) else float("nan")
        prices.append(p.usd_per_gpu_hr)
        bases.append(p.basis)
        per_gpu.append(metrics.tok_s_per_gpu(tok_s, int(n)))
        per_m.append(metrics.usd_per_mtok(tok_s, p.usd_per_gpu_hr, int(n)))
        per_usd.append(metrics.tok_per_usd(tok_s, p.usd_per_gpu_hr, int(n)))
    out["usd_per_gpu_hr"] = prices
    out["price_basis"] = pd.Series(bases, index=out.index, dtype="string")
    out["tok_s_per_gpu"] = per_gpu
    out["usd_per_mtok"] = per_m
    out["tok_per_usd"] = per_usd
    out["tok_s_basis"] = pd.Series([tok_s_col] * len(out), index=out.index, dtype="string")
    return out


def pareto_front(df: pd.DataFrame, x: str = "tok_s_per_stream", y: str = "tok_s_per_gpu") -> pd.DataFrame:
    """Rows not dominated in (x, y), both to be maximised, sorted by ``x`` ascending (so ``y`` descends); with a
    ``status`` column only ok rows (:func:`kit.results.ok_mask`) take part.

    Raises:
        ValueError: ``x`` or ``y`` not a column.
    """
    for c in (x, y):
        if c not in df.columns:
            raise UserError(f"column {c!r} not in the frame; have {list(df.columns)[:12]}...")
    d = df.dropna(subset=[x, y])
    if "status" in d.columns:
        d = d[ok_mask(d)]
    d = d.sort_values([x, y], ascending=[False, False])
    keep, best_y = [], -np.inf
    for i, r in d.iterrows():
        if r[y] > best_y:
            keep.append(i)
            best_y = r[y]
    return d.loc[keep].sort_values(x).reset_index(drop=True)


def at_interactivity(
    df: pd.DataFrame,
    targets,
    x: str = "tok_s_per_stream",
    y: str = "tok_s_per_gpu",
    usd_per_gpu_hr: float | None = None,
) -> pd.DataFrame:
    """``y`` at each target interactivity ``x`` (tok/s/user), interpolated along the Pareto front of ``df``.

    Piecewise-linear (monotone) interpolation between front points; NaN outside the front's x range. With
    ``usd_per_gpu_hr`` (or a single ``usd_per_gpu_hr`` value in ``df``) also ``usd_per_mtok`` at each target,
    from the interpolated tok/s/GPU (:func:`kit.metrics.usd_per_mtok` with n_gpus = 1).

    Returns: DataFrame with columns ``x``, ``y`` (and ``usd_per_mtok``, ``usd_per_gpu_hr``).
    """
    front = pareto_front(df, x, y)
    t = np.atleast_1d(np.asarray(targets, dtype=float))
    if len(front) == 0:
        vals = np.full_like(t, np.nan)
    else:
        xs, ys = front[x].to_numpy(float), front[y].to_numpy(float)
        vals = np.interp(t, xs, ys, left=np.nan, right=np.nan)
    out = pd.DataFrame({x: t, y: vals})
    price = usd_per_gpu_hr
    if price is None and "usd_per_gpu_hr" in df.columns:
        u = df["usd_per_gpu_hr"].dropna().unique()
        price = float(u[0]) if len(u) == 1 else None
    if price is not None:
        out["usd_per_gpu_hr"] = price
        out["usd_per_mtok"] = [metrics.usd_per_mtok(v, price, 1) if v == v else np.nan for v in vals]
    return out


def compare_at_interactivity(
    systems: dict[str, pd.DataFrame], targets, x: str = "tok_s_per_stream", y: str = "tok_s_per_gpu"
) -> pd.DataFrame:
    """Each system's tok/s/GPU and $/Mtok at the same interactivity targets, in one long table (system, x, y,
    usd_per_mtok, usd_per_gpu_hr, price_basis). Frames should already carry cost columns
    (:func:`add_cost_columns`)."""
    rows = []
    for name, df in systems.items():
        a = at_interactivity(df, targets, x, y)
        a.insert(0, "system", name)
        if "price_basis" in df.columns and df["price_basis"].notna().any():
            a["price_basis"] = str(df["price_basis"].dropna().iloc[0])
        rows.append(a)
    return pd.concat(rows, ignore_index=True)


# ---------------------------------------------------------------- published figures
def published_kimi_k3() -> pd.DataFrame:
    """The published Kimi K3 serving figures on 8×MI355X, 8×B300 and 2×8 B200 (Wafer blog, 2026-08-02; shipped as
    ``kit/data/published_kimi_k3.csv`` with the source), one row per system."""
    p = data_path("published_kimi_k3.csv")
    return pd.read_csv(p)


def published_cost_table(bases=("assumed-rental", "tco", "on-demand"), catalog: Catalog | None = None) -> pd.DataFrame:
    """$/Mtok of the published Kimi K3 figures under each price basis the catalog has for each system, at peak
    aggregate throughput and at single-stream throughput (output tokens). Rows: system, basis, usd_per_gpu_hr,
    tok_s, usd_per_mtok, tok_per_usd, tok_s_per_gpu, point ("peak" | "single-stream")."""
    cat = catalog or load_catalog()
    pub = published_kimi_k3()
    rows = []
    for _, r in pub.iterrows():
        for basis in bases:
            try:
                p = cat.price(r["accelerator"], basis)
            except KeyError:
                continue
            for point, col in (("peak", "peak_aggregate_tok_s"), ("single-stream", "single_stream_tok_s")):
                tok_s, n = float(r[col]), int(r["gpus"])
                rows.append(
                    {
                        "system": r["system"],
                        "accelerator": p.accelerator,
                        "point": point,
                        "price_basis": basis,
                        "usd_per_gpu_hr": p.usd_per_gpu_hr,
                        "n_gpus": n,
                        "tok_s": tok_s,
                        "tok_s_per_gpu": metrics.tok_s_per_gpu(tok_s, n),
                        "usd_per_mtok": metrics.usd_per_mtok(tok_s, p.usd_per_gpu_hr, n),
                        "tok_per_usd": metrics.tok_per_usd(tok_s, p.usd_per_gpu_hr, n),
                        "tok_s_basis": "output tokens",
                    }
                )
    return pd.DataFrame(rows)


def published_as_results(basis: str = "assumed-rental", catalog: Catalog | None = None) -> pd.DataFrame:
    """The published figures as two result rows per system (single stream at concurrency 1, peak at its published
    concurrency) in the :mod:`kit.results` schema with cost columns — a two-point front per system for
    :func:`compare_at_interactivity`. Systems without a price on ``basis`` are left out."""
    cat = catalog or load_catalog()
    recs = []
    for _, r in published_kimi_k3().iterrows():
        n = int(r["gpus"])
        for conc, tok_s in (
            (1, float(r["single_stream_tok_s"])),
            (int(r["peak_concurrency"]), float(r["peak_aggregate_tok_s"])),
        ):
            recs.append(
                {
                    "backend": "openai",
                    "status": "ok",
                    "model": "kimi-k3",
                    "accelerator": r["accelerator"],
                    "n_gpus": n,
                    "concurrency": conc,
                    "output_tok_s": tok_s,
                    "x_system": r["system"],
                    "x_source": r["source"],
                }
            )
    df = to_frame(recs)
    # published figures carry no TPOT: the mean rate per user (aggregate / users) stands in for 1000 / TPOT
    df["tok_s_per_stream"] = df["output_tok_s"] / df["concurrency"]
    keep = [i for i, a in df["accelerator"].items() if basis in cat.bases_for(a)]
    return add_cost_columns(df.loc[keep], basis=basis, tok_s_col="output_tok_s", catalog=cat)
