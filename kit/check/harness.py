"""Op checks: compare an implementation of a sampling op with the kit's reference over dtypes × modes × inputs.

:func:`check_op` runs an implementation against the reference in float32, float16 and bfloat16, eager and under
``torch.compile``, on generated and edge-case inputs (:mod:`kit.check.cases`), and returns a :class:`CheckReport`
(a pandas DataFrame, one row per dtype × mode × input) whose :meth:`~CheckReport.summary` names the op, dtype, mode,
input and first bad row. Probabilities are compared, not sampled ids: samplers are given explicit noise, because
compiled code does not reproduce eager's random numbers (pytorch #118735); sampled frequencies are tested by
:func:`kit.check.stats.frequency_check`. :data:`OP_CHECKS` says how each op is checked. The implementation checked
defaults to :func:`kit.check.resolver.resolve_op`'s pick. pytest helpers built on :func:`check_op` are in
:mod:`kit.check.testing`.

Tolerances (:data:`DEFAULT_TOL`) are ``torch.testing.assert_close``'s defaults per dtype (PyTorch docs,
"torch.testing"): the reference runs on the *same* rounded inputs upcast to float64, so the error measured is the
implementation's own rounding plus any bug.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from kit import hardware
from kit.check import cases as K
from kit.check import sampling as S
from kit.check.cases import Case
from kit.check.resolver import ResolvedOp, resolve_op
from kit.dtypes import MODEL_DTYPES, model_dtype, to_torch
from kit.errors import UserError

#: how an implementation is run: as written, and under ``torch.compile``
MODES = ("eager", "compile")
#: dtype name → (atol, rtol); torch.testing.assert_close defaults (float64 tightened for the reference itself)
DEFAULT_TOL: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1.3e-6),
    "float16": (1e-5, 1e-3),
    "bfloat16": (1e-5, 1.6e-2),
    "float64": (1e-7, 1e-7),
}


def checked_dtype(d) -> str:
    """Canonical name of a dtype the checks run in: a :data:`kit.dtypes.MODEL_DTYPES` name, alias or
    ``torch.dtype``, or ``float64``.

    Raises:
        UserError: any other dtype (int8, fp8, …); the message lists the allowed.
    """
    if d is torch.float64 or str(d).strip().lower() == "float64":
        return "float64"
    try:
        return model_dtype(d)
    except UserError:
        raise UserError(
            f"dtype {str(d).removeprefix('torch.')!r} is not checked; allowed: {sorted(MODEL_DTYPES) + ['float64']}"
        ) from None


def checked_torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` of a :func:`checked_dtype` name."""
    return torch.float64 if name == "float64" else to_torch(name)


def _support_plain(case: Case) -> torch.Tensor:
    return S.top_k_renorm_prob(case.args[0].double(), 0)


def _support_sampling(case: Case) -> torch.Tensor:
    x, k, p = case.args[0].double(), case.args[1], case.args[2]
    return S.top_p_renorm_prob(S.top_k_renorm_prob(x, k), p)


@dataclass(frozen=True)
class OpCheck:
    """How to check one op: its reference, output kind (``"probs"``, ``"logits"`` or ``"ids"``), an input
    generator ``(dtype, device, generator) → [Case]`` and, for ids, the filtered distribution ``Case → probs``."""

    name: str
    reference: Callable
    output: str
    generate: Callable
    support: Callable | None = None


#: op name → :class:`OpCheck`, for every op :func:`check_op` can check
OP_CHECKS: dict[str, OpCheck] = {
    c.name: c
    for c in (
        OpCheck("top_k_renorm_prob", S.top_k_renorm_prob, "probs", K.top_k_cases),
        OpCheck("top_p_renorm_prob", S.top_p_renorm_prob, "probs", K.top_p_cases),
        OpCheck("min_p_renorm_prob", S.min_p_renorm_prob, "probs", K.min_p_cases),
        OpCheck("top_k_mask_logits", S.top_k_mask_logits, "logits", K.mask_logits_cases),
        OpCheck("softmax_with_temperature", S.softmax_with_temperature, "probs", K.temperature_cases),
        OpCheck(
            "top_k_top_p_sampling_from_probs",
            S.top_k_top_p_sampling_from_probs,
            "ids",
            K.sampling_cases,
            _support_sampling,
        ),
        OpCheck("sampling_from_probs", S.sampling_from_probs, "ids", K.plain_sampling_cases, _support_plain),
    )
}


# ================================================================================================================
# comparison
def _fmt(vals) -> str:
    return "[" + ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in vals) + "]"


def _bad_values(ref: torch.Tensor, out: torch.Tensor, i: int, atol: float, rtol: float, n: int = 6) -> dict:
    """Expected vs got in row ``i``: the id for samplers, else the first ``n`` tokens outside tolerance."""
    if ref.dim() == 1:
        return {"expected": f"id {int(ref[i])}", "got": f"id {int(out[i])}"}
    r, o = ref[i].double().cpu(), out[i].double().cpu()
    cols = (~torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)).nonzero().flatten()[:n].tolist()
    more = " …" if int((~torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)).sum()) > n else ""
    return {
        "expected": f"tokens {cols}{more}: {_fmt(r[cols].tolist())}",
        "got": f"tokens {cols}{more}: {_fmt(o[cols].tolist())}",
    }


def _compare_float(ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float) -> dict:
    r, o = ref.double().cpu(), out.double().cpu()
    close = torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)
    both = torch.isfinite(r) & torch.isfinite(o)
    diff = (o - r).abs().where(both, torch.zeros_like(r))
    rel = (diff / r.abs()).where(both & (r.abs() > atol), torch.zeros_like(r))
    bad_rows = (~close).any(-1).nonzero().flatten().tolist()
    return {
        "max_abs_err": float(diff.max()) if diff.numel() else 0.0,
        "max_rel_err": float(rel.max()) if rel.numel() else 0.0,
        "mismatches": int((~close).sum()),
        "n_elements": r.numel(),
        "nonfinite_ref": int((~torch.isfinite(r)).sum()),
        "nonfinite_out": int((~torch.isfinite(o)).sum()),
        "bad_rows": bad_rows,
    }


def _compare_ids(
    ref: torch.Tensor, out: torch.Tensor, q: torch.Tensor, u: torch.Tensor, atol: float, rtol: float
) -> dict:
    """Ids agree, or differ only where ``u`` lies within the tolerance of a CDF boundary of the filtered
    distribution ``q`` (rounding may legitimately move the choice to a neighbour there)."""
    ref, out, q, u = ref.cpu().long(), out.cpu().long(), q.double().cpu(), u.double().cpu()
    q = torch.nan_to_num(q, nan=0.0)
    total = q.sum(-1)
    cdf = torch.cumsum(q, -1) / total.clamp_min(1e-300).unsqueeze(1)
    bad = []
    tol = atol + rtol
    for i in range(ref.shape[0]):
        a, b = int(ref[i]), int(out[i])
        if a == b:
            continue
        if a < 0 or b < 0 or b >= q.shape[1] or q[i, b] <= 0:
            bad.append(i)
            continue
        lo = float(cdf[i, b] - q[i, b] / total[i])
        hi = float(cdf[i, b])
        if not (lo - tol <= float(u[i]) <= hi + tol):
            bad.append(i)
    return {
        "max_abs_err": float("nan"),
        "max_rel_err": float("nan"),
        "mismatches": len(bad),
        "n_elements": ref.numel(),
        "nonfinite_ref": int((ref < 0).sum()),
        "nonfinite_out": int((out < 0).sum()),
        "bad_rows": bad,
    }


_COMPILED: dict = {}


def compiled(fn: Callable, backend: str = "inductor", **compile_kwargs) -> Callable:
    """``torch.compile(fn)``, cached per (fn, backend, options) so a process compiles each graph once."""
    key = (fn, backend, repr(sorted(compile_kwargs.items())))  # repr: options= is a dict (unhashable)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, backend=backend, **compile_kwargs)
    return _COMPILED[key]


def compiled_call(fn: Callable, *args, backend: str = "inductor", **kwargs):
    """Call ``torch.compile(fn)`` (cached per fn/backend) on ``args``/``kwargs`` with the recompile guard of
    :func:`check_op` (many recompiles allowed; hitting the limit raises instead of silently running eager)."""
    with _compile_guard():
        return compiled(fn, backend)(*args, **kwargs)


def _compile_guard():
    """While a compiled check runs: allow many recompiles (dtype × shape), and fail loudly rather than silently
    falling back to eager when the limit is hit."""
    return torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True)


# ================================================================================================================
# report
@dataclass
class CheckReport:
    """Result of :func:`check_op`.

    Attributes:
        op, impl, device: what was checked.
        df: one row per dtype × mode × input: ``status`` (pass | fail | error | skipped), ``passed``,
            ``max_abs_err``, ``max_rel_err``, ``mismatches`` (elements, or rows for ids, outside tolerance),
            ``n_elements``, ``nonfinite_ref``/``nonfinite_out`` (NaN/inf, or id −1), ``first_bad_row``,
            ``first_bad_label`` (edge-case name), ``atol``, ``rtol``, ``out_dtype``, ``expected``/``got`` (first bad
            row, abbreviated), ``error``.
    """

    op: str
    impl: str
    device: str
    df: object

    @property
    def passed(self) -> bool:
        return bool(self.df["passed"].all())

    @property
    def failures(self):
        return self.df[~self.df["passed"]]

    def first_failure(self) -> dict | None:
        """The first failing row as a dict of plain Python values (JSON-ready), or None when all passed."""
        f = self.failures
        if f.empty:
            return None
        return {
            k: (None if v is None or (not isinstance(v, str) and pd.isna(v)) else v.item() if hasattr(v, "item") else v)
            for k, v in f.iloc[0].to_dict().items()
        }

    def summary(self, max_lines: int = 6) -> str:
        """Readable text: one headline, then one line per failing cell naming dtype, mode, input, first bad row."""
        n, nf = len(self.df), int((~self.df["passed"]).sum())
        skipped = int((self.df["status"] == "skipped").sum())
        head = (
            f"check {self.op}: impl {self.impl!r} vs kit reference on {self.device} — "
            + (f"all {n - skipped} cells passed" if nf == 0 else f"{nf} of {n} cells FAILED")
            + (f" ({skipped} skipped)" if skipped else "")
        )
        lines = [head]
        for _, r in self.failures.head(max_lines).iterrows():
            where = f"op={self.op} dtype={r['dtype']} mode={r['mode']} input={r['input']}"
            if r["status"] == "error":
                lines.append(f"  ERROR {where}: {r['error']}")
                continue
            label = f" ({r['first_bad_label']})" if pd.notna(r["first_bad_label"]) else ""
            unit = "rows" if r["n_elements"] == r["batch"] and OP_CHECKS[self.op].output == "ids" else "elements"
            lines.append(
                f"  FAIL  {where} first bad row={r['first_bad_row']}{label}: {r['mismatches']}/"
                f"{r['n_elements']} {unit} outside atol={r['atol']:g} rtol={r['rtol']:g}"
                + (f", max abs err {r['max_abs_err']:.3g}" if pd.notna(r["max_abs_err"]) else "")
            )
            lines.append(f"        expected {r['expected']}")
            lines.append(f"        got      {r['got']}")
        if nf > max_lines:
            lines.append(f"  … {nf - max_lines} more failing cells in .df")
        for _, r in self.df[self.df["status"] == "skipped"].head(2).iterrows():
            lines.append(f"  skipped dtype={r['dtype']} mode={r['mode']}: {r['error']}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def check_op(
    op: str,
    impl: Callable | ResolvedOp | None = None,
    *,
    dtypes: Sequence = ("float32", "float16", "bfloat16"),
    modes: Sequence[str] = MODES,
    device: str = "cpu",
    inputs: Callable | Sequence[Case] | None = None,
    tol: dict[str, tuple[float, float]] | None = None,
    compile_options: dict | None = None,
) -> CheckReport:
    """Compare ``impl`` with the kit's reference for ``op`` over dtypes × modes × inputs.

    The reference runs in eager mode on the same inputs upcast to float64; ``impl`` runs on the inputs in each
    dtype, as is (``"eager"``) and under ``torch.compile`` (``"compile"``; each graph compiled once per process).

    Args:
        op: a key of :data:`OP_CHECKS` (``"top_k_renorm_prob"``, ``"top_p_renorm_prob"``, ``"min_p_renorm_prob"``,
            ``"top_k_mask_logits"``, ``"softmax_with_temperature"``, ``"top_k_top_p_sampling_from_probs"``,
            ``"sampling_from_probs"``). Samplers are called with ``uniform=`` noise.
        impl: the implementation, with the kit's signature: a callable (the report names it by its qualified name)
            or a :class:`~kit.check.resolver.ResolvedOp` (named by its library). Default: :func:`resolve_op`'s pick.
        dtypes: names, aliases or torch dtypes among float32, float16, bfloat16 (float64 allowed).
        modes: subset of ``("eager", "compile")``.
        device: torch device string; a dtype the device cannot run is reported as ``skipped``.
        inputs: cases to use instead of the generated (seed 0) + edge-case ones: a list of :class:`Case` (cast per
            dtype by the harness) or a callable ``(dtype, device, generator) → [Case]`` (the generator is seeded
            with 0; reseed it for other generated inputs: ``OP_CHECKS[op].generate(dtype, device, g.manual_seed(7))``).
        tol: per-dtype ``(atol, rtol)`` overriding :data:`DEFAULT_TOL`.
        compile_options: keyword arguments of ``torch.compile`` for the compile mode (default: backend
            ``"inductor"``, no options).

    Returns:
        A :class:`CheckReport`.

    Raises:
        UserError: unknown op, dtype or mode.
    """
    if op not in OP_CHECKS:
        raise UserError(f"unknown op {op!r}; checkable ops: {sorted(OP_CHECKS)}")
    bad_modes = [m for m in modes if m not in MODES]
    if bad_modes or not modes:
        raise UserError(f"modes {list(modes)!r} not allowed; use a non-empty subset of {MODES}")
    names = [checked_dtype(d) for d in dtypes]
    impl = resolve_op(op) if impl is None else impl
    if isinstance(impl, ResolvedOp):
        fn, impl_name = impl.fn, impl.library
    else:
        fn, impl_name = impl, getattr(impl, "__qualname__", None) or repr(impl)
    run = _CheckRun(OP_CHECKS[op], fn, impl_name, device, tuple(modes), compile_options or {})
    tols = {**DEFAULT_TOL, **(tol or {})}
    rows = [row for dname in names for row in run.dtype_rows(dname, tols[dname], inputs)]
    df = pd.DataFrame(rows).reindex(columns=REPORT_COLUMNS)
    df["passed"] = df["passed"].astype(bool)
    for col in ("mismatches", "n_elements", "nonfinite_ref", "nonfinite_out", "first_bad_row", "batch"):
        df[col] = df[col].astype("Int64")  # integers, missing (<NA>) for error/skipped cells
    return CheckReport(op, impl_name, str(device), df)


#: the columns of :attr:`CheckReport.df`, in order
REPORT_COLUMNS = (
    "op impl device dtype mode input shape status passed max_abs_err max_rel_err mismatches n_elements nonfinite_ref "
    "nonfinite_out first_bad_row first_bad_label atol rtol out_dtype expected got error batch"
).split()


@dataclass(frozen=True)
class _CheckRun:
    """One :func:`check_op` call: the op's check, the implementation and where and how it runs."""

    spec: OpCheck
    fn: Callable
    impl_name: str
    device: str
    modes: tuple[str, ...]
    compile_options: dict

    def dtype_rows(self, dname: str, tol: tuple[float, float], inputs) -> list[dict]:
        """The rows of one dtype: every mode × input, or one ``skipped`` row per mode when the device cannot run
        the dtype."""
        dtype, (atol, rtol) = checked_torch_dtype(dname), tol
        base = {"op": self.spec.name, "impl": self.impl_name, "device": str(self.device), "dtype": dname}
        base.update(atol=atol, rtol=rtol)
        try:
            hardware.check_dtype_supported(dtype, self.device)
        except UserError as e:
            return [
                {**base, "mode": m, "input": "*", "status": "skipped", "passed": True, "error": str(e)}
                for m in self.modes
            ]
        cases = self._cases(dtype, inputs)
        refs = [
            (
                self.spec.reference(c.args[0].double(), *c.args[1:], **c.kwargs),
                self.spec.support(c) if self.spec.support else None,
            )
            for c in cases
        ]
        rows = []
        for mode in self.modes:
            fn = self.fn if mode == "eager" else compiled(self.fn, **self.compile_options)
            rows += [self._cell({**base, "mode": mode}, fn, c, ref, q) for c, (ref, q) in zip(cases, refs)]
        return rows

    def _cases(self, dtype: torch.dtype, inputs) -> list[Case]:
        g = torch.Generator().manual_seed(0)
        if inputs is None:
            return self.spec.generate(dtype, self.device, g)
        if callable(inputs):
            return inputs(dtype, self.device, g)
        return [
            Case(c.name, (c.args[0].to(dtype=dtype, device=self.device),) + tuple(c.args[1:]), c.kwargs, c.rows)
            for c in inputs
        ]

    def _cell(self, base: dict, fn: Callable, c: Case, ref: torch.Tensor, q) -> dict:
        """One row: run ``fn`` on case ``c`` (an exception or a wrong shape is an ``error`` row) and compare with
        the reference output ``ref`` (ids: within the filtered distribution ``q``)."""
        row = {**base, "input": c.name, "shape": str(tuple(c.args[0].shape)), "batch": c.args[0].shape[0]}
        row.update(error=None, first_bad_row=None, first_bad_label=None, expected=None, got=None)
        try:
            if base["mode"] == "compile":
                with _compile_guard():
                    out = fn(*c.args, **c.kwargs)
            else:
                out = fn(*c.args, **c.kwargs)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
                raise UserError(
                    f"output {type(out).__name__} of shape "
                    f"{tuple(getattr(out, 'shape', ()))}; expected shape {tuple(ref.shape)}"
                )
        except Exception as e:  # the impl failing is a result, not a harness error
            error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return {**row, "status": "error", "passed": False, "error": error}
        atol, rtol = base["atol"], base["rtol"]
        if self.spec.output == "ids":
            m = _compare_ids(ref, out, q, c.kwargs["uniform"], atol, rtol)
        else:
            m = _compare_float(ref, out, atol, rtol)
        bad = m.pop("bad_rows")
        row.update(m, out_dtype=str(out.dtype).removeprefix("torch."))
        if bad:
            i = bad[0]
            row.update(
                first_bad_row=i, first_bad_label=c.rows[i] if c.rows else None, **_bad_values(ref, out, i, atol, rtol)
            )
        row.update(status="fail" if bad else "pass", passed=not bad)
        return row
