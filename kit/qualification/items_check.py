"""The qualification's correctness items: ``doctor`` (:func:`kit.check.doctor.run_doctor`) and ``ops`` (every
sampling op of :data:`kit.check.harness.OP_CHECKS`, eager and compiled, against the reference per dtype through
:func:`kit.check.harness.check_op`)."""

from __future__ import annotations

import importlib
import json
import re
import time

import pandas as pd

from kit._io import atomic_write_text
from kit.errors import UserError
from kit.qualification.context import ItemContext, ItemResult, headline
from kit.qualification.verdicts import doctor_verdict, ops_verdict

#: the doctor's torch.compile check: at most this long (s; DoctorConfig's default), at least this short
DOCTOR_COMPILE_TIMEOUT_S, DOCTOR_MIN_COMPILE_S = 25.0, 5.0


def run_doctor_item(ctx: ItemContext) -> ItemResult:
    """``kit doctor`` with its torch.compile check (a subprocess) held to 60 % of the share (at most 25 s; not run
    when that is under 5 s: the ``ops`` item compiles too; ``--compile-timeout`` sets it); the report is
    ``OUT/doctor/doctor.json``. A warning about documented format behaviour (:func:`expected_notes`) is kept in the
    figures as ``notes`` and does not warn."""
    from kit.check.doctor import DoctorConfig, run_doctor

    timeout = ctx.config.compile_timeout_s or min(DOCTOR_COMPILE_TIMEOUT_S, 0.6 * ctx.share_s)
    check = timeout >= DOCTOR_MIN_COMPILE_S or bool(ctx.config.compile_timeout_s)  # else the ops item compiles
    report = run_doctor(
        DoctorConfig(device=ctx.config.device, compile_timeout_s=max(timeout, 1.0), compile_check=check)
    )
    atomic_write_text(ctx.dir / "doctor.json", json.dumps(report, indent=2))
    d, c = report["device"], report["compile"]
    works = [x["dtype"] for x in report["dtypes"] if x["works"]]
    summary = (
        f"{d['name']} x{d['count']}, torch {report['torch']['version']}, dtypes {', '.join(works)}, fp8 "
        f"{report['fp8']['native_format']}, torch.compile "
        + ("not checked (the ops item compiles)" if not c["checked"] else "ok" if c["ok"] else "not ok")
    )
    notes = expected_notes(report["warnings"])
    warns = [w for w in report["warnings"] if w not in notes]
    fig = {"problems": report["problems"], "warnings": warns, "notes": notes, "summary": summary,
           "device": d, "torch": report["torch"], "packages": report["packages"]}  # fmt: skip
    return ItemResult(doctor_verdict(fig, ctx.config.thresholds), fig, str(ctx.dir))


#: doctor warnings that describe documented behaviour of a format, not a fault of the node: PyTorch's cast of an
#: out-of-range value to the fnuz fp8 formats gives NaN (documented in kit.check.fp8:
#: to_fp8 clamps first)
EXPECTED_WARNINGS = (re.compile(r"^casting an out-of-range value to float8_\w+fnuz gives NaN"),)


def expected_notes(warnings: list[str]) -> list[str]:
    """The doctor warnings (strings) that match :data:`EXPECTED_WARNINGS`: information, not a warning."""
    return [w for w in warnings if any(p.search(w) for p in EXPECTED_WARNINGS)]


def op_impls(specs) -> dict:
    """``{op: callable}`` of ``--op-impl OP=MODULE:FUNCTION`` overrides (an implementation to check instead of the
    one :func:`kit.check.resolver.resolve_op` picks: a fork, a planted fault).

    Raises:
        UserError: an unknown op, a module that does not import, a missing or non-callable attribute.
    """
    from kit.check.harness import OP_CHECKS

    out = {}
    for spec in specs:
        op, _, target = str(spec).partition("=")
        module, _, attr = target.partition(":")
        if op not in OP_CHECKS:
            raise UserError(f"--op-impl {spec!r}: unknown op {op!r}; checkable ops: {', '.join(OP_CHECKS)}")
        try:
            fn = getattr(importlib.import_module(module), attr, None)
        except ImportError as e:
            raise UserError(f"--op-impl {spec!r}: module {module!r} does not import ({e})") from None
        if not callable(fn):
            raise UserError(f"--op-impl {spec!r}: {module} has no function {attr!r}")
        out[op] = fn
    return out


def _bad_cells(df: pd.DataFrame) -> list[dict]:
    """The failing cells of a check frame as plain dicts (an error cell counts every element as bad)."""
    out = []
    for _, r in df[~df["passed"]].iterrows():
        n = (
            int(r["mismatches"])
            if pd.notna(r["mismatches"])
            else max(1, int(r["n_elements"] or 1) if pd.notna(r["n_elements"]) else 1)
        )
        detail = r["error"] if r["status"] == "error" else f"first bad row {r['first_bad_row']}, got {r['got']}"
        out.append({"op": r["op"], "dtype": r["dtype"], "mode": r["mode"], "input": r["input"], "mismatches": n,
                    "detail": str(detail)[:200]})  # fmt: skip
    return out


def run_ops_item(ctx: ItemContext) -> ItemResult:
    """Every op eager in every dtype, then compiled (``plan.compile_backend``) in ``plan.compile_dtypes`` op by op
    while the share lasts (overridden ops first); ``OUT/ops/op_checks.csv`` holds every cell. A kernel library's
    sampler (ids out) is not called with the harness's explicit noise (its signature differs): the reference stands
    in and the figures say so, unless ``--op-impl`` names a wrapper."""
    from kit.check.harness import OP_CHECKS, check_op
    from kit.check.resolver import REFERENCE, resolve_op

    p, cfg = ctx.plan, ctx.config
    impls = op_impls(cfg.op_impls)
    ops = sorted(OP_CHECKS, key=lambda op: op not in impls)  # a named implementation is checked first
    picked, unwrapped = {}, {}
    for op in ops:
        picked[op] = impls.get(op) or resolve_op(op)
        lib = getattr(picked[op], "library", REFERENCE)
        if OP_CHECKS[op].output == "ids" and lib != REFERENCE:  # (resolver: samplers' signatures differ)
            unwrapped[op] = f"{lib}'s sampler takes its noise differently: wrap it and pass --op-impl {op}=MODULE:FN"
            picked[op] = resolve_op(op, libraries=())
    frames = [check_op(op, picked[op], dtypes=p.op_dtypes, modes=("eager",), device=p.device).df for op in ops]
    limit = len(ops) if cfg.compile_ops is None else cfg.compile_ops
    not_compiled, capped, t0 = [], [], time.monotonic()
    for i, op in enumerate(ops):
        if i >= limit:  # --compile-ops: the user's choice, said in the verdict
            capped.append(op)
            continue
        if ctx.should_stop():
            not_compiled.append(op)
            continue
        for dt in p.compile_dtypes:
            opts = {"backend": p.compile_backend}
            frames.append(check_op(op, picked[op], dtypes=(dt,), modes=("compile",), device=p.device,
                                   compile_options=opts).df)  # fmt: skip
    df = pd.concat(frames, ignore_index=True)
    df.to_csv(ctx.dir / "op_checks.csv", index=False)
    eager_bad = _bad_cells(df[df["mode"] == "eager"])
    eager_keys = {(c["op"], c["dtype"], c["input"]) for c in eager_bad}
    comp_bad = [
        c for c in _bad_cells(df[df["mode"] == "compile"]) if (c["op"], c["dtype"], c["input"]) not in eager_keys
    ]
    fig = {
        "cells": int((df["status"] != "skipped").sum()),
        "eager_failed": eager_bad,
        "compile_failed": comp_bad,
        "not_compiled": not_compiled,
        "compile_capped": capped,
        "eager_only": limit == 0,
        "implementations": {
            op: getattr(f, "library", None) or getattr(f, "__qualname__", repr(f)) for op, f in picked.items()
        },
        "compile_s": round(time.monotonic() - t0, 1),
        "library_not_checked": unwrapped,
    }
    plots = _ops_plot(df, ctx)
    return ItemResult(ops_verdict(fig, cfg.thresholds), fig, str(ctx.dir), plots,
                      headline("cells passed", int(df["passed"].sum()), "cells"))  # fmt: skip


def _ops_plot(df: pd.DataFrame, ctx: ItemContext) -> dict:
    from kit.view.files import save_figure
    from kit.view.qualify_plots import op_check_grid

    return {"op checks": str(save_figure(op_check_grid(df), ctx.dir / "op_checks.png"))}
