"""Roofline: predicted prefill and decode times of LLM inference, as rows of the kit's results schema.

:func:`predict_point` predicts a batch prefill of B × C tokens and one decode step at (batch B, context C) on a
:class:`kit.plan.device.DeviceModel`, per op class (linear layers, attention):
``t = max(bytes / (BW × eff_bw), flops / (peak × eff_flops))``, summed, ``+ t_comm + overhead``; bytes = weights
touched (routed experts: E·(1−(1−1/E)^(B·k)) of E are touched per MoE layer) + KV reads. Rows use the schema of
:mod:`kit.results` with ``backend="planner"`` and the assumptions in columns (``eff_bw``, ``eff_flops``, ``tp``,
``assumptions``, ``x_*``) so predicted and measured points plot on the same axes
(:func:`kit.view.plan_plots.overlay_figure`).
:func:`predict_grid` covers a grid (stored like a sweep with ``out_dir``), :func:`predict_like` the grid of a
measured sweep, :func:`prediction_error` adds the error per point.

The memory fit it uses is :mod:`kit.plan.fit`; the bytes and FLOPs of a step :mod:`kit.plan.step`. Formulas:
``docs/metrics.md`` (Planner formulas).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from dataclasses import asdict, fields, replace
from pathlib import Path

import pandas as pd

from kit import dtypes, metrics
from kit.errors import UserError
from kit.grid import GridPoint
from kit.plan.comm import apply_comm_calibration, comm_terms, decode_messages
from kit.plan.config import PredictConfig, as_predict_config
from kit.plan.decode import StepSetup, assumptions_text, decode_step, dominant_term
from kit.plan.device import check_eff
from kit.plan.fit import FitResult, check_context, memory_fit, weight_dtypes_summary
from kit.plan.sizes import check_pos_int, kv_bytes_per_token, state_bytes_per_seq
from kit.plan.spec import ArchSpec, get_spec
from kit.plan.stack import BLOCK_PARALLEL_DRAFTS, resolve_stack, with_stack_layout
from kit.plan.step import prefill_terms, roofline_times
from kit.results import ok_mask, to_frame


def predict_point(model, concurrency: int = 1, context_len: int = 1024, config: PredictConfig | None = None) -> dict:
    """Predict one point — a batch prefill of ``concurrency`` × ``context_len`` tokens and one decode step at that
    context — as a record in the :mod:`kit.results` schema (``backend="planner"``), under ``config``
    (:class:`kit.plan.config.PredictConfig`: accelerator, GPUs, layout, dtypes, efficiencies, overhead,
    speculative decoding; default: one ``"local"`` device, the model's dtypes).

    Decode step (ms) = max(bytes / (BW × eff_bw), flops / (peak × eff_flops)) + t_comm + overhead, per rank
    (:func:`kit.plan.decode.decode_step`), with
    bytes = weights (routed experts × coverage E·(1−(1−1/E)^(B·k))/E, embedding rows only) + B × attended
    positions × KV bytes/token/rank (+ sliding-window caches, + linear-attention state read and written); flops =
    2 × B × matmul params/rank + attention (grows with context); t_comm = Σ (α + S × factor / busbw) over the
    step's TP all-reduces, EP dispatch/combine all-to-alls and pipeline hand-offs, each on its link class
    (:mod:`kit.plan.comm`); overhead = device per-step overhead (fixed + per layer; measured by ``kit calibrate``,
    :data:`kit.plan.device.DEFAULT_GPU_OVERHEAD_MS_PER_LAYER` for catalog GPUs). Each term is its own
    ``x_t_*_ms`` column and is named in ``assumptions``.
    Prefill likewise with B × C tokens (causal attention ≈ C²/2 per sequence, logits for the last token only).

    Args:
        model: anything :func:`kit.plan.spec.get_spec` accepts (a reference model, a kit preset, a config.json).
        concurrency: sequences in the batch (B). context_len: tokens per sequence (C).

    Returns:
        dict: schema columns (prefill_ms, ttft_ms, tpot_ms_p50, decode_tok_s, tok_s_per_stream, prefill_tok_s,
        achieved_gb_s, peak_mem_gb, kv_cache_gb, weights_gb, eff_bw, eff_flops, tp, assumptions, ...) and x_ extras
        (x_bound, x_t_mem_ms, x_t_compute_ms, x_t_comm_ms, x_overhead_ms, x_bytes_per_step, x_flops_per_step,
        x_expert_coverage, x_kv_dtype, x_max_concurrency, x_kv_tokens_free, ...). status "oom" (timings missing)
        when the point is predicted not to fit.

    Raises:
        UserError: non-positive sizes, ``context_len`` beyond the model's ``max_position_embeddings``, unknown
            dtype, bad parallel layout, ``eff_bw`` / ``eff_flops`` not in the interval from 0 (excluded) to 1, a
            negative or non-finite ``overhead_ms``, bad speculative-decoding settings.
        UnknownNameError: unknown model or accelerator.
    """
    cfg = as_predict_config(config)
    spec = get_spec(model)
    B = check_pos_int("concurrency", concurrency)
    C = check_context(spec, context_len)
    setup, fit = _settle(spec, B, C, cfg)
    att = check_pos_int("attend_len", cfg.attend_len) if cfg.attend_len is not None else C
    d = decode_step(spec, B, att, setup)
    rec = _decode_columns(spec, cfg, setup, fit, d, att)
    if cfg.prefill:
        rec.update(_prefill_columns(spec, setup, B, C, cfg.attend_len))
    rec["assumptions"] = assumptions_text(
        d,
        setup,
        f"TP{setup.tp} EP{setup.ep} PP{setup.pp}; KV {setup.kv_dtype}; weights "
        f"{weight_dtypes_summary(setup.weight_dtypes)}; attends {att} positions; uniform expert routing",
    )
    if not fit.fits:
        rec.update(
            status="oom",
            error=f"predicted not to fit: needs {fit.need_gb_per_gpu or 0:,.1f} GB/GPU, "
            f"{fit.usable_gb_per_gpu:,.1f} GB usable (weights {fit.weights_gb_per_gpu:,.1f} GB/GPU)",
            **dict.fromkeys(_TIMING_COLUMNS),
        )
    return rec


#: the columns of a prediction that are timings (None when the point is predicted not to fit)
_TIMING_COLUMNS = (
    "tpot_ms_p50",
    "decode_tok_s",
    "tok_s_per_stream",
    "achieved_gb_s",
    "prefill_ms",
    "ttft_ms",
    "prefill_tok_s",
)


def _settle(spec: ArchSpec, B: int, C: int, cfg: PredictConfig) -> tuple[StepSetup, FitResult]:
    """The device (with ``comm_calibration``), the stack profile, the dtypes, the memory fit (which settles the
    parallel layout), the efficiencies, the per-step overhead and speculative decoding of one point.

    Raises:
        UserError: as :func:`predict_point`.
    """
    dev = cfg.device()
    if cfg.comm_calibration is not None:
        dev = apply_comm_calibration(replace(dev), cfg.comm_calibration)
    stack = resolve_stack(cfg.stack, dev.name, dev.stack_profile)
    if stack is not None and stack.mem_bw_gb_s:  # the bandwidth the stack's decode kernels were measured to reach
        dev = replace(dev, mem_bw_gb_s=stack.mem_bw_gb_s)
    cfg = with_stack_layout(cfg, spec, stack)
    dts, kv_dtype, act_dtype, compute_dtype = cfg.dtypes(spec)
    fit = memory_fit(spec, C, B, replace(cfg, device_model=dev))
    eb_default = stack.eta_bw if stack is not None else dev.eff_bw
    eb = check_eff("eff_bw", eb_default if cfg.eff_bw is None else cfg.eff_bw)
    ef = check_eff("eff_flops", dev.eff_flops if cfg.eff_flops is None else cfg.eff_flops)
    if cfg.overhead_ms is not None:
        ovh = float(cfg.overhead_ms)
    elif stack is not None:
        ovh = stack.host_us * 1e-3
    else:
        ovh = dev.overhead_ms_fixed + dev.overhead_ms_per_layer * spec.num_layers
    if not ovh >= 0 or not math.isfinite(ovh):
        raise UserError(f"overhead_ms={cfg.overhead_ms!r} must be a finite number >= 0 (ms per decode step)")
    k, accept, draft_layers, passes, note = cfg.spec_k, cfg.spec_accept, cfg.draft_layers, None, ""
    if cfg.speculative and stack is None:
        raise UserError("speculative=True (--spec) needs a stack profile; name one with --stack or pass --spec-k")
    if cfg.speculative and stack is not None and stack.spec_method:
        k = k or stack.spec_k
        accept = accept if accept is not None else (stack.spec_accept if k == stack.spec_k else None)
        draft_layers = stack.spec_draft_layers
        passes = 1 if stack.spec_method in BLOCK_PARALLEL_DRAFTS else None
    if cfg.speculative and stack is not None and not stack.spec_method and not k:
        note = f"stack {stack.name} runs no speculative decoding"
    if k and stack is not None and stack.spec_method:  # the stack says where its method runs
        blocker = stack.spec_blocker(fit.pp, fit.ep)
        if blocker:
            k, accept, note = None, None, blocker
    setup = StepSetup(
        dev, fit.tp, fit.ep, fit.pp, dts, kv_dtype, dtypes.canonical(cfg.state_dtype), act_dtype, compute_dtype,
        eb, ef, ovh, k, accept, draft_layers, passes, stack, note,
    )  # fmt: skip
    return setup, fit


def _decode_columns(spec: ArchSpec, cfg: PredictConfig, s: StepSetup, fit: FitResult, d: dict, att: int) -> dict:
    """The row of a point without its prefill: identity, memory fit and the decode step ``d``
    (:func:`kit.plan.decode.decode_step`) with each of its terms."""
    B, C, dev = fit.concurrency, fit.context_len, s.dev
    tpot = d["step_ms"] / d["emitted"]
    bound = max(
        (s.overhead_ms, "overhead"),
        (d["t_floor_ms"], "floor"),
        (d["t_comm_ms"], "communication"),
        (d["mem_part"], "memory"),
        (d["compute_part"], "compute"),
    )[1]
    kv_seq = C * kv_bytes_per_token(spec, s.kv_dtype) + state_bytes_per_seq(spec, C, s.kv_dtype, s.state_dtype)
    return {
        "backend": "planner",
        "status": "ok",
        "model": cfg.model_label or spec.name,
        "dtype": s.compute_dtype,
        "device": dev.device,
        "device_name": dev.full_name or dev.name,
        "accelerator": dev.name,
        "n_gpus": fit.n_gpus,
        "concurrency": B,
        "context_len": C,
        "tp": s.tp,
        "eff_bw": s.eff_bw,
        "eff_flops": s.eff_flops,
        "peak_mem_method": "planner",
        "weights_gb": fit.weights_gb_total,
        "peak_mem_gb": fit.need_gb_per_gpu,
        "kv_cache_gb": B * kv_seq / 1e9,
        "tpot_ms_p50": tpot,
        "decode_tok_s": metrics.decode_tok_s(B, tpot),
        "tok_s_per_stream": metrics.tok_s_per_stream(tpot),
        "achieved_gb_s": metrics.achieved_gb_s(d["bytes"] * s.tp, d["step_ms"] / 1e3),
        "x_bound": bound,
        "x_dominant_term": dominant_term(d),
        "x_step_ms": d["step_ms"],
        "x_t_linear_ms": d["t_linear"],
        "x_t_attn_ms": d["t_attn"],
        "x_t_mem_ms": d["t_mem"],
        "x_t_compute_ms": d["t_compute"],
        **{f"x_{k}": v for k, v in d.items() if k.startswith("t_") and k.endswith("_ms") and k != "t_compute_ms"},
        "x_t_compute_part_ms": d["t_compute_ms"],
        "x_spec_k": d["spec_k"],
        "x_spec_accept": d["emitted"],
        "x_spec_note": s.spec_note or None,
        "x_stack": s.stack.name if s.stack is not None else None,
        "x_stack_engine": f"{s.stack.engine} {s.stack.version}".strip() if s.stack is not None else None,
        "x_stack_flags": s.stack.flags if s.stack is not None else None,
        "x_overhead_ms": s.overhead_ms,
        "x_bytes_per_step": d["bytes"],
        "x_flops_per_step": d["flops"],
        "x_expert_coverage": d["expert_coverage"],
        "x_link_source": dev.link_source,
        "x_attend_len": att,
        "x_kv_dtype": s.kv_dtype,
        "x_compute_dtype": s.compute_dtype,
        "x_ep": s.ep,
        "x_pp": s.pp,
        "x_weights_gb_per_gpu": fit.weights_gb_per_gpu,
        "x_kv_tokens_free": fit.kv_tokens_free,
        "x_max_concurrency": fit.max_concurrency,
        "x_fits": fit.fits,
        "x_mem_bw_gb_s": dev.mem_bw_gb_s,
        "x_peak_tflops": dev.peak_tflops(s.compute_dtype),
        "x_device_source": dev.source,
    }


def _prefill_columns(spec: ArchSpec, s: StepSetup, B: int, C: int, attend_len: int | None) -> dict:
    """The prefill columns of a point: a batch prefill of ``B`` × ``C`` tokens (:func:`kit.plan.step.prefill_terms`),
    its roofline time, its collectives and the per-step overhead."""
    t = prefill_terms(spec, B, C, attend_len, s.tp, s.ep, s.weight_dtypes, s.kv_dtype)
    pr = roofline_times(s.dev, t, s.compute_dtype, s.eff_bw, s.eff_flops, decode=False)
    p_comm = comm_terms(decode_messages(spec, s.dev, B * C, s.tp, s.ep, s.pp, s.act_dtype))["t_comm_ms"]
    prefill_ms = pr["t_linear"] + pr["t_attn"] + p_comm + s.overhead_ms
    return {
        "prefill_ms": prefill_ms,
        "ttft_ms": prefill_ms,
        "prefill_tok_s": metrics.prefill_tok_s(B, C, prefill_ms),
        "x_prefill_bound": "memory" if pr["mem_part"] >= pr["compute_part"] else "compute",
        "x_prefill_flops": t["flops"],
    }


class PlannerBackend:
    """The planner backend of :func:`kit.grid.run_grid` (kind ``"planner"``): one :class:`GridPoint` per
    (context_len, concurrency), ordered context → concurrency; :meth:`measure` is one :func:`predict_point` row.

    The device model is built once; the first point is predicted on construction, so a bad setting (unknown model,
    accelerator or dtype, a bad layout, a context beyond the model's positions) raises before any point is stored.

    Args:
        model: anything :func:`kit.plan.spec.get_spec` accepts.
        concurrencies, context_lens: the grid (sequences; tokens).
        config: the deployment and assumptions of every point (:class:`kit.plan.config.PredictConfig`).

    Raises:
        UserError / UnknownNameError: as :func:`predict_point`.
    """

    kind = "planner"

    def __init__(
        self,
        model,
        concurrencies=(1, 4, 16),
        context_lens=(128, 512, 2048),
        config: PredictConfig | None = None,
    ):
        cfg = as_predict_config(config)
        self.spec = get_spec(model)
        self.device_model = cfg.device()
        self.config = replace(cfg, device_model=self.device_model)
        self.concurrencies = [check_pos_int("concurrency", b) for b in concurrencies]
        self.context_lens = [check_context(self.spec, c) for c in context_lens]
        if not self.concurrencies or not self.context_lens:
            raise UserError("a planner grid needs at least one concurrency and one context_len")
        self.description = f"plan {self.spec.name} on {self.device_model.name}"
        self.measure(self.points()[0])

    def _settings(self) -> dict:
        """What identifies this grid's predictions: the model, the GPU count, the device model and every config
        field set away from its default (the device's sources excepted: the device model stands for them)."""
        cfg = self.config
        kw = {
            f.name: getattr(cfg, f.name)
            for f in fields(cfg)
            if f.name not in ("accelerator", "n_gpus", "device_model", "catalog", "calibration")
            and getattr(cfg, f.name) != f.default
        }
        return {
            "model": self.spec.name,
            "n_gpus": cfg.n_gpus,
            "device_model": asdict(self.device_model),
            **{k: v for k, v in sorted(kw.items())},
        }

    def points(self) -> list[GridPoint]:
        """Every (context_len, concurrency) point; ``point_id`` hashes the settings and the device model, so a
        changed calibration or efficiency predicts again on resume."""
        base = json.dumps(self._settings(), sort_keys=True, default=str)
        cols = {
            "model": self.config.model_label or self.spec.name,
            "accelerator": self.device_model.name,
            "device": self.device_model.device,
            "n_gpus": self.config.n_gpus,
        }
        out = []
        for c in self.context_lens:
            for b in self.concurrencies:
                pid = hashlib.sha1(json.dumps([base, b, c]).encode()).hexdigest()[:16]
                out.append(GridPoint(pid, {**cols, "concurrency": b, "context_len": c}, f"C={c} B={b}", (b, c)))
        return out

    def metadata(self) -> dict:
        from kit.store import run_metadata

        return run_metadata(model=self.spec.name, accelerator=self.device_model.name, config=self._settings())

    def session(self):
        return contextlib.nullcontext(self)

    def measure(self, point: GridPoint) -> dict:
        b, c = point.config
        return predict_point(self.spec, b, c, self.config)

    def after_failure(self) -> dict:
        return {}


def predict_grid(
    model,
    concurrencies=(1, 4, 16),
    context_lens=(128, 512, 2048),
    config: PredictConfig | None = None,
    *,
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = False,
) -> pd.DataFrame:
    """Planner rows for every (context_len, concurrency) pair, as a :mod:`kit.results` DataFrame, under ``config``
    (:class:`kit.plan.config.PredictConfig`, as :func:`predict_point`).

    Without ``out_dir`` the rows are only returned. With it they are stored through the one grid runner
    (:func:`kit.grid.run_grid` over a :class:`PlannerBackend`) exactly like a measured sweep:
    ``out_dir/points.jsonl``, ``results.parquet`` + ``results.json``; a re-run skips points already stored
    (``resume=False`` archives them), and the returned frame holds every row in ``out_dir``.

    Raises:
        UserError / UnknownNameError: as :func:`predict_point`, before any point is stored.
    """
    backend = PlannerBackend(model, concurrencies, context_lens, config)
    if out_dir is None:
        return to_frame([{**p.columns, **backend.measure(p), "point_id": p.point_id} for p in backend.points()])
    from kit.grid import run_grid

    return run_grid(backend, out_dir, resume=resume, progress=progress)


def predict_like(measured: pd.DataFrame, config: PredictConfig | None = None) -> pd.DataFrame:
    """Planner rows for the grid of a measured sweep (one per distinct ok grid point: same model, dtype,
    concurrency and context_len), for overlays and error tables, under ``config``
    (:class:`kit.plan.config.PredictConfig`; its ``dtype``, ``n_gpus`` and ``attend_len`` are each row's). The kit's
    engine attends over its whole static cache, so each step's attended length is taken as ``context_len +
    decode_steps`` (``x_cache_len`` when the row has it). Rows with ``tp`` > 1 (a tensor-parallel sweep) are
    predicted with the same tp unless ``config.tp`` is set.

    Raises:
        UserError: ``measured`` has no ok rows with model, dtype, concurrency and context_len.
    """
    need = ["model", "dtype", "concurrency", "context_len"]
    missing = [c for c in need if c not in measured.columns]
    if missing:
        raise UserError(f"measured frame lacks column(s) {missing}")
    ok = measured[ok_mask(measured)] if "status" in measured.columns else measured
    ok = ok.dropna(subset=need)
    if ok.empty:
        raise UserError("measured frame has no ok rows with model, dtype, concurrency and context_len")
    cfg = as_predict_config(config)
    dev = cfg.device()
    recs = []
    grid = [
        c
        for c in ("model", "dtype", "concurrency", "context_len", "decode_steps", "n_gpus", "tp", "x_cache_len")
        if c in ok.columns
    ]
    ok = ok.drop_duplicates(subset=grid)  # one prediction per grid point, however often it was measured
    for _, r in ok.iterrows():
        C = int(r["context_len"])
        if "x_cache_len" in r and pd.notna(r.get("x_cache_len")):
            att = int(r["x_cache_len"])
        elif "decode_steps" in r and pd.notna(r.get("decode_steps")):
            att = C + max(int(r["decode_steps"]), 3)
        else:
            att = C
        tp = int(r["tp"]) if "tp" in r and pd.notna(r.get("tp")) else None  # a TP sweep predicts with its tp
        n = int(r["n_gpus"]) if "n_gpus" in r and pd.notna(r.get("n_gpus")) else 1
        lay = {"tp": tp} if tp and cfg.tp is None else {}
        row_cfg = replace(cfg, n_gpus=max(n, tp or 1), dtype=str(r["dtype"]), attend_len=att, device_model=dev, **lay)
        rec = predict_point(r["model"], int(r["concurrency"]), C, row_cfg)
        rec["decode_steps"] = (
            int(r["decode_steps"]) if "decode_steps" in r and pd.notna(r.get("decode_steps")) else None
        )
        recs.append(rec)
    return to_frame(recs)


def prediction_error(measured: pd.DataFrame, predicted: pd.DataFrame, column: str = "tpot_ms_p50") -> pd.DataFrame:
    """Join measured and predicted rows on (model, dtype, concurrency, context_len) and add the error per point:
    ``error_pct = 100 × (predicted − measured) / measured`` for ``column``. Only ok rows of either frame
    (:func:`kit.results.ok_mask`: a flagged row is no measurement) are joined.

    Returns: DataFrame with model, dtype, concurrency, context_len, measured, predicted, error_pct, x_bound.
    """
    keys = ["model", "dtype", "concurrency", "context_len"]
    m = measured[ok_mask(measured)] if "status" in measured.columns else measured
    p = predicted[ok_mask(predicted)] if "status" in predicted.columns else predicted
    cols_p = (
        keys + [column] + [c for c in ("x_bound", "x_overhead_ms", "x_t_linear_ms", "x_t_attn_ms") if c in p.columns]
    )
    p = p.drop_duplicates(subset=keys)
    j = m[keys + [column]].merge(p[cols_p], on=keys, suffixes=("_measured", "_predicted"))
    j = j.rename(columns={f"{column}_measured": "measured", f"{column}_predicted": "predicted"})
    j["error_pct"] = 100.0 * (j["predicted"] - j["measured"]) / j["measured"]
    return j.sort_values(keys).reset_index(drop=True)
