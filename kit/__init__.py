"""kit: an exploration kit for LLM inference performance — the front door.

``import kit`` gives the things a notebook or a script reaches for, by short names; each is imported on first use
(``import kit`` itself loads neither torch nor pandas, so ``kit --help`` stays fast). Every name lives in one module
of the kit, shown beside it; this façade only points there.

Measure
    sweep(config=None, out_dir, **fields)      in-process sweep, KV length x concurrency (kit.measure.sweep.run_sweep)
    serve_bench(url, concurrency, out_dir, **)  benchmark an OpenAI-compatible endpoint: a concurrency sweep, a ramp,
                                                multi-turn sessions, a trace replay, an SLO search
                                                (kit.serve.modes.serve_bench)
    launch_bench(spec, concurrency, out_dir, server_grid=None, **)  start a server (vLLM, SGLang, transformers
                                                serve) from a LaunchSpec, sweep, stop it; each server configuration
                                                in turn (kit.serve.launched.launch_bench)
    agree(prompts, config=None, **fields)       an endpoint's greedy tokens and logprobs vs the in-process reference
                                                (kit.serve.agree.agree)
    kv_stress(config=None, out_dir, **fields)  the largest context that decodes (kit.measure.stress.run_kv_stress)
    comm(config=None, **fields)                collective probes: latency, algbw, busbw (kit.measure.comm.run_comm)
    calibrate(...)                             this device's bandwidth, TFLOPS, step overhead
                                                (kit.measure.calibrate.calibrate)
Plan
    predict(model, concurrency, context_len, config)   one predicted point (kit.plan.roofline.predict_point)
    predict_grid(...)                                  a predicted grid (kit.plan.roofline.predict_grid)
    memory_fit(...)                                    weights, KV cache and users per GPU (kit.plan.fit.memory_fit)
    get_spec(model)                                    an architecture as the planner sees it (kit.plan.spec.get_spec)
    add_cost(df, ...)                                  $/GPU-hour, $ per million tokens (kit.plan.cost.add_cost_columns)
Check
    check_op(op, impl, ...)     an op against the reference per dtype and mode (kit.check.harness.check_op)
    doctor(config=None, ...)    versions, devices, kernels, dtypes (kit.check.doctor.run_doctor)
    qualify(config=None, **fields)  qualify this node: doctor, ops, seed workload, served, KV stress, collectives,
                                power, calibration, planner under one budget, with verdicts and a report
                                (kit.qualification.node.qualify)
Tour
    tour_check(ctx=None, url=None)  every lesson of ``kit tour`` headless, in order: the smoke test
                                (kit.tour.check.run_check)
    TourServer(port, ...)       the tour's page on 127.0.0.1: lessons and a live prompt playground
                                (kit.tour.server.TourServer)
Results
    load(path)                  a run directory's rows as a DataFrame (kit.store.load_results)
    compare(sets, prices, ...)  result sets side by side with $/Mtok (kit.view.compare_view.compare_frame)
    compare_runs(db, base, head)  noise-aware compare of two commits' runs (kit.track.compare.compare)
    load_profile(spec)          a profiled point (sweep(profile=...)): summary and top operators
                                (kit.measure.profile_compare.resolve_profile)
    compare_profiles(a, b)      two profiled points operator by operator, the gap and what explains it
                                (kit.measure.profile_compare.compare_profiles)
    plots                       the figures: kit.plots.throughput_vs_concurrency(df), ... (module kit.view.plots)
    ControlPanel, CompareView   the notebook widgets (kit.view.panel, kit.view.compare_view)
Configs
    SweepConfig, LoadConfig, ServedMode, LaunchSpec, StressConfig, CommConfig, PredictConfig, DoctorConfig,
    QualifyConfig
Errors
    KitError, UserError         KitError: the base of every error the kit raises for a user's input; UserError: a
                                bad value, named with what is allowed (files: kit.errors.InputNotFoundError,
                                OutputPathError); a bug keeps its traceback

Subpackages by concern (``docs/architecture.md``): :mod:`kit.measure` (in-process engine and sweep, calibration,
torchrun ranks, collectives, KV stress, power), :mod:`kit.serve` (OpenAI-compatible endpoints under load, launch
recipes), :mod:`kit.plan` (specs, memory fit, roofline, cost), :mod:`kit.check` (reference ops, harness, fp8,
doctor), :mod:`kit.view` (figures, panel, dashboard), :mod:`kit.track` (history per commit), :mod:`kit.qualification`
(a node's qualification: all of the above under one budget, with verdicts). Top level: the grid
runner, cli, errors, metrics, results (schema), store (files), dtypes, hardware, catalog, models.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: the front door: short name -> "module:attribute" (a bare module path for a module)
FRONT_DOOR = {
    "sweep": "kit.measure.sweep:run_sweep",
    "serve_bench": "kit.serve.modes:serve_bench",
    "launch_bench": "kit.serve.launched:launch_bench",
    "agree": "kit.serve.agree:agree",
    "kv_stress": "kit.measure.stress:run_kv_stress",
    "comm": "kit.measure.comm:run_comm",
    "calibrate": "kit.measure.calibrate:calibrate",
    "predict": "kit.plan.roofline:predict_point",
    "predict_grid": "kit.plan.roofline:predict_grid",
    "memory_fit": "kit.plan.fit:memory_fit",
    "get_spec": "kit.plan.spec:get_spec",
    "add_cost": "kit.plan.cost:add_cost_columns",
    "check_op": "kit.check.harness:check_op",
    "doctor": "kit.check.doctor:run_doctor",
    "qualify": "kit.qualification.node:qualify",
    "tour_check": "kit.tour.check:run_check",
    "TourServer": "kit.tour.server:TourServer",
    "load": "kit.store:load_results",
    "compare": "kit.view.compare_view:compare_frame",
    "compare_runs": "kit.track.compare:compare",
    "load_profile": "kit.measure.profile_compare:resolve_profile",
    "compare_profiles": "kit.measure.profile_compare:compare_profiles",
    "plots": "kit.view.plots",
    "ControlPanel": "kit.view.panel:ControlPanel",
    "CompareView": "kit.view.compare_view:CompareView",
    "SweepConfig": "kit.measure.sweep:SweepConfig",
    "LoadConfig": "kit.serve.load:LoadConfig",
    "ServedMode": "kit.serve.modes:ServedMode",
    "LaunchSpec": "kit.serve.recipes:LaunchSpec",
    "StressConfig": "kit.measure.stress:StressConfig",
    "CommConfig": "kit.measure.comm:CommConfig",
    "PredictConfig": "kit.plan.config:PredictConfig",
    "DoctorConfig": "kit.check.doctor:DoctorConfig",
    "QualifyConfig": "kit.qualification.config:QualifyConfig",
    "KitError": "kit.errors:KitError",
    "UserError": "kit.errors:UserError",
}

__all__ = sorted(FRONT_DOOR)


def __getattr__(name: str):
    """The front-door name ``name``, imported on first use (then cached in this module)."""
    target = FRONT_DOOR.get(name)
    if target is None:
        raise AttributeError(f"module 'kit' has no attribute {name!r} (the front door: {', '.join(__all__)})")
    module, _, attr = target.partition(":")
    value = importlib.import_module(module)
    value = getattr(value, attr) if attr else value
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(FRONT_DOOR))
