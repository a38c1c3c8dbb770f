"""What the device drew during a point: a background power sampler and the energy columns of a row.

:class:`PowerSampler` reads every device each ``period_s`` (default 50 ms) in a background thread while a point
runs — power (W), the energy counter where the device has one (J), clock (MHz), temperature (°C), utilisation
(%) — and :meth:`PowerSampler.columns` turns the readings into a row's columns (:func:`energy_columns`).

Readers (:mod:`kit.measure.power_readers`), tried in this order by ``source="auto"``: NVML (``pynvml`` from
``nvidia-ml-py``), amd-smi (``amdsmi``), Linux RAPL under ``/sys/class/powercap`` (CPU packages). Both libraries
are optional imports. When none works every power column is missing and ``x_energy_method`` /
``x_power_status`` say ``not available: <why>`` — a point never fails for want of a power reading.

Units are converted once, at the reader (case T1): NVML reports mW and mJ, amd-smi W for socket power, µW for the
power cap and an energy count × a resolution in µJ, RAPL µJ. Energy per token is always W × s = J.

Formulas (``docs/metrics.md``, "Energy and power"): ``energy_j`` = the counter difference over the point when
every device has a counter, else the trapezoid integral of sampled power (``x_energy_method`` says which);
``avg_power_w = energy_j / duration``; ``j_per_output_token = energy_j / Σ output tokens``;
``j_per_token = energy_j / Σ (input + output) tokens``; ``pct_tdp = 100 × avg_power_w / (TDP × devices)``;
``x_energy_usd = energy_j / 3.6e6 × $/kWh`` (1 kWh = 3.6 MJ).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kit.errors import UserError
from kit.measure.power_readers import SOURCES, open_reader

log = logging.getLogger("kit")

#: default sampling period, s (``--power-period-ms 50``)
DEFAULT_PERIOD_S = 0.05
#: throttling: a sample is throttled when its clock is below this fraction of the device's max clock ...
THROTTLE_CLOCK_FRACTION = 0.85
#: ... while its power is at least this fraction of the power limit
POWER_AT_LIMIT_FRACTION = 0.95
#: a point counts as throttled when at least this fraction of its samples are
THROTTLED_SAMPLE_FRACTION = 0.1
#: J per kWh
J_PER_KWH = 3.6e6


@dataclass
class Sample:
    """One reading of one device: time (s, the sampler's clock) and what the device reported (None: not
    reported). ``energy_j`` is the raw counter (J since some origin), not an energy over the point."""

    t_s: float
    power_w: float | None = None
    energy_j: float | None = None
    clock_mhz: float | None = None
    temp_c: float | None = None
    util_pct: float | None = None


def _num(v) -> float | None:
    return float(v) if v is not None and math.isfinite(float(v)) else None


def trapezoid_j(samples: Sequence[Sample]) -> float | None:
    """Energy (J) as the trapezoid integral of sampled power (W) over time (s); None with fewer than two power
    readings. Samples without a power reading are skipped."""
    pts = [(s.t_s, s.power_w) for s in samples if s.power_w is not None]
    if len(pts) < 2:
        return None
    return sum((t1 - t0) * (p0 + p1) / 2.0 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))


def device_energy(samples: Sequence[Sample]) -> tuple[float | None, str]:
    """Energy (J) one device used over its samples and how it was found: ``counter`` (last − first counter
    reading, when both exist and the counter did not go backwards) else ``integral`` (:func:`trapezoid_j`)."""
    readings = [s.energy_j for s in samples if s.energy_j is not None]
    if len(readings) >= 2 and all(b >= a for a, b in zip(readings, readings[1:])):
        return readings[-1] - readings[0], "counter"
    if len(readings) >= 2:
        log.warning("an energy counter went backwards (wrapped or reset); using the integral of sampled power")
    return trapezoid_j(samples), "integral"


def throttle_fraction(samples: Sequence[Sample], max_clock_mhz: float | None, limit_w: float | None) -> float | None:
    """Fraction of samples with clock < :data:`THROTTLE_CLOCK_FRACTION` × max clock while power ≥
    :data:`POWER_AT_LIMIT_FRACTION` × the power limit; None when the max clock or the limit is unknown."""
    if not max_clock_mhz or not limit_w:
        return None
    rated = [s for s in samples if s.clock_mhz is not None and s.power_w is not None]
    if not rated:
        return None
    hot = sum(
        s.clock_mhz < THROTTLE_CLOCK_FRACTION * max_clock_mhz and s.power_w >= POWER_AT_LIMIT_FRACTION * limit_w
        for s in rated
    )
    return hot / len(rated)


def catalog_tdp_w(accelerator: str | None) -> float | None:
    """The catalog TDP of one ``accelerator`` device, W (``kit/data/accelerators.csv``; None when unnamed, unknown
    or without a TDP: ``pct_tdp`` then stays empty)."""
    if not accelerator:
        return None
    import pandas as pd

    from kit.catalog import load_catalog

    try:
        v = load_catalog().get(accelerator).get("tdp_w")
    except KeyError:
        return None
    return float(v) if v is not None and not pd.isna(v) else None


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def energy_columns(
    samples: dict[str, Sequence[Sample]],
    *,
    output_tokens: int | None = None,
    total_tokens: int | None = None,
    tdp_w: float | None = None,
    usd_per_kwh: float | None = None,
    limits_w: dict[str, float | None] | None = None,
    max_clocks_mhz: dict[str, float | None] | None = None,
) -> dict:
    """A row's power and energy columns from per-device samples (see the module docstring for the formulas).

    Args:
        samples: device name → its samples in time order (every device sampled at the same instants).
        output_tokens / total_tokens: Σ output and Σ (input + output) tokens of the point (None: no per-token
            columns).
        tdp_w: the catalog TDP of one device, W (None: no ``pct_tdp``).
        usd_per_kwh: electricity price, $/kWh (None: no cost columns).
        limits_w / max_clocks_mhz: per device power limit (W) and max clock (MHz), for throttling detection.

    Returns: ``avg_power_w``, ``peak_power_w`` (max over sampling instants of the summed device power),
    ``energy_j``, ``j_per_output_token``, ``j_per_token``, ``pct_tdp``, ``x_energy_method`` (``counter`` |
    ``integral`` | ``counter+integral`` when devices differ), ``x_energy_usd``, ``x_energy_usd_per_mtok`` (per
    million output tokens), ``x_power_duration_s``, ``x_power_samples``, clocks, temperature, utilisation,
    ``x_throttle_fraction`` and ``x_throttled``.
    """
    limits_w, max_clocks_mhz = limits_w or {}, max_clocks_mhz or {}
    energies, methods, throttles = [], set(), []
    for name, ss in samples.items():
        e, how = device_energy(ss)
        energies.append(e)
        methods.add(how)
        throttles.append(throttle_fraction(ss, max_clocks_mhz.get(name), limits_w.get(name)))
    flat = [s for ss in samples.values() for s in ss]
    times = sorted({s.t_s for s in flat})
    duration = times[-1] - times[0] if len(times) >= 2 else None
    energy = sum(energies) if energies and None not in energies else None
    by_time: dict[float, float] = {}
    for s in flat:
        if s.power_w is not None:
            by_time[s.t_s] = by_time.get(s.t_s, 0.0) + s.power_w
    avg = energy / duration if energy is not None and duration else None
    n_dev = len(samples)
    known = [t for t in throttles if t is not None]
    worst = max(known) if known else None
    return {
        "avg_power_w": avg,
        "peak_power_w": max(by_time.values()) if by_time else None,
        "energy_j": energy,
        "j_per_output_token": energy / output_tokens if energy is not None and output_tokens else None,
        "j_per_token": energy / total_tokens if energy is not None and total_tokens else None,
        "pct_tdp": 100.0 * avg / (tdp_w * n_dev) if avg is not None and tdp_w and n_dev else None,
        "x_energy_method": "+".join(sorted(methods)) if energy is not None else "not available: too few samples",
        "x_energy_usd": energy / J_PER_KWH * usd_per_kwh if energy is not None and usd_per_kwh is not None else None,
        "x_energy_usd_per_mtok": energy / J_PER_KWH * usd_per_kwh / output_tokens * 1e6
        if energy is not None and usd_per_kwh is not None and output_tokens
        else None,
        "x_power_duration_s": duration,
        "x_power_samples": len(times),
        "x_clock_mhz_mean": _mean([s.clock_mhz for s in flat if s.clock_mhz is not None]),
        "x_clock_mhz_min": min((s.clock_mhz for s in flat if s.clock_mhz is not None), default=None),
        "x_temp_c_max": max((s.temp_c for s in flat if s.temp_c is not None), default=None),
        "x_util_pct_mean": _mean([s.util_pct for s in flat if s.util_pct is not None]),
        "x_throttle_fraction": worst,
        "x_throttled": None if worst is None else worst >= THROTTLED_SAMPLE_FRACTION,
    }


def unavailable_columns(why: str) -> dict:
    """The power columns of a point whose power could not be read: numbers missing, the reason in
    ``x_energy_method`` and ``x_power_status`` (``not available: <why>``)."""
    text = f"not available: {why}"
    cols = dict.fromkeys([*energy_columns({}), "x_power_source", "x_power_devices", "x_power_limit_w"])
    return {**cols, "x_energy_method": text, "x_power_status": text}


class PowerSampler:
    """Samples device power in a background thread while the ``with`` block runs.

    ``with PowerSampler() as ps: <measure>`` then ``ps.columns(output_tokens, total_tokens, tdp_w, usd_per_kwh)``.

    Args:
        devices: device indices of the library (NVML / amd-smi index, RAPL package number); None: every device.
        period_s: sampling period, s (> 0; default 50 ms). A read that takes longer stretches the period.
        source: ``auto`` | ``nvml`` | ``amdsmi`` | ``rapl`` | ``none`` (:data:`kit.measure.power_readers.SOURCES`).
        library: module name to import instead of ``pynvml`` / ``amdsmi`` (a stand-in, e.g. for tests; needs
            ``source="nvml"`` or ``"amdsmi"``).
        rapl_root: the powercap directory (default ``/sys/class/powercap``).
        clock: seconds, monotonic (tests pass a scripted one).

    Raises:
        UserError: ``period_s`` not > 0, an unknown ``source``, ``library`` without its source (an unreadable
            device is not an error: the columns then say "not available" and why).
    """

    def __init__(
        self,
        devices: Sequence[int] | None = None,
        period_s: float = DEFAULT_PERIOD_S,
        source: str = "auto",
        library: str | None = None,
        rapl_root: str = "/sys/class/powercap",
        clock: Callable[[], float] = time.monotonic,
    ):
        if not isinstance(period_s, (int, float)) or not period_s > 0 or not math.isfinite(period_s):
            raise UserError(f"power sampling period {period_s!r} s (--power-period-ms) must be a number > 0")
        if source not in SOURCES:
            raise UserError(f"power source {source!r}; allowed: {SOURCES}")
        if library and source not in ("nvml", "amdsmi"):
            raise UserError(f"library={library!r} stands in for pynvml or amdsmi: give source='nvml' or 'amdsmi'")
        self.devices, self.period_s, self.source, self.library = devices, float(period_s), source, library
        self.rapl_root, self.clock = rapl_root, clock
        self.reader = None
        self.status = "not started"
        self.samples: dict[str, list[Sample]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def open(self) -> PowerSampler:
        """Open the reader (no thread); :attr:`status` says which one, or ``not available: <why>``."""
        self.reader, why = open_reader(self.source, self.devices, self.library, self.rapl_root)
        if self.reader is None:
            self.status = f"not available: {why}"
            log.debug("power: %s", self.status)  # said once per row (x_power_status), not per point on the console
        else:
            self.status = f"ok: {self.reader.name} ({', '.join(self.reader.names)})"
            self.samples = {n: [] for n in self.reader.names}
        return self

    def sample(self) -> None:
        """Read every device once (a device whose read fails gets an empty sample at that instant)."""
        if self.reader is None:
            return
        t = self.clock()
        for i, name in enumerate(self.reader.names):
            vals = self.reader.read(i)
            s = Sample(t, *(_num(vals.get(k)) for k in ("power_w", "energy_j", "clock_mhz", "temp_c", "util_pct")))
            with self._lock:
                self.samples[name].append(s)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> PowerSampler:
        self.open()
        if self.reader is not None:
            self.sample()
            self._thread = threading.Thread(target=self._loop, name="kit-power", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the thread, take the last sample and close the reader (idempotent)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(10 * self.period_s + 5)
            self._thread = None
            self.sample()
        if self.reader is not None:
            self.reader.close()
            self._closed_reader, self.reader = self.reader, None

    def columns(
        self,
        output_tokens: int | None = None,
        total_tokens: int | None = None,
        tdp_w: float | None = None,
        usd_per_kwh: float | None = None,
    ) -> dict:
        """The row's power columns (:func:`energy_columns`, or :func:`unavailable_columns`) plus
        ``x_power_status``, ``x_power_source``, ``x_power_devices``, ``x_power_limit_w`` and
        ``x_power_period_ms``."""
        if not self.status.startswith("ok"):
            why = self.status.removeprefix("not available: ")
            return {**unavailable_columns(why), "x_power_period_ms": self.period_s * 1000.0}
        rd = getattr(self, "_closed_reader", None) or self.reader
        with self._lock:
            samples = {k: list(v) for k, v in self.samples.items()}
        limits = dict(zip(rd.names, rd.limits_w))
        cols = energy_columns(
            samples,
            output_tokens=output_tokens,
            total_tokens=total_tokens,
            tdp_w=tdp_w,
            usd_per_kwh=usd_per_kwh,
            limits_w=limits,
            max_clocks_mhz=dict(zip(rd.names, rd.max_clocks_mhz)),
        )
        known = [v for v in limits.values() if v]
        return {
            **cols,
            "x_power_status": self.status,
            "x_power_source": rd.name,
            "x_power_devices": ",".join(rd.names),
            "x_power_limit_w": sum(known) if known else None,
            "x_power_period_ms": self.period_s * 1000.0,
        }
