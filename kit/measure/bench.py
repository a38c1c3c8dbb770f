"""``kit bench``: benchmarks of the kit itself, printed as figures (not timed unit tests).

(a) harness overhead: the kit's median decode step (:func:`kit.measure.engine.run_point`, per-step clock + device sync)
    beside a bare loop of the same forward calls on the same static cache, timed as a whole. Goal: ratio <= 1.05.
(b) against what users would do instead: the kit's decode tok/s beside ``model.generate()`` (transformers'
    default dynamic cache, greedy) on the same model, batch and context. generate's
    decode tok/s = B / (median gap between consecutive generated tokens), taken with a timestamping
    StoppingCriteria (prefill excluded). Goal: kit >= 1.3x.

(c) eager vs compiled (``--which compile``): the same point's median decode step eagerly and through
    :class:`kit.measure.compiled.CompiledDecode` (torch.compile; CUDA/HIP graphs on GPUs), with the compiled
    step's achieved GB/s (weights + cache bytes per step) to set beside ``kit calibrate``'s bandwidth.
(d) TP=1 vs TP=N (``--which tp``): the same point in one process and on N torchrun ranks
    (:mod:`kit.measure.tp`).

``--profile``: after the benchmarks, the bench point is profiled (:mod:`kit.measure.profile`, a pass of its own:
the figures above stay unprofiled) eagerly and, with ``--which compile|all``, compiled; the files go to
``OUT/profiles/eager`` and ``OUT/profiles/compiled`` (``kit profile compare`` reads them) and the operators (on
CPU) or launches (on GPUs) per step of the two are printed side by side.

Each alternates the two sides for ``rounds`` rounds (interleaved, so machine noise hits both alike) and reports
medians and minima with n (rounds). ``--which all`` runs (a), (b) and (c); (d) starts ranks and runs only when
asked.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from kit import hardware, metrics
from kit.cli import number_arg
from kit.measure.engine import MAX_REPEATS, PointConfig, bare_decode_loop_ms, run_point
from kit.measure.ranks import check_local_ranks
from kit.measure.sweep import get_model
from kit.models import get_config, max_positions


def _pair(a: list[float], b: list[float], names: tuple[str, str]) -> dict:
    """Medians and minima of two sides' per-round step times (ms), n and ratio = median a / median b."""
    ma, mb = float(np.median(a)), float(np.median(b))
    (x, y) = names
    out = {f"{x}_step_ms_p50": ma, f"{x}_step_ms_min": float(min(a)), f"{y}_step_ms_p50": mb}
    return {**out, f"{y}_step_ms_min": float(min(b)), "n": len(a), "ratio": ma / mb}


def compiled_vs_eager(model, batch: int, context_len: int, steps: int, rounds: int, device: str) -> dict:
    """Interleaved rounds of eager and compiled decode on one point (synthetic KV, ``steps`` timed steps each).

    Returns: dict with eager/compiled step ms (medians over rounds of each round's p50, and minima), n (rounds),
    ratio (eager / compiled: > 1 means compiled is faster), engine_mode, compile_s_p50 (each round compiles once,
    outside its timed steps), compiled_achieved_gb_s_p50 and recompiles_timed (summed; 0 expected).
    """
    p = PointConfig(batch, context_len, steps, warmup_steps=3, repeats=1, kv_fill="synthetic")
    eager, comp, rows = [], [], []
    for _ in range(rounds):
        eager.append(run_point(model, p, device)["tpot_ms_p50"])
        rows.append(run_point(model, p, device, compile=True))
        comp.append(rows[-1]["tpot_ms_p50"])
    return {
        **_pair(eager, comp, ("eager", "compiled")),
        "engine_mode": rows[-1]["x_engine_mode"],
        "compile_s_p50": float(np.median([r["x_compile_s"] for r in rows])),
        "compiled_achieved_gb_s_p50": float(np.median([r["achieved_gb_s"] for r in rows])),
        "recompiles_timed": int(sum(r["x_recompiles_timed"] for r in rows)),
    }


def tp_vs_single(model_name: str, dtype: str, batch: int, context_len: int, steps: int, rounds: int, tp: int,
                 device: str) -> dict:  # fmt: skip
    """Interleaved rounds of one point in this process (TP=1) and on ``tp`` torchrun ranks (the same weights:
    :func:`kit.measure.tp.tp_checkpoint`, seed 0).

    Returns: dict with tp1/tpN step ms (medians over rounds of each round's p50, and minima), n (rounds), tp and
    ratio (TP=1 / TP=N: > 1 means the sharded model decodes faster).

    Raises:
        RankError: a rank failed.
    """
    import tempfile

    from kit.measure.tp import TPRanks, run_tp_point, tp_checkpoint

    ckpt = tp_checkpoint(model_name, dtype, seed=0)
    model = get_model(model_name, dtype, device)
    p = PointConfig(batch, context_len, steps, warmup_steps=3, repeats=1, kv_fill="synthetic")
    one, many = [], []
    with tempfile.TemporaryDirectory(prefix="kit-bench-tp-") as work:
        for i in range(rounds):
            one.append(run_point(model, p, device)["tpot_ms_p50"])
            many.append(run_tp_point(ckpt, dtype, p, f"{work}/{i}", TPRanks(tp))["tpot_ms_p50"])
    return {**_pair(one, many, ("tp1", f"tp{tp}")), "tp": tp}


def harness_overhead(model, batch: int, context_len: int, steps: int, rounds: int, device: str) -> dict:
    """Interleaved rounds of the kit's timed decode vs a bare forward loop; ms per step for each.

    Returns: dict with kit_step_ms / bare_step_ms medians and minima, n (rounds) and ratio (median kit / median
    bare).
    """
    kit_ms, bare_ms = [], []
    for _ in range(rounds):
        r = run_point(
            model, PointConfig(batch, context_len, steps, warmup_steps=3, repeats=1, kv_fill="synthetic"), device
        )
        kit_ms.append(r["tpot_ms_p50"])
        bare_ms.append(bare_decode_loop_ms(model, batch, context_len, steps, device))
    k, b = float(np.median(kit_ms)), float(np.median(bare_ms))
    return {
        "kit_step_ms_p50": k,
        "kit_step_ms_min": float(min(kit_ms)),
        "bare_step_ms_p50": b,
        "bare_step_ms_min": float(min(bare_ms)),
        "n": rounds,
        "ratio": k / b,
    }


class _StepClock:
    """A transformers ``StoppingCriteria`` that only timestamps: generate() calls it once per generated token."""

    def __init__(self, device):
        self.device, self.times = device, []

    def __call__(self, input_ids, scores, **kwargs):
        hardware.synchronize(self.device)
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def generate_step_ms(model, ids, new_tokens: int, device) -> list[float]:
    """Per-step decode times (ms) of ``model.generate()`` (greedy, default cache): gaps between consecutive
    generated tokens, so prefill and the first token are excluded."""
    from transformers import StoppingCriteriaList

    clock = _StepClock(device)
    model.generate(
        ids,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
        stopping_criteria=StoppingCriteriaList([clock]),
    )
    return [(b - a) * 1000.0 for a, b in zip(clock.times, clock.times[1:])]


def versus_generate(model, batch: int, context_len: int, steps: int, rounds: int, device: str) -> dict:
    """Interleaved rounds of the kit's decode tok/s vs ``model.generate()``'s on the same batch and context.

    Both sides use the median decode step of the round: decode tok/s = B / (median step ms / 1000).

    Returns: dict with kit/generate decode tok/s medians over rounds, n and speedup (kit / generate).
    """
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, context_len), generator=g).to(device)
    kit_tps, gen_tps = [], []
    with torch.inference_mode():
        generate_step_ms(model, ids[:, :16], 3, device)  # warm-up
        for _ in range(rounds):
            r = run_point(
                model, PointConfig(batch, context_len, steps, warmup_steps=3, repeats=1, kv_fill="prefill"), device
            )
            kit_tps.append(r["decode_tok_s"])
            gen_tps.append(
                metrics.decode_tok_s(batch, float(np.median(generate_step_ms(model, ids, steps + 1, device))))
            )
    k, gm = float(np.median(kit_tps)), float(np.median(gen_tps))
    return {
        "kit_decode_tok_s_p50": k,
        "generate_decode_tok_s_p50": gm,
        "kit_decode_tok_s_max": float(max(kit_tps)),
        "generate_decode_tok_s_max": float(max(gen_tps)),
        "n": rounds,
        "speedup": k / gm,
    }


def profile_bench_point(model, args, device: str, out: dict) -> dict:
    """Profile the bench point (``args``: batch, context, steps, which, out) eagerly and, when ``--which`` ran the
    compiled benchmark, compiled, into ``args.out/profiles/<mode>`` (:func:`kit.measure.profile.profile_point`);
    each mode's unprofiled step p50 from ``out`` (the benchmarks' figures), when measured. Returns mode → its
    ``x_prof_*`` columns."""
    from pathlib import Path

    from kit.measure.profile import PROFILE_DIR, profile_point

    c, o = out.get("compile", {}), out.get("overhead", {})
    plain = {"eager": c.get("eager_step_ms_p50") or o.get("kit_step_ms_p50"), "compiled": c.get("compiled_step_ms_p50")}
    p = PointConfig(args.batch, args.context, args.steps, warmup_steps=3, repeats=1, kv_fill="synthetic")
    modes = ("eager", "compiled") if args.which in ("compile", "all") else ("eager",)
    where = Path(args.out) / PROFILE_DIR
    return {
        m: profile_point(model, p, device, where / m, compile=m == "compiled", plain_step_ms=plain[m]) for m in modes
    }


def print_profiles(profiles: dict) -> None:
    """One line per profiled mode of :func:`profile_bench_point`: launches per step, profiled step, launch share."""
    for mode, pc in profiles.items():
        what = "launches" if pc["x_prof_kernels_per_step"] is not None else "operators called from Python"
        share = pc["x_prof_launch_share"]
        share = f"{100 * share:.1f}% of the step" if share is not None else pc["x_prof_launch_note"]
        print(
            f"profile {mode}: {pc['x_prof_launches_per_step']:.0f} {what} per step ({pc['x_prof_ops_per_step']:.0f} "
            f"operators in all), profiled step {pc['x_prof_step_ms']:.3f} ms, launch/dispatch share {share}; top op "
            f"{pc['x_prof_top_op']}; trace {pc['x_prof_trace']}"
        )


def add_cli(sub) -> None:
    p = sub.add_parser("bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llama", help="preset or checkpoint directory")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | rocm")
    count = number_arg(int, minimum=1)  # a bad count is one line naming the option and what is allowed
    p.add_argument("--batch", type=count, default=16, help="concurrency B")
    p.add_argument("--context", type=count, default=1024, help="KV-cache length C (tokens; at most the model's)")
    p.add_argument("--steps", type=count, default=32, help="decode steps per round")
    rounds = number_arg(int, minimum=1, maximum=MAX_REPEATS)
    p.add_argument("--rounds", type=rounds, default=7, help=f"interleaved rounds per side (1 to {MAX_REPEATS})")
    p.add_argument("--tp", type=count, default=2, help="ranks of --which tp (at most this node's GPUs, or 4 per core)")
    p.add_argument(
        "--which",
        choices=("overhead", "generate", "compile", "tp", "all"),
        default="all",
        help="which benchmark (all: overhead, generate, compile; tp starts ranks and runs only when named)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile the point (eager; compiled too with --which compile|all) in a pass of its own: traces and "
        "top operators in OUT/profiles/<mode>/",
    )
    p.add_argument("--out", default="results/bench", help="where --profile writes its files")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    info = hardware.detect(args.device)
    if args.profile:  # a bad --out is said before any benchmark runs
        from kit._io import check_out_dir

        check_out_dir(args.out, "--out", "results/bench")
    PointConfig(args.batch, args.context, args.steps, warmup_steps=3).validate(max_positions(get_config(args.model)))
    if args.which == "tp":
        check_local_ranks(args.tp, "tp", "gloo" if info.device == "cpu" else "nccl")
    model = get_model(args.model, args.dtype, info.device)
    out = {
        "model": args.model,
        "dtype": args.dtype,
        "device": info.name,
        "batch": args.batch,
        "context": args.context,
        "steps": args.steps,
    }
    if args.which in ("overhead", "all"):
        out["overhead"] = harness_overhead(model, args.batch, args.context, args.steps, args.rounds, info.device)
    if args.which in ("generate", "all"):
        out["vs_generate"] = versus_generate(model, args.batch, args.context, args.steps, args.rounds, info.device)
    if args.which in ("compile", "all"):
        out["compile"] = compiled_vs_eager(model, args.batch, args.context, args.steps, args.rounds, info.device)
    if args.which == "tp":
        out["tp"] = tp_vs_single(args.model, args.dtype, args.batch, args.context, args.steps, args.rounds, args.tp,
                                 info.device)  # fmt: skip
    if args.profile:
        out["profile"] = profile_bench_point(model, args, info.device, out)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"{args.model} {args.dtype} on {info.name}: B={args.batch}, C={args.context}, {args.steps} steps, "
        f"{args.rounds} interleaved rounds"
    )
    if "overhead" in out:
        o = out["overhead"]
        print(
            f"(a) harness overhead: kit step p50 {o['kit_step_ms_p50']:.3f} ms (min {o['kit_step_ms_min']:.3f}) vs "
            f"bare loop {o['bare_step_ms_p50']:.3f} ms (min {o['bare_step_ms_min']:.3f}), n={o['n']}: "
            f"ratio {o['ratio']:.3f} (goal <= 1.05)"
        )
    if "vs_generate" in out:
        v = out["vs_generate"]
        print(
            f"(b) vs model.generate(): kit {v['kit_decode_tok_s_p50']:.0f} tok/s vs generate "
            f"{v['generate_decode_tok_s_p50']:.0f} tok/s (medians, n={v['n']}): speedup {v['speedup']:.2f}x "
            f"(goal >= 1.3x)"
        )
    if "compile" in out:
        c = out["compile"]
        print(
            f"(c) eager vs compiled ({c['engine_mode']}): eager step p50 {c['eager_step_ms_p50']:.3f} ms (min "
            f"{c['eager_step_ms_min']:.3f}) vs compiled {c['compiled_step_ms_p50']:.3f} ms (min "
            f"{c['compiled_step_ms_min']:.3f}), n={c['n']}: ratio {c['ratio']:.2f}x; compile "
            f"{c['compile_s_p50']:.1f} s per point, compiled {c['compiled_achieved_gb_s_p50']:.1f} GB/s "
            "(compare kit calibrate's bandwidth), "
            f"{c['recompiles_timed']} recompilations in timed steps"
        )
    print_profiles(out.get("profile", {}))
    if "tp" in out:
        t, n = out["tp"], out["tp"]["tp"]
        print(
            f"(d) TP=1 vs TP={n}: step p50 {t['tp1_step_ms_p50']:.3f} ms (min {t['tp1_step_ms_min']:.3f}) vs "
            f"{t[f'tp{n}_step_ms_p50']:.3f} ms (min {t[f'tp{n}_step_ms_min']:.3f}), n={t['n']}: ratio "
            f"{t['ratio']:.2f}x (TP=1 / TP={n}; > 1: sharding is faster)"
        )
    return 0
