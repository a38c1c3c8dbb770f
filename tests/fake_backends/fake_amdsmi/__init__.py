"""A stand-in for ROCm's ``amdsmi`` Python API with its units and quirks (case T1): socket power in W where
``average_socket_power`` may be ``"N/A"``, the power cap in µW, energy as an accumulator count × a counter
resolution in µJ, clocks in MHz. Readings live in :data:`DEVICES`; a value may be a callable of :data:`CLOCK`'s
time (a scripted trace)."""

import enum
import time

CLOCK = time.monotonic
DEVICES: list[dict] = []


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    pass


class AmdSmiClkType(enum.IntEnum):
    SYS = 0
    GFX = 0
    MEM = 4


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0


def reset(n: int = 1, **values) -> list[dict]:
    """``n`` devices with T1's readings (current 717 W, average "N/A", cap 750,000,000 µW)."""
    DEVICES.clear()
    for _ in range(n):
        d = dict(
            market_name="AMD Instinct MI355X",
            current_socket_power=717,
            average_socket_power="N/A",
            power_cap=750_000_000,
            energy_accumulator=None,
            counter_resolution=15.2587890625,
            clk=2400,
            max_clk=2400,
            hotspot=71,
            gfx_activity=99,
        )
        d.update(values)
        DEVICES.append(d)
    return DEVICES


def _get(h, key):
    v = DEVICES[h][key]
    return v(CLOCK()) if callable(v) else v


def amdsmi_init(*flags):
    pass


def amdsmi_shut_down():
    pass


def amdsmi_get_processor_handles():
    return list(range(len(DEVICES)))


def amdsmi_get_gpu_asic_info(h):
    return {"market_name": _get(h, "market_name")}


def amdsmi_get_power_info(h):
    return {
        "current_socket_power": _get(h, "current_socket_power"),
        "average_socket_power": _get(h, "average_socket_power"),
        "gfx_voltage": "N/A",
    }


def amdsmi_get_power_cap_info(h):
    return {"power_cap": _get(h, "power_cap"), "dpm_cap": 0, "default_power_cap": _get(h, "power_cap")}


def amdsmi_get_energy_count(h):
    acc = _get(h, "energy_accumulator")
    if acc is None:
        raise AmdSmiLibraryException("AMDSMI_STATUS_NOT_SUPPORTED")
    return {"energy_accumulator": acc, "counter_resolution": _get(h, "counter_resolution"), "timestamp": 0}


def amdsmi_get_clock_info(h, clk_type):
    assert clk_type == AmdSmiClkType.GFX
    return {"clk": _get(h, "clk"), "min_clk": 500, "max_clk": _get(h, "max_clk"), "clk_locked": False}


def amdsmi_get_temp_metric(h, sensor, metric):
    assert sensor == AmdSmiTemperatureType.HOTSPOT and metric == AmdSmiTemperatureMetric.CURRENT
    return _get(h, "hotspot")


def amdsmi_get_gpu_activity(h):
    return {"gfx_activity": _get(h, "gfx_activity"), "umc_activity": 0, "mm_activity": "N/A"}


reset()  # one device with the readings above until a test scripts its own
