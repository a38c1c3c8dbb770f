"""``kit doctor``: is this machine ready? One report of torch/CUDA/HIP versions, devices and gfx arch, which dtypes
actually work (tiny ops, matmul speed sanity), fp8 e4m3fn / e4m3fnuz casts, whether ``torch.compile`` works, and
which kernel libraries are importable with which of the expected sampling ops — missing ones called out.

Everything is *run*, not inferred from version numbers: a dtype "works" when a tiny matmul in it runs on the device;
fp8 works when a clamp-then-cast round trip is exact on representable values; ``torch.compile`` works when a
compiled function matches eager in a separate process (a compiler crash or hang cannot take the doctor down; it is
stopped after ``compile_timeout_s``). The compile check runs while the fp8 and library probes do, after the matmul
timing (so the two do not compete for the CPU).

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
import subprocess
import sys
import time

import torch

from kit import dtypes
from kit.errors import UserError
from kit.check import harness as C
from kit.measure.timing import timed_repeats
from kit.hardware import check_dtype_supported, detect

SCHEMA_VERSION = 1
#: Python packages whose version is reported (installed or not)
PACKAGES = ("vllm", "sglang", "flashinfer", "sgl_kernel", "aiter", "triton", "transformers")

_NULLSTR = {"type": ["string", "null"]}
_NULLNUM = {"type": ["number", "null"]}
#: JSON Schema (draft 2020-12) of ``kit doctor --json``
SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "kit doctor report",
    "type": "object",
    "required": ["schema_version", "ok", "problems", "warnings", "elapsed_s", "platform", "torch", "device",
                 "devices", "dtypes", "fp8", "compile", "backends", "packages"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "ok": {"type": "boolean", "description": "true when problems is empty"},
        "problems": {"type": "array", "items": {"type": "string"}, "description": "what fails --strict"},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "elapsed_s": {"type": "number", "minimum": 0, "description": "wall time of the doctor run, seconds"},
        "platform": {"type": "object", "required": ["python", "os", "machine"],
                     "properties": {"python": {"type": "string"}, "os": {"type": "string"},
                                    "machine": {"type": "string"}}},
        "torch": {"type": "object", "required": ["version", "cuda", "hip"],
                  "properties": {"version": {"type": "string"}, "cuda": _NULLSTR, "hip": _NULLSTR}},
        "device": {"type": "object", "required": ["platform", "device", "name", "count", "memory_gb", "gfx_arch"],
                   "properties": {"platform": {"enum": ["cpu", "cuda", "rocm"]}, "device": {"type": "string"},
                                  "name": {"type": "string"}, "count": {"type": "integer", "minimum": 1},
                                  "memory_gb": {"type": "number"}, "gfx_arch": _NULLSTR}},
        "devices": {"type": "array", "items": {
            "type": "object", "required": ["index", "name", "memory_gb", "capability", "gfx_arch"],
            "properties": {"index": {"type": "integer"}, "name": {"type": "string"}, "memory_gb": {"type": "number"},
                           "capability": _NULLSTR, "gfx_arch": _NULLSTR}}},
        "dtypes": {"type": "array", "items": {
            "type": "object", "required": ["dtype", "works", "error", "matmul_n", "matmul_ms_p50", "tflops", "n",
                                           "vs_float32"],
            "properties": {"dtype": {"enum": ["float32", "float16", "bfloat16"]}, "works": {"type": "boolean"},
                           "error": _NULLSTR, "matmul_n": {"type": "integer"}, "matmul_ms_p50": _NULLNUM,
                           "tflops": _NULLNUM, "n": {"type": "integer", "minimum": 0},
                           "vs_float32": {**_NULLNUM, "description": "throughput relative to float32"},
                           "spread": {**_NULLNUM, "description": "slowest / fastest of the timed repeats "
                                                                 "(noisy above NOISY_SPREAD)"}}}},
        "fp8": {"type": "object", "required": ["native_format", "formats"], "properties": {
            "native_format": {"enum": list(C.FP8_FORMATS)},
            "formats": {"type": "array", "items": {
                "type": "object", "required": ["format", "available", "max", "cast_ok", "raw_overflow", "error"],
                "properties": {"format": {"enum": list(C.FP8_FORMATS)}, "available": {"type": "boolean"},
                               "max": _NULLNUM, "cast_ok": {"type": "boolean"},
                               "raw_overflow": {**_NULLSTR, "description": "what casting 2×max without clamping "
                                                                             "gives: saturates | nan | inf"},
                               "error": _NULLSTR}}}}},
        "compile": {"type": "object", "required": ["checked", "ok", "backend", "seconds", "timed_out", "error"],
                    "properties": {"checked": {"type": "boolean"}, "ok": {"type": ["boolean", "null"]},
                                   "backend": {"type": "string"}, "seconds": _NULLNUM,
                                   "timed_out": {"type": "boolean"}, "error": _NULLSTR}},
        "backends": {"type": "array", "items": {
            "type": "object", "required": ["name", "module", "importable", "version", "error", "ops", "missing"],
            "properties": {"name": {"type": "string"}, "module": {"type": "string"},
                           "importable": {"type": "boolean"}, "version": _NULLSTR, "error": _NULLSTR,
                           "ops": {"type": "object", "additionalProperties": _NULLSTR},
                           "missing": {"type": "array", "items": {"type": "string"}}}}},
        "packages": {"type": "object", "additionalProperties": _NULLSTR},
    },
}

_COMPILE_CODE = r"""
import json, sys, time
t0 = time.perf_counter()
try:
    import torch
    dev = sys.argv[1]
    def f(x):
        return torch.softmax(x * 2.0, dim=-1).cumsum(-1) + torch.sin(x)
    x = torch.randn(8, 32, device=dev)
    out = torch.compile(f, backend=sys.argv[2])(x)
    ok = bool(torch.allclose(out, f(x), atol=1e-4, rtol=1e-4))
    print(json.dumps({"ok": ok, "error": None if ok else "compiled result differs from eager",
                      "seconds": time.perf_counter() - t0}))
except Exception as e:
    print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:500], "seconds": time.perf_counter() - t0}))
"""


def _start_compile_check(device: str, backend: str):
    return subprocess.Popen([sys.executable, "-c", _COMPILE_CODE, device, backend], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish_compile_check(proc, backend: str, deadline: float, timeout_s: float) -> dict:
    out = {"checked": True, "ok": None, "backend": backend, "seconds": None, "timed_out": False, "error": None}
    try:
        stdout, stderr = proc.communicate(timeout=max(0.1, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        out.update(timed_out=True, error=f"did not finish within {timeout_s:g} s (a cold compiler cache can take "
                                         "longer; rerun, or raise --compile-timeout)")
        return out
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (stderr or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        out.update(ok=False, error=f"compile check process failed: {tail[0][:300]}")
        return out
    res = json.loads(lines[-1])
    out.update(ok=bool(res["ok"]), seconds=round(float(res["seconds"]), 2), error=res["error"])
    return out


def _time_matmul(dtype: torch.dtype, device: str, n: int, reps: int = 5,
                 warmup_s: float = 0.2) -> tuple[float, float, float]:
    """Median ms of an n×n matmul (after ≥ 3 warm-up runs and ≥ ``warmup_s`` seconds of them — CPU BLAS libraries
    JIT their kernels over the first calls — synchronised), the TFLOP/s it implies (2n³ flop) and the spread of the
    repeats (slowest / fastest; near 1 on a quiet machine)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    times = sorted(t * 1e3 for t in timed_repeats(lambda: a @ b, device, 3, reps, warmup_s=warmup_s))
    ms = times[len(times) // 2]
    return ms, 2 * n ** 3 / (ms / 1e3) / 1e12, times[-1] / times[0] if times[0] > 0 else float("inf")


def probe_dtypes(device: str, timing: bool = True) -> list[dict]:
    """Which of float32/float16/bfloat16 run a tiny matmul on ``device``, and how fast a medium one is
    (256² on CPU, 2048² on a GPU; median of 5 after warm-up)."""
    n = 256 if torch.device(device).type == "cpu" else 2048
    rows = []
    for name in dtypes.MODEL_DTYPES:
        dt = dtypes.to_torch(name)
        row = {"dtype": name, "works": True, "error": None, "matmul_n": n, "matmul_ms_p50": None, "tflops": None,
               "n": 0, "vs_float32": None, "spread": None}
        try:
            check_dtype_supported(dt, device)
            if timing:
                ms, tf, spread = _time_matmul(dt, device, n)
                row.update(matmul_ms_p50=round(ms, 4), tflops=round(tf, 4), n=5, spread=round(spread, 2))
        except ValueError as e:
            row.update(works=False, error=str(e))
        rows.append(row)
    base = rows[0]["tflops"]
    for r in rows:
        if base and r["tflops"]:
            r["vs_float32"] = round(r["tflops"] / base, 3)
    return rows


#: slowest/fastest of the timed repeats above which a matmul timing is flagged noisy
NOISY_SPREAD = 2.0
#: a half-precision matmul this many times faster than float32 is implausible (CPU: AMX/AVX-512 bf16 reaches a few
#: ×; GPU: tensor cores vs plain fp32 reach ~15-35×): most likely a mis-timed (noisy) run
IMPLAUSIBLE_VS_FLOAT32 = {"cpu": 20.0, "gpu": 64.0}


def timing_caveats(dtypes: list[dict], backend: str = "cpu", name: str = "this device") -> list[str]:
    """Warnings (never problems) for timings not to trust: repeats whose slowest/fastest exceeds
    :data:`NOISY_SPREAD` ("noisy: ...") and a ratio to float32 beyond :data:`IMPLAUSIBLE_VS_FLOAT32`."""
    out = []
    for d in dtypes:
        sp = d.get("spread")
        if d.get("works") and sp is not None and sp > NOISY_SPREAD:
            out.append(f"noisy: {d['dtype']} matmul timings vary {sp:.3g}× between repeats (slowest/fastest of "
                       f"n={d.get('n')}) on {name}; its speed and ratios to it are unreliable (rerun on a quieter "
                       "machine)")
    lim = IMPLAUSIBLE_VS_FLOAT32["cpu" if backend == "cpu" else "gpu"]
    for d in dtypes:
        r = d.get("vs_float32")
        if d.get("dtype") != "float32" and r is not None and r > lim:
            out.append(f"implausible: {d['dtype']} matmul measured {r:.4g}× float32 on {name} (more than {lim:g}× "
                       "is not expected here); the float32 timing was probably disturbed: rerun kit doctor")
    return out


def probe_fp8(device: str, backend: str, gfx_arch: str | None) -> dict:
    """Clamp-then-cast round trip of representable values for each fp8 format, and what an unclamped overflow
    cast gives (case F1: 250 → e4m3fnuz is NaN on PyTorch CPU)."""
    native = C.fp8_format_for(backend, gfx_arch)
    out = []
    for fmt, (attr, mx, _who) in C.FP8_FORMATS.items():
        row = {"format": fmt, "available": hasattr(torch, attr), "max": None, "cast_ok": False, "raw_overflow": None,
               "error": None}
        if row["available"]:
            try:
                dt = C.fp8_dtype(fmt)
                row["max"] = float(torch.finfo(dt).max)
                vals = torch.tensor([1.0, -2.0, 0.5, row["max"], -row["max"]], device=device)
                back = C.to_fp8(vals * 1.0, fmt).float()
                row["cast_ok"] = bool(torch.equal(back, vals))
                if not row["cast_ok"]:
                    row["error"] = f"round trip of {vals.tolist()} gave {back.tolist()}"
                raw = torch.tensor([2 * row["max"]], device=device).to(dt).float().item()
                row["raw_overflow"] = "nan" if raw != raw else ("inf" if abs(raw) == float("inf") else "saturates")
            except Exception as e:  # a device without fp8 support raises RuntimeError/TypeError
                row["error"] = f"{type(e).__name__}: {e}"[:300]
        out.append(row)
    return {"native_format": native, "formats": out}


def _devices() -> list[dict]:
    out = []
    if torch.cuda.is_available():
        from kit.hardware import gfx_arch

        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append({"index": i, "name": p.name, "memory_gb": round(p.total_memory / 1e9, 2),
                        "capability": f"{p.major}.{p.minor}",
                        "gfx_arch": gfx_arch(p) if getattr(torch.version, "hip", None) else None})
    return out


def _package_versions() -> dict:
    from importlib import metadata

    dists = {"sgl_kernel": "sgl-kernel", "flashinfer": "flashinfer-python", "aiter": "amd-aiter"}
    out = {}
    for name in PACKAGES:
        ver = None
        for dist in (dists.get(name, name), name, name.replace("_", "-")):
            try:
                ver = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        out[name] = ver
    return out


def _backends_from(overrides: list[str] | None) -> tuple[C.Backend, ...]:
    """Default backends, with ``NAME=MODULE`` overrides pointing a known backend's symbol table at another module."""
    backends = {b.name: b for b in C.BACKENDS}
    for item in overrides or []:
        name, sep, module = item.partition("=")
        if not sep or not module or name not in backends:
            raise UserError(f"--backend {item!r}: use NAME=MODULE with NAME one of {sorted(backends)}")
        b = backends[name]
        backends[name] = dataclasses.replace(b, module=module)
    return tuple(backends.values())


def run_doctor(device: str | None = None, *, backend_overrides: list[str] | None = None,
               require: list[str] | None = None, compile_check: bool = True, compile_backend: str = "inductor",
               compile_timeout_s: float = 25.0, timing: bool = True) -> dict:
    """Probe this machine and return the report (a dict matching :data:`SCHEMA`).

    Args:
        device: ``None``/``"auto"``, ``"cpu"``, ``"cuda"`` or ``"rocm"`` (see :func:`kit.hardware.detect`).
        backend_overrides: ``["sgl_kernel=my_fork_module", ...]``: look a known library's ops up in another module.
        require: library names that must be importable (else a problem), e.g. ``["flashinfer"]`` on a GPU node.
        compile_check: run the ``torch.compile`` check (in a subprocess, concurrently with the other probes).
        compile_backend: ``torch.compile`` backend for that check.
        compile_timeout_s: seconds the compile check may take (timeout → a warning, not a problem).
        timing: time the matmul speed sanity check (off → only "does it run").

    Raises:
        ValueError: bad device, bad override, unknown required library.
    """
    t0 = time.perf_counter()
    info = detect(device)
    backends = _backends_from(backend_overrides)
    known = {b.name for b in backends}
    for r in require or []:
        if r not in known:
            raise UserError(f"--require {r!r}: unknown library; known: {sorted(known)}")
    problems, warnings = [], []
    dtypes = probe_dtypes(info.device, timing)  # timed before the compile check starts competing for the CPU
    proc = _start_compile_check(info.device, compile_backend) if compile_check else None
    deadline = time.perf_counter() + compile_timeout_s
    for d in dtypes:
        if not d["works"]:
            problems.append(f"dtype {d['dtype']} does not run on {info.name}: {d['error']}")
        elif info.platform != "cpu" and d["dtype"] != "float32" and d["vs_float32"] is not None and d["vs_float32"] < 1:
            warnings.append(f"{d['dtype']} matmul is slower than float32 on {info.name} ({d['vs_float32']}×): "
                            "an emulated or untuned path?")
    warnings.extend(timing_caveats(dtypes, info.platform, info.name))
    fp8 = probe_fp8(info.device, info.platform, info.gfx_arch)
    for f in fp8["formats"]:
        if f["format"] == fp8["native_format"] and not f["cast_ok"]:
            problems.append(f"native fp8 format {f['format']} does not cast on {info.name}: {f['error']}")
        if f["raw_overflow"] == "nan":
            warnings.append(f"casting an out-of-range value to float8_{f['format']} gives NaN here: clamp to ±"
                            f"{f['max']:g} first (kit.check.harness.to_fp8)")
    probes = [C.probe_backend(b) for b in backends]
    for p in probes:
        problems.extend(p["problems"])
        if not p["importable"] and p["name"] in (require or []):
            problems.append(f"required library {p['name']} ({p['module']}) is not importable: {p['error']}")
    if proc is not None:
        comp = _finish_compile_check(proc, compile_backend, deadline, compile_timeout_s)
        if comp["timed_out"]:
            warnings.append(f"torch.compile check {comp['error']}")
        elif not comp["ok"]:
            problems.append(f"torch.compile ({compile_backend}) does not work on {info.device}: {comp['error']}")
    else:
        comp = {"checked": False, "ok": None, "backend": compile_backend, "seconds": None, "timed_out": False,
                "error": None}
    for p in probes:  # keep the schema's fields only (problems are in the top-level list)
        p.pop("problems", None)
    dev = {k: info.as_dict()[k] for k in ("platform", "device", "name", "count", "gfx_arch")}
    dev["memory_gb"] = round(info.memory_gb, 2)
    return {
        "schema_version": SCHEMA_VERSION, "ok": not problems, "problems": problems, "warnings": warnings,
        "elapsed_s": round(time.perf_counter() - t0, 2),
        "platform": {"python": platform.python_version(), "os": platform.platform(), "machine": platform.machine()},
        "torch": {"version": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
                  "hip": getattr(torch.version, "hip", None)},
        "device": dev, "devices": _devices(), "dtypes": dtypes, "fp8": fp8, "compile": comp, "backends": probes,
        "packages": _package_versions(),
    }


def format_report(r: dict) -> str:
    """The report as readable text (what ``kit doctor`` prints without ``--json``)."""
    t, d = r["torch"], r["device"]
    lines = [f"kit doctor — torch {t['version']} (CUDA {t['cuda'] or '-'}, HIP {t['hip'] or '-'}), "
             f"python {r['platform']['python']}, {r['elapsed_s']:.1f} s",
             f"device         {d['platform']}: {d['name']} ×{d['count']}, {d['memory_gb']:.1f} GB"
             + (f", {d['gfx_arch']}" if d["gfx_arch"] else "")]
    for g in r["devices"]:
        lines.append(f"  [{g['index']}] {g['name']}  {g['memory_gb']} GB  capability {g['capability']}"
                     + (f"  {g['gfx_arch']}" if g["gfx_arch"] else ""))
    for i, x in enumerate(r["dtypes"]):
        head = "dtypes         " if i == 0 else "               "
        if not x["works"]:
            lines.append(f"{head}{x['dtype']:9s} FAILS: {x['error']}")
            continue
        speed = (f"{x['matmul_n']}² matmul {x['matmul_ms_p50']:.3g} ms p50 (n={x['n']}), {x['tflops'] * 1e3:.3g} "
                 f"GFLOP/s" + (f", {x['vs_float32']}× float32" if x["dtype"] != "float32" else "")
                 + (f" (noisy: repeats vary {x['spread']:.3g}×)" if (x.get("spread") or 0) > NOISY_SPREAD else "")
                 if x["matmul_ms_p50"] is not None else "runs")
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
        lines.append(f"torch.compile  {state} ({c['backend']}" + (f", {c['seconds']} s" if c["seconds"] else "")
                     + ")" + (f": {c['error']}" if c["error"] and not c["ok"] else ""))
    for i, b in enumerate(r["backends"]):
        head = "kernel libs    " if i == 0 else "               "
        if not b["importable"]:
            lines.append(f"{head}{b['name']:11s} -  {b['error']}")
            continue
        have = [op for op, where in b["ops"].items() if where]
        lines.append(f"{head}{b['name']:11s} {b['version'] or '?'} ({b['module']}): has {', '.join(have) or 'none'}"
                     + (f"; MISSING {', '.join(b['missing'])}" if b["missing"] else ""))
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
    p = sub.add_parser("doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema: kit doctor --schema)")
    p.add_argument("--schema", action="store_true", help="print the JSON Schema of --json and exit")
    p.add_argument("--strict", action="store_true", help="exit 1 when there is any problem (for CI gates)")
    p.add_argument("--device", default=None, help="auto (default) | cpu | cuda | rocm")
    p.add_argument("--backend", action="append", default=[], metavar="NAME=MODULE",
                   help="look library NAME's ops up in MODULE (a fork or a test double); repeatable")
    p.add_argument("--require", action="append", default=[], metavar="NAME",
                   help="library that must be importable (e.g. flashinfer on a CUDA node); repeatable")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile check")
    p.add_argument("--compile-timeout", type=float, default=25.0, metavar="S",
                   help="seconds the torch.compile check may take (default 25)")
    p.add_argument("--quick", action="store_true", help="skip timing and the torch.compile check")
    p.add_argument("--out", default=None, help="also write the JSON report to this file")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    if args.schema:
        print(json.dumps(SCHEMA, indent=2))
        return 0
    if args.compile_timeout <= 0:
        raise UserError(f"--compile-timeout must be > 0 seconds; got {args.compile_timeout}")
    if args.out:
        from kit._io import check_out_file

        check_out_file(args.out, example="doctor.json")  # before the probes run, not after
    report = run_doctor(args.device, backend_overrides=args.backend, require=args.require,
                        compile_check=not (args.no_compile or args.quick), compile_timeout_s=args.compile_timeout,
                        timing=not args.quick)
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
