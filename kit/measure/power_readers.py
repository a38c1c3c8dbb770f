"""Device power readers for :class:`kit.measure.power.PowerSampler`: NVML, amd-smi and Linux RAPL.

Each reader converts its library's units to W, J, MHz, °C and % once, here (case T1):

- NVML (``pynvml``, from ``nvidia-ml-py``; NVIDIA's NVML API reference): ``nvmlDeviceGetPowerUsage`` mW,
  ``nvmlDeviceGetTotalEnergyConsumption`` mJ since the driver loaded (Volta and newer),
  ``nvmlDeviceGetEnforcedPowerLimit`` mW, ``nvmlDeviceGetClockInfo`` / ``nvmlDeviceGetMaxClockInfo`` (SM) MHz,
  ``nvmlDeviceGetTemperature`` °C, ``nvmlDeviceGetUtilizationRates().gpu`` %.
- amd-smi (``amdsmi``; ROCm's amdsmi Python API): ``amdsmi_get_power_info`` W — ``current_socket_power``, else
  ``average_socket_power`` (either may be the string ``"N/A"``); ``amdsmi_get_power_cap_info()["power_cap"]`` µW;
  ``amdsmi_get_energy_count`` → ``energy_accumulator`` (``power`` before amdsmi 6.2.1) × ``counter_resolution``
  µJ; ``amdsmi_get_clock_info(GFX)`` → ``clk`` (``cur_clk`` in older builds) and ``max_clk`` MHz;
  ``amdsmi_get_temp_metric(HOTSPOT, CURRENT)`` °C; ``amdsmi_get_gpu_activity()["gfx_activity"]`` %.
- RAPL (Linux powercap sysfs, ``Documentation/power/powercap/powercap.rst``): ``intel-rapl:N/energy_uj`` µJ per
  CPU package (wrapping at ``max_energy_range_uj``); power is the counter's rate between two reads.

Energy counters wrap: RAPL at ``max_energy_range_uj`` (about 262 kJ on many Intel parts: an hour and a half at
50 W), NVML's and amd-smi's at 2^64 (``unsigned long long`` in NVML's API reference, ``uint64_t
*energy_accumulator`` in amdsmi's). Every reader unwraps its raw counter with one :class:`CounterUnwrap` per device
and reports ``energy_j`` as the energy since the reader's first reading (so a wrap, or several, never shows).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from pathlib import Path

from kit.visibility import resolve_visible_devices

log = logging.getLogger("kit")

#: what PowerSampler(source=...) accepts
SOURCES = ("auto", "nvml", "amdsmi", "rapl", "none")


def _na(v):
    """amd-smi's "N/A" (and None) → None; numbers pass."""
    return None if v is None or (isinstance(v, str) and v.strip().upper() in ("N/A", "NA", "")) else float(v)


#: the width of NVML's energy counter (``unsigned long long`` mJ) and of amd-smi's accumulator (``uint64_t`` counts)
COUNTER_MODULUS_64 = 2**64


class CounterUnwrap:
    """One device's energy counter made monotonic: the raw counter wraps to 0 after ``modulus - 1`` (counts in the
    counter's own unit; None: the width is unknown).

    Calling it with each raw reading, in time order, returns the counts since the first reading. A reading below
    the previous one is a wrap when the counter can have wrapped in between — the wrapped difference
    ``modulus - previous + raw`` is under half the modulus — and then adds ``modulus``; otherwise (no known width, or
    a drop far from the top: the counter was reset, or the reading glitched) the result goes back by the drop, so
    :func:`kit.measure.power.device_energy` sees a counter that went backwards and integrates sampled power instead.

    Wraps are decided from the previous *raw* reading, never from an unwrapped total, so each wrap is counted once
    however many reads follow it (issue 22: comparing with the unwrapped total added a wrap at every read after the
    first, 840 J for a 50 W zone over 1.2 s instead of 60 J).
    """

    def __init__(self, modulus: int | None):
        self.modulus = int(modulus) if modulus else None
        self.first: int | None = None
        self.last: int | None = None
        self.offset = 0

    def __call__(self, raw: int) -> int:
        raw = int(raw)
        if self.first is None:
            self.first = raw
        elif raw < self.last and self.modulus and self.modulus - self.last + raw < self.modulus // 2:
            self.offset += self.modulus
        self.last = raw
        return raw + self.offset - self.first


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # a library error (NVMLError, AmdSmiException) means "this reading is not supported"
        return None


class NvmlReader:
    """NVIDIA GPUs through NVML (``pynvml``)."""

    name = "nvml"

    def __init__(self, mod, devices: Sequence[int] | None):
        self.m = mod
        mod.nvmlInit()
        n = mod.nvmlDeviceGetCount()
        idx = list(range(n)) if devices is None else list(devices)
        bad = [i for i in idx if not 0 <= i < n]
        if bad or not idx:
            mod.nvmlShutdown()
            raise LookupError(f"NVML sees {n} device(s); asked for {idx}")
        self.handles = [mod.nvmlDeviceGetHandleByIndex(i) for i in idx]
        self.names = [f"{i}:{_try(mod.nvmlDeviceGetName, h) or 'gpu'}" for i, h in zip(idx, self.handles)]
        mw = [_try(mod.nvmlDeviceGetEnforcedPowerLimit, h) for h in self.handles]
        self.limits_w = [v / 1000.0 if v is not None else None for v in mw]  # mW → W
        self.max_clocks_mhz = [_try(mod.nvmlDeviceGetMaxClockInfo, h, mod.NVML_CLOCK_SM) for h in self.handles]
        self.has_energy = [_try(mod.nvmlDeviceGetTotalEnergyConsumption, h) is not None for h in self.handles]
        self.energy = [CounterUnwrap(COUNTER_MODULUS_64) for _ in self.handles]  # mJ

    def read(self, i: int) -> dict:
        m, h = self.m, self.handles[i]
        mw = _try(m.nvmlDeviceGetPowerUsage, h)
        mj = _try(m.nvmlDeviceGetTotalEnergyConsumption, h) if self.has_energy[i] else None
        util = _try(m.nvmlDeviceGetUtilizationRates, h)
        return {
            "power_w": mw / 1000.0 if mw is not None else None,  # mW → W
            "energy_j": self.energy[i](mj) / 1000.0 if mj is not None else None,  # mJ since the first read → J
            "clock_mhz": _try(m.nvmlDeviceGetClockInfo, h, m.NVML_CLOCK_SM),
            "temp_c": _try(m.nvmlDeviceGetTemperature, h, m.NVML_TEMPERATURE_GPU),
            "util_pct": getattr(util, "gpu", None),
        }

    def close(self) -> None:
        _try(self.m.nvmlShutdown)


class AmdSmiReader:
    """AMD GPUs through amd-smi (``amdsmi``)."""

    name = "amdsmi"

    def __init__(self, mod, devices: Sequence[int] | None):
        self.m = mod
        mod.amdsmi_init()
        hs = list(mod.amdsmi_get_processor_handles())
        idx = list(range(len(hs))) if devices is None else list(devices)
        bad = [i for i in idx if not 0 <= i < len(hs)]
        if bad or not idx:
            mod.amdsmi_shut_down()
            raise LookupError(f"amd-smi sees {len(hs)} device(s); asked for {idx}")
        self.handles = [hs[i] for i in idx]
        names = [(_try(mod.amdsmi_get_gpu_asic_info, h) or {}).get("market_name") for h in self.handles]
        self.names = [f"{i}:{n or 'gpu'}" for i, n in zip(idx, names)]
        caps = [(_try(mod.amdsmi_get_power_cap_info, h) or {}).get("power_cap") for h in self.handles]
        self.limits_w = [_na(c) / 1e6 if _na(c) else None for c in caps]  # µW → W
        self.max_clocks_mhz = [_na((self._clock(h) or {}).get("max_clk")) for h in self.handles]
        self.energy = [CounterUnwrap(COUNTER_MODULUS_64) for _ in self.handles]  # accumulator counts

    def _clock(self, h):
        return _try(self.m.amdsmi_get_clock_info, h, self.m.AmdSmiClkType.GFX)

    def read(self, i: int) -> dict:
        m, h = self.m, self.handles[i]
        p = _try(m.amdsmi_get_power_info, h) or {}
        power = _na(p.get("current_socket_power"))
        power = power if power is not None else _na(p.get("average_socket_power"))  # W
        e = _try(m.amdsmi_get_energy_count, h) or {}
        acc = e.get("energy_accumulator", e.get("power"))
        acc = None if _na(acc) is None else int(acc)  # an int: a float loses counts near 2^64
        res = _na(e.get("counter_resolution"))
        counts = self.energy[i](acc) if acc is not None and res else None
        clk = self._clock(h) or {}
        temp = _try(m.amdsmi_get_temp_metric, h, m.AmdSmiTemperatureType.HOTSPOT, m.AmdSmiTemperatureMetric.CURRENT)
        return {
            "power_w": power,
            "energy_j": counts * res / 1e6 if counts is not None else None,  # counts since the first read × µJ → J
            "clock_mhz": _na(clk.get("clk", clk.get("cur_clk"))),
            "temp_c": _na(temp),
            "util_pct": _na((_try(m.amdsmi_get_gpu_activity, h) or {}).get("gfx_activity")),
        }

    def close(self) -> None:
        _try(self.m.amdsmi_shut_down)


class RaplReader:
    """CPU packages through Linux RAPL (``/sys/class/powercap/intel-rapl:N``; AMD CPUs use the same zone names)."""

    name = "rapl"

    def __init__(self, root: str | Path, devices: Sequence[int] | None):
        zones = sorted(p for p in Path(root).glob("intel-rapl:*") if p.name.count(":") == 1)
        if devices is not None:
            zones = [z for z in zones if int(z.name.split(":")[1]) in set(devices)]
        if not zones:
            raise LookupError(f"no RAPL package zone under {root}")
        self.zones = zones
        for z in zones:
            int((z / "energy_uj").read_text())  # PermissionError when not readable (root-only since Linux 5.10)
        self.names = [
            f"{z.name}:{(z / 'name').read_text().strip() if (z / 'name').exists() else 'package'}" for z in zones
        ]
        self.limits_w = [None] * len(zones)
        self.max_clocks_mhz = [None] * len(zones)
        self.energy = [CounterUnwrap(self._int(z / "max_energy_range_uj")) for z in zones]  # µJ
        self.last: list[tuple[float, int] | None] = [None] * len(zones)

    @staticmethod
    def _int(p: Path) -> int | None:
        try:
            return int(p.read_text())
        except (OSError, ValueError):
            return None

    def read(self, i: int) -> dict:
        import time

        uj, t = self._int(self.zones[i] / "energy_uj"), time.monotonic()
        if uj is None:
            return {}
        prev, total = self.last[i], self.energy[i](uj)
        rate = prev is not None and t > prev[0] and total >= prev[1]  # no rate across a reset
        power = (total - prev[1]) / 1e6 / (t - prev[0]) if rate else None
        self.last[i] = (t, total)
        return {"power_w": power, "energy_j": total / 1e6}  # µJ → J

    def close(self) -> None:
        pass


def gpu_devices(source: str, devices) -> list[int] | None:
    """The physical indices an NVML or amd-smi reader opens: ``devices`` as given, else the GPUs this process sees
    (:func:`kit.visibility.resolve_visible_devices` under CUDA rules for NVML, ROCm rules for amd-smi; None: every
    device).

    Raises:
        LookupError: a device named by UUID (its index is not looked up: power is then not read, never read from
            another GPU). UserError: conflicting visibility variables.
    """
    if devices is None:
        devices = resolve_visible_devices("cuda" if source == "nvml" else "rocm")
    if devices is not None and not all(isinstance(d, int) for d in devices):
        raise LookupError(f"devices {list(devices)} are named by UUID; the kit reads power by physical index only")
    return None if devices is None else list(devices)


def open_reader(source: str, devices, library: str | None, rapl_root: str):
    """``(reader, None)`` for the first source that works, else ``(None, why)`` naming every source tried.
    ``devices``: physical indices (NVML / amd-smi; None: the GPUs this process sees, :func:`gpu_devices`) or RAPL
    package numbers (None: every package)."""
    order = ("nvml", "amdsmi", "rapl") if source == "auto" else (source,)
    if source == "none":
        return None, "power sampling switched off"
    why = []
    for src in order:
        try:
            if src == "rapl":
                packages = devices if source == "rapl" else None  # a GPU index is not a CPU package
                return RaplReader(rapl_root, packages), None
            mod = importlib.import_module(library or ("pynvml" if src == "nvml" else "amdsmi"))
            return (NvmlReader if src == "nvml" else AmdSmiReader)(mod, gpu_devices(src, devices)), None
        except ImportError as e:
            why.append(f"{src}: {e.name or e} not installed")
        except (OSError, LookupError) as e:
            why.append(f"{src}: {e}")
        except Exception as e:  # the library's own error type (NVMLError, AmdSmiException): no driver, no device
            why.append(f"{src}: {type(e).__name__}: {e}")
    return None, "; ".join(why)
