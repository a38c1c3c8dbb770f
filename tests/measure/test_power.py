"""kit.measure.power: case T1's unit conversions through fake pynvml and amdsmi modules, an energy figure worked
out by hand for a scripted power trace (counter and integral), throttling, RAPL from a scripted sysfs tree, and
"not available" with its reason."""

from pathlib import Path

import pytest

from kit.errors import UserError
from kit.measure import power as P

FAKES = str(Path(__file__).parents[1] / "fake_backends")


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.syspath_prepend(FAKES)
    import fake_amdsmi
    import fake_pynvml

    fake_pynvml.reset()
    fake_amdsmi.reset()
    return fake_pynvml, fake_amdsmi


class ScriptedClock:
    """Time that advances only when the test says so."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _run_trace(ps, fake, clock, trace, key, scale):
    """Sample once per (t, value) step of ``trace``, with ``fake.DEVICES[0][key] = value * scale``."""
    ps.open()
    for t, v in trace:
        clock.t = t
        fake.DEVICES[0][key] = v * scale
        ps.sample()
    ps.close()


# the hand-computed trace: 400, 500, 600, 500, 400 W every 50 ms; trapezoid
# 0.05 x (450 + 550 + 550 + 450) = 100 J over 0.2 s -> 500 W average
TRACE = [(0.0, 400), (0.05, 500), (0.10, 600), (0.15, 500), (0.20, 400)]


def test_t1_nvml_units(fakes):
    """Case T1: NVML reports mW — 450000 → 450.0 W; limit 1000000 → 1000.0 W."""
    nv, _ = fakes
    ps = P.PowerSampler(source="nvml", library="fake_pynvml").open()
    assert ps.reader.limits_w == [1000.0]
    assert ps.reader.read(0)["power_w"] == 450.0
    assert ps.reader.max_clocks_mhz == [1980]
    assert ps.status == "ok: nvml (0:NVIDIA H100 80GB HBM3)"
    ps.close()
    assert nv.CALLS == ["init", "shutdown"]


def test_t1_amdsmi_units(fakes):
    """Case T1: amdsmi average_socket_power "N/A" → current_socket_power 717 → 717.0 W; cap 750000000 µW → 750 W."""
    _, amd = fakes
    ps = P.PowerSampler(source="amdsmi", library="fake_amdsmi").open()
    assert ps.reader.limits_w == [750.0]
    r = ps.reader.read(0)
    assert r["power_w"] == 717.0 and r["energy_j"] is None and r["clock_mhz"] == 2400 and r["util_pct"] == 99
    amd.DEVICES[0]["current_socket_power"] = "N/A"
    amd.DEVICES[0]["average_socket_power"] = 640
    assert ps.reader.read(0)["power_w"] == 640.0  # the other reading when one says N/A
    # energy = accumulator counts since the first reading x resolution (µJ): 6,553,600 x 15.2587890625 µJ = 100 J
    amd.DEVICES[0]["energy_accumulator"] = 1_000_000
    assert ps.reader.read(0)["energy_j"] == 0.0
    amd.DEVICES[0]["energy_accumulator"] = 7_553_600
    assert ps.reader.read(0)["energy_j"] == pytest.approx(100.0)


def test_energy_by_hand_integral_nvml(fakes):
    """No energy counter (NVML raises Not Supported): the trapezoid of the trace, 100 J, in watts x seconds."""
    nv, _ = fakes
    clock = ScriptedClock()
    ps = P.PowerSampler(source="nvml", library="fake_pynvml", clock=clock)
    _run_trace(ps, nv, clock, TRACE, "power_mw", 1000)  # W → the fake's mW
    c = ps.columns(output_tokens=1000, total_tokens=5000, tdp_w=700, usd_per_kwh=0.12)
    assert c["x_energy_method"] == "integral"
    assert c["energy_j"] == pytest.approx(100.0)
    assert c["avg_power_w"] == pytest.approx(500.0)
    assert c["peak_power_w"] == 600.0
    assert c["j_per_output_token"] == pytest.approx(0.1)
    assert c["j_per_token"] == pytest.approx(0.02)
    assert c["pct_tdp"] == pytest.approx(100 * 500 / 700)
    assert c["x_energy_usd"] == pytest.approx(100 / 3.6e6 * 0.12)
    assert c["x_energy_usd_per_mtok"] == pytest.approx(100 / 3.6e6 * 0.12 / 1000 * 1e6)
    assert c["x_power_samples"] == 5 and c["x_power_duration_s"] == pytest.approx(0.2)
    assert c["x_throttled"] is False and c["x_power_limit_w"] == 1000.0 and c["x_power_source"] == "nvml"


def test_energy_by_hand_counter_beats_integral(fakes):
    """With a counter, energy is its difference (mJ → J), not the integral: 1,000,000 → 1,080,000 mJ = 80 J."""
    nv, _ = fakes
    clock = ScriptedClock()
    counter = {0.0: 1_000_000, 0.05: 1_020_000, 0.10: 1_050_000, 0.15: 1_070_000, 0.20: 1_080_000}
    nv.DEVICES[0]["energy_mj"] = lambda t: counter[t]
    nv.CLOCK = clock
    try:
        ps = P.PowerSampler(source="nvml", library="fake_pynvml", clock=clock)
        _run_trace(ps, nv, clock, TRACE, "power_mw", 1000)
    finally:
        nv.CLOCK = __import__("time").monotonic
    c = ps.columns(output_tokens=800, total_tokens=1600)
    assert c["x_energy_method"] == "counter"
    assert c["energy_j"] == pytest.approx(80.0) and c["avg_power_w"] == pytest.approx(400.0)
    assert c["j_per_output_token"] == pytest.approx(0.1) and c["j_per_token"] == pytest.approx(0.05)
    assert c["pct_tdp"] is None and c["x_energy_usd"] is None  # no TDP, no price given


def test_energy_by_hand_amdsmi_counter_two_devices(fakes):
    """Two MI355X: each counter advances 6,553,600 counts x 15.2587890625 µJ = 100 J → 200 J; pct_tdp vs 2 x TDP."""
    _, amd = fakes
    amd.reset(2)
    clock = ScriptedClock()
    ps = P.PowerSampler(source="amdsmi", library="fake_amdsmi", clock=clock).open()
    for step, t in enumerate((0.0, 0.1, 0.2, 0.3, 0.4)):
        clock.t = t
        for d in amd.DEVICES:
            d["energy_accumulator"] = 1_000_000 + step * 1_638_400  # 4 steps x 1,638,400 = 6,553,600 counts
            d["current_socket_power"] = 500
        ps.sample()
    ps.close()
    c = ps.columns(output_tokens=2000, tdp_w=1400)
    assert c["x_energy_method"] == "counter" and c["energy_j"] == pytest.approx(200.0)
    assert c["avg_power_w"] == pytest.approx(500.0) and c["peak_power_w"] == 1000.0  # two devices at 500 W
    assert c["pct_tdp"] == pytest.approx(100 * 500 / (2 * 1400))
    assert c["x_power_devices"] == "0:AMD Instinct MI355X,1:AMD Instinct MI355X"
    assert c["x_power_limit_w"] == 1500.0


def test_background_thread_with_counter(fakes):
    """The real thread at 10 ms: 450 W constant and a counter at 450 J/s give 450 W and energy = 450 W x time."""
    nv, _ = fakes
    import time

    nv.DEVICES[0]["energy_mj"] = lambda t: 450_000 * t  # mJ: 450 W
    with P.PowerSampler(period_s=0.01, source="nvml", library="fake_pynvml") as ps:
        time.sleep(0.3)
    c = ps.columns(output_tokens=10)
    assert c["x_power_samples"] >= 5
    assert c["x_energy_method"] == "counter"
    assert c["avg_power_w"] == pytest.approx(450.0, rel=0.05)
    assert c["energy_j"] == pytest.approx(450.0 * c["x_power_duration_s"], rel=0.05)
    assert c["x_power_period_ms"] == 10.0


def test_throttling_clock_low_at_power_limit(fakes):
    """Clock below 85 % of max while power sits at the limit → throttled; low clock at low power is not."""
    nv, _ = fakes
    clock = ScriptedClock()
    ps = P.PowerSampler(source="nvml", library="fake_pynvml", clock=clock).open()
    for i, (mw, mhz) in enumerate([(990_000, 1400), (995_000, 1300), (1_000_000, 1500), (200_000, 800)]):
        clock.t = i * 0.05
        nv.DEVICES[0].update(power_mw=mw, clock=mhz)
        ps.sample()
    ps.close()
    c = ps.columns()
    assert c["x_throttle_fraction"] == pytest.approx(0.75) and c["x_throttled"] is True
    assert c["x_clock_mhz_min"] == 800


def test_not_available_says_why(fakes, tmp_path):
    """No library and no readable RAPL → every power number missing, the reason in x_energy_method."""
    ps = P.PowerSampler(source="auto", rapl_root=str(tmp_path))
    with ps:
        pass
    c = ps.columns(output_tokens=10, total_tokens=20, tdp_w=700)
    assert all(
        c[k] is None
        for k in ("avg_power_w", "peak_power_w", "energy_j", "j_per_output_token", "j_per_token", "pct_tdp")
    )
    assert c["x_energy_method"].startswith("not available: ") and "rapl: no RAPL package zone" in c["x_energy_method"]
    assert c["x_power_status"] == c["x_energy_method"]
    off = P.PowerSampler(source="none")
    with off:
        pass
    assert off.columns()["x_power_status"] == "not available: power sampling switched off"
    nvml_missing = P.PowerSampler(source="nvml", library="no_such_nvml_module").open()
    assert "no_such_nvml_module not installed" in nvml_missing.status


def test_no_device_is_not_available(fakes):
    nv, _ = fakes
    nv.reset(0)
    ps = P.PowerSampler(source="nvml", library="fake_pynvml").open()
    assert ps.status == "not available: nvml: NVML sees 0 device(s); asked for []"
    nv.reset(1)
    assert "asked for [3]" in P.PowerSampler([3], source="nvml", library="fake_pynvml").open().status


def test_rapl_from_a_scripted_sysfs_tree(tmp_path):
    """RAPL: µJ counters per package (subzones ignored); the counter wraps at max_energy_range_uj."""
    pkg = tmp_path / "intel-rapl:0"
    (pkg / "intel-rapl:0:0").mkdir(parents=True)
    (pkg / "name").write_text("package-0\n")
    (pkg / "max_energy_range_uj").write_text("262143328850\n")
    (pkg / "energy_uj").write_text("262143000000\n")
    clock = ScriptedClock()
    ps = P.PowerSampler(source="rapl", rapl_root=str(tmp_path), clock=clock).open()
    assert ps.reader.names == ["intel-rapl:0:package-0"]
    ps.sample()
    (pkg / "energy_uj").write_text("49671150\n")  # wrapped: 328,850 + 49,671,150 µJ = 50 J later
    clock.t = 1.0
    ps.sample()
    ps.close()
    c = ps.columns(output_tokens=100)
    assert c["x_energy_method"] == "counter" and c["energy_j"] == pytest.approx(50.0)
    assert c["j_per_output_token"] == pytest.approx(0.5)


def test_rapl_unreadable_is_not_available(tmp_path, monkeypatch):
    """energy_uj is root-only since Linux 5.10: a PermissionError → not available, naming it."""
    pkg = tmp_path / "intel-rapl:0"
    pkg.mkdir()
    (pkg / "energy_uj").write_text("1\n")
    real = Path.read_text

    def deny(self, *a, **k):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", deny)
    ps = P.PowerSampler(source="rapl", rapl_root=str(tmp_path)).open()
    assert ps.status.startswith("not available: rapl: [Errno 13] Permission denied")
    assert P.unavailable_columns("x")["energy_j"] is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"period_s": 0}, "period 0 s"),
        ({"period_s": float("nan")}, "must be a number > 0"),
        ({"source": "nvidia-smi"}, "allowed: \\('auto'"),
        ({"library": "fake_pynvml"}, "give source='nvml' or 'amdsmi'"),
    ],
)
def test_bad_settings_are_user_errors(kwargs, match):
    with pytest.raises(UserError, match=match):
        P.PowerSampler(**kwargs)


# Counter wraps (issue 22): a 50 W device sampled every 0.1 s for 1.2 s used 60 J, however often its counter wraps.
# Each reader's counter starts 1 J below its top and wraps at MODULUS_J (several wraps), or at its real width.
WATTS, STEP_S, STEPS = 50.0, 0.1, 12


def _counter_run(kind, fakes, tmp_path, monkeypatch, modulus_j: float | None):
    """Sample ``kind``'s reader at 0, 0.1 ... 1.2 s while its raw counter reads (top - 1 J + 50 W x t) mod top, in
    the reader's own unit (integers, as the libraries return them; top: ``modulus_j`` or 2^64); return the row's
    columns."""
    nv, amd = fakes
    unit_j = {"nvml": 1e-3, "amdsmi": 15.2587890625e-6, "rapl": 1e-6}[kind]  # J per raw count
    modulus = round(modulus_j / unit_j) if modulus_j else None
    if modulus and kind != "rapl":
        monkeypatch.setattr("kit.measure.power_readers.COUNTER_MODULUS_64", modulus)
    top = modulus or 2**64
    raw = lambda t: (top - round(1.0 / unit_j) + round(t / STEP_S) * round(WATTS * STEP_S / unit_j)) % top
    clock = ScriptedClock()
    if kind == "rapl":
        zone = tmp_path / "intel-rapl:0"
        zone.mkdir()
        if modulus:
            (zone / "max_energy_range_uj").write_text(f"{modulus}\n")
        (zone / "energy_uj").write_text(f"{raw(0.0)}\n")
        ps = P.PowerSampler(source="rapl", rapl_root=str(tmp_path), clock=clock)
    else:
        fake = nv if kind == "nvml" else amd
        monkeypatch.setattr(fake, "CLOCK", clock)
        key = "energy_mj" if kind == "nvml" else "energy_accumulator"
        fake.DEVICES[0][key] = raw
        ps = P.PowerSampler(source=kind, library=f"fake_{'pynvml' if kind == 'nvml' else 'amdsmi'}", clock=clock)
    ps.open()
    for k in range(STEPS + 1):
        clock.t = k * STEP_S
        if kind == "rapl":
            (tmp_path / "intel-rapl:0" / "energy_uj").write_text(f"{raw(clock.t)}\n")
        ps.sample()
    ps.close()
    return ps.columns()


@pytest.mark.parametrize("kind", ["rapl", "nvml", "amdsmi"])
@pytest.mark.parametrize("modulus_j", [13.0, 25.0, None])  # 13 J: five wraps in 60 J; 25 J: three; None: real width
def test_energy_counter_wraps_are_counted_once(kind, modulus_j, fakes, tmp_path, monkeypatch):
    """Before the fix RAPL reported 840 J here (a wrap added at every read after the first one); every reader now
    gives 60 J from its counter, across one wrap at its real width (2^64 for NVML and amd-smi) or several."""
    if modulus_j is None and kind == "rapl":
        modulus_j = 262143.328850  # a common max_energy_range_uj (µJ → J)
    c = _counter_run(kind, fakes, tmp_path, monkeypatch, modulus_j)
    assert c["x_energy_method"] == "counter"
    assert c["energy_j"] == pytest.approx(WATTS * STEP_S * STEPS, abs=1e-3)
    assert c["avg_power_w"] == pytest.approx(WATTS, abs=1e-3)


@pytest.mark.parametrize("kind", ["rapl", "nvml", "amdsmi"])
def test_a_counter_reset_is_not_a_wrap(kind, fakes, tmp_path, monkeypatch, caplog):
    """A counter that drops far from its top (reset, glitch) or whose width is unknown: never a wrap of the
    counter's width (which would add up to 2^64 units); the integral of sampled power is used instead."""
    nv, amd = fakes
    clock = ScriptedClock()
    mid = {"nvml": 10**9, "amdsmi": 10**9, "rapl": 10**9}[kind]
    values = iter([mid, mid + 1000, 5, 1005, 2005])  # raw units; dropped to 5 at the third read
    if kind == "rapl":
        zone = tmp_path / "intel-rapl:0"
        zone.mkdir()  # no max_energy_range_uj: the width is unknown
        ps = P.PowerSampler(source="rapl", rapl_root=str(tmp_path), clock=clock)
        (zone / "energy_uj").write_text(f"{mid}\n")
    else:
        fake, key = (nv, "energy_mj") if kind == "nvml" else (amd, "energy_accumulator")
        fake.DEVICES[0][key] = mid
        ps = P.PowerSampler(source=kind, library=f"fake_{'pynvml' if kind == 'nvml' else 'amdsmi'}", clock=clock)
    ps.open()
    for k, v in enumerate(values):
        clock.t = k * 0.1
        if kind == "rapl":
            (tmp_path / "intel-rapl:0" / "energy_uj").write_text(f"{v}\n")
        else:
            fake.DEVICES[0][key] = v
        ps.sample()
    ps.close()
    c = ps.columns()
    assert c["x_energy_method"] != "counter" and "went backwards" in caplog.text
    if kind != "rapl":  # the fakes report power too: the integral of it
        assert c["x_energy_method"] == "integral" and c["energy_j"] == pytest.approx(c["avg_power_w"] * 0.4)


def test_power_is_read_from_the_physical_gpu_the_visibility_variables_select(fakes, monkeypatch):
    """Issue 22: under ROCR_VISIBLE_DEVICES=2,3 HIP_VISIBLE_DEVICES=1 the process's GPU is physical 3 (amd-smi
    numbers every GPU of the machine); it was read as GPU 1. A GPU named by UUID is not read at all."""
    from kit.visibility import physical_gpus

    nv, amd = fakes
    for fake, key in ((amd, "current_socket_power"), (nv, "power_mw")):
        for i, d in enumerate(fake.reset(4)):
            d[key] = 100 * (i + 1) * (1000 if fake is nv else 1)  # GPU i draws 100 x (i + 1) W
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    for devices in (None, physical_gpus("rocm", 1)):  # the sampler's default (served points) and a sweep's point
        ps = P.PowerSampler(devices, source="amdsmi", library="fake_amdsmi").open()
        assert ps.reader.names == ["3:AMD Instinct MI355X"] and ps.reader.read(0)["power_w"] == 400.0
        ps.close()
    monkeypatch.delenv("HIP_VISIBLE_DEVICES")
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    ps = P.PowerSampler(source="nvml", library="fake_pynvml").open()
    assert [n.split(":")[0] for n in ps.reader.names] == ["2", "0"] and ps.reader.read(0)["power_w"] == 300.0
    ps.close()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8a1b2c3d")
    ps = P.PowerSampler(source="nvml", library="fake_pynvml").open()
    assert (
        ps.status == "not available: nvml: devices ['GPU-8a1b2c3d'] are named by UUID; the kit reads power by "
        "physical index only"
    )
