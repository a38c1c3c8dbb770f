"""What ``kit doctor`` runs: each probe tries something small on this machine and reports what happened.

Probes never raise for what they find (a dtype that does not run, an fp8 cast that fails, a compiler that
crashes): they return it as data for :func:`kit.check.doctor.run_doctor` to judge. The ``torch.compile`` check runs
in a child process (:func:`start_compile_check` / :func:`finish_compile_check`) so a compiler crash or hang cannot
take the doctor down.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import torch

from kit import hardware
from kit.check import fp8
from kit.dtypes import MODEL_DTYPES, to_torch
from kit.errors import UserError
from kit.measure.timing import timed_repeats

#: Python packages whose version is reported (installed or not)
PROBED_PACKAGES = ("vllm", "sglang", "flashinfer", "sgl_kernel", "aiter", "triton", "transformers")
#: slowest/fastest of the timed repeats above which a matmul timing is flagged noisy
NOISY_SPREAD = 2.0
#: a half-precision matmul this many times faster than float32 is implausible (CPU: AMX/AVX-512 bf16 reaches a few
#: ×; GPU: tensor cores vs plain fp32 reach ~15-35×): most likely a mis-timed (noisy) run
IMPLAUSIBLE_VS_FLOAT32 = {"cpu": 20.0, "gpu": 64.0}

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


def check_compile_backend(name: str) -> None:
    """Refuse a ``torch.compile`` backend name that torch does not know (``torch._dynamo.list_backends``, which
    includes backends registered by installed packages), before the compile check starts.

    Raises:
        UserError: ``name`` is not a registered backend (the message lists them).
    """
    if name == "inductor":  # torch's default: always there, and no need to import dynamo to know it
        return
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if name not in known:
        raise UserError(f"compile_backend={name!r} is not a torch.compile backend; known: {', '.join(known)}")


def start_compile_check(device: str, compile_backend: str) -> subprocess.Popen:
    """Start the ``torch.compile`` check in a child process: compile a small function on ``device`` with
    ``compile_backend`` (``"inductor"``) and compare it with eager. Collect it with :func:`finish_compile_check`."""
    return subprocess.Popen(
        [sys.executable, "-c", _COMPILE_CODE, device, compile_backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def compile_not_checked(compile_backend: str) -> dict:
    """The ``compile`` section of the report when the check was skipped."""
    return {
        "checked": False,
        "ok": None,
        "backend": compile_backend,
        "seconds": None,
        "timed_out": False,
        "error": None,
    }


def finish_compile_check(proc: subprocess.Popen, compile_backend: str, deadline: float, timeout_s: float) -> dict:
    """Wait for the check started by :func:`start_compile_check` until ``deadline`` (a ``time.perf_counter()``
    value; ``timeout_s`` is only quoted in the message) and return the report's ``compile`` section:
    ``{"checked", "ok", "backend", "seconds", "timed_out", "error"}``. A hang is killed (``timed_out``); a crash of
    the child is ``ok: False`` with the last line of its stderr. Never raises."""
    out = {**compile_not_checked(compile_backend), "checked": True}
    try:
        stdout, stderr = proc.communicate(timeout=max(0.1, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        out.update(
            timed_out=True,
            error=f"did not finish within {timeout_s:g} s (a cold compiler cache can take "
            "longer; rerun, or raise --compile-timeout)",
        )
        return out
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (stderr or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        out.update(ok=False, error=f"compile check process failed: {tail[0][:300]}")
        return out
    res = json.loads(lines[-1])
    out.update(ok=bool(res["ok"]), seconds=round(float(res["seconds"]), 2), error=res["error"])
    return out


def _time_matmul(
    dtype: torch.dtype, device: str, n: int, reps: int = 5, warmup_s: float = 0.2
) -> tuple[float, float, float]:
    """Median ms of an n×n matmul (after ≥ 3 warm-up runs and ≥ ``warmup_s`` seconds of them — CPU BLAS libraries
    JIT their kernels over the first calls — synchronised), the TFLOP/s it implies (2n³ flop) and the spread of the
    repeats (slowest / fastest; near 1 on a quiet machine)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    times = sorted(t * 1e3 for t in timed_repeats(lambda: a @ b, device, 3, reps, warmup_s=warmup_s))
    ms = times[len(times) // 2]
    return ms, 2 * n**3 / (ms / 1e3) / 1e12, times[-1] / times[0] if times[0] > 0 else float("inf")


def probe_dtypes(device: str, timing: bool = True) -> list[dict]:
    """Which of :data:`kit.dtypes.MODEL_DTYPES` run a tiny matmul on ``device``, and how fast a medium one is
    (256² on CPU, 2048² on a GPU; median ms of 5 after warm-up, TFLOP/s, ratio to float32, spread of the repeats).

    Returns:
        One dict per dtype: ``{"dtype", "works", "error", "matmul_n", "matmul_ms_p50", "tflops", "n",
        "vs_float32", "spread"}`` (timing fields None when ``timing`` is off or the dtype does not run).
    """
    n = 256 if torch.device(device).type == "cpu" else 2048
    rows = []
    for name in MODEL_DTYPES:
        dt = to_torch(name)
        row = {
            "dtype": name,
            "works": True,
            "error": None,
            "matmul_n": n,
            "matmul_ms_p50": None,
            "tflops": None,
            "n": 0,
            "vs_float32": None,
            "spread": None,
        }
        try:
            hardware.check_dtype_supported(dt, device)
            if timing:
                ms, tf, spread = _time_matmul(dt, device, n)
                row.update(matmul_ms_p50=round(ms, 4), tflops=round(tf, 4), n=5, spread=round(spread, 2))
        except UserError as e:
            row.update(works=False, error=str(e))
        rows.append(row)
    base = rows[0]["tflops"]
    for r in rows:
        if base and r["tflops"]:
            r["vs_float32"] = round(r["tflops"] / base, 3)
    return rows


def timing_caveats(dtype_rows: list[dict], platform: str = "cpu", name: str = "this device") -> list[str]:
    """Warnings (never problems) for timings not to trust, from :func:`probe_dtypes` rows: repeats whose
    slowest/fastest exceeds :data:`NOISY_SPREAD` ("noisy: ...") and a ratio to float32 beyond
    :data:`IMPLAUSIBLE_VS_FLOAT32` for ``platform`` (``"cpu"``, else the GPU limit)."""
    out = []
    for d in dtype_rows:
        sp = d.get("spread")
        if d.get("works") and sp is not None and sp > NOISY_SPREAD:
            out.append(
                f"noisy: {d['dtype']} matmul timings vary {sp:.3g}× between repeats (slowest/fastest of "
                f"n={d.get('n')}) on {name}; its speed and ratios to it are unreliable (rerun on a quieter "
                "machine)"
            )
    lim = IMPLAUSIBLE_VS_FLOAT32["cpu" if platform == "cpu" else "gpu"]
    for d in dtype_rows:
        r = d.get("vs_float32")
        if d.get("dtype") != "float32" and r is not None and r > lim:
            out.append(
                f"implausible: {d['dtype']} matmul measured {r:.4g}× float32 on {name} (more than {lim:g}× "
                "is not expected here); the float32 timing was probably disturbed: rerun kit doctor"
            )
    return out


def probe_fp8(device: str, platform: str, gfx_arch: str | None) -> dict:
    """Clamp-then-cast round trip of representable values for each format of
    :data:`kit.check.fp8.FP8_FORMAT_INFO`, and what an unclamped overflow cast (2 × max) gives (on PyTorch CPU
    250 → e4m3fnuz is NaN).

    Returns:
        ``{"native_format": fp8_format_for(platform, gfx_arch), "formats": [{"format", "available", "max",
        "cast_ok", "raw_overflow" (saturates | nan | inf), "error"}, ...]}``. Never raises.
    """
    out = []
    for name, f in fp8.FP8_FORMAT_INFO.items():
        row = {
            "format": name,
            "available": hasattr(torch, f.torch_attr),
            "max": None,
            "cast_ok": False,
            "raw_overflow": None,
            "error": None,
        }
        if row["available"]:
            try:
                dt = fp8.fp8_dtype(name)
                row["max"] = float(torch.finfo(dt).max)
                vals = torch.tensor([1.0, -2.0, 0.5, row["max"], -row["max"]], device=device)
                back = fp8.to_fp8(vals * 1.0, name).float()
                row["cast_ok"] = bool(torch.equal(back, vals))
                if not row["cast_ok"]:
                    row["error"] = f"round trip of {vals.tolist()} gave {back.tolist()}"
                raw = torch.tensor([2 * row["max"]], device=device).to(dt).float().item()
                row["raw_overflow"] = "nan" if raw != raw else ("inf" if abs(raw) == float("inf") else "saturates")
            except Exception as e:  # a device without fp8 support raises RuntimeError/TypeError: a finding
                row["error"] = f"{type(e).__name__}: {e}"[:300]
        out.append(row)
    return {"native_format": fp8.fp8_format_for(platform, gfx_arch), "formats": out}


def gpu_list() -> list[dict]:
    """One dict per visible GPU: ``{"index", "name", "memory_gb" (GB, 1e9 bytes), "capability", "gfx_arch"}``
    (``gfx_arch`` on ROCm only); empty without a GPU."""
    out = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(
                {
                    "index": i,
                    "name": p.name,
                    "memory_gb": round(p.total_memory / 1e9, 2),
                    "capability": f"{p.major}.{p.minor}",
                    "gfx_arch": hardware.gfx_arch(p) if getattr(torch.version, "hip", None) else None,
                }
            )
    return out


def installed_versions() -> dict:
    """Installed version of each of :data:`PROBED_PACKAGES` (None when not installed), from the package metadata."""
    from importlib import metadata

    dists = {"sgl_kernel": "sgl-kernel", "flashinfer": "flashinfer-python", "aiter": "amd-aiter"}
    out = {}
    for name in PROBED_PACKAGES:
        ver = None
        for dist in (dists.get(name, name), name, name.replace("_", "-")):
            try:
                ver = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        out[name] = ver
    return out
