"""The planner against every published Kimi K3 point (kit/data/published_kimi_k3_points.csv), like for like.

Each row is predicted under its own conditions (ISL/OSL, concurrency, speculative decoding as its stack runs it,
precision) with the stack profile of its accelerator (kit/data/stacks.csv): first from the cited profile as
shipped, then leave-one-out — the profile's latency figures (per-layer floors, host time, all-reduce α) scaled by
one factor fitted WITHOUT that row, on the other like-for-like rows of the same stack (or, when there are none,
on the like-for-like rows of the same engine on the same vendor's other platforms; else unfitted). Printed per
row: the stack and whether it is like for like, published, cited and leave-one-out predictions with
predicted/published (time per token: above 1 the planner is too slow), and the dominant term; then the order of
the three single-stream systems and the issue's goals. Nothing is tuned to a row.

    python benchmarks/planner_vs_published.py
"""

from __future__ import annotations

import pandas as pd

from kit.catalog import load_catalog
from kit.plan.anchors import fit_latency_scale, load_anchors, predict_anchor, scaled
from kit.plan.stack import default_stack

WAFER = "1024/400"


def _pool(df: pd.DataFrame, i: int, stack, vendor) -> tuple[pd.DataFrame, str]:
    """The rows a leave-one-out scale for row ``i`` is fitted on, and what they are."""
    others = df.drop(index=i)
    like = others["like"].str.startswith("like for like")
    same = others[(others["stack"] == stack.name) & like]
    if len(same):
        return same, f"{len(same)} other {stack.name} rows"
    eng = others[(others["engine"] == stack.engine) & (others["vendor"] == vendor) & like]
    if len(eng):
        return eng, f"{len(eng)} {stack.engine} rows on other {vendor} platforms"
    return eng, "none (cited profile)"


def rows() -> pd.DataFrame:
    df = load_anchors()
    cat = load_catalog()
    stacks = {a: default_stack(a) for a in df.accelerator.unique()}
    df["stack"] = [stacks[a].name for a in df.accelerator]
    df["engine"] = [stacks[a].engine for a in df.accelerator]
    df["vendor"] = [cat.get(a)["vendor"] for a in df.accelerator]
    cited = [predict_anchor(r, stacks[r.accelerator]) for _, r in df.iterrows()]
    df["like"] = [c["like_for_like"] for c in cited]
    out = []
    for (i, r), c in zip(df.iterrows(), cited):
        st = stacks[r.accelerator]
        pool, what = _pool(df, i, st, r.vendor)
        # a pool row is predicted with its own stack scaled by the same factor: fit on the pool's own stack
        s = fit_latency_scale(stacks[pool.accelerator.iloc[0]], pool) if len(pool) else 1.0
        loo = predict_anchor(r, scaled(st, s))
        out.append(
            {"row": r.key, "stack": st.name, "like_for_like": c["like_for_like"], "metric": r.metric,
             "published": r.value, "cited": c["predicted"], "cited_ratio": c["ratio"], "dominant": c["dominant"],
             "loo_pool": what, "loo_scale": s, "loo": loo["predicted"], "loo_ratio": loo["ratio"],
             "loo_dominant": loo["dominant"], "spec_note": c["spec_note"] or "", "source": r.source}
        )  # fmt: skip
    return pd.DataFrame(out)


def _within(r: float, f: float = 1.5) -> bool:
    return 1 / f <= r <= f


def main() -> None:
    df = rows()
    show = df.drop(columns=["source"])
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 60):
        print(show.to_string(index=False, float_format=lambda v: f"{v:,.2f}"))
    print("\nratio = predicted / published time per token (tok/s rows inverted): above 1 the planner is too slow")
    for _, r in df[df.spec_note != ""].iterrows():
        print(f"  {r.row}: speculative decoding off — {r.spec_note}")
    wafer = df[df.row.str.contains(WAFER)]
    print(
        "\nWafer single-stream rows (ISL/OSL 1024/400, DSpark on): no like-for-like anchor without speculative "
        "decoding exists at this workload in the published set; the nearest no-spec points are ISL/OSL 8192/1024."
    )
    for col in ("cited", "loo"):
        tok = {r.row.split(" |")[0]: r[col] for _, r in wafer.iterrows()}
        order = sorted(tok, key=tok.get, reverse=True)
        print(
            f"  {col:5s} order: {' > '.join(f'{s} ({tok[s]:.0f} tok/s)' for s in order)}"
            f"  (published: 8x B300 (172) > 8x MI355X (118) > 2x8 B200 (90)); same order: "
            f"{order == ['8x B300', '8x MI355X', '2x8 B200']}; each within ×1.5: "
            f"{ {r.row.split(' |')[0]: _within(r[col + '_ratio']) for _, r in wafer.iterrows()} }"
        )
    like = df[
        df.row.str.contains("SGLang \\| none") & df.row.str.contains("c1 \\||c2 \\|") & df.row.str.contains("MXFP4")
    ]
    for _, r in like.iterrows():
        print(
            f"  like-for-like no-spec {r.row}: published {r.published:g} ms, cited {r.cited:.2f} "
            f"(×{r.cited_ratio:.2f}, within ×1.5: {_within(r.cited_ratio)}), leave-one-out {r.loo:.2f} "
            f"(×{r.loo_ratio:.2f}, within ×1.5: {_within(r.loo_ratio)})"
        )
    b200 = load_anchors()
    b200 = b200[b200.system == "2x8 B200"].iloc[0]
    tp16 = predict_anchor(b200, tp=16)
    print(
        f"  2x8 B200 as TP16 EP1 over both nodes instead: {tp16['predicted']:.0f} tok/s (×{tp16['ratio']:.2f}), "
        f"dominant {tp16['dominant']}" + (f"; {tp16['spec_note']}" if tp16["spec_note"] else "; DSpark on")
    )


if __name__ == "__main__":
    main()
