"""Profiles of in-process points: where a decode step goes, operator by operator.

``kit sweep --profile [all|kv=32768,B=8;...]`` (also ``kit kv-stress --profile``, ``kit bench --profile``) runs
``torch.profiler`` around the timed decode steps of the chosen points. Activities: CPU always, and CUDA when the
point runs on a GPU (ROCm builds report HIP activity through the same ``ProfilerActivity.CUDA``; their
``torch.version.hip`` is set).

**Timings are never mixed.** A profiled point is first measured exactly like any other point (its row's TPOT,
tok/s, GB/s come from that plain pass); then a *separate profiled pass* runs the same point once more (one block,
the same warm-up and decode steps; the cache filled synthetically, since only decode is profiled) with the
profiler held around its timed steps. That pass's numbers land only in ``x_prof_*`` columns, so a profiled row's
speed figures are as trustworthy as an unprofiled one's and ``x_prof_step_ms`` says what the profiler itself cost
(``x_prof_overhead_ratio`` = profiled step / plain TPOT p50).

Per profiled point, in ``<run dir>/profiles/<point_id>/``:

- ``trace.json``: the Chrome/Perfetto trace (open in https://ui.perfetto.dev or ``chrome://tracing``); each timed
  step is a ``kit.decode_step`` range.
- ``ops.csv``: every operator with ``calls_per_step``, ``self_cpu_ms_per_step``, ``self_device_ms_per_step``,
  ``self_ms_per_step`` (device time on a GPU, CPU time on the CPU), ``pct_of_step`` (of the mean profiled step) and
  ``kernels_per_step`` (empty on the CPU: no device kernels), sorted by ``self_ms_per_step``. The per-step times
  are **medians over the profiled steps** (each operator's self time summed within each ``kit.decode_step`` range,
  then the median of those per-step sums), so one step the machine stalled in does not move them;
  ``self_ms_mean_per_step`` keeps the total / steps. The row named :data:`OUTSIDE_OPS` is the step's own time
  outside every operator (the ``kit.decode_step`` range's self time: Python, the framework, the harness).
- ``profile.json``: the summary the row carries, plus the top operators.

(``kit sweep --runs N`` profiles each replicate in its own pass, into the point's one folder: the files are the last
replicate's, each row's ``x_prof_*`` columns its own.)

**Launch overhead.** ``x_prof_launches_per_step`` counts what the host issues per step: on a GPU the runtime's
launch calls (``cudaLaunchKernel``, ``hipLaunchKernel``, ``cudaGraphLaunch``, ...), on the CPU the operators called
from Python (``x_prof_top_ops_per_step``: the outermost ``cpu_op`` spans, as the calibration's chains of tiny ops
are; ``x_prof_ops_per_step`` also counts the operators they call inside). The estimated
launch/dispatch share of the step is ``launches × launch_us_per_op ÷ step time`` (the plain pass's TPOT p50), with
``launch_us_per_op`` from ``kit calibrate`` (``graph_launch_us_per_op`` for a step replayed as a CUDA/HIP graph);
without a calibration the row says "not calibrated". On the CPU there are no device kernels: the tables say "no
device kernels (CPU)" and count dispatches (operators called from Python) instead of printing 0 or null.

**Noise.** ``x_prof_step_ms_min`` / ``x_prof_step_ms_max`` and ``x_prof_step_spread`` ((max − min) ÷ median of
the profiled steps) say how steady the profiled pass was; with ``x_prof_overhead_ratio`` they tell a profile taken
on a busy machine (see :mod:`kit.measure.profile_compare`).

The ``USDT: ... profiler_start`` / ``profiler_stop`` lines on stderr are printed by libkineto inside torch at its
highest log level; the only switch is libkineto's ``KINETO_LOG_LEVEL`` (6 silences them), which also silences its
warnings and errors, so the kit leaves it to the user.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from bisect import bisect_right
from dataclasses import replace
from pathlib import Path

import pandas as pd

from kit._io import atomic_write_text
from kit.errors import InputNotFoundError, UserError

#: the run directory's sub-folder that holds one folder of profile files per point
PROFILE_DIR = "profiles"
#: the trace's name for one timed decode step (:func:`kit.measure.engine.time_point`)
STEP_RANGE = "kit.decode_step"
#: what the tables call a step's time outside every operator (the ``kit.decode_step`` range's own self time)
OUTSIDE_OPS = "Python/framework time outside operators"
#: what the tables say on the CPU instead of a kernel count
NO_KERNELS = "no device kernels (CPU)"
#: how many operators the row's ``x_prof_top`` and ``profile.json`` list
TOP_N = 10
#: runtime calls that launch work on a GPU (CUDA and HIP spellings; a graph launch counts once)
LAUNCH_CALL = re.compile(r"Launch", re.IGNORECASE)


def profile_activities(device) -> list:
    """``torch.profiler`` activities for ``device``: CPU, plus CUDA on a GPU (ROCm reports HIP through it)."""
    import torch
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def activities_label(device) -> str:
    """``cpu``, ``cpu+cuda`` or ``cpu+hip`` (a ROCm build: ``torch.version.hip`` set)."""
    import torch

    if torch.device(device).type != "cuda":
        return "cpu"
    return "cpu+hip" if getattr(torch.version, "hip", None) else "cpu+cuda"


#: per-compile hashes in operator names (inductor's ``## Call CompiledFxGraph <hash> ##``), dropped so the same
#: graph compares across runs
_GRAPH_HASH = re.compile(r"(CompiledFxGraph) [0-9a-z]{16,}")


def op_name(name: str) -> str:
    """An operator's name as the tables show it: a compiled graph's per-compile hash dropped."""
    return _GRAPH_HASH.sub(r"\1", name)


def operator_table(events, steps: int, step_ms: float) -> pd.DataFrame:
    """Per-operator self times of a profiler's events (``prof.events()``; host-side operators), per decode step.

    Each operator's self time is summed within each ``kit.decode_step`` range (the steps the profile marked); its
    ``self_*_ms_per_step`` is the **median** of those per-step sums over the marked steps (a robust statistic: one
    stalled step does not move it), ``self_ms_mean_per_step`` the total / ``steps``. Without step marks the median
    falls back to the mean. The step range's own self time is the row :data:`OUTSIDE_OPS`.

    Args:
        events: ``torch.autograd.profiler_util.FunctionEvent`` s; only host (CPU) events are rows, their device
            time is what their kernels took.
        steps: decode steps the profile covered.
        step_ms: the profiled step's median wall time, ms (the denominator of ``pct_of_step``).

    Returns:
        DataFrame: ``op``, ``calls_per_step``, ``self_ms_per_step`` (device time when any operator has some, else
        CPU; median), ``pct_of_step``, ``self_cpu_ms_per_step``, ``self_device_ms_per_step`` (medians),
        ``self_ms_mean_per_step`` and ``kernels_per_step`` (NaN when nothing ran on a device), sorted by
        ``self_ms_per_step`` (largest first). Times from the profiler's µs.
    """
    from torch.autograd import DeviceType

    host = [e for e in events if getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU]
    marks = sorted((e.time_range.start, e.time_range.end) for e in host if e.name == STEP_RANGE)
    starts = [m[0] for m in marks]
    agg: dict[str, list] = {}
    for e in host:
        name = OUTSIDE_OPS if e.name == STEP_RANGE else op_name(e.name)
        a = agg.setdefault(name, [0, 0.0, 0.0, 0, [0.0] * len(marks), [0.0] * len(marks)])
        cpu, dev = float(e.self_cpu_time_total), float(getattr(e, "self_device_time_total", 0.0) or 0.0)
        a[0] += 1
        a[1] += cpu
        a[2] += dev
        a[3] += len(getattr(e, "kernels", []) or [])
        i = bisect_right(starts, e.time_range.start) - 1
        if i >= 0 and e.time_range.start < marks[i][1]:
            a[4][i] += cpu
            a[5][i] += dev

    def per_step(total_us: float, by_step: list) -> float:
        return (statistics.median(by_step) if by_step else total_us / steps) / 1000.0

    rows = [
        {"op": name, "calls_per_step": n / steps, "self_cpu_ms_per_step": per_step(cpu, sc),
         "self_device_ms_per_step": per_step(dev, sd), "mean_cpu": cpu / 1000 / steps, "mean_dev": dev / 1000 / steps,
         "kernels_per_step": k / steps}
        for name, (n, cpu, dev, k, sc, sd) in agg.items()
    ]  # fmt: skip
    df = pd.DataFrame(rows, columns=["op", "calls_per_step", "self_cpu_ms_per_step", "self_device_ms_per_step",
                                     "mean_cpu", "mean_dev", "kernels_per_step"])  # fmt: skip
    on_device = bool(len(df)) and df["mean_dev"].sum() > 0
    df["self_ms_per_step"] = df["self_device_ms_per_step"] if on_device else df["self_cpu_ms_per_step"]
    df["self_ms_mean_per_step"] = df["mean_dev"] if on_device else df["mean_cpu"]
    if not on_device and not df["kernels_per_step"].any():
        df["kernels_per_step"] = math.nan  # no device kernels: not "0 kernels"
    df["pct_of_step"] = 100.0 * df["self_ms_per_step"] / step_ms if step_ms > 0 else math.nan
    df = df.sort_values("self_ms_per_step", ascending=False, kind="stable").reset_index(drop=True)
    cols = ["op", "calls_per_step", "self_ms_per_step", "pct_of_step", "self_cpu_ms_per_step",
            "self_device_ms_per_step", "self_ms_mean_per_step", "kernels_per_step"]  # fmt: skip
    return df[cols]


def trace_counts(trace: dict, steps: int) -> dict:
    """Counts per decode step in a Chrome trace (``traceEvents``): ``ops_per_step`` (``cpu_op`` events named
    ``namespace::op``: operators dispatched, nested ones too; torch.compile's named ranges such as
    ``Torch-Compiled Region`` are not operators), ``top_ops_per_step`` (the outermost operators: called from Python
    or from a compiled graph's wrapper, not from inside another operator; a compiled CPU graph's fused C++ kernels
    are plain function calls the profiler does not see), ``kernels_per_step`` (``kernel`` events: device kernels run),
    ``launches_per_step`` (runtime calls whose name says Launch: kernel and graph launches; 0 on the CPU) and
    ``steps_marked`` (the ``kit.decode_step`` ranges found)."""
    n = {"cpu_op": 0, "kernel": 0, "launch": 0, "steps": 0}
    spans: dict = {}
    for e in trace.get("traceEvents", []):
        cat = e.get("cat")
        if cat == "cpu_op" and "::" in str(e.get("name", "")):  # an operator (aten::mm), not a named range
            n["cpu_op"] += 1
            spans.setdefault((e.get("pid"), e.get("tid")), []).append((float(e.get("ts", 0)), float(e.get("dur", 0))))
        elif cat == "kernel":
            n["kernel"] += 1
        elif cat in ("cuda_runtime", "hip_runtime", "cuda_driver") and LAUNCH_CALL.search(str(e.get("name", ""))):
            n["launch"] += 1
        elif cat == "user_annotation" and e.get("name") == STEP_RANGE:
            n["steps"] += 1
    top = 0
    for events in spans.values():  # an operator inside another one's span (same thread) is nested
        end = -math.inf
        for ts, dur in sorted(events, key=lambda x: (x[0], -x[1])):
            if ts >= end:
                top += 1
                end = ts + dur
    s = max(steps, 1)
    return {"ops_per_step": n["cpu_op"] / s, "top_ops_per_step": top / s, "kernels_per_step": n["kernel"] / s,
            "launches_per_step": n["launch"] / s, "steps_marked": n["steps"]}  # fmt: skip


def launch_cost_us(engine_mode: str, calibration: dict | None = None, device: str | None = None) -> tuple:
    """``(µs per launch, where it came from)`` for a step run as ``engine_mode``: ``launch_us_per_op`` of the
    calibration (eager and compiled steps launch op by op), ``graph_launch_us_per_op`` for ``compiled+graphs``.
    ``calibration``: a loaded calibration (default: :func:`kit.measure.calibrate.load_calibration` of ``device``).
    ``(None, "not calibrated ...")`` when there is no calibration or it lacks the key."""
    from kit.measure.calibrate import load_calibration

    key = "graph_launch_us_per_op" if engine_mode == "compiled+graphs" else "launch_us_per_op"
    if calibration is None:
        try:
            calibration = load_calibration(device=device)
        except InputNotFoundError:
            return None, "not calibrated (run `kit calibrate`)"
        except UserError as e:
            return None, f"not calibrated ({e})"
    v = calibration.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        where = calibration.get("path", "the calibration")
        return None, f"not calibrated ({where} has no {key}; rerun `kit calibrate`)"
    return float(v), f"{key} from {calibration.get('path', 'the calibration')}"


def launch_share(launches_per_step: float, us_per_launch: float | None, step_ms: float | None) -> float | None:
    """Estimated share of a decode step spent launching/dispatching (0-1): ``launches × µs per launch / 1000 ÷
    step ms``; None when a factor is unknown."""
    if us_per_launch is None or not step_ms or step_ms <= 0 or launches_per_step is None:
        return None
    return launches_per_step * us_per_launch / 1000.0 / step_ms


def point_profile_dir(run_dir: str | Path | None, point_id: str) -> Path:
    """``<run_dir>/profiles/<point_id>``: where a point's profile files go (run_dir None: a new temporary
    directory)."""
    if run_dir is None:
        import tempfile

        run_dir = tempfile.mkdtemp(prefix="kit-profile-")
    return Path(run_dir) / PROFILE_DIR / point_id


def profile_point(
    model,
    point,
    device: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    compile: bool = False,
    compile_backend: str = "inductor",
    plain_step_ms: float | None = None,
) -> dict:
    """The separate profiled pass of one point (see the module text): the trace, ``ops.csv`` and ``profile.json``
    in ``out_dir``; returns the row's ``x_prof_*`` columns (:func:`profile_columns`). The launch cost comes from
    this device's calibration (:func:`launch_cost_us`), when there is one.

    Args:
        model, device, seed, compile, compile_backend: as :func:`kit.measure.engine.time_point`.
        point: the point (a :class:`kit.measure.engine.PointConfig`); profiled as one block of its warm-up and
            decode steps with a synthetic cache of its context.
        out_dir: the point's profile folder (created).
        plain_step_ms: the unprofiled TPOT p50, ms (the launch share's denominator and the profiler's overhead
            ratio); None: the profiled step's.

    Raises:
        OutputPathError: a file cannot be written. Whatever the point's own measurement raises.
    """
    import torch

    from kit.measure.engine import time_point

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pp = replace(point, repeats=1, kv_fill="synthetic", prefill_chunk=None)
    prof = torch.profiler.profile(activities=profile_activities(device), record_shapes=False)
    raw = time_point(model, pp, device, seed, compile, compile_backend, around_timed=prof)
    steps = len(raw["step_ms"])
    tmp = out / "trace.json.tmp"
    prof.export_chrome_trace(str(tmp))
    tmp.replace(out / "trace.json")
    counts = trace_counts(json.loads((out / "trace.json").read_text()), steps)
    ops = operator_table(prof.events(), steps, statistics.median(raw["step_ms"]))
    atomic_write_text(out / "ops.csv", ops.to_csv(index=False), "profile operators table", "ops.csv")
    cols = profile_columns(raw, counts, ops, device, out, plain_step_ms)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    summary = {**cols, "x_prof_top": json.loads(cols["x_prof_top"]), "context_len": point.context_len,
               "concurrency": point.concurrency, "dtype": dtype, "decode_steps": point.decode_steps,
               "plain_step_ms": plain_step_ms, "steps_marked": counts["steps_marked"]}  # fmt: skip
    atomic_write_text(out / "profile.json", json.dumps(summary, indent=2, default=str), "profile summary")
    return cols


def profile_columns(raw: dict, counts: dict, ops: pd.DataFrame, device: str, out: Path, plain_step_ms) -> dict:
    """The row's ``x_prof_*`` columns of a profiled pass: ``raw`` (its :func:`kit.measure.engine.time_point`),
    ``counts`` (:func:`trace_counts`), ``ops`` (:func:`operator_table`), the files in ``out``.

    Returns:
        ``x_profiled`` (True), ``x_prof_dir``, ``x_prof_trace``, ``x_prof_ops_csv``, ``x_prof_activities``,
        ``x_prof_engine_mode``, ``x_prof_steps``, ``x_prof_step_ms`` (median profiled step, ms),
        ``x_prof_step_ms_min``, ``x_prof_step_ms_max``, ``x_prof_step_spread`` ((max − min) ÷ median),
        ``x_prof_overhead_ratio`` (profiled step ÷ plain TPOT p50), ``x_prof_ops_per_step``,
        ``x_prof_top_ops_per_step``, ``x_prof_kernels_per_step`` (GPUs; None on the CPU), ``x_prof_kernels_note``
        (on the CPU: "no device kernels (CPU): dispatches per step N"),
        ``x_prof_launches_per_step``, ``x_prof_top_op``, ``x_prof_top_op_pct``, ``x_prof_top`` (JSON list
        of the top operators), ``x_prof_launch_us_per_op``, ``x_prof_launch_share`` (0-1 or None) and
        ``x_prof_launch_note``.
    """
    import torch

    step_ms = statistics.median(raw["step_ms"])
    engine_mode = raw["extras"].get("x_engine_mode", "eager")
    gpu = torch.device(device).type == "cuda"
    launches = counts["launches_per_step"] if gpu else counts["top_ops_per_step"]
    us, note = launch_cost_us(engine_mode, None, device)
    shown = ops[~ops["op"].isin([STEP_RANGE, OUTSIDE_OPS])].head(TOP_N)
    top = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()} for r in shown.to_dict("records")]
    return {
        "x_profiled": True,
        "x_prof_dir": str(out),
        "x_prof_trace": str(out / "trace.json"),
        "x_prof_ops_csv": str(out / "ops.csv"),
        "x_prof_activities": activities_label(device),
        "x_prof_engine_mode": engine_mode,
        "x_prof_steps": len(raw["step_ms"]),
        "x_prof_step_ms": step_ms,
        "x_prof_step_ms_min": min(raw["step_ms"]),
        "x_prof_step_ms_max": max(raw["step_ms"]),
        "x_prof_step_spread": (max(raw["step_ms"]) - min(raw["step_ms"])) / step_ms if step_ms > 0 else None,
        "x_prof_overhead_ratio": step_ms / plain_step_ms if plain_step_ms else None,
        "x_prof_ops_per_step": counts["ops_per_step"],
        "x_prof_top_ops_per_step": counts["top_ops_per_step"],
        "x_prof_kernels_per_step": counts["kernels_per_step"] if gpu else None,
        "x_prof_kernels_note": None if gpu else f"{NO_KERNELS}: dispatches per step {launches:.0f}",
        "x_prof_launches_per_step": launches,
        "x_prof_top_op": top[0]["op"] if top else None,
        "x_prof_top_op_pct": top[0]["pct_of_step"] if top else None,
        "x_prof_top": json.dumps(top),
        "x_prof_launch_us_per_op": us,
        "x_prof_launch_share": launch_share(launches, us, plain_step_ms or step_ms),
        "x_prof_launch_note": note
        if us is None
        else f"{launches:.0f} {'launches' if gpu else 'dispatches'}/step x {us:g} us ({note})",
    }


def top_table(ops: pd.DataFrame, n: int = TOP_N) -> str:
    """The top ``n`` operators of an ``ops.csv`` table as text (median ms per step, % of step, calls per step, and
    kernels per step where a device ran any; on the CPU a line says there are none)."""
    t = ops.head(n).copy()
    if not len(t):
        return "(no operators)"
    t["self_ms_per_step"] = t["self_ms_per_step"].map("{:.4f}".format)
    t["pct_of_step"] = t["pct_of_step"].map("{:.1f}".format)
    t["calls_per_step"] = t["calls_per_step"].map("{:g}".format)
    cols = ["op", "self_ms_per_step", "pct_of_step", "calls_per_step"]
    if t["kernels_per_step"].notna().any():
        t["kernels_per_step"] = t["kernels_per_step"].map("{:g}".format)
        return t[[*cols, "kernels_per_step"]].to_string(index=False)
    return t[cols].to_string(index=False) + f"\n({NO_KERNELS}: per-step times are medians over the profiled steps)"


def profile_summary_lines(df: pd.DataFrame) -> list[str]:
    """One line per profiled row of ``df``: the point, where its trace is, the profiled step, ops and launches per
    step, the launch share (or why there is none) and the top operator."""
    if "x_profiled" not in df.columns:
        return []
    lines = []
    for _, r in df[df["x_profiled"].fillna(False).astype(bool)].iterrows():
        share = r.get("x_prof_launch_share")
        share = f"{100 * share:.1f}% of the step" if share is not None and share == share else r["x_prof_launch_note"]
        lo, hi = r.get("x_prof_step_ms_min"), r.get("x_prof_step_ms_max")
        spread = f"; steps {lo:.3f}-{hi:.3f} ms" if lo is not None and lo == lo else ""
        kern = r.get("x_prof_kernels_per_step")
        if kern is not None and kern == kern:
            kern = f", {kern:.0f} kernels/step, {r['x_prof_launches_per_step']:.0f} launches/step"
        else:
            kern = f", {NO_KERNELS}: dispatches per step {r['x_prof_launches_per_step']:.0f}"
        lines.append(
            f"profile kv={r['context_len']} B={r['concurrency']} {r.get('dtype', '')}: {r['x_prof_trace']}; profiled "
            f"step {r['x_prof_step_ms']:.3f} ms (x{r['x_prof_overhead_ratio']:.2f} the plain TPOT{spread}), "
            f"{r['x_prof_ops_per_step']:.0f} ops/step ({r['x_prof_top_ops_per_step']:.0f} called from Python){kern}, "
            f"launch/dispatch {share}; top op {r['x_prof_top_op']} "
            f"({r['x_prof_top_op_pct']:.1f}% of the step); table {r['x_prof_ops_csv']}"
        )
    return lines
