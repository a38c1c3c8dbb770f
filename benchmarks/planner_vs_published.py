"""The planner against the published Kimi K3 table (kit/data/published_kimi_k3.csv): each row's single-stream
and concurrency-64 figures predicted with the planner's defaults (1024 input + 400 output tokens: context 1424),
printed with the published figure, their ratio and the dominant term of the decode step. The two-node B200 row
is predicted twice: the planner's default layout (TP within a node, PP across nodes) and TP16/EP16 over both
nodes (SGLang's documented multi-node recipe, ``--tp 16 --nnodes 2``). Rows whose published figure used
speculative decoding are also predicted with it (k=1, 1.85 tokens per verify step: DeepSeek-V3 report §5.4.3).
Nothing here is fitted to the published figures.

    python benchmarks/planner_vs_published.py
"""

from __future__ import annotations

import warnings

import pandas as pd

from kit._io import data_path
from kit.plan.config import PredictConfig
from kit.plan.decode import DEFAULT_SPEC_ACCEPT, DEFAULT_SPEC_K
from kit.plan.roofline import predict_point


def rows() -> pd.DataFrame:
    pub = pd.read_csv(data_path("published_kimi_k3.csv"))
    out = []
    for _, r in pub.iterrows():
        layouts = [("default", {})] + ([("TP16 EP16", {"tp": 16})] if r["gpus"] > 8 else [])
        spec = "speculative" in str(r["workload"])
        for name, lay in layouts:
            for point, B, published in (
                ("single", 1, r["single_stream_tok_s"]),
                ("peak", 64, r["peak_aggregate_tok_s"]),
            ):
                kws = [("", {})] + ([(" +spec", {"spec_k": DEFAULT_SPEC_K, "spec_accept": DEFAULT_SPEC_ACCEPT})]
                                    if spec and point == "peak" else [])  # fmt: skip
                for tag, kw in kws:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        cfg = PredictConfig(r["accelerator"], int(r["gpus"]), prefill=False, **lay, **kw)
                        p = predict_point("kimi-k3", B, 1424, cfg)
                    pred = p["tok_s_per_stream"] if point == "single" else p["decode_tok_s"]
                    out.append({"system": r["system"], "layout": f"TP{p['tp']} EP{p['x_ep']} PP{p['x_pp']} ({name})",
                                "point": point + tag, "predicted_tok_s": pred, "published_tok_s": published,
                                "ratio": pred / published, "dominant": p["x_dominant_term"],
                                "step_ms": p["x_step_ms"], "comm_lat_ms": p["x_t_comm_lat_ms"]})  # fmt: skip
    return pd.DataFrame(out)


def main() -> None:
    df = rows()
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.to_string(index=False, float_format=lambda v: f"{v:,.2f}"))
    single = df[(df.point == "single") & df.layout.str.contains("default")]
    order = single.sort_values("predicted_tok_s", ascending=False)["system"].tolist()
    print(
        f"\nsingle stream, default layouts, predicted order: {' > '.join(order)}"
        " (published: 8x B300 > 8x MI355X > 2x8 B200)"
    )
    print(f"single-stream ratios within ×1.5: {((single.ratio <= 1.5) & (single.ratio >= 1 / 1.5)).tolist()}")


if __name__ == "__main__":
    main()
