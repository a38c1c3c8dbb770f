"""``kit plan``: will it fit, how fast, at what cost — the text and JSON front end of :mod:`kit.plan`.

One (``--context``, ``--concurrency``) pair prints the memory fit, the fewest GPUs that fit, predictions at
concurrency 1 and the one asked, and the cost per price basis. Comma lists (``--context 1024,8192 --concurrency
1,16,64``) or ``--out DIR`` predict the whole grid; with ``--out`` it is stored like a measured sweep
(``DIR/points.jsonl``, ``results.parquet``; a re-run resumes). Options derive from :class:`PlanConfig`.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, replace

import pandas as pd

from kit.cli import DefaultsHelpFormatter, add_config_args, config_field, config_from_args, int_list_arg
from kit.errors import UserError
from kit.plan.config import DEFAULT_MEM_UTIL, PredictConfig
from kit.plan.device import DEFAULT_EFF_BW, DEFAULT_EFF_FLOPS, get_device_model
from kit.plan.fit import MIN_GPUS_MAX, memory_fit, min_gpus
from kit.plan.roofline import PlannerBackend, predict_point
from kit.plan.spec import get_spec, list_models
from kit.plan.stack import resolve_stack, with_stack_layout


@dataclass
class PlanConfig:
    """The settings of ``kit plan`` (each field's ``help`` is also the CLI's)."""

    model: str | None = config_field(None, help="reference model key, kit preset, or config.json path/dir (required)")
    accelerator: str = config_field("local", help="catalog name (MI355X, B300, H200, ...) or local/cpu")
    gpus: int | None = config_field(None, help="number of accelerators (default: fewest that fit)")
    context: list = config_field(
        default_factory=lambda: [1424],
        parse=int_list_arg(example="1424,8192"),
        help="tokens per sequence (prompt + output); a comma list predicts a grid",
    )
    concurrency: list = config_field(
        default_factory=lambda: [64],
        parse=int_list_arg(example="1,16,64"),
        help="concurrent sequences (batch); a comma list predicts a grid",
    )
    kv_dtype: str = config_field("bfloat16", help="KV-cache dtype: bfloat16, fp8, float32, ...")
    weight_dtypes: str | None = config_field(
        None, help="per-group weight dtypes, e.g. 'default=bf16;routed_experts=mxfp4' (default: the model's)"
    )
    tp: int | None = config_field(None, help="tensor-parallel size (default: GPUs in a node)")
    ep: int | None = config_field(None, help="expert-parallel size (default: tp for MoE)")
    eff_bw: float | None = config_field(
        None, help=f"fraction of peak bandwidth (default {DEFAULT_EFF_BW} for catalog accelerators, 1 when calibrated)"
    )
    eff_flops: float | None = config_field(
        None, help=f"fraction of peak TFLOPS (default {DEFAULT_EFF_FLOPS} for catalog accelerators, 1 when calibrated)"
    )
    overhead_ms: float | None = config_field(
        None,
        help="per-step overhead, ms (default: 0.01 ms/layer launch overhead for catalog GPUs, measured for local)",
    )
    spec_k: int | None = config_field(None, help="speculative decoding: draft tokens per verify step (default off)")
    spec_accept: float | None = config_field(
        None, help="speculative decoding: mean tokens emitted per verify step, in [1, k+1] (default 1.85)"
    )
    stack: str | None = config_field(
        None,
        help="serving-stack profile (kit/data/stacks.csv name, 'local' = the calibration's, 'none'); default: the "
        "calibration's local profile, else the one marked default for the accelerator",
    )
    spec: bool = config_field(
        False, help="speculative decoding as the stack runs it (method, k, acceptance), where it runs with the layout"
    )
    comm_calibration: str | None = config_field(
        None, help="link α/busbw measured by `kit comm --save-links` (replaces the catalog's)"
    )
    mem_util: float = config_field(DEFAULT_MEM_UTIL, help="fraction of memory usable")
    basis: str | None = config_field(None, help="price basis (tco, assumed-rental, on-demand); default: all")
    price: float | None = config_field(None, help="your $/GPU-hour (basis 'user')")
    prices: str | None = config_field(
        None, help="price CSV (accelerator, usd_per_gpu_hr, basis) overriding the catalog's prices"
    )
    calibration: str | None = config_field(None, help="calibration JSON for --accelerator local")
    out: str | None = config_field(
        None,
        help="store the predicted grid in this directory like a sweep "
        "(points.jsonl, results.parquet; a re-run resumes)",
    )
    resume: bool = config_field(
        True,
        help="with --out: skip points already stored (--no-resume predicts all "
        "again; earlier files move to OUT/previous/)",
    )
    json: bool = config_field(False, help="print JSON")

    @property
    def is_grid(self) -> bool:
        """More than one (context, concurrency) point, or stored predictions (``--out``)."""
        return len(self.context) > 1 or len(self.concurrency) > 1 or self.out is not None

    def validate(self) -> PlanConfig:
        """Checks the CLI owns (the library checks the rest).

        Raises:
            UserError: no ``--model``, ``--gpus`` < 1, ``--price`` not > 0.
        """
        if not self.model:
            raise UserError(
                f"--model is required; reference models: {', '.join(list_models())}; also kit "
                "presets and any config.json path"
            )
        if self.gpus is not None and self.gpus < 1:
            raise UserError(f"--gpus {self.gpus} must be >= 1")
        if self.price is not None and not 0 < self.price < float("inf"):
            raise UserError(f"--price {self.price} must be > 0 ($/GPU-hour)")
        return self


def add_cli(sub) -> None:
    """``kit plan``: memory fit, KV headroom, predicted tok/s and cost for a model on N accelerators."""
    p = sub.add_parser(
        "plan",
        formatter_class=DefaultsHelpFormatter,
        description="Analytic plan for serving a model: weights per GPU, KV tokens left, max users "
        "at a context, predicted decode tok/s (roofline) and $ per million tokens. "
        f"Reference models: {', '.join(list_models())}; also kit presets and any "
        "config.json path.",
    )
    add_config_args(p, PlanConfig)
    p.set_defaults(func=_cli_plan)


def _cost_tables(df: pd.DataFrame, cfg: PlanConfig, dev, cat) -> list[pd.DataFrame]:
    from kit.plan.cost import add_cost_columns

    if dev.name in ("local", "CPU") and not cfg.price:
        return []
    bases = [cfg.basis or "user"] if cfg.price else [cfg.basis] if cfg.basis else cat.bases_for(dev.name)
    keep = [
        "context_len",
        "concurrency",
        "usd_per_gpu_hr",
        "price_basis",
        "tok_s_per_gpu",
        "usd_per_mtok",
        "tok_per_usd",
    ]
    return [
        add_cost_columns(df, basis=b, usd_per_gpu_hr=cfg.price, tok_s_col="decode_tok_s", catalog=cat)[keep]
        for b in bases
    ]


def _cli_plan(args) -> int:
    from kit.catalog import load_catalog
    from kit.results import to_frame

    cfg = config_from_args(PlanConfig, args).validate()
    spec = get_spec(cfg.model, cfg.weight_dtypes)
    cat = load_catalog(extra_prices=cfg.prices)
    dev = get_device_model(
        cfg.accelerator, catalog=cat, calibration=cfg.calibration, eff_bw=cfg.eff_bw, eff_flops=cfg.eff_flops
    )
    base = PredictConfig(accelerator=dev.name, device_model=dev, kv_dtype=cfg.kv_dtype, mem_util=cfg.mem_util)
    C, B = max(cfg.context), max(cfg.concurrency)
    least = min_gpus(spec, C, B, base)
    n = cfg.gpus if cfg.gpus is not None else (least or dev.gpus_per_node)
    pcfg = replace(base, n_gpus=n, tp=cfg.tp, ep=cfg.ep, overhead_ms=cfg.overhead_ms, spec_k=cfg.spec_k)
    pcfg = replace(pcfg, spec_accept=cfg.spec_accept, comm_calibration=cfg.comm_calibration)
    pcfg = replace(pcfg, stack=cfg.stack, speculative=cfg.spec)
    stack = resolve_stack(cfg.stack, dev.name, dev.stack_profile)
    pcfg = with_stack_layout(pcfg, spec, stack)
    fit = memory_fit(spec, C, B, pcfg)
    if cfg.is_grid:
        backend = PlannerBackend(spec, cfg.concurrency, cfg.context, pcfg)
        if cfg.out is not None:
            from kit._io import check_out_dir
            from kit.grid import run_grid
            from kit.store import latest_rows

            ids = [p.point_id for p in backend.points()]
            df = run_grid(
                backend, check_out_dir(cfg.out, "--out", "results/my-plan"), resume=cfg.resume, progress=False
            )
            df = latest_rows(df, ids)
        else:
            df = to_frame([{**p.columns, **backend.measure(p)} for p in backend.points()])
    else:
        df = to_frame([predict_point(spec, b, C, pcfg) for b in sorted({1, B})])
    costs = _cost_tables(df, cfg, dev, cat)
    if cfg.json:
        out = {
            "spec": spec.summary(),
            "stack": stack.as_dict() if stack is not None else None,
            "fit": fit.as_dict(),
            "min_gpus": least,
            "predictions": json.loads(df.to_json(orient="records")),
            "cost": [json.loads(c.to_json(orient="records")) for c in costs],
        }
        if cfg.out is not None:
            out["out"] = cfg.out
        print(json.dumps(out, indent=2, default=str))
        return 0
    _print_plan(spec, fit, least, dev, cfg, df, costs, stack)
    return 0


def _print_plan(
    spec, fit, least, dev, cfg: PlanConfig, df: pd.DataFrame, costs: list[pd.DataFrame], stack=None
) -> None:
    s = spec.summary()
    print(
        f"{spec.name}: {s['total_params_b']:,.1f}B params ({s['active_params_b']:,.1f}B active), "
        f"KV {s['kv_bytes_per_token_bf16']:,.0f} B/token bf16"
    )
    if spec.flags:  # in full, wrapped at word boundaries (never cut mid-word)
        print(
            textwrap.fill(
                f"flags: {spec.flags}",
                width=110,
                initial_indent="  ",
                subsequent_indent="    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    print(fit)
    if least is None:
        where = (
            "one CPU host (the planner does not split a model over CPUs)"
            if dev.device == "cpu"
            else f"any number of {dev.name} (tried up to {MIN_GPUS_MAX} GPUs)"
        )
        least_txt = f"does not fit on {where}"
    else:
        least_txt = f"{least}"
    C, B = max(cfg.context), max(cfg.concurrency)
    print(f"  fewest {dev.name} that fit {B} users × {C} tokens: {least_txt}")
    print(
        f"  stack: {stack.name} ({stack.engine} {stack.version}, {stack.platform})"
        + (f" [{stack.flags.split(':')[0]}]" if stack.flags else "")
        if stack is not None
        else "  stack: none (plain roofline with the device's per-step overhead)"
    )
    print("Predicted (roofline + stack profile):" if stack is not None else "Predicted (roofline):")
    grid = cfg.is_grid
    for _, r in df.iterrows():
        where = f"context {r['context_len']:>7} " if grid else ""
        if r["status"] != "ok":
            print(f"  {where}concurrency {r['concurrency']:>5}: {r['error']}")
            continue
        if isinstance(r.get("x_spec_note"), str):
            print(f"  {where}concurrency {r['concurrency']:>5}: speculative decoding off: {r['x_spec_note']}")
        print(
            f"  {where}concurrency {r['concurrency']:>5}: decode step {r['tpot_ms_p50']:.2f} ms ({r['x_bound']}-bound)"
            f" -> {r['decode_tok_s']:,.0f} tok/s total, {r['tok_s_per_stream']:,.1f} tok/s/user; "
            f"prefill {r['prefill_ms']:,.0f} ms"
        )
    for c in costs:
        for _, r in c.iterrows():
            if pd.notna(r["usd_per_mtok"]):
                where = f"context {r['context_len']}, " if grid else ""
                print(
                    f"  cost [{r['price_basis']}] ${r['usd_per_gpu_hr']:.2f}/GPU-h, {where}concurrency "
                    f"{r['concurrency']}: ${r['usd_per_mtok']:.2f}/M output tokens ({r['tok_s_per_gpu']:,.0f} "
                    "tok/s/GPU)"
                )
    print(f"  assumptions: {df['assumptions'].iloc[-1]}")
    if cfg.out is not None:
        print(f"stored: {cfg.out}/results.parquet (+ results.json metadata, points.jsonl log; a re-run resumes)")
