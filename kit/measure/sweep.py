"""Sweeps: a grid of KV-cache lengths x concurrencies (x dtypes), one in-process point at a time.

Guarantees:
- Everything is validated before any work starts (unknown preset/dtype, kv or concurrency <= 0, kv beyond the
  model's positions, a dtype the device cannot run, an output path that is a file): ``ValueError`` naming the value.
- Each finished point is appended to ``out_dir/points.jsonl`` (fsync'd) before the next starts, so an OOM, an
  exception, Ctrl-C or ``kill -9`` never loses a finished point; re-running the same sweep resumes and skips
  points already recorded as ok or oom (points that errored are retried).
- ``torch.OutOfMemoryError`` (a RuntimeError subclass; matched by type, not message) is recorded as status
  ``oom``; memory is freed *outside* the ``except`` block (the exception's traceback keeps the failed point's
  tensors alive while it is being handled; pytorch #27600) and the sweep continues.
- Any other exception in a point is recorded as ``error`` with its text; the sweep continues.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from kit import dtypes, hardware, models
from kit._io import check_out_dir
from kit.cli import config_field, config_flag, config_with, int_list_arg
from kit.dtypes import MODEL_DTYPES
from kit.errors import UserError
from kit.grid import RUN_OPTIONS, GridPoint, run_grid, split_run_options
from kit.measure import memguard
from kit.measure.engine import KV_FILLS, PointConfig, run_point
from kit.measure.power import PowerSampler, catalog_tdp_w
from kit.measure.power_readers import SOURCES as POWER_SOURCES
from kit.measure.profile import point_profile_dir, profile_point
from kit.measure.profile_select import PROFILE_HELP, parse_profile_points, point_selected, require_selected
from kit.measure.ranks import check_local_ranks
from kit.results import ok_mask, verdict
from kit.store import latest_rows, run_metadata
from kit.validity import validity
from kit.visibility import physical_gpus

log = logging.getLogger("kit")


def _str_list(text: str) -> list[str]:
    """argparse type of ``--dtype``: a comma list of names (each checked by :meth:`SweepConfig.validate`)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item (expected a comma list like float32,bfloat16)")
    return parts


#: the largest seed of weights and token ids (torch generators take 64-bit seeds), and the longest limit of one
#: tp > 1 point (7 days, s): past them a typo fails every point, or never ends
MAX_SEED = 2**63 - 1
MAX_TP_TIMEOUT_S = 7 * 86_400.0
#: ``--kv`` / ``--concurrency``: range checks are SweepConfig.validate's, so its messages name the bad value
_int_list = int_list_arg(minimum=None, example="128,512")


@dataclass
class SweepConfig:
    """An in-process sweep's settings: the one source of its defaults and help text (``kit sweep`` options, the
    panel and the dashboard derive from these fields)."""

    model: str = config_field(
        models.DEFAULT_PRESET,
        help=f"model preset name or local checkpoint directory (presets: {', '.join(models.PRESETS)})",
    )
    dtypes: list = config_field(
        help="dtypes, comma list: " + ", ".join(MODEL_DTYPES),
        flag="--dtype",
        parse=_str_list,
        default_factory=lambda: ["float32"],
    )
    device: str = config_field("auto", help="auto | cpu | cuda | rocm")
    kv_lens: list = config_field(
        help="KV-cache lengths at the start of decode (tokens; comma list)",
        flag="--kv",
        parse=_int_list,
        default_factory=lambda: [128, 512, 2048],
    )
    concurrencies: list = config_field(
        help="batch sizes = concurrent sequences (comma list)",
        flag="--concurrency",
        parse=_int_list,
        default_factory=lambda: [1, 4, 16],
    )
    decode_steps: int = config_field(16, help="timed decode steps per repeat")
    warmup_steps: int = config_field(3, help="untimed decode steps before each timed block")
    repeats: int = config_field(3, help="interleaved measurement blocks per point (prefill + warm-up + timed steps)")
    kv_fill: str = config_field(
        "prefill", help="prefill (real, timed TTFT) | synthetic (random KV, for long contexts)", choices=KV_FILLS
    )
    prefill_chunk: int | None = config_field(
        None,
        help="kv_fill=prefill: tokens per prefill chunk (memory linear in the context; default: one forward)",
    )
    compile: bool = config_field(
        False,
        help="decode steps through torch.compile over the static cache (CUDA/HIP graphs on GPUs, default mode "
        "on CPU; prefill stays eager); x_compile_s is outside the timed steps",
    )
    tp: int = config_field(
        1,
        help="tensor-parallel ranks: > 1 shards the model with transformers' tp_plan='auto' over this many "
        "torchrun ranks (gloo on CPU, nccl/RCCL on GPUs), one rank per GPU (at most the visible GPUs; on the CPU 4 "
        "per core, 8 at least)",
    )
    tp_timeout_s: float = config_field(
        1800.0, help="tp > 1: limit per point (load + measure) before every rank is stopped, s (at most 7 days)"
    )
    seed: int = config_field(0, help="seed for weights and token ids (0 to 2**63 - 1)")
    accelerator: str | None = config_field(
        None, help="catalog accelerator for cost columns (default: the detected device)"
    )
    power_period_ms: float = config_field(50.0, help="power sampling period during every point, ms")
    power_source: str = config_field(
        "auto", help="where power comes from: auto | nvml | amdsmi | rapl | none", choices=POWER_SOURCES
    )
    usd_per_kwh: float | None = config_field(None, help="electricity price for the energy cost column, $/kWh")
    trust_remote_code: bool = config_field(
        False,
        help="allow a local checkpoint's own Python code (config.json "
        "auto_map); off: such a checkpoint is refused, never run",
    )
    guard: bool = config_field(
        True, help="refuse before any work when the largest point is predicted not to fit in free memory"
    )
    threads: int | None = config_field(
        None,
        help="CPU only: torch threads (default: one per core that is free "
        "at the start, recorded per row); 1 is steadiest on a busy shared machine",
    )
    profile: str | None = config_field(None, help=PROFILE_HELP, cli=False)

    def points(self) -> list[tuple[str, PointConfig]]:
        """The grid as (dtype, PointConfig), ordered dtype → KV length → concurrency."""
        return [
            (
                dt,
                PointConfig(
                    int(b), int(c), self.decode_steps, self.warmup_steps, self.repeats, self.kv_fill, self.prefill_chunk
                ),
            )
            for dt in self.dtypes
            for c in self.kv_lens
            for b in self.concurrencies
        ]

    def validate(self) -> SweepConfig:
        """Check every setting before any work; raise ValueError naming the bad value and what is allowed."""
        cfg = models.get_config(self.model, self.trust_remote_code)  # unknown preset → UserError listing presets
        if models.is_checkpoint_dir(self.model) and not models.has_weights(self.model):
            raise UserError(f"model={self.model!r} has config.json but no *.safetensors (or *.bin) weights")
        for name in ("dtypes", "kv_lens", "concurrencies"):
            v = getattr(self, name)
            if isinstance(v, (str, int)) or not list(v):
                raise UserError(f"{name}={v!r} ({config_flag(SweepConfig, name)}) must be a non-empty list")
        for dt in self.dtypes:
            dtypes.to_torch(dt)
        for name, vals in (("kv_lens", self.kv_lens), ("concurrencies", self.concurrencies)):
            for v in vals:
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    what = "KV length" if name == "kv_lens" else "concurrency"
                    raise UserError(
                        f"{what} {v!r} in {name} ({config_flag(SweepConfig, name)}) must be an integer >= 1"
                    )
        if self.kv_fill not in KV_FILLS:
            raise UserError(f"kv_fill={self.kv_fill!r}; allowed: {KV_FILLS}")
        cores = os.cpu_count() or 1
        if not (isinstance(self.power_period_ms, (int, float)) and math.isfinite(self.power_period_ms)
                and self.power_period_ms > 0):  # fmt: skip
            raise UserError(f"power_period_ms={self.power_period_ms!r} (--power-period-ms) must be a number > 0")
        if self.usd_per_kwh is not None and not (math.isfinite(self.usd_per_kwh) and self.usd_per_kwh >= 0):
            raise UserError(f"usd_per_kwh={self.usd_per_kwh!r} (--usd-per-kwh) must be a finite number >= 0")
        if self.threads is not None and (not isinstance(self.threads, int) or not 1 <= self.threads <= cores):
            raise UserError(
                f"threads={self.threads!r} (--threads) must be an integer from 1 to {cores} (the cores "
                "of this machine), or unset (None) for one torch thread per core free at the start"
            )
        if self.accelerator is not None:
            from kit.catalog import load_catalog

            try:
                self.accelerator = load_catalog().resolve(self.accelerator)
            except KeyError as e:
                raise UserError(f"accelerator (--accelerator): {e.args[0]}") from None
        if not isinstance(self.tp, int) or isinstance(self.tp, bool) or self.tp < 1:
            raise UserError(f"tp={self.tp!r} (--tp) must be an integer >= 1 (ranks the model is sharded over)")
        if (self.compile or parse_profile_points(self.profile)) and self.tp > 1:  # a bad --profile is said here
            what = ("compile=True", "--compile") if self.compile else ("profile", "--profile")
            raise UserError(f"{what[0]} with tp > 1 is not supported: use {what[1]} or --tp N, not both")
        require_selected(self.profile, [(p.context_len, p.concurrency, dtypes.name_of(dt)) for dt, p in self.points()])
        if not (isinstance(self.tp_timeout_s, (int, float)) and 0 < self.tp_timeout_s <= MAX_TP_TIMEOUT_S):
            raise UserError(
                f"tp_timeout_s={self.tp_timeout_s!r} (--tp-timeout-s) must be a number of seconds > 0 and <= "
                f"{MAX_TP_TIMEOUT_S:,.0f} (7 days)"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise UserError(f"seed={self.seed!r} (--seed) must be an integer from 0 to {MAX_SEED:,} (2**63 - 1)")
        maxpos = models.max_positions(cfg)
        for _, p in self.points():
            p.validate(maxpos)
        info = hardware.detect(self.device)
        for dt in self.dtypes:
            hardware.check_dtype_supported(dtypes.to_torch(dt), info.device)
        check_local_ranks(self.tp, "tp", "gloo" if info.device == "cpu" else "nccl")  # GPUs, or cores on the CPU
        return self


def sweep_point_id(config: SweepConfig, dtype: str, platform: str, p: PointConfig) -> str:
    """Stable key of an in-process point: everything that changes what is measured (model, dtype, platform, the
    point's settings, the seed of weights and ids, the requested torch threads). Resume skips ids already
    recorded, so a re-run with other ``--threads`` or ``--seed`` measures again instead of showing old numbers."""
    point = {k: v for k, v in asdict(p).items() if v is not None}  # a new optional field keeps old ids
    key = [config.model, dtypes.name_of(dtype), platform, point, config.seed, config.threads]
    engine = {**({"compile": True} if config.compile else {}), **({"tp": config.tp} if config.tp != 1 else {})}
    engine |= {"profile": True} if point_selected(config.profile, p.context_len, p.concurrency, dtype) else {}
    key = json.dumps(key + [engine] if engine else key, sort_keys=True)
    return hashlib.sha1(key.encode()).hexdigest()[:16]


_MODEL_CACHE: dict = {}


def get_model(model: str, dtype: str, device: str, seed: int = 0, trust_remote_code: bool = False):
    """Build (or reuse the last built) model; one model is kept so notebooks and the panel re-run quickly."""
    key = (model, dtypes.name_of(dtype), device, seed, trust_remote_code)
    if key not in _MODEL_CACHE:
        _MODEL_CACHE.clear()
        hardware.free_memory(device)
        _MODEL_CACHE[key] = models.build_model(model, dtype, device, seed, trust_remote_code)
    return _MODEL_CACHE[key]


class EngineBackend:
    """The in-process backend of :func:`kit.grid.run_grid`: one :func:`kit.measure.engine.run_point` per
    (dtype, KV length, concurrency) of a validated :class:`SweepConfig`.

    Args:
        config: the sweep (validated here).
        runner: ``runner(model, point, device, seed[, compile=True]) -> record``; default
            :func:`kit.measure.engine.run_point` (tests inject failures here). Not used when ``config.tp > 1``:
            each point then runs on ``tp`` ranks (:func:`kit.measure.tp.run_tp_point`).
        work_dir: ``tp > 1``: where each point's job file and rank logs go (``<work_dir>/tp/<point_id>/``;
            default: a new temporary directory).
    """

    kind = "engine"

    def __init__(self, config: SweepConfig, runner: Callable | None = None, work_dir: str | Path | None = None):
        self.config = config.validate()
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self.info = hardware.detect(config.device)
        if config.guard:  # a model cached by an earlier sweep is freed before this one's is built: its bytes count
            memguard.check_sweep_memory(config, self.info.device, sum(map(models.param_bytes, _MODEL_CACHE.values())))
        self.runner = runner or run_point
        self.description = f"sweep {config.model}"
        self._baseline_gb = None
        self._baseline_model = None
        self.tdp_w = catalog_tdp_w(config.accelerator or self.info.catalog_name)

    def points(self) -> list[GridPoint]:
        cfg, info = self.config, self.info
        accel = cfg.accelerator or info.catalog_name
        out = []
        for dt, p in cfg.points():
            name = dtypes.name_of(dt)
            cols = {
                "model": cfg.model,
                "dtype": name,
                "device": info.platform,
                "device_name": info.name,
                "accelerator": accel,
                "n_gpus": cfg.tp,
                "tp": cfg.tp,
                "concurrency": p.concurrency,
                "context_len": p.context_len,
                "decode_steps": p.decode_steps,
                "kv_fill": p.kv_fill,
                "repeats": p.repeats,
            }
            label = f"{name} kv={p.context_len} B={p.concurrency}" + (f" tp={cfg.tp}" if cfg.tp > 1 else "")
            out.append(GridPoint(sweep_point_id(cfg, dt, info.platform, p), cols, label, (dt, p)))
        return out

    def metadata(self) -> dict:
        return run_metadata(device=self.info.as_dict(), model=self.config.model, config=asdict(self.config))

    @contextlib.contextmanager
    def session(self):
        """CPU: torch threads from ``config.threads``, else one per core free at the start (recorded per row as
        ``x_threads`` / ``x_threads_reason``; a busy machine is logged as a warning). Restored on exit."""
        threads_before = torch.get_num_threads()
        self.thread_columns = {}
        if self.info.device == "cpu":
            if self.config.threads:
                n, why = self.config.threads, "--threads"
            else:
                n, why, busy = hardware.cpu_threads_for_timing()
                if busy >= hardware.BUSY_CORE_FRACTION:
                    log.warning("busy machine: %s; timings use %d torch thread(s) (override with --threads)", why, n)
            torch.set_num_threads(n)
            self.thread_columns = {"x_threads": n, "x_threads_reason": why}
        try:
            yield self
        finally:
            torch.set_num_threads(threads_before)

    def measure(self, point: GridPoint) -> dict:
        dt, p = point.config
        dev, cfg = self.info.device, self.config
        if cfg.tp > 1:
            return self._measure_tp(point, dt, p)
        model = get_model(cfg.model, dt, dev, cfg.seed, cfg.trust_remote_code)
        if model is not self._baseline_model:  # a new dtype builds a new model: a new baseline
            self._baseline_gb, self._baseline_model = hardware.allocated_gb(dev), model
        extra = {"compile": True} if cfg.compile else {}
        gpus = physical_gpus(self.info.platform, 1)  # the point runs on device 0: its physical index
        with PowerSampler(gpus, cfg.power_period_ms / 1000.0, cfg.power_source) as ps:
            rec = self.runner(model, p, dev, cfg.seed, **extra)
        rec = {**rec, **ps.columns(*p.processed_tokens(), self.tdp_w, cfg.usd_per_kwh), **self.thread_columns}
        if point_selected(cfg.profile, p.context_len, p.concurrency, dt):  # a pass of its own, after the plain one
            where, plain = point_profile_dir(self.work_dir, point.point_id), rec.get("tpot_ms_p50")
            rec |= profile_point(model, p, dev, where, seed=cfg.seed, compile=cfg.compile, plain_step_ms=plain)
        return {**rec, **validity(rec)}

    def _measure_tp(self, point: GridPoint, dt: str, p: PointConfig) -> dict:
        from kit.measure.tp import TPRanks, run_tp_point, tp_checkpoint

        cfg = self.config
        if self.work_dir is None:  # run_sweep passes out_dir; other callers get a temporary directory
            import tempfile

            self.work_dir = Path(tempfile.mkdtemp(prefix="kit-tp-"))
        ckpt = tp_checkpoint(cfg.model, dt, cfg.seed)
        work = self.work_dir / "tp" / point.point_id
        ranks = TPRanks(cfg.tp, cfg.threads, cfg.tp_timeout_s, cfg.seed, cfg.trust_remote_code)
        gpus = physical_gpus(self.info.platform, cfg.tp)  # rank r runs on GPU r: these physical devices
        with PowerSampler(gpus, cfg.power_period_ms / 1000.0, cfg.power_source) as ps:
            rec = run_tp_point(ckpt, dt, p, work, ranks)
        rec = {**rec, **ps.columns(*p.processed_tokens(), self.tdp_w, cfg.usd_per_kwh)}
        return {**rec, "x_tp_checkpoint": str(ckpt), "x_tp_logs": str(work / "logs")}

    def after_failure(self) -> dict:
        dev = self.info.device
        hardware.free_memory(dev)
        if dev != "cpu" and self._baseline_gb is not None:
            return {"x_mem_above_baseline_gb": round(hardware.allocated_gb(dev) - self._baseline_gb, 4)}
        return {}


def run_sweep(
    config: SweepConfig | None = None,
    out_dir: str | Path = "results/sweep",
    *,
    runner: Callable | None = None,
    **options,
) -> pd.DataFrame:
    """Run every point of ``config`` in-process through the grid runner (:func:`kit.grid.run_grid`:
    append-on-finish, resume, OOM and Ctrl-C handling); return every row in ``out_dir``.

    ``kit.sweep(model="tiny-llama", kv_lens=[128, 512], concurrencies=[1, 4], out_dir="results/nb")`` is the same as
    passing a :class:`SweepConfig`: its fields may be given as keywords (they override ``config``'s).

    Args:
        config: the sweep (default: :class:`SweepConfig`'s defaults).
        out_dir: run directory (created); must not be a file.
        runner: ``runner(model, point, device, seed) -> record``; defaults to :func:`kit.measure.engine.run_point`.
        options: :class:`SweepConfig` fields, and :func:`kit.grid.run_grid`'s ``resume`` (False: earlier files move
            to ``out_dir/previous/``), ``progress``, ``on_point(record, frame)``, ``should_stop()`` and
            ``retry_killed``.

    Returns:
        DataFrame in the :mod:`kit.results` schema (also in ``out_dir/results.parquet``).

    Raises:
        UserError / OutputPathError before any work for bad settings or an unknown option. KeyboardInterrupt is
            re-raised after the finished points are saved.
    """
    config, rest = config_with(SweepConfig, config, options)
    run_options, unknown = split_run_options(rest)
    if unknown:
        raise UserError(
            f"unknown option(s) {sorted(unknown)}; give SweepConfig fields or run options ({', '.join(RUN_OPTIONS)})"
        )
    check_out_dir(out_dir)
    return run_grid(EngineBackend(config, runner, work_dir=out_dir), out_dir, **run_options)


def summary_table(df: pd.DataFrame) -> str:
    """Text table: decode tok/s and TPOT p50 per (dtype, KV length, concurrency). The status column is the row's
    verdict (:func:`kit.results.verdict`): ``flagged`` rows (e.g. non-finite logits) show no speed figures."""
    rows = []
    df = df.assign(_verdict=verdict(df)) if len(df) else df
    for _, r in df.sort_values(["dtype", "context_len", "concurrency"]).iterrows() if len(df) else ():
        ok = r["_verdict"] == "ok"
        fmt = lambda v, f, ok=ok: f.format(v) if ok and v is not None and not pd.isna(v) else "-"
        rows.append(
            {
                "dtype": r["dtype"],
                "kv": r["context_len"],
                "B": r["concurrency"],
                "status": r["_verdict"],
                "ttft_ms": fmt(r["ttft_ms"], "{:.1f}"),
                "tpot_p50_ms": fmt(r["tpot_ms_p50"], "{:.2f}"),
                "tpot_min_ms": fmt(r["tpot_ms_min"], "{:.2f}"),
                "n": r["tpot_n"] if ok else "-",
                "decode_tok_s": fmt(r["decode_tok_s"], "{:.0f}"),
                "tok_s/stream": fmt(r["tok_s_per_stream"], "{:.1f}"),
                "peak_GB": fmt(r["peak_mem_gb"], "{:.2f}"),
            }
        )
    return pd.DataFrame(rows).to_string(index=False) if rows else "(no points)"


def current_rows(df: pd.DataFrame, config: SweepConfig) -> pd.DataFrame:
    """The latest row of each point of ``config`` (a run directory can also hold earlier runs' points)."""
    backend = hardware.detect(config.device).platform
    ids = {sweep_point_id(config, dt, backend, p) for dt, p in config.points()}
    return latest_rows(df, ids)


def noise_warning(df: pd.DataFrame, ratio: float = 2.0) -> str | None:
    """A warning when TPOT p50 is far above the fastest step (a busy machine), else None."""
    ok = df[ok_mask(df) & df["tpot_ms_min"].notna()]
    if ok.empty:
        return None
    worst = float((ok["tpot_ms_p50"] / ok["tpot_ms_min"]).max())
    if worst <= ratio:
        return None
    return (
        f"noisy machine: TPOT p50 is up to {worst:.1f}x the fastest step of its point; treat the figures as "
        "upper bounds (re-run on a quiet machine, or with --threads 1 on a busy shared one)"
    )
