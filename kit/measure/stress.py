"""KV-cache stress: the largest context a model decodes at a batch on this device, found safely.

Search (:class:`ContextSearch`): from ``start`` the context doubles until a probe does not fit or fails (or
``max_context`` is reached: never past it), then the gap between the largest ok probe and the smallest failed one
is bisected until it is within ``resolution`` (a fraction) of the ok one. Every probe is one point of the grid
runner (:func:`kit.grid.run_grid`, one call per probe, since the next probe depends on the last outcome):
stored in the results schema, resumable — a re-run replays the recorded probes (ok, oom, killed; a ``refused``
probe is checked again, which costs no allocation) and measures from where the earlier run stopped.

Each probe (:class:`StressBackend`):

1. the memory guard (:mod:`kit.measure.memguard`) predicts weights + KV + workspace and compares with what is free
   minus a margin; a probe predicted not to fit is recorded ``refused`` with predicted and available GB, never
   allocated (``guard=False`` attempts it anyway);
2. otherwise :func:`kit.measure.engine.run_point` measures it (static cache of ``context + max(warmup, steps)``
   tokens; ``kv_fill="synthetic"`` writes random keys/values, ``"prefill"`` runs a chunked prefill); on cpu the
   RSS high-water mark is reset first, so ``peak_mem_gb`` is this probe's;
3. the row gets predicted vs measured KV bytes (``x_kv_error_pct``), the predicted peak (``x_pred_peak_gb``) and
   the allocator's fragmentation columns (GPUs; "not available" on cpu).

Positions past a preset's ``max_position_embeddings`` are allowed (a random-weight model: the override is free,
:func:`kit.models.override_positions`); a real checkpoint's contexts stop at its limit unless
``extend_positions``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from kit import dtypes, hardware, models
from kit._io import atomic_write_text, check_out_dir
from kit.cli import config_field, config_with
from kit.dtypes import MODEL_DTYPES
from kit.errors import UserError
from kit.grid import FINISHED_STATUSES, GridPoint, run_grid, split_run_options
from kit.measure import memguard
from kit.measure.engine import KV_FILLS, PointConfig, run_point
from kit.measure.profile import point_profile_dir, profile_point
from kit.measure.profile_select import parse_profile_points, point_selected
from kit.measure.sweep import EngineBackend, SweepConfig
from kit.plan.spec import get_spec
from kit.results import ok_mask
from kit.store import latest_rows, load_results, read_log, run_metadata

log = logging.getLogger("kit")
DEFAULT_MAX_CONTEXT = 4_194_304
#: a probe the process died on (``kill -9``, the kernel's OOM killer, a crash) is measured again when the stress
#: resumes: one kill says nothing about whether it fits. Only a probe that killed this many runs counts as "does
#: not fit" (an OOM kill repeats; a person's kill -9 rarely lands on the same probe twice)
KILLS_TO_GIVE_UP = 2


@dataclass
class StressConfig:
    """``kit kv-stress``'s settings (flags, defaults and help derive from these fields)."""

    model: str = config_field(models.DEFAULT_PRESET, help="model preset name or local checkpoint directory")
    batch: int = config_field(1, help="concurrent sequences (batch size) every probe decodes")
    dtype: str = config_field("float32", help="weights, activations and KV cache dtype", choices=MODEL_DTYPES)
    device: str = config_field("auto", help="auto | cpu | cuda | rocm")
    start: int = config_field(4096, help="first context probed (tokens); the context doubles from here")
    max_context: int = config_field(DEFAULT_MAX_CONTEXT, help="never probe past this context (tokens)")
    resolution: float = config_field(0.05, help="bisect until the gap is within this fraction of the ok context")
    kv_fill: str = config_field(
        "synthetic", help="synthetic (random KV, untimed) | prefill (chunked, timed prefill)", choices=KV_FILLS
    )
    prefill_chunk: int = config_field(2048, help="tokens per prefill chunk (kv_fill=prefill)")
    decode_steps: int = config_field(8, help="timed decode steps per repeat")
    warmup_steps: int = config_field(2, help="untimed decode steps before each timed block")
    repeats: int = config_field(2, help="measurement blocks per probe")
    guard: bool = config_field(True, help="refuse a probe predicted not to fit in free memory (--no-guard: try it)")
    margin_gb: float | None = config_field(
        None, help="memory kept free by the guard, GB (default: max(1 GB, 5 percent of the device memory))"
    )
    expandable_segments: bool | None = config_field(
        None, help="GPUs: run the caching allocator with expandable segments on/off (default: as the env says)"
    )
    max_probes: int = config_field(40, help="stop after this many probes")
    check_context: int = config_field(
        1024,
        help="first check that a cached decode step equals an uncached forward at this context (0: skip; at most "
        "--max-context)",
    )
    seed: int = config_field(0, help="seed for weights, token ids and the synthetic KV")
    threads: int | None = config_field(None, help="CPU only: torch threads (default: one per free core)")
    extend_positions: bool = config_field(
        False, help="let a real checkpoint run past its max_position_embeddings (presets always may)"
    )
    trust_remote_code: bool = config_field(False, help="allow a local checkpoint's own Python code")
    profile: str | None = config_field(
        None,
        help="torch.profiler around the decode steps of these probes, in a separate pass after the plain one: "
        "'all' or 'kv=32768' (kit.measure.profile); files in OUT/profiles/<point_id>/",
        cli=False,
    )

    def point(self, context: int) -> PointConfig:
        """The engine point of one probe."""
        chunk = self.prefill_chunk if self.kv_fill == "prefill" else None
        return PointConfig(
            self.batch, int(context), self.decode_steps, self.warmup_steps, self.repeats, self.kv_fill, chunk
        )

    @property
    def positions(self) -> int:
        """Positions the model is built with: the largest probe's cache (context + max(warmup, decode steps))."""
        return self.max_context + max(self.warmup_steps, self.decode_steps)

    def validate(self) -> StressConfig:
        """Check every setting before any work (a real checkpoint's ``max_context`` is capped at its limit unless
        ``extend_positions``).

        Raises:
            UserError: naming the bad value and what is allowed.
        """
        for name in ("batch", "start", "max_context", "max_probes", "prefill_chunk"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"{name}={v!r} (--{name.replace('_', '-')}) must be an integer >= 1")
        if not 0 < self.resolution < 1:
            raise UserError(f"resolution={self.resolution!r} (--resolution) must be a fraction in (0, 1), e.g. 0.05")
        m = self.margin_gb
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < math.inf):
            raise UserError(f"margin_gb={m!r} (--margin-gb) must be a finite number >= 0 GB, or None (the default)")
        if not isinstance(self.check_context, int) or self.check_context < 0:
            raise UserError(f"check_context={self.check_context!r} (--check-context) must be an integer >= 0")
        self.dtype = dtypes.model_dtype(self.dtype)
        if models.is_checkpoint_dir(self.model) and not self.extend_positions:
            limit = models.max_positions(models.get_config(self.model, self.trust_remote_code))
            cap = limit - max(self.warmup_steps, self.decode_steps)
            if self.max_context > cap:
                log.info("%s: contexts capped at %d (its %d positions; --extend-positions)", self.model, cap, limit)
                self.max_context = cap
        if self.check_context > self.max_context:  # the check never runs past the longest probe (or the model)
            log.info("correctness check at %d tokens (--max-context), not %d", self.max_context, self.check_context)
            self.check_context = self.max_context
        if self.start > self.max_context:
            raise UserError(f"start={self.start} (--start) is past max_context={self.max_context} (--max-context)")
        self.point(self.start).validate()
        selection = parse_profile_points(self.profile)
        if selection is not None and not selection.everything:  # probes lie in [start, max_context] at one B, dtype
            dt = dtypes.name_of(self.dtype)
            if not any(m.get("concurrency", self.batch) == self.batch and m.get("dtype", dt) == dt
                       and self.start <= m.get("context_len", self.start) <= self.max_context
                       for m in selection.matches):  # fmt: skip
                raise UserError(
                    f"profile={selection.text()!r} (--profile) matches no probe: they run at B {self.batch}, dtype "
                    f"{dt}, contexts {self.start}-{self.max_context}; name those, or 'all'"
                )
        return self

    def profiled(self, context: int) -> bool:
        """Whether :attr:`profile` selects the probe at ``context`` (:mod:`kit.measure.profile`)."""
        return point_selected(self.profile, context, self.batch, self.dtype)


class ContextSearch:
    """Geometric growth (×2 from ``start``, capped at ``max_context``) until the first probe that does not fit,
    then bisection until ``hi - lo <= max(1, resolution × lo)``. ``lo``: largest context that fit (None: none
    yet); ``hi``: smallest that did not (None: none yet). Pure: feed it outcomes with :meth:`record`."""

    def __init__(self, start: int, max_context: int, resolution: float):
        self.start, self.max_context, self.resolution = start, max_context, resolution
        self.lo: int | None = None
        self.hi: int | None = None

    def next(self) -> int | None:
        """The next context to probe, or None when the search is done."""
        if self.hi is None:
            if self.lo is None:
                return self.start
            return None if self.lo >= self.max_context else min(2 * self.lo, self.max_context)
        lo = self.lo or 0
        if self.hi - lo <= max(1, self.resolution * lo):
            return None
        return lo + (self.hi - lo) // 2

    def record(self, context: int, fits: bool) -> None:
        """Note a probe's outcome (ok: ``fits``; refused, oom, killed or error: not)."""
        if fits:
            self.lo = context if self.lo is None else max(self.lo, context)
        else:
            self.hi = context if self.hi is None else min(self.hi, context)


def stress_point_id(config: StressConfig, platform: str, p: PointConfig, expandable: bool | None) -> str:
    """Stable key of a probe: model, dtype, platform, the point's settings, seed, threads, allocator setting."""
    key = ["kv-stress", config.model, config.dtype, platform, asdict(p), config.seed, config.threads, expandable]
    key += ["profile"] if config.profiled(p.context_len) else []  # a profiled probe never resumes a plain one
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


class StressBackend:
    """The grid backend of one probe at a time: :meth:`points` is the probe set in :attr:`context` (see the module
    docstring for what :meth:`measure` does). ``runner(model, point, device, seed) -> record`` defaults to
    :func:`kit.measure.engine.run_point`."""

    kind = "engine"

    def __init__(self, config: StressConfig, runner=None):
        self.config = config.validate()
        # the sweep's backend validates model, device, dtype and threads and owns the CPU thread policy (not its
        # memory pre-flight: the stress guards each probe itself)
        sweep = SweepConfig(
            model=config.model, dtypes=[config.dtype], device=config.device, kv_lens=[1], concurrencies=[1],
            seed=config.seed, threads=config.threads, trust_remote_code=config.trust_remote_code, guard=False,
        )  # fmt: skip
        self.engine = EngineBackend(sweep)
        self.info = self.engine.info
        if config.expandable_segments is not None and self.info.device == "cpu":
            raise UserError("expandable_segments (--expandable-segments) applies to GPUs; this device is the CPU")
        total = memguard.available_memory(self.info.device).total_gb
        if config.margin_gb is not None and config.margin_gb >= total:  # it would refuse every probe
            raise UserError(
                f"margin_gb={config.margin_gb!r} (--margin-gb) must be below the {total:.2f} GB of memory of this "
                f"device ({self.info.device}): a margin that keeps all of it free refuses every probe"
            )
        self.spec = get_spec(models.get_config(config.model, config.trust_remote_code), f"default={config.dtype}")
        self.runner = runner or run_point
        self.description = f"kv-stress {config.model} B={config.batch}"
        self.context: int | None = None
        self.model = None
        #: where profiled probes' files go (run_kv_stress sets the run directory)
        self.work_dir: Path | None = None
        self.expandable = memguard.expandable_segments(self.info.platform)
        self._meta = run_metadata(device=self.info.as_dict(), model=config.model, config=asdict(config))

    def point_of(self, context: int) -> GridPoint:
        cfg, info = self.config, self.info
        p = cfg.point(context)
        cols = {
            "model": cfg.model, "dtype": cfg.dtype, "device": info.platform, "device_name": info.name,
            "accelerator": info.catalog_name, "n_gpus": 1, "concurrency": cfg.batch, "context_len": p.context_len,
            "decode_steps": p.decode_steps, "kv_fill": p.kv_fill, "repeats": p.repeats,
        }  # fmt: skip
        pid = stress_point_id(cfg, info.platform, p, self.expandable)
        return GridPoint(pid, cols, f"kv={context} B={cfg.batch}", p)

    def points(self) -> list[GridPoint]:
        return [self.point_of(self.context)] if self.context is not None else []

    def metadata(self) -> dict:
        return self._meta

    def session(self):
        """Per probe: nothing (the stress holds :meth:`stress_session` around every probe)."""
        return contextlib.nullcontext(self)

    def stress_session(self):
        """Held around the whole search: the allocator setting, then the sweep's CPU thread policy (threads sampled
        once, so every probe runs with the same count)."""
        if self.config.expandable_segments is not None:
            memguard.set_expandable_segments(self.info.platform, self.config.expandable_segments)
            self.expandable = memguard.expandable_segments(self.info.platform)
        return self.engine.session()

    def get_model(self):
        if self.model is None:
            c = self.config
            hardware.free_memory(self.info.device)
            self.model = models.build_model(
                c.model, c.dtype, self.info.device, c.seed, c.trust_remote_code, c.positions, c.extend_positions
            )
        return self.model

    def measure(self, point: GridPoint) -> dict:
        cfg, dev, p = self.config, self.info.device, point.config
        q = 1 if p.kv_fill == "synthetic" else min(p.prefill_chunk or p.context_len, p.context_len)
        pred = memguard.predict_memory(self.spec, cfg.dtype, p.concurrency, p.cache_len, self.model is not None, q)
        hardware.free_memory(dev)  # gpu: cached blocks of the last probe go back, so mem_get_info counts them free
        free = memguard.available_memory(dev)
        margin = cfg.margin_gb if cfg.margin_gb is not None else memguard.default_margin_gb(free.total_gb)
        base = hardware.allocated_gb(dev)  # cpu: this process's RSS; gpu: allocated (weights once resident)
        cols = {
            "x_pred_weights_gb": pred.weights_gb, "x_pred_kv_gb": pred.kv_gb, "x_pred_workspace_gb": pred.workspace_gb,
            "x_pred_total_gb": pred.total_gb, "x_avail_gb": free.free_gb, "x_avail_source": free.source,
            "x_margin_gb": margin, "x_guard": cfg.guard, "x_cache_len": p.cache_len, "x_base_gb": base,
            "x_pred_peak_gb": base + pred.total_gb, "x_limit_gb": base + free.free_gb - margin,
            "x_kv_bytes_per_token_pred": pred.kv_bytes_per_token,
        }  # fmt: skip
        why = memguard.refusal(pred, free, margin)
        if why is not None and cfg.guard:
            return {"status": "refused", "error": why, **cols, **memguard.fragmentation_columns(None)}
        model = self.get_model()
        cols["x_weights_resident_gb"] = models.param_bytes(model) / memguard.GB
        if dev == "cpu":
            memguard.reset_rss_peak()
        base = hardware.allocated_gb(dev)  # now with the weights resident: the peak's prediction starts here
        cols.update(x_base_gb=base, x_pred_peak_gb=base + pred.kv_gb + pred.workspace_gb)
        stats = memguard.allocator_stats(dev)
        retries = int(stats.get("num_alloc_retries", 0)) if stats else 0
        rec = self.runner(model, p, dev, cfg.seed)
        frag = memguard.fragmentation_columns(memguard.allocator_stats(dev), retries, self.expandable)
        if cfg.profiled(p.context_len) and rec.get("status", "ok") == "ok":  # after the plain pass, apart from it
            where = point_profile_dir(self.work_dir, point.point_id)
            rec |= profile_point(model, p, dev, where, seed=cfg.seed, plain_step_ms=rec.get("tpot_ms_p50"))
        kv_pred, kv_meas, pred_peak = pred.kv_gb, rec.get("kv_cache_gb"), cols["x_pred_peak_gb"]
        return {
            **rec,
            **cols,
            **frag,
            **self.engine.thread_columns,
            "x_kv_bytes_per_token_meas": kv_meas * memguard.GB / (p.concurrency * p.cache_len) if kv_meas else None,
            "x_kv_error_pct": 100.0 * (kv_meas - kv_pred) / kv_pred if kv_meas and kv_pred else None,
            "x_peak_vs_pred_pct": 100.0 * (rec["peak_mem_gb"] / pred_peak - 1) if rec.get("peak_mem_gb") else None,
        }

    def after_failure(self) -> dict:
        return self.engine.after_failure()


def fits(row) -> bool:
    """Whether a probe's row counts as "decodes at this context": status ok and no problem flag."""
    return bool(ok_mask(pd.DataFrame([row])).iloc[0])


def run_kv_stress(
    config: StressConfig | None = None, out_dir: str | Path = "results/kv-stress", *, runner=None, **options
) -> pd.DataFrame:
    """Find the largest context that decodes (see the module docstring); every probe stored in ``out_dir``.

    Args:
        config: the stress (validated here; default: :class:`StressConfig`'s defaults).
        out_dir: run directory (created; a re-run resumes from the recorded probes).
        runner: ``runner(model, point, device, seed) -> record`` (default :func:`kit.measure.engine.run_point`).
        options: :class:`StressConfig` fields (they override ``config``'s), and :func:`kit.grid.run_grid`'s
            ``resume`` (False: the earlier files move to ``out_dir/previous/`` and every probe is measured again),
            ``on_point``, ``should_stop``, ``retry_killed`` (``progress`` is off: one line per probe goes to the
            ``kit`` logger).

    Returns:
        The probes' rows in probe order (the latest row of each), results schema; ``attrs["largest_ok"]`` and
        ``attrs["smallest_failed"]`` (tokens or None), ``attrs["max_context"]`` (the search's limit) and
        ``attrs["check"]`` (the correctness check or None).

    Raises:
            UserError / OutputPathError before any work; KeyboardInterrupt after the finished probes are saved.
    """
    from kit.measure.stress_check import run_check

    config, rest = config_with(StressConfig, config, options)
    out = check_out_dir(out_dir)
    opts, rest = split_run_options(rest)
    if rest:
        raise UserError(f"unknown option(s) {sorted(rest)} for run_kv_stress; give StressConfig fields or run options")
    backend = StressBackend(config, runner)
    backend.work_dir = out
    search = ContextSearch(config.start, config.max_context, config.resolution)
    recorded = recorded_probes(out, opts.get("resume", True), opts.get("retry_killed", False))
    if recorded:
        log.info("resuming: %d probes already recorded in %s (--no-resume to measure again)", len(recorded), out)
    probed, check = [], None
    opts["progress"] = False
    with backend.stress_session():
        check = run_check(backend, out) if config.check_context else None
        while len(probed) < config.max_probes and (ctx := search.next()) is not None:
            resume = opts.get("resume", True) or bool(probed)  # resume=False archives once, before the first probe
            if not _probe(backend, search, ctx, out, {**opts, "resume": resume}, probed, recorded):
                break  # should_stop() ended the grid before the probe
    df = pd.DataFrame()
    if probed:
        df = load_results(out)
        df = latest_rows(df, probed)
        df = df.sort_values("point_id", key=lambda ids: ids.map({p: i for i, p in enumerate(probed)}))
    df.attrs.update(largest_ok=search.lo, smallest_failed=search.hi, done=search.next() is None, check=check,
                    max_context=config.max_context)  # fmt: skip
    atomic_write_text(out / "stress.json", json.dumps(df.attrs, indent=2, default=str))
    return df


def recorded_probes(out: Path, resume: bool = True, retry_killed: bool = False) -> dict[str, dict]:
    """point_id → the latest record of every probe already finished in ``out`` (the grid runner's rule:
    :data:`kit.grid.FINISHED_STATUSES`, except that a ``killed`` probe is finished only once it killed
    :data:`KILLS_TO_GIVE_UP` runs, and never with ``retry_killed``); empty when not resuming. A resumed stress
    replays these without measuring them again."""
    log_file = out / "points.jsonl"
    if not resume or not log_file.exists():
        return {}
    records = read_log(log_file)
    latest = {r.get("point_id"): r for r in records}
    kills = {pid: sum(r.get("point_id") == pid and r.get("status") == "killed" for r in records) for pid in latest}
    done = lambda pid, r: r.get("status") != "killed" or (not retry_killed and kills[pid] >= KILLS_TO_GIVE_UP)
    return {pid: r for pid, r in latest.items() if r.get("status") in FINISHED_STATUSES and done(pid, r)}


def _probe(backend: StressBackend, search: ContextSearch, ctx: int, out: Path, opts: dict, probed, recorded) -> bool:
    """One probe: replayed from ``recorded`` or measured by the grid runner; its outcome goes to ``search``, its
    id to ``probed``. False when the grid stopped before measuring it."""
    backend.context = ctx
    pid = backend.point_of(ctx).point_id
    if pid in recorded:
        row, how = recorded[pid], "recorded"
    else:
        frame = run_grid(backend, out, **opts)
        rows = frame[frame["point_id"] == pid]
        kills = int((rows["status"] == "killed").sum()) if len(rows) else 0
        if len(rows) and rows["status"].iloc[-1] == "killed" and kills < KILLS_TO_GIVE_UP:
            log.info("kv=%d: an earlier run died while measuring it; measuring it again (a probe that kills %d "
                     "runs counts as not fitting)", ctx, KILLS_TO_GIVE_UP)  # fmt: skip
            frame = run_grid(backend, out, **{**opts, "retry_killed": True})
            rows = frame[frame["point_id"] == pid]
        if rows.empty:
            return False
        row, how = rows.iloc[-1].to_dict(), "measured"
    probed.append(pid)
    search.record(ctx, fits(row))
    if fits(row):
        what = f"ok, TPOT p50 {row['tpot_ms_p50']:.2f} ms, peak {row['peak_mem_gb']:.2f} GB"
    else:
        what = f"{row['status']}: {row.get('error')}"
    log.info("kv=%d B=%d (%s): %s", ctx, backend.config.batch, how, what)
    return True


def stress_summary(df: pd.DataFrame) -> str:
    """One line: the largest context that decoded and what stopped the search."""
    lo, hi = df.attrs.get("largest_ok"), df.attrs.get("smallest_failed")
    cut = "" if df.attrs.get("done", True) else f" (stopped after {len(df)} probes, before the search ended)"
    if lo is None and hi is None:
        return "no probe ran"
    if lo is None:
        return f"no context decoded: the smallest probe, {hi:,} tokens, did not ({_status_at(df, hi)}){cut}"
    stop = "" if hi is None else f"; {hi:,} tokens did not ({_status_at(df, hi)})"
    top = df.attrs.get("max_context")
    if hi is None and top is not None and lo >= top:
        stop = " (the --max-context limit: larger contexts were not tried; raise --max-context to search further)"
    return f"largest context that decodes: {lo:,} tokens{stop}{cut}"


def _status_at(df: pd.DataFrame, context: int) -> str:
    r = df[df["context_len"] == context]
    return str(r["status"].iloc[-1]) if len(r) else "?"
