"""A stand-in for ``pynvml`` (nvidia-ml-py) with NVML's units: power and limits in mW, energy in mJ, clocks in
MHz. Each device's readings live in :data:`DEVICES`; a value may be a callable of :data:`CLOCK`'s time (a
scripted trace); ``None`` makes that call raise ``NVMLError`` (not supported), as on a GPU without the counter."""

import time

NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
NVML_ERROR_NOT_SUPPORTED = 3

CLOCK = time.monotonic
DEVICES: list[dict] = []
CALLS: list[str] = []


class NVMLError(Exception):
    def __init__(self, value=NVML_ERROR_NOT_SUPPORTED):
        super().__init__(f"NVML error {value}: Not Supported")
        self.value = value


def reset(n: int = 1, **values) -> list[dict]:
    """``n`` devices with T1's readings (450 W, limit 1000 W), overridden by ``values``."""
    DEVICES.clear()
    CALLS.clear()
    for _ in range(n):
        d = dict(
            name="NVIDIA H100 80GB HBM3",
            power_mw=450000,
            energy_mj=None,
            limit_mw=1000000,
            clock=1980,
            max_clock=1980,
            temp=61,
            util=97,
        )
        d.update(values)
        DEVICES.append(d)
    return DEVICES


def _get(h, key):
    v = DEVICES[h][key]
    v = v(CLOCK()) if callable(v) else v
    if v is None:
        raise NVMLError()
    return v


class _Util:
    def __init__(self, gpu, memory=0):
        self.gpu, self.memory = gpu, memory


def nvmlInit():
    CALLS.append("init")


def nvmlShutdown():
    CALLS.append("shutdown")


def nvmlDeviceGetCount():
    return len(DEVICES)


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetName(h):
    return _get(h, "name")


def nvmlDeviceGetPowerUsage(h):
    return int(_get(h, "power_mw"))


def nvmlDeviceGetTotalEnergyConsumption(h):
    return int(_get(h, "energy_mj"))


def nvmlDeviceGetEnforcedPowerLimit(h):
    return int(_get(h, "limit_mw"))


def nvmlDeviceGetClockInfo(h, clock_type):
    assert clock_type == NVML_CLOCK_SM
    return _get(h, "clock")


def nvmlDeviceGetMaxClockInfo(h, clock_type):
    assert clock_type == NVML_CLOCK_SM
    return _get(h, "max_clock")


def nvmlDeviceGetTemperature(h, sensor):
    assert sensor == NVML_TEMPERATURE_GPU
    return _get(h, "temp")


def nvmlDeviceGetUtilizationRates(h):
    return _Util(_get(h, "util"))


reset()  # one device with the readings above until a test scripts its own
