"""The settings of a qualification: what to run (:class:`QualifyConfig`), the thresholds every verdict is decided by
(:class:`Thresholds`, each with its source), the time budget (:func:`parse_budget`) and the choices made for this
device (:func:`plan`: a tiny preset and small grids on a CPU, a real preset in bfloat16 on a GPU; every choice is
a line of :attr:`Plan.choices`, printed and kept in the report).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from kit.errors import UserError

#: the items, in the order they run, and the weight of each in the budget (a share of what is left when it starts)
ITEMS: dict[str, float] = {
    "doctor": 0.08,
    "ops": 0.16,
    "seed": 0.22,
    "served": 0.14,
    "kv": 0.12,
    "comm": 0.08,
    "power": 0.01,
    "calibrate": 0.15,
    "planner": 0.04,
}
#: what each item checks (the report's first column)
ITEM_TITLES = {
    "doctor": "environment: versions, devices, kernel symbols, fp8, dtypes, torch.compile",
    "ops": "sampling ops eager and compiled vs the reference, per dtype",
    "seed": "seed workload in-process (ISL/OSL at each concurrency)",
    "served": "seed workload against a served endpoint",
    "kv": "KV-cache stress: the largest context that decodes",
    "comm": "collectives across local devices (and nodes)",
    "power": "power and energy per token",
    "calibrate": "calibration: bandwidth, matmul TFLOPS, step overhead",
    "planner": "planner prediction vs measured decode",
}
LAUNCHERS = ("vllm", "sglang")
#: the longest budget accepted (7 days, s): past it a typo ("5000h") would hold a node for months
MAX_BUDGET_S = 7 * 86_400.0
#: the longest torch.compile check of the doctor item (s): a compile that takes an hour is broken, not slow
MAX_COMPILE_TIMEOUT_S = 3600.0
_BUDGET_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")


def parse_budget(text) -> float:
    """A time budget typed by a user → seconds: ``"90s"``, ``"5m"``, ``"1.5h"``, ``"1h30m"`` (h, m, s parts, each
    a number with its unit, largest unit first).

    Raises:
        UserError: no unit, an unknown unit, a repeated or misordered part, zero, or more than 7 days; the message
            names the value and the allowed form.
    """
    t = str(text).strip().lower().replace(" ", "")
    form = "give a duration like 90s, 5m, 1.5h or 1h30m"
    parts = _BUDGET_PART.findall(t)
    if not t or "".join(n + u for n, u in parts) != t:
        raise UserError(f"budget {text!r} is not a duration: {form}")
    units = [u for _, u in parts]
    if units != sorted(set(units), key="hms".index):
        raise UserError(f"budget {text!r}: each of h, m, s at most once, largest first ({form})")
    seconds = sum(float(n) * {"h": 3600.0, "m": 60.0, "s": 1.0}[u] for n, u in parts)
    if not 0 < seconds <= MAX_BUDGET_S:
        raise UserError(f"budget {text!r} must be more than 0 s and at most 7 days ({form})")
    return seconds


#: the allowed range of a threshold that is a fraction of a reference figure
FRACTION = (0.0, 1.0)
#: the allowed range of a count of bad cells or points
COUNT = (0.0, 1e9)


def _threshold(default: float, source: str, allowed: tuple[float, float] = FRACTION):
    return field(default=default, metadata={"source": source, "range": allowed})


@dataclass(frozen=True)
class Thresholds:
    """Every number a verdict is decided by, with its source (``Thresholds.source(name)``). Override on the command
    line with ``--threshold NAME=VALUE`` or in Python with ``Thresholds(kv_shortfall=0.2)``."""

    ops_max_mismatches: float = _threshold(
        0, "an op's output outside torch.testing.assert_close's per-dtype atol/rtol on any element fails "
        "(kit.check.harness.DEFAULT_TOL)", COUNT
    )  # fmt: skip
    seed_max_bad_points: float = _threshold(
        0, "any point of the seed workload that is not ok (oom, error, flagged invalid) fails: the seed workload "
        "is the load the node is bought for", COUNT
    )  # fmt: skip
    served_max_bad_points: float = _threshold(
        0, "any served point with a failed request or a failed validity check fails (kit.validity.CHECKS)", COUNT
    )
    kv_shortfall: float = _threshold(
        0.10, "largest decoding context below the target by more than this fraction fails: the search resolves to "
        "5 % (StressConfig.resolution) and the memory guard keeps max(1 GB, 5 %) free (memguard.default_margin_gb)"
    )  # fmt: skip
    comm_min_busbw_fraction: float = _threshold(
        0.5, "all_reduce busbw below this fraction of the catalog's scale-up busbw fails; the catalog figures are "
        "nccl-tests results (kit/data/accelerators.csv link_source), which a healthy node reaches at 1 GiB"
    )  # fmt: skip
    calib_min_bw_fraction: float = _threshold(
        0.5, "measured copy bandwidth below this fraction of the catalog's memory bandwidth fails: STREAM-style "
        "copies reach 80-90 % of HBM peak on healthy GPUs, so half is a broken or throttled part"
    )  # fmt: skip
    calib_min_tflops_fraction: float = _threshold(
        0.3, "measured matmul TFLOPS (the run's dtype) below this fraction of the catalog's dense peak fails: "
        "cuBLAS/hipBLASLt reach 60-80 % of dense peak on large squares"
    )  # fmt: skip
    planner_fail_fraction: float = _threshold(
        0.5, "measured decode tok/s below this fraction of the planner's prediction fails (the prediction uses "
        "this device's own calibration, so half of it means the stack loses what the device can do)"
    )  # fmt: skip
    planner_warn_fraction: float = _threshold(
        0.8, "measured decode tok/s below this fraction of the prediction warns (the planner's own error on "
        "calibrated devices is within 20 % in the kit's tests of the roofline)"
    )  # fmt: skip
    planner_high_ratio: float = _threshold(
        1.25, "measured decode tok/s above this multiple of the prediction warns: faster than the device's own "
        "calibration allows means the calibration or the measurement is wrong (the mirror of "
        "planner_warn_fraction: 1 / 0.8)", (1.0, 100.0)
    )  # fmt: skip
    power_max_pct_tdp: float = _threshold(
        105.0,
        "average power above this percent of the catalog TDP warns (a sensor or a power cap set wrong)",
        (1.0, 1000.0),
    )
    cluster_outlier_fraction: float = _threshold(
        0.10, "a node whose headline figure is further than this fraction from the cluster's median is the outlier "
        "(two healthy nodes of one SKU differ by a few percent in the kit's repeated sweeps)"
    )  # fmt: skip
    overrun_warn: float = _threshold(
        1.5,
        "an item that took more than this multiple of its budget share warns (the budget was not held)",
        (1.0, 1000.0),
    )

    @classmethod
    def source(cls, name: str) -> str:
        """Where the default of threshold ``name`` comes from."""
        return {f.name: f.metadata["source"] for f in dataclasses.fields(cls)}[name]

    @classmethod
    def allowed(cls, name: str) -> tuple[float, float]:
        """``(lowest, highest)`` value threshold ``name`` accepts (a fraction: 0 to 1)."""
        return {f.name: f.metadata["range"] for f in dataclasses.fields(cls)}[name]

    def with_overrides(self, items) -> Thresholds:
        """A copy with ``NAME=VALUE`` overrides (strings, or a dict of name → number).

        Raises:
            UserError: an unknown name (lists the known ones), a value that is not a number in the threshold's
                range (:meth:`allowed`; fractions 0 to 1), or planner_fail_fraction above planner_warn_fraction.
        """
        pairs = items.items() if isinstance(items, dict) else (str(i).partition("=")[::2] for i in items)
        names = [f.name for f in dataclasses.fields(self)]
        new = {}
        for name, value in pairs:
            if name not in names:
                raise UserError(f"--threshold {name}={value}: unknown threshold; known: {', '.join(names)}")
            try:
                v = float(value)
            except (TypeError, ValueError):
                v = math.nan
            lo, hi = self.allowed(name)
            if not (math.isfinite(v) and lo <= v <= hi):
                what = "a fraction" if (lo, hi) == FRACTION else "a number"
                raise UserError(f"--threshold {name}={value!r}: give {what} from {lo:g} to {hi:g}")
            new[name] = v
        out = dataclasses.replace(self, **new)
        if out.planner_fail_fraction > out.planner_warn_fraction:
            raise UserError(
                f"--threshold planner_fail_fraction={out.planner_fail_fraction:g} is above planner_warn_fraction="
                f"{out.planner_warn_fraction:g}: the fail line must be at or below the warn line"
            )
        return out


@dataclass
class QualifyConfig:
    """What ``kit qualify`` runs (None: chosen for the device by :func:`plan`, and printed)."""

    out: str = "results/qualify"
    budget_s: float = 900.0
    model: str | None = None
    dtype: str | None = None
    device: str = "auto"
    isl: int | None = None
    osl: int | None = None
    concurrencies: tuple[int, ...] | None = None
    url: str | None = None
    served_model: str | None = None
    launch: str | None = None
    items: tuple[str, ...] = tuple(ITEMS)
    op_impls: tuple[str, ...] = ()
    compile_backend: str | None = None
    compile_ops: int | None = None
    kv_budget_gb: float | None = None
    threads: int | None = None
    compile_timeout_s: float | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    db: str | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    resume: bool = True

    def validate(self) -> QualifyConfig:
        """Check the values before any work.

        Raises:
            UserError: naming the value and what is allowed.
        """
        if not (isinstance(self.budget_s, (int, float)) and 0 < self.budget_s <= MAX_BUDGET_S):
            raise UserError(f"budget_s={self.budget_s!r} must be seconds > 0 and at most 7 days")
        bad = [i for i in self.items if i not in ITEMS]
        if bad or not self.items:
            raise UserError(f"items {list(self.items)!r}: give some of {', '.join(ITEMS)}")
        self.items = tuple(i for i in ITEMS if i in self.items)  # always in the qualification's order
        if self.url and self.launch:
            raise UserError("give --url (a running endpoint) or --launch (start one), not both")
        if self.url is not None:
            from kit.serve.limits import check_url

            check_url(self.url)
        if self.compile_timeout_s is not None and not (
            isinstance(self.compile_timeout_s, (int, float)) and 0 < self.compile_timeout_s <= MAX_COMPILE_TIMEOUT_S
        ):
            raise UserError(
                f"compile_timeout_s={self.compile_timeout_s!r} (--compile-timeout) must be seconds > 0 and at most "
                f"{MAX_COMPILE_TIMEOUT_S:g}"
            )
        if self.launch is not None and self.launch not in LAUNCHERS:
            raise UserError(f"launch={self.launch!r}; allowed: {', '.join(LAUNCHERS)}")
        if self.launch and not self.served_model:
            raise UserError(
                f"--launch {self.launch} needs --served-model: the checkpoint directory or model id to serve"
            )
        for name in ("isl", "osl", "compile_ops"):
            v = getattr(self, name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "compile_ops" else 1)
            ):
                raise UserError(f"{name}={v!r} must be an integer >= {0 if name == 'compile_ops' else 1}")
        if self.concurrencies is not None:
            self.concurrencies = tuple(self.concurrencies)
            if not self.concurrencies or any(not isinstance(c, int) or c < 1 for c in self.concurrencies):
                raise UserError(f"concurrencies={self.concurrencies!r} must be integers >= 1")
        if self.kv_budget_gb is not None and not (0 < self.kv_budget_gb < math.inf):
            raise UserError(f"kv_budget_gb={self.kv_budget_gb!r} must be a finite number of GB > 0")
        if not (isinstance(self.nnodes, int) and self.nnodes >= 1 and 0 <= self.node_rank < self.nnodes):
            raise UserError(f"nnodes={self.nnodes!r}, node_rank={self.node_rank!r}: need 0 <= node_rank < nnodes")
        for item in self.op_impls:
            op, sep, target = str(item).partition("=")
            if not sep or ":" not in target:
                raise UserError(f"--op-impl {item!r}: use OP=MODULE:FUNCTION (e.g. top_p_renorm_prob=mylib:top_p)")
        return self


#: the seed workload (the project's own checklist): 1,024 prefill + 400 decode tokens at concurrency 1, 24 and 64
SEED_ISL, SEED_OSL, SEED_CONCURRENCIES = 1024, 400, (1, 24, 64)
#: on a CPU: the same shape scaled down so a qualification takes minutes (tiny-llama, float32)
CPU_ISL, CPU_OSL, CPU_CONCURRENCIES = 128, 16, (1, 4, 8)
GPU_MODEL, CPU_MODEL = "llama-3.1-8b", "tiny-llama"


@dataclass
class Plan:
    """The choices of one qualification on this device (every one also a line of :attr:`choices`)."""

    platform: str
    device: str
    device_name: str
    n_devices: int
    catalog_name: str | None
    model: str
    dtype: str
    isl: int
    osl: int
    concurrencies: tuple[int, ...]
    repeats: int
    compile_backend: str
    compile_dtypes: tuple[str, ...]
    op_dtypes: tuple[str, ...]
    served_requests: int
    kv_start: int
    kv_cap: int
    choices: list = field(default_factory=list)


def plan(config: QualifyConfig, info=None) -> Plan:
    """The choices for this device (``info``: :func:`kit.hardware.detect`'s result, default detected): on a CPU a
    tiny preset in float32, a scaled seed workload and compiled op checks through ``aot_eager``; on a GPU the real
    seed workload in bfloat16 with ``inductor``. A value set in ``config`` wins; each choice says why."""
    from kit import hardware

    info = info or hardware.detect(config.device)
    cpu = info.platform == "cpu"
    why = "CPU: a tiny preset and small grids" if cpu else f"{info.platform} GPU: the seed workload itself"
    isl, osl, concs = (CPU_ISL, CPU_OSL, CPU_CONCURRENCIES) if cpu else (SEED_ISL, SEED_OSL, SEED_CONCURRENCIES)
    p = Plan(
        platform=info.platform, device=info.device, device_name=info.name, n_devices=info.count,
        catalog_name=info.catalog_name, model=config.model or (CPU_MODEL if cpu else GPU_MODEL),
        dtype=config.dtype or ("float32" if cpu else "bfloat16"), isl=config.isl or isl, osl=config.osl or osl,
        concurrencies=tuple(config.concurrencies or concs), repeats=1 if cpu else 2,
        compile_backend=config.compile_backend or ("aot_eager" if cpu else "inductor"),
        compile_dtypes=("float32",) if cpu else ("float32", "float16", "bfloat16"),
        op_dtypes=("float32", "float16", "bfloat16"), served_requests=8 if cpu else 128,
        kv_start=1024 if cpu else 4096, kv_cap=8192 if cpu else 4_194_304,
    )  # fmt: skip
    p.choices = [
        f"device: {info.name} ({info.platform}, {info.count} device(s)); {why}",
        f"model: {p.model} in {p.dtype}" + ("" if config.model else " (default for this device; --model to change)"),
        f"seed workload: ISL {p.isl} / OSL {p.osl} at concurrency {', '.join(map(str, p.concurrencies))}"
        + (f" (the seed workload is {SEED_ISL}/{SEED_OSL} at 1/24/64; scaled for a CPU)" if cpu else ""),
        f"op checks: eager in {', '.join(p.op_dtypes)}; compiled ({p.compile_backend}) in "
        f"{', '.join(p.compile_dtypes)}"
        + ("; aot_eager on a CPU: inductor's C++ code generation costs ~20 s per graph on a small CPU" if cpu else ""),
        f"served: {p.served_requests} measured requests per concurrency"
        + (f" against {config.url}" if config.url else f", server launched with {config.launch}" if config.launch
           else " (no --url or --launch: the served item is skipped)"),
        f"KV stress: batch 1 from {p.kv_start:,} tokens, up to min(the planner's capacity, {p.kv_cap:,})",
    ]  # fmt: skip
    return p
