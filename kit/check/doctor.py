"""``kit doctor``: is this machine ready? One report of torch/CUDA/HIP versions, devices and gfx arch, which dtypes
actually work (tiny ops, matmul speed sanity), fp8 e4m3fn / e4m3fnuz casts, whether ``torch.compile`` works, and
which kernel libraries are importable with which of the expected sampling ops — missing ones called out.

Everything is *run*, not inferred from version numbers (the probes are in :mod:`kit.check.probes`): a dtype
"works" when a tiny matmul in it runs on the device; fp8 works when a clamp-then-cast round trip is exact on
representable values; ``torch.compile`` works when a compiled function matches eager in a separate process (a
compiler crash or hang cannot take the doctor down; it is stopped after ``compile_timeout_s``). The compile check
runs while the fp8 and library probes do, after the matmul timing (so the two do not compete for the CPU).

``--json`` prints the report as JSON matching :data:`SCHEMA` (``kit doctor --schema`` prints the schema). With
``--strict`` the exit code is 1 when :attr:`problems` is non-empty, so CI can gate on it. Problems (fail
``--strict``): a dtype that does not run; the device's native fp8 format failing to cast; ``torch.compile``
failing (not: timing out); an importable kernel library lacking an expected op (the message names the symbol);
a ``--require``\\ d library that is not importable. Everything else is a warning.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
import time
from dataclasses import dataclass

import torch

from kit.check import probes
from kit.check.fp8 import FP8_FORMAT_INFO
from kit.check.probes import NOISY_SPREAD
from kit.check.resolver import KERNEL_LIBRARIES, KernelLibrary, probe_library
from kit.cli import DefaultsHelpFormatter, add_config_args, config_field, config_from_args
from kit.errors import UserError
from kit.hardware import detect

REPORT_SCHEMA_VERSION = 1

_NULLSTR = {"type": ["string", "null"]}
_NULLNUM = {"type": ["number", "null"]}
#: JSON Schema (draft 2020-12) of ``kit doctor --json``
SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "kit doctor report",
    "type": "object",
    "required": [
        "schema_version",
        "ok",
        "problems",
        "warnings",
        "elapsed_s",
        "platform",
        "torch",
        "device",
        "devices",
        "dtypes",
        "fp8",
        "compile",
        "libraries",
        "packages",
    ],
    "properties": {
        "schema_version": {"const": REPORT_SCHEMA_VERSION},
        "ok": {"type": "boolean", "description": "true when problems is empty"},
        "problems": {"type": "array", "items": {"type": "string"}, "description": "what fails --strict"},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "elapsed_s": {"type": "number", "minimum": 0, "description": "wall time of the doctor run, seconds"},
        "platform": {
            "type": "object",
            "required": ["python", "os", "machine"],
            "properties": {"python": {"type": "string"}, "os": {"type": "string"}, "machine": {"type": "string"}},
        },
        "torch": {
            "type": "object",
            "required": ["version", "cuda", "hip"],
            "properties": {"version": {"type": "string"}, "cuda": _NULLSTR, "hip": _NULLSTR},
        },
        "device": {
            "type": "object",
            "required": ["platform", "device", "name", "count", "memory_gb", "gfx_arch", "identity", "visibility"],
            "properties": {
                "platform": {"enum": ["cpu", "cuda", "rocm"]},
                "device": {"type": "string"},
                "name": {"type": "string"},
                "count": {"type": "integer", "minimum": 1},
                "memory_gb": {"type": "number"},
                "gfx_arch": _NULLSTR,
                "catalog_name": _NULLSTR,
                "identity": {"type": "string", "description": "how the part was named, or why it could not be"},
                "visibility": {"type": "string", "description": "which devices this process may see, and why"},
            },
        },
        "devices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "name", "memory_gb", "capability", "gfx_arch"],
                "properties": {
                    "index": {"type": "integer"},
                    "name": {"type": "string"},
                    "memory_gb": {"type": "number"},
                    "capability": _NULLSTR,
                    "gfx_arch": _NULLSTR,
                },
            },
        },
        "dtypes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["dtype", "works", "error", "matmul_n", "matmul_ms_p50", "tflops", "n", "vs_float32"],
                "properties": {
                    "dtype": {"enum": ["float32", "float16", "bfloat16"]},
                    "works": {"type": "boolean"},
                    "error": _NULLSTR,
                    "matmul_n": {"type": "integer"},
                    "matmul_ms_p50": _NULLNUM,
                    "tflops": _NULLNUM,
                    "n": {"type": "integer", "minimum": 0},
                    "vs_float32": {**_NULLNUM, "description": "throughput relative to float32"},
                    "spread": {
                        **_NULLNUM,
                        "description": "slowest / fastest of the timed repeats "
                        "(noisy above kit.check.probes.NOISY_SPREAD)",
                    },
                },
            },
        },
        "fp8": {
            "type": "object",
            "required": ["native_format", "formats"],
            "properties": {
                "native_format": {"enum": list(FP8_FORMAT_INFO)},
                "formats": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["format", "available", "max", "cast_ok", "raw_overflow", "error"],
                        "properties": {
                            "format": {"enum": list(FP8_FORMAT_INFO)},
                            "available": {"type": "boolean"},
                            "max": _NULLNUM,
                            "cast_ok": {"type": "boolean"},
                            "raw_overflow": {
                                **_NULLSTR,
                                "description": "what casting 2×max without clamping gives: saturates | nan | inf",
                            },
                            "error": _NULLSTR,
                        },
                    },
                },
            },
        },
        "compile": {
            "type": "object",
            "required": ["checked", "ok", "backend", "seconds", "timed_out", "error"],
            "properties": {
                "checked": {"type": "boolean"},
                "ok": {"type": ["boolean", "null"]},
                "backend": {"type": "string", "description": "torch.compile backend"},
                "seconds": _NULLNUM,
                "timed_out": {"type": "boolean"},
                "error": _NULLSTR,
            },
        },
        "libraries": {
            "type": "array",
            "description": "kernel libraries (kit.check.resolver.KERNEL_LIBRARIES)",
            "items": {
                "type": "object",
                "required": ["name", "module", "importable", "version", "error", "ops", "missing"],
                "properties": {
                    "name": {"type": "string"},
                    "module": {"type": "string"},
                    "importable": {"type": "boolean"},
                    "version": _NULLSTR,
                    "error": _NULLSTR,
                    "ops": {"type": "object", "additionalProperties": _NULLSTR},
                    "missing": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        "packages": {"type": "object", "additionalProperties": _NULLSTR},
    },
}


@dataclass(frozen=True)
class DoctorConfig:
    """What ``kit doctor`` checks (the CLI options derive from these fields)."""

    device: str = config_field("auto", help="auto | cpu | cuda | rocm (see kit.hardware.detect)")
    libraries: tuple[str, ...] = config_field(
        (), cli=False, help="NAME=MODULE: look kernel library NAME's ops up in MODULE (a fork or a test double)"
    )
    require: tuple[str, ...] = config_field(
        (), cli=False, help="kernel libraries that must be importable (e.g. flashinfer on a CUDA node)"
    )
    compile_check: bool = config_field(
        True, flag="--compile", help="run the torch.compile check (a subprocess, beside the other probes)"
    )
    compile_backend: str = config_field("inductor", help="torch.compile backend of the compile check")
    compile_timeout_s: float = config_field(
        25.0, flag="--compile-timeout", help="seconds the torch.compile check may take (then a warning)"
    )
    timing: bool = config_field(True, help="time the matmul speed sanity check (off: only 'does it run')")

    def __post_init__(self):
        if not 0 < self.compile_timeout_s < float("inf"):  # (NaN fails too)
            raise UserError(f"compile_timeout_s={self.compile_timeout_s!r} must be a finite number of seconds > 0")
        object.__setattr__(self, "libraries", tuple(self.libraries))
        object.__setattr__(self, "require", tuple(self.require))


def _libraries_from(overrides) -> tuple[KernelLibrary, ...]:
    """Default kernel libraries, with ``NAME=MODULE`` overrides pointing a known library's symbol table at another
    module."""
    libraries = {b.name: b for b in KERNEL_LIBRARIES}
    for item in overrides:
        name, sep, module = item.partition("=")
        if not sep or not module or name not in libraries:
            raise UserError(f"--library {item!r}: use NAME=MODULE with NAME one of {sorted(libraries)}")
        libraries[name] = dataclasses.replace(libraries[name], module=module)
    return tuple(libraries.values())


def run_doctor(config: DoctorConfig | None = None, **overrides) -> dict:
    """Probe this machine and return the report (a dict matching :data:`SCHEMA`).

    Args:
        config: what to check (default :class:`DoctorConfig`).
        overrides: :class:`DoctorConfig` fields replacing ``config``'s, e.g. ``run_doctor(device="cpu",
            compile_check=False)``, ``libraries=["sgl_kernel=my_fork_module"]``, ``require=["flashinfer"]``.

    Raises:
        UserError: bad device, bad ``NAME=MODULE`` override, unknown required library, compile timeout ≤ 0.
        TypeError: an override that is not a :class:`DoctorConfig` field.
    """
    cfg = dataclasses.replace(config or DoctorConfig(), **overrides)
    t0 = time.perf_counter()
    info = detect(cfg.device)
    libraries = _libraries_from(cfg.libraries)
    known = {b.name for b in libraries}
    for r in cfg.require:
        if r not in known:
            raise UserError(f"--require {r!r}: unknown library; known: {sorted(known)}")
    problems, warnings = [], []
    dtypes = probes.probe_dtypes(info.device, cfg.timing)  # timed before the compile check competes for the CPU
    proc = probes.start_compile_check(info.device, cfg.compile_backend) if cfg.compile_check else None
    deadline = time.perf_counter() + cfg.compile_timeout_s
    for d in dtypes:
        if not d["works"]:
            problems.append(f"dtype {d['dtype']} does not run on {info.name}: {d['error']}")
        elif info.platform != "cpu" and d["dtype"] != "float32" and d["vs_float32"] is not None and d["vs_float32"] < 1:
            warnings.append(
                f"{d['dtype']} matmul is slower than float32 on {info.name} ({d['vs_float32']}×): "
                "an emulated or untuned path?"
            )
    warnings.extend(probes.timing_caveats(dtypes, info.platform, info.name))
    fp8 = probes.probe_fp8(info.device, info.platform, info.gfx_arch)
    for f in fp8["formats"]:
        if f["format"] == fp8["native_format"] and not f["cast_ok"]:
            problems.append(f"native fp8 format {f['format']} does not cast on {info.name}: {f['error']}")
        if f["raw_overflow"] == "nan":
            warnings.append(
                f"casting an out-of-range value to float8_{f['format']} gives NaN here: clamp to ±"
                f"{f['max']:g} first (kit.check.fp8.to_fp8)"
            )
    found = [probe_library(b) for b in libraries]
    for p in found:
        problems.extend(p["problems"])
        if not p["importable"] and p["name"] in cfg.require:
            problems.append(f"required library {p['name']} ({p['module']}) is not importable: {p['error']}")
    if proc is not None:
        comp = probes.finish_compile_check(proc, cfg.compile_backend, deadline, cfg.compile_timeout_s)
        if comp["timed_out"]:
            warnings.append(f"torch.compile check {comp['error']}")
        elif not comp["ok"]:
            problems.append(f"torch.compile ({cfg.compile_backend}) does not work on {info.device}: {comp['error']}")
    else:
        comp = probes.compile_not_checked(cfg.compile_backend)
    for p in found:  # keep the schema's fields only (problems are in the top-level list)
        p.pop("problems", None)
    keys = ("platform", "device", "name", "count", "gfx_arch", "catalog_name", "identity", "visibility")
    dev = {k: info.as_dict()[k] for k in keys}
    dev["memory_gb"] = round(info.memory_gb, 2)
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "ok": not problems,
        "problems": problems,
        "warnings": warnings,
        "elapsed_s": round(time.perf_counter() - t0, 2),
        "platform": {"python": platform.python_version(), "os": platform.platform(), "machine": platform.machine()},
        "torch": {
            "version": torch.__version__,
            "cuda": getattr(torch.version, "cuda", None),
            "hip": getattr(torch.version, "hip", None),
        },
        "device": dev,
        "devices": probes.gpu_list(),
        "dtypes": dtypes,
        "fp8": fp8,
        "compile": comp,
        "libraries": found,
        "packages": probes.installed_versions(),
    }


def format_report(r: dict) -> str:
    """The report as readable text (what ``kit doctor`` prints without ``--json``)."""
    t, d = r["torch"], r["device"]
    lines = [
        f"kit doctor — torch {t['version']} (CUDA {t['cuda'] or '-'}, HIP {t['hip'] or '-'}), "
        f"python {r['platform']['python']}, {r['elapsed_s']:.1f} s",
        f"device         {d['platform']}: {d['name']} ×{d['count']}, {d['memory_gb']:.1f} GB"
        + (f", {d['gfx_arch']}" if d["gfx_arch"] else ""),
        f"identity       {d['identity']}",
        f"visibility     {d['visibility']}",
    ]
    for g in r["devices"]:
        lines.append(
            f"  [{g['index']}] {g['name']}  {g['memory_gb']} GB  capability {g['capability']}"
            + (f"  {g['gfx_arch']}" if g["gfx_arch"] else "")
        )
    for i, x in enumerate(r["dtypes"]):
        head = "dtypes         " if i == 0 else "               "
        if not x["works"]:
            lines.append(f"{head}{x['dtype']:9s} FAILS: {x['error']}")
            continue
        speed = (
            f"{x['matmul_n']}² matmul {x['matmul_ms_p50']:.3g} ms p50 (n={x['n']}), {x['tflops'] * 1e3:.3g} "
            f"GFLOP/s"
            + (f", {x['vs_float32']}× float32" if x["dtype"] != "float32" else "")
            + (f" (noisy: repeats vary {x['spread']:.3g}×)" if (x.get("spread") or 0) > NOISY_SPREAD else "")
            if x["matmul_ms_p50"] is not None
            else "runs"
        )
        lines.append(f"{head}{x['dtype']:9s} ok   {speed}")
    f8 = r["fp8"]
    parts = []
    for f in f8["formats"]:
        state = "ok" if f["cast_ok"] else ("absent" if not f["available"] else "FAILS")
        extra = f", unclamped overflow → {f['raw_overflow']}" if f["raw_overflow"] else ""
        parts.append(f"{f['format']} {state} (max {f['max']:g}{extra})" if f["max"] else f"{f['format']} {state}")
    lines.append(f"fp8            native {f8['native_format']}; " + "; ".join(parts))
    c = r["compile"]
    if not c["checked"]:
        lines.append("torch.compile  not checked")
    else:
        state = "ok" if c["ok"] else ("TIMED OUT" if c["timed_out"] else "FAILS")
        lines.append(
            f"torch.compile  {state} ({c['backend']}"
            + (f", {c['seconds']} s" if c["seconds"] else "")
            + ")"
            + (f": {c['error']}" if c["error"] and not c["ok"] else "")
        )
    for i, b in enumerate(r["libraries"]):
        head = "kernel libs    " if i == 0 else "               "
        if not b["importable"]:
            lines.append(f"{head}{b['name']:11s} -  {b['error']}")
            continue
        have = [op for op, where in b["ops"].items() if where]
        lines.append(
            f"{head}{b['name']:11s} {b['version'] or '?'} ({b['module']}): has {', '.join(have) or 'none'}"
            + (f"; MISSING {', '.join(b['missing'])}" if b["missing"] else "")
        )
    pk = ", ".join(f"{k} {v}" for k, v in r["packages"].items() if v)
    lines.append(f"packages       {pk or '-'}")
    for w in r["warnings"]:
        lines.append(f"warning: {w}")
    for p in r["problems"]:
        lines.append(f"PROBLEM: {p}")
    lines.append("verdict: ready" if r["ok"] else f"verdict: NOT READY ({len(r['problems'])} problem(s))")
    return "\n".join(lines)


def add_cli(sub) -> None:
    """``kit doctor``: environment report; ``--strict`` exits 1 when something expected is missing."""
    p = sub.add_parser("doctor", description=__doc__.split("\n\n")[0], formatter_class=DefaultsHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema: kit doctor --schema)")
    p.add_argument("--schema", action="store_true", help="print the JSON Schema of --json and exit")
    p.add_argument("--strict", action="store_true", help="exit 1 when there is any problem (for CI gates)")
    add_config_args(p, DoctorConfig)
    fields = {f.name: f for f in dataclasses.fields(DoctorConfig)}
    p.add_argument(
        "--library",
        dest="libraries",
        action="append",
        default=[],
        metavar="NAME=MODULE",
        help=fields["libraries"].metadata["help"] + "; repeatable (none by default)",
    )
    p.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="NAME",
        help=fields["require"].metadata["help"] + "; repeatable (none by default)",
    )
    p.add_argument("--quick", action="store_true", help="skip timing and the torch.compile check")
    p.add_argument("--out", default=None, help="also write the JSON report to this file")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    if args.schema:
        print(json.dumps(SCHEMA, indent=2))
        return 0
    quick = {"compile_check": False, "timing": False} if args.quick else {}
    config = config_from_args(DoctorConfig, args, **quick)
    if config.compile_check:
        probes.check_compile_backend(config.compile_backend)
    if args.out:
        from kit._io import check_out_file

        check_out_file(args.out, example="doctor.json")  # before the probes run, not after
    report = run_doctor(config)
    if args.out:
        from kit._io import atomic_write_text

        atomic_write_text(args.out, json.dumps(report, indent=2), example="doctor.json")
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    if args.strict and report["problems"]:
        print(f"kit doctor --strict: {len(report['problems'])} problem(s):", file=sys.stderr)
        for p in report["problems"]:
            print(f"  - {p}", file=sys.stderr)
        return 1
    return 0
