"""Simulated in-process run records with known noise and known slowdowns: the ground truth the compare is tested
on (``tests/track``) and measured against (``benchmarks/history_power.py``).

A simulated decode step of point ``p`` in replicate ``r``, repeat ``k``, step ``i`` takes
``base_ms(p) × factor(p) × exp(run_r + block_rk + e_rki)`` ms, with ``run_r ~ N(0, run_noise)``,
``block_rk ~ N(0, block_noise)`` and ``e`` an AR(1) series of lag-1 correlation ``step_ar`` and marginal standard
deviation ``step_noise`` (log scale; 0.05 ≈ 5 % step-to-step spread). A busy machine (``load`` > 0) makes a
share ``load_share`` of the steps (and prefills) wait ``load`` times longer, as another job on the decode thread's
core does: TPOT p50 grows, the fastest steps do not. Rows are in the :mod:`kit.results` schema, as
``kit sweep --runs N`` writes them (``x_step_ms``, ``x_prefill_ms``, ``x_run_index``, ``x_point_key``,
``x_threads``, ``x_threads_reason``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: (KV length, concurrency) of the simulated grid
DEFAULT_POINTS = ((128, 1), (128, 4), (512, 1), (512, 4))
#: the price of the simulated rows' cost columns, $/GPU-hour (basis ``user``)
USD_PER_GPU_HR = 0.1


@dataclass(frozen=True)
class Noise:
    """Noise of a simulated run (log-scale standard deviations; see the module docstring) and the machine it ran
    on: ``load`` (extra wait of a busy machine's steps, 1.5 = 2.5x as long), ``load_share`` (the share of steps
    that wait), ``threads`` and ``busy_cores`` (what ``x_threads`` / ``x_threads_reason`` say)."""

    step_noise: float = 0.05
    step_ar: float = 0.0
    block_noise: float = 0.0
    run_noise: float = 0.0
    load: float = 0.0
    load_share: float = 0.8
    threads: int = 1
    busy_cores: float = 0.0

    def loaded(self, rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
        """``x`` (times, ms) with a share :attr:`load_share` waiting :attr:`load` times longer (no draw when idle)."""
        if not self.load:
            return x
        return x * np.where(rng.random(x.shape) < self.load_share, 1.0 + self.load, 1.0)

    def threads_reason(self) -> str:
        """``x_threads_reason`` as :func:`kit.hardware.cpu_threads_for_timing` words it on a 2-core machine."""
        if self.busy_cores >= 0.5:
            return f"{self.threads} of 2 cores free at the start ({self.busy_cores:.1f} cores busy with other work)"
        return "2 cores, all free at the start"


def base_ms(context_len: int, concurrency: int) -> float:
    """The simulated noiseless step time of a point, ms (grows with KV length and batch)."""
    return 8.0 + 0.004 * context_len * concurrency + 0.6 * concurrency


def _ar1(rng: np.random.Generator, n: int, sd: float, ar: float) -> np.ndarray:
    e = rng.normal(0.0, sd * np.sqrt(1 - ar * ar), n)
    out = np.empty(n)
    out[0] = rng.normal(0.0, sd)
    for i in range(1, n):
        out[i] = ar * out[i - 1] + e[i]
    return out


def simulated_records(
    rng: np.random.Generator,
    *,
    factors: dict | None = None,
    points=DEFAULT_POINTS,
    noise: Noise = Noise(),
    runs: int = 3,
    repeats: int = 3,
    steps: int = 16,
    run_id: str = "2025-01-01T00:00:00+00:00",
) -> list[dict]:
    """Rows of one simulated run (``runs`` replicates of the grid ``points``, interleaved).

    Args:
        factors: ``{(kv, B): multiplier}`` of the step time (1.10 = a 10 % slowdown); missing points: 1.
        points: ``(kv, B)`` pairs. noise: :class:`Noise`. runs, repeats, steps: replicates of the grid, timed
            blocks per point, decode steps per block. run_id: the rows' ``run_id`` and ``timestamp``.

    The cost columns use :data:`USD_PER_GPU_HR` (basis ``user``).
    """
    factors = factors or {}
    out = []
    for r in range(runs):
        run_eff = rng.normal(0.0, noise.run_noise) if noise.run_noise else 0.0
        for kv, b in points:
            f = factors.get((kv, b), 1.0) * base_ms(kv, b)
            blocks = rng.normal(0.0, noise.block_noise, repeats) if noise.block_noise else np.zeros(repeats)
            step = np.concatenate(
                [
                    f * np.exp(run_eff + blocks[k] + _ar1(rng, steps, noise.step_noise, noise.step_ar))
                    for k in range(repeats)
                ]
            )
            step = noise.loaded(rng, step)
            pre = f * kv * 0.05 * np.exp(run_eff + blocks + rng.normal(0.0, noise.step_noise, repeats))
            pre = noise.loaded(rng, pre)
            tpot = float(np.median(step))
            tok_s = b * 1000.0 / tpot
            out.append(
                {
                    "run_id": run_id,
                    "point_id": f"sim-kv{kv}-b{b}-r{r}",
                    "x_point_key": f"sim-kv{kv}-b{b}",
                    "x_run_index": r,
                    "backend": "engine",
                    "status": "ok",
                    "timestamp": run_id,
                    "model": "simulated",
                    "dtype": "float32",
                    "device": "cpu",
                    "device_name": "simulated CPU",
                    "accelerator": "CPU",
                    "n_gpus": 1,
                    "concurrency": b,
                    "context_len": kv,
                    "decode_steps": steps,
                    "repeats": repeats,
                    "kv_fill": "prefill",
                    "tpot_ms_p50": tpot,
                    "tpot_ms_min": float(step.min()),
                    "tpot_n": len(step),
                    "ttft_ms": float(np.median(pre)),
                    "decode_tok_s": tok_s,
                    "usd_per_gpu_hr": USD_PER_GPU_HR,
                    "price_basis": "user",
                    "usd_per_mtok": USD_PER_GPU_HR / (tok_s * 3600.0) * 1e6,
                    "x_step_ms": [float(x) for x in step],
                    "x_prefill_ms": [float(x) for x in pre],
                    "x_threads": noise.threads,
                    "x_threads_reason": noise.threads_reason(),
                }
            )
    return out
