"""Timing a callable the way every measurement in the kit does: warm up, synchronise the device, time each
repeat with ``time.perf_counter``, keep every sample (callers report medians and percentiles with n, never one
run; :func:`kit.metrics.percentiles`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from kit import hardware


def timed_repeats(
    fn: Callable[[], object], device: str = "cpu", warmup: int = 2, repeats: int = 10, warmup_s: float = 0.0
) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()``, after at least ``warmup`` untimed calls and at least
    ``warmup_s`` seconds of them (CPU BLAS libraries pick and JIT kernels over the first calls). The device is
    synchronised after every call and before each clock read, so asynchronous CUDA/HIP work is inside the time.

    Returns:
        ``repeats`` durations in seconds, in call order.
    """
    t0, i = time.perf_counter(), 0
    while i < warmup or time.perf_counter() - t0 < warmup_s:
        fn()
        hardware.synchronize(device)
        i += 1
    hardware.synchronize(device)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        hardware.synchronize(device)
        out.append(time.perf_counter() - t0)
    return out
