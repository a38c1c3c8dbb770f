"""How often does ``kit history compare`` cry wolf, and how often does it catch a real slowdown, at its defaults?

1. Measures this machine's noise with the in-process engine (tiny preset, CPU): the per-step spread (robust
   log-scale sd, 1.4826 x MAD, of the timed steps around their block's median), the lag-1 correlation of
   consecutive steps, the spread of block medians within a run and of run medians between runs.
2. Simulates histories with that noise (:mod:`kit.track.simulate`): BASE and HEAD each ``--runs 3`` replicates of
   a 4-point grid (3 repeats x 16 steps), and compares them with the defaults (±3 % band, 95 % intervals,
   FDR 5 %). Prints the false-alarm rate over ``--pairs`` unchanged pairs (a pair alarms when any point is
   flagged) and the detection rate of a 5 % and a 10 % slowdown of every point (per point, and per pair), and how
   many pairs the gate called inconclusive (exit 3: different machine noise; ``benchmarks/history_gate.py`` runs
   real pairs under a shifting load).

Run: ``.venv/bin/python benchmarks/history_power.py [--pairs 300] [--seed 0]`` (~1 min on 2 cores).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from kit.track.compare import compare_frames
from kit.track.noise import INCONCLUSIVE_EXIT
from kit.track.rows import frames_of
from kit.track.simulate import Noise, simulated_records


def measure_noise(runs: int = 4, repeats: int = 3, steps: int = 16) -> Noise:
    """This machine's decode noise from ``runs`` separate run_point calls of the tiny preset (kv=64, B=2)."""
    import torch

    from kit.measure.engine import PointConfig, run_point
    from kit.measure.sweep import get_model

    torch.set_num_threads(1)
    model = get_model("tiny-llama", "float32", "cpu")
    pt = PointConfig(2, 64, steps, 3, repeats)
    run_point(model, pt)  # warm-up
    resid, ar, block_sd, run_med = [], [], [], []
    for _ in range(runs):
        s = np.log(np.asarray(run_point(model, pt)["x_step_ms"])).reshape(repeats, steps)
        med = np.median(s, axis=1)
        r = s - med[:, None]
        resid.append(r.ravel())
        ar += [np.corrcoef(x[:-1], x[1:])[0, 1] for x in r]
        block_sd.append(np.std(med, ddof=1))
        run_med.append(np.median(s))
    res = np.concatenate(resid)
    step_sd = float(1.4826 * np.median(np.abs(res - np.median(res))))  # robust: preemption outliers aside
    return Noise(
        step_noise=round(step_sd, 4),
        step_ar=round(float(np.clip(np.nanmean(ar), 0, 0.95)), 3),
        block_noise=round(float(np.median(block_sd)), 4),
        run_noise=round(float(np.std(run_med, ddof=1)), 4),
    )


def rates(noise: Noise, pairs: int, slowdown: float, rng: np.random.Generator) -> tuple[float, float, float]:
    """(fraction of points flagged, fraction of pairs with any point flagged, fraction of pairs inconclusive) over
    ``pairs`` simulated pairs."""
    pts = flagged = 0
    pair_hits = inconclusive = 0
    for i in range(pairs):
        recs_b = simulated_records(rng, noise=noise, run_id=f"b{i}")
        factors = {p: 1 + slowdown for p in ((128, 1), (128, 4), (512, 1), (512, 4))} if slowdown else {}
        recs_h = simulated_records(rng, noise=noise, factors=factors, run_id=f"h{i}")
        rb, sb = frames_of(recs_b, "base")
        rh, sh = frames_of(recs_h, "head")
        rows = pd.concat([rb.assign(side="base"), rh.assign(side="head")], ignore_index=True)
        cmp = compare_frames(rows, pd.concat([sb, sh], ignore_index=True))
        n = len(cmp.regressed_points)
        pts += 4
        flagged += n
        pair_hits += n > 0
        inconclusive += cmp.exit_code == INCONCLUSIVE_EXIT
    return flagged / pts, pair_hits / pairs, inconclusive / pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=300, help="simulated pairs per case (>= 200)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    noise = measure_noise()
    print(f"this machine's noise (log-scale sd): {noise}  [measured in {time.perf_counter() - t0:.1f} s]")
    rng = np.random.default_rng(args.seed)
    cases = [("measured noise", noise), ("step noise only", Noise(noise.step_noise, noise.step_ar))]
    print(f"defaults: ±3% band, 95% intervals, FDR 5%; 3 runs x 3 repeats x 16 steps per side; {args.pairs} pairs")
    for name, nz in cases:
        fa_pt, fa_pair, fa_inc = rates(nz, args.pairs, 0.0, rng)
        d5_pt, d5_pair, d5_inc = rates(nz, args.pairs, 0.05, rng)
        d10_pt, d10_pair, d10_inc = rates(nz, args.pairs, 0.10, rng)
        print(
            f"{name:16s}: false alarms {fa_pair:.1%} of unchanged pairs ({fa_pt:.2%} of points); "
            f"5% slowdown detected {d5_pt:.1%} of points ({d5_pair:.1%} of pairs); "
            f"10% slowdown detected {d10_pt:.1%} of points ({d10_pair:.1%} of pairs); "
            f"inconclusive {fa_inc:.1%} / {d5_inc:.1%} / {d10_inc:.1%} of pairs"
        )
    print(f"wall {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
