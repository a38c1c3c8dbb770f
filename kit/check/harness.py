"""Kernel and dtype sanity checks: a reference-comparison harness and pytest helpers.

Tools usable from a user's own test suite:

* :func:`check_op` — run an implementation against the reference over dtypes (float32, float16, bfloat16) and
  modes (eager, ``torch.compile``) on generated and edge-case inputs; returns a :class:`CheckReport` (a pandas
  DataFrame, one row per dtype × mode × input) whose :meth:`~CheckReport.summary` names the op, dtype, mode,
  input and first bad row. Probabilities are compared, not sampled ids; samplers are given explicit noise
  (case S5, pytorch #118735), and :func:`frequency_check` tests sampled frequencies with Pearson's χ² test.
* pytest helpers — :func:`device_dtype_params`, :func:`mode_params`, :func:`assert_matches_reference`.

The implementation checked defaults to :func:`kit.check.resolver.resolve_op`'s pick (the op resolver lives in
:mod:`kit.check.resolver`); the fp8 helpers live in :mod:`kit.check.fp8`. Both modules' public names are re-exported here, so
``from kit.check.harness import resolve_op, to_fp8`` keeps working.

Tolerances (:data:`DEFAULT_TOL`) are ``torch.testing.assert_close``'s defaults per dtype (PyTorch docs,
"torch.testing"): the reference runs on the *same* rounded inputs upcast to float64, so the error measured is the
implementation's own rounding plus any bug.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from kit.dtypes import MODEL_DTYPES, to_torch
from kit.errors import UserError
from kit.check import sampling as S
from .fp8 import FP8_FORMATS, e4m3fn_to_e4m3fnuz, fp8_dtype, fp8_format_for, to_fp8
from kit.check.resolver import BACKENDS, REFERENCE, Backend, OpNotFoundError, ResolvedOp, probe_backend, resolve_op

MODES = ("eager", "compile")
#: dtype name → (atol, rtol); torch.testing.assert_close defaults (float64 tightened for the reference itself)
DEFAULT_TOL: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1.3e-6), "float16": (1e-5, 1e-3), "bfloat16": (1e-5, 1.6e-2), "float64": (1e-7, 1e-7),
}


# ================================================================================================================
# harness: inputs
@dataclass
class Case:
    """One input to an op: ``args[0]`` is the ``(batch, vocab)`` tensor; ``rows`` labels each row (edge cases)."""

    name: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    rows: list[str] | None = None


def _distinct_probs(batch: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Rows of distinct probabilities that stay distinct after rounding to bfloat16 (vocab ≤ 64): each row is
    ``j / sum(j)`` for ``vocab`` distinct integers ``j`` in 1..2·vocab (neighbours differ by > 2⁻⁷ relative)."""
    j = torch.stack([torch.randperm(2 * vocab, generator=g)[:vocab] + 1 for _ in range(batch)]).double()
    return j / j.sum(-1, keepdim=True)


def _mid_thresholds(probs: torch.Tensor, g: torch.Generator, cumulative: bool) -> torch.Tensor:
    """Per-row thresholds placed midway between two neighbouring sorted values (cumulative mass for top-p, ratio to
    the max for min-p), among the top third, so the kept set is unambiguous at the dtype's precision."""
    x = probs.double()
    s = torch.sort(x, -1, descending=True).values
    v = torch.cumsum(s, -1) / s.sum(-1, keepdim=True) if cumulative else s / s[:, :1]
    r = torch.randint(0, max(1, x.shape[1] // 3), (x.shape[0], 1), generator=g)
    return ((v.gather(1, r) + v.gather(1, r + 1)) / 2).squeeze(1).float()


def _edge(rows: list[tuple[str, list[float], object]], dtype, device, vocab: int = 8):
    labels = [r[0] for r in rows]
    x = torch.tensor([r[1] + [0.0] * (vocab - len(r[1])) for r in rows], dtype=torch.float64)
    return labels, x.to(dtype=dtype, device=device), [r[2] for r in rows]


NAN, INF = float("nan"), float("inf")
_BASE = [.05, .3, .1, .2, .15, .05, .1, .05]
_TIES = [.2, .2, .2, .1, .1, .1, .05, .05]
_ONEHOT = [0, 1, 0, 0, 0, 0, 0, 0]
_ZERO = [0.0] * 8
_NANROW = [NAN, .5, .25, .25]


def _gen_top_k(dtype, device, g):
    p = _distinct_probs(6, 48, g).to(dtype=dtype, device=device)
    k = torch.randint(1, 48, (6,), generator=g).to(device)
    labels, x, ks = _edge([("k=0 (disabled)", _BASE, 0), ("k=vocab", _BASE, 8), ("k=2**30", _BASE, 2**30),
                           ("k=1", _BASE, 1), ("ties at pivot, k=2", _TIES, 2), ("one-hot, k=2", _ONEHOT, 2),
                           ("all-zero row", _ZERO, 3), ("NaN row", _NANROW, 3), ("inf row", [INF, .5], 3)],
                          dtype, device)
    return [Case("generated", (p, k)), Case("edge", (x, torch.tensor(ks, device=device)), rows=labels)]


def _gen_top_p(dtype, device, g):
    p = _distinct_probs(6, 48, g).to(dtype=dtype, device=device)
    tp = _mid_thresholds(p, g, cumulative=True).to(device)
    labels, x, ps = _edge([("p=0", _BASE, 0.0), ("p=1", _BASE, 1.0), ("p=1e-6", _BASE, 1e-6),
                           ("mass exactly p", [.5, .25, .125, .125], 0.5), ("ties at pivot, p=.3", _TIES, 0.3),
                           ("one-hot, p=.9", _ONEHOT, 0.9), ("all-zero row", _ZERO, 0.5), ("NaN row", _NANROW, 0.5)],
                          dtype, device)
    return [Case("generated", (p, tp)), Case("edge", (x, torch.tensor(ps, device=device)), rows=labels)]


def _gen_min_p(dtype, device, g):
    p = _distinct_probs(6, 48, g).to(dtype=dtype, device=device)
    mp = _mid_thresholds(p, g, cumulative=False).to(device)
    labels, x, ps = _edge([("min_p=0", _BASE, 0.0), ("min_p=1", _BASE, 1.0), ("S4 min_p=.8", [.9, 0, 0, .1], 0.8),
                           ("S4 min_p=.05", [.9, 0, 0, .1], 0.05), ("ties at pivot", _TIES, 1.0),
                           ("one-hot", _ONEHOT, 0.5), ("all-zero row", _ZERO, 0.5), ("NaN row", _NANROW, 0.5)],
                          dtype, device)
    return [Case("generated", (p, mp)), Case("edge", (x, torch.tensor(ps, device=device)), rows=labels)]


def _gen_mask(dtype, device, g):
    lg = _distinct_probs(6, 48, g).log().to(dtype=dtype, device=device)
    k = torch.randint(1, 48, (6,), generator=g).to(device)
    ninf = float("-inf")
    labels, x, ks = _edge([("k=0 (disabled)", _BASE, 0), ("k=vocab", _BASE, 8), ("k=1", _BASE, 1),
                           ("ties at pivot, k=2", _TIES, 2), ("all -inf row", [ninf] * 8, 2),
                           ("2 finite, k=3", [1.0, 2.0] + [ninf] * 6, 3), ("large logits", [1e4, -1e4, 3e3], 2),
                           ("NaN row", _NANROW, 2)], dtype, device)
    return [Case("generated", (lg, k)), Case("edge", (x, torch.tensor(ks, device=device)), rows=labels)]


def _gen_temperature(dtype, device, g):
    lg = (torch.randn(6, 48, generator=g, dtype=torch.float64) * 3).to(dtype=dtype, device=device)
    t = (0.5 + 1.5 * torch.rand(6, generator=g)).to(device)
    ninf = float("-inf")
    labels, x, ts = _edge([("T=1", _BASE, 1.0), ("S4 [2,1,0] T=2", [2.0, 1.0, 0.0] + [ninf] * 5, 2.0),
                           ("T=0.5", _BASE, 0.5), ("T=100", _BASE, 100.0), ("all -inf row", [ninf] * 8, 1.0),
                           ("large logits", [1e4, 0.0, -1e4], 1.0), ("NaN row", _NANROW, 1.0)], dtype, device)
    return [Case("generated", (lg, t)), Case("edge", (x, torch.tensor(ts, device=device)), rows=labels)]


def _gen_sampling(dtype, device, g):
    p = _distinct_probs(6, 48, g).to(dtype=dtype, device=device)
    k = torch.randint(1, 48, (6,), generator=g).to(device)
    tp = (0.3 + 0.7 * torch.rand(6, generator=g)).to(device)
    u = torch.rand(6, generator=g).to(device)
    rows = [("u=0", _BASE, 0, 1.0, 0.0), ("u→1", _BASE, 0, 1.0, 0.99999994), ("one-hot", _ONEHOT, 0, 1.0, 0.7),
            ("all-zero row", _ZERO, 0, 1.0, 0.5), ("NaN row", _NANROW, 0, 1.0, 0.5), ("k=1", _BASE, 1, 1.0, 0.9),
            ("p=0", _BASE, 0, 0.0, 0.9), ("ties, k=2", _TIES, 2, 1.0, 0.5)]
    labels, x, _ = _edge([(r[0], r[1], None) for r in rows], dtype, device)
    ek = torch.tensor([r[2] for r in rows], device=device)
    ep = torch.tensor([r[3] for r in rows], device=device)
    eu = torch.tensor([r[4] for r in rows], dtype=torch.float32, device=device)
    return [Case("generated", (p, k, tp), {"uniform": u}), Case("edge", (x, ek, ep), {"uniform": eu}, rows=labels)]


def _gen_plain_sampling(dtype, device, g):
    return [Case(c.name, c.args[:1], c.kwargs, c.rows) for c in _gen_sampling(dtype, device, g)]


def _support_plain(case: Case) -> torch.Tensor:
    return S.top_k_renorm_prob(case.args[0].double(), 0)


def _support_sampling(case: Case) -> torch.Tensor:
    x, k, p = case.args[0].double(), case.args[1], case.args[2]
    return S.top_p_renorm_prob(S.top_k_renorm_prob(x, k), p)


@dataclass(frozen=True)
class OpSpec:
    """How to check one op: its reference, output kind (``"probs"``, ``"logits"`` or ``"ids"``), an input
    generator ``(dtype, device, generator) → [Case]`` and, for ids, the filtered distribution ``Case → probs``."""

    name: str
    reference: Callable
    output: str
    generate: Callable
    support: Callable | None = None


SPECS: dict[str, OpSpec] = {s.name: s for s in (
    OpSpec("top_k_renorm_prob", S.top_k_renorm_prob, "probs", _gen_top_k),
    OpSpec("top_p_renorm_prob", S.top_p_renorm_prob, "probs", _gen_top_p),
    OpSpec("min_p_renorm_prob", S.min_p_renorm_prob, "probs", _gen_min_p),
    OpSpec("top_k_mask_logits", S.top_k_mask_logits, "logits", _gen_mask),
    OpSpec("softmax_with_temperature", S.softmax_with_temperature, "probs", _gen_temperature),
    OpSpec("top_k_top_p_sampling_from_probs", S.top_k_top_p_sampling_from_probs, "ids", _gen_sampling,
           _support_sampling),
    OpSpec("sampling_from_probs", S.sampling_from_probs, "ids", _gen_plain_sampling, _support_plain),
)}


# ================================================================================================================
# harness: comparison
def _fmt(vals) -> str:
    return "[" + ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in vals) + "]"


def _bad_values(ref: torch.Tensor, out: torch.Tensor, i: int, atol: float, rtol: float, n: int = 6) -> dict:
    """Expected vs got in row ``i``: the id for samplers, else the first ``n`` tokens outside tolerance."""
    if ref.dim() == 1:
        return {"expected": f"id {int(ref[i])}", "got": f"id {int(out[i])}"}
    r, o = ref[i].double().cpu(), out[i].double().cpu()
    cols = (~torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)).nonzero().flatten()[:n].tolist()
    more = " …" if int((~torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)).sum()) > n else ""
    return {"expected": f"tokens {cols}{more}: {_fmt(r[cols].tolist())}", "got": f"tokens {cols}{more}: "
            f"{_fmt(o[cols].tolist())}"}


def _compare_float(ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float) -> dict:
    r, o = ref.double().cpu(), out.double().cpu()
    close = torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)
    both = torch.isfinite(r) & torch.isfinite(o)
    diff = (o - r).abs().where(both, torch.zeros_like(r))
    rel = (diff / r.abs()).where(both & (r.abs() > atol), torch.zeros_like(r))
    bad_rows = (~close).any(-1).nonzero().flatten().tolist()
    return {"max_abs_err": float(diff.max()) if diff.numel() else 0.0,
            "max_rel_err": float(rel.max()) if rel.numel() else 0.0,
            "mismatches": int((~close).sum()), "n_elements": r.numel(),
            "nonfinite_ref": int((~torch.isfinite(r)).sum()), "nonfinite_out": int((~torch.isfinite(o)).sum()),
            "bad_rows": bad_rows}


def _compare_ids(ref: torch.Tensor, out: torch.Tensor, q: torch.Tensor, u: torch.Tensor, atol: float,
                 rtol: float) -> dict:
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
    return {"max_abs_err": float("nan"), "max_rel_err": float("nan"), "mismatches": len(bad),
            "n_elements": ref.numel(), "nonfinite_ref": int((ref < 0).sum()), "nonfinite_out": int((out < 0).sum()),
            "bad_rows": bad}


_COMPILED: dict = {}
_ID_OPS = ("top_k_top_p_sampling_from_probs", "sampling_from_probs")


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


def _dtype(d) -> str:
    if isinstance(d, torch.dtype):
        d = str(d).removeprefix("torch.")
    aliases = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "half": "float16", "float": "float32"}
    d = aliases.get(str(d).lower(), str(d).lower())
    if d not in MODEL_DTYPES and d != "float64":
        raise UserError(f"dtype {d!r} is not checked; allowed: {sorted(MODEL_DTYPES) + ['float64']}")
    return d


# ================================================================================================================
# harness: report
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
    df: "object"

    @property
    def passed(self) -> bool:
        return bool(self.df["passed"].all())

    @property
    def failures(self):
        return self.df[~self.df["passed"]]

    def first_failure(self) -> dict | None:
        """The first failing row as a dict of plain Python values (JSON-ready), or None when all passed."""
        import pandas as pd

        f = self.failures
        if f.empty:
            return None
        return {k: (None if v is None or (not isinstance(v, str) and pd.isna(v))
                    else v.item() if hasattr(v, "item") else v) for k, v in f.iloc[0].to_dict().items()}

    def summary(self, max_lines: int = 6) -> str:
        """Readable text: one headline, then one line per failing cell naming dtype, mode, input, first bad row."""
        import pandas as pd

        n, nf = len(self.df), int((~self.df["passed"]).sum())
        skipped = int((self.df["status"] == "skipped").sum())
        head = (f"check {self.op}: impl {self.impl!r} vs kit reference on {self.device} — "
                + (f"all {n - skipped} cells passed" if nf == 0 else f"{nf} of {n} cells FAILED")
                + (f" ({skipped} skipped)" if skipped else ""))
        lines = [head]
        for _, r in self.failures.head(max_lines).iterrows():
            where = f"op={self.op} dtype={r['dtype']} mode={r['mode']} input={r['input']}"
            if r["status"] == "error":
                lines.append(f"  ERROR {where}: {r['error']}")
                continue
            label = f" ({r['first_bad_label']})" if pd.notna(r["first_bad_label"]) else ""
            unit = "rows" if r["n_elements"] == r["batch"] and self.op in _ID_OPS else "elements"
            lines.append(f"  FAIL  {where} first bad row={r['first_bad_row']}{label}: {r['mismatches']}/"
                         f"{r['n_elements']} {unit} outside atol={r['atol']:g} rtol={r['rtol']:g}"
                         + (f", max abs err {r['max_abs_err']:.3g}" if pd.notna(r["max_abs_err"]) else ""))
            lines.append(f"        expected {r['expected']}")
            lines.append(f"        got      {r['got']}")
        if nf > max_lines:
            lines.append(f"  … {nf - max_lines} more failing cells in .df")
        for _, r in self.df[self.df["status"] == "skipped"].head(2).iterrows():
            lines.append(f"  skipped dtype={r['dtype']} mode={r['mode']}: {r['error']}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def check_op(op: str, impl: Callable | None = None, *, impl_name: str | None = None,
             dtypes: Sequence = ("float32", "float16", "bfloat16"), modes: Sequence[str] = MODES,
             device: str = "cpu", inputs: Callable | Sequence[Case] | None = None,
             tol: dict[str, tuple[float, float]] | None = None, compile_backend: str = "inductor",
             compile_kwargs: dict | None = None, seed: int = 0) -> CheckReport:
    """Compare ``impl`` with the kit's reference for ``op`` over dtypes × modes × inputs.

    The reference runs in eager mode on the same inputs upcast to float64; ``impl`` runs on the inputs in each
    dtype, as is (``"eager"``) and under ``torch.compile`` (``"compile"``; each graph compiled once per process).

    Args:
        op: a key of :data:`SPECS` (``"top_k_renorm_prob"``, ``"top_p_renorm_prob"``, ``"min_p_renorm_prob"``,
            ``"top_k_mask_logits"``, ``"softmax_with_temperature"``, ``"top_k_top_p_sampling_from_probs"``,
            ``"sampling_from_probs"``). Samplers are called with ``uniform=`` noise.
        impl: the implementation, with the kit's signature (default: :func:`resolve_op`'s pick).
        dtypes: names or torch dtypes among float32, float16, bfloat16 (float64 allowed).
        modes: subset of ``("eager", "compile")``.
        device: torch device string; a dtype the device cannot run is reported as ``skipped``.
        inputs: cases to use instead of the generated + edge-case ones: a list of :class:`Case` (cast per dtype
            by the harness) or a callable ``(dtype, device, generator) → [Case]``.
        tol: per-dtype ``(atol, rtol)`` overriding :data:`DEFAULT_TOL`.
        compile_backend / compile_kwargs: passed to ``torch.compile``.
        seed: seed of the generated inputs.

    Returns:
        A :class:`CheckReport`.

    Raises:
        ValueError: unknown op, dtype or mode.
    """
    import pandas as pd

    if op not in SPECS:
        raise UserError(f"unknown op {op!r}; checkable ops: {sorted(SPECS)}")
    bad_modes = [m for m in modes if m not in MODES]
    if bad_modes or not modes:
        raise UserError(f"modes {list(modes)!r} not allowed; use a non-empty subset of {MODES}")
    spec = SPECS[op]
    names = [_dtype(d) for d in dtypes]
    if impl is None:
        r = resolve_op(op)
        impl, impl_name = r.fn, impl_name or r.backend
    impl_name = impl_name or getattr(impl, "__qualname__", None) or repr(impl)
    tols = {**DEFAULT_TOL, **(tol or {})}
    rows = []
    for dname in names:
        dtype = torch.float64 if dname == "float64" else to_torch(dname)
        atol, rtol = tols[dname]
        base = {"op": op, "impl": impl_name, "device": str(device), "dtype": dname, "atol": atol, "rtol": rtol}
        try:
            from kit.hardware import check_dtype_supported
            check_dtype_supported(dtype, device)
        except ValueError as e:
            rows += [{**base, "mode": m, "input": "*", "status": "skipped", "passed": True, "error": str(e)}
                     for m in modes]
            continue
        g = torch.Generator().manual_seed(seed)
        if inputs is None:
            cases = spec.generate(dtype, device, g)
        elif callable(inputs):
            cases = inputs(dtype, device, g)
        else:
            cases = [Case(c.name, (c.args[0].to(dtype=dtype, device=device),) + tuple(c.args[1:]), c.kwargs, c.rows)
                     for c in inputs]
        refs = []
        for c in cases:
            ref = spec.reference(c.args[0].double(), *c.args[1:], **c.kwargs)
            q = spec.support(c) if spec.support else None
            refs.append((ref, q))
        for mode in modes:
            fn = impl if mode == "eager" else compiled(impl, compile_backend, **(compile_kwargs or {}))
            for c, (ref, q) in zip(cases, refs):
                row = {**base, "mode": mode, "input": c.name, "shape": str(tuple(c.args[0].shape)),
                       "batch": c.args[0].shape[0], "error": None, "first_bad_row": None, "first_bad_label": None,
                       "expected": None, "got": None}
                try:
                    if mode == "compile":
                        with _compile_guard():
                            out = fn(*c.args, **c.kwargs)
                    else:
                        out = fn(*c.args, **c.kwargs)
                    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
                        raise UserError(f"output {type(out).__name__} of shape "
                                         f"{tuple(getattr(out, 'shape', ()))}; expected shape {tuple(ref.shape)}")
                except Exception as e:  # the impl failing is a result, not a harness error
                    rows.append({**row, "status": "error", "passed": False,
                                 "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
                    continue
                if spec.output == "ids":
                    m = _compare_ids(ref, out, q, c.kwargs["uniform"], atol, rtol)
                else:
                    m = _compare_float(ref, out, atol, rtol)
                bad = m.pop("bad_rows")
                row.update(m, out_dtype=str(out.dtype).removeprefix("torch."))
                if bad:
                    i = bad[0]
                    row.update(first_bad_row=i, first_bad_label=c.rows[i] if c.rows else None,
                               **_bad_values(ref, out, i, atol, rtol))
                row.update(status="fail" if bad else "pass", passed=not bad)
                rows.append(row)
    cols = ["op", "impl", "device", "dtype", "mode", "input", "shape", "status", "passed", "max_abs_err",
            "max_rel_err", "mismatches", "n_elements", "nonfinite_ref", "nonfinite_out", "first_bad_row",
            "first_bad_label", "atol", "rtol", "out_dtype", "expected", "got", "error", "batch"]
    df = pd.DataFrame(rows).reindex(columns=cols)
    df["passed"] = df["passed"].astype(bool)
    for col in ("mismatches", "n_elements", "nonfinite_ref", "nonfinite_out", "first_bad_row", "batch"):
        df[col] = df[col].astype("Int64")  # integers, missing (<NA>) for error/skipped cells
    return CheckReport(op, impl_name, str(device), df)


# ================================================================================================================
# sampled frequencies
@dataclass
class FrequencyResult:
    """Pearson χ² goodness-of-fit of sampled ids against ``probs``; ``impossible``: draws of a zero-probability
    (or invalid) id, which fail the check outright."""

    counts: list[int]
    expected: list[float]
    chi2: float
    dof: int
    p_value: float
    alpha: float
    impossible: int
    n_draws: int

    @property
    def passed(self) -> bool:
        return self.impossible == 0 and self.p_value >= self.alpha

    def __str__(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        return (f"frequency check {verdict}: n={self.n_draws}, counts={self.counts}, expected="
                f"{[round(e, 1) for e in self.expected]}, chi2={self.chi2:.3g} (dof {self.dof}), "
                f"p={self.p_value:.3g} (alpha {self.alpha:g}), impossible draws={self.impossible}")


def frequency_check(sampler: Callable[[torch.Tensor], torch.Tensor], probs, n_draws: int = 1000,
                    alpha: float = 1e-3) -> FrequencyResult:
    """Draw ``n_draws`` ids with ``sampler`` and test them against ``probs`` (Pearson's χ² test).

    The sampler is called once on ``probs`` repeated ``n_draws`` times, shape ``(n_draws, vocab)``, and must
    return ``(n_draws,)`` ids. This is how eager and compiled samplers are compared: their random streams differ
    (pytorch #118735), their distributions must not (case S5: probs ``[.25, .25, .5]``, 1000 draws).
    p-value = Q(dof/2, χ²/2), the regularised upper incomplete gamma (χ² survival function; NIST/SEMATECH
    e-Handbook, "Chi-Square Goodness-of-Fit Test"), via :func:`torch.special.gammaincc`.

    Raises:
        ValueError: probs not a 1-d floating tensor/list with a positive sum; n_draws < 1; alpha not in (0, 1);
            the sampler returns the wrong shape.
    """
    p = torch.as_tensor(probs, dtype=torch.float64) if not isinstance(probs, torch.Tensor) else probs
    if p.dim() != 1 or not p.is_floating_point() or not bool((p >= 0).all()) or float(p.sum()) <= 0:
        raise UserError(f"probs must be a 1-d floating tensor of non-negative values with a positive sum; got "
                         f"{tuple(p.shape)} {p.dtype}")
    if not isinstance(n_draws, int) or n_draws < 1:
        raise UserError(f"n_draws must be an int ≥ 1; got {n_draws!r}")
    if not 0 < alpha < 1:
        raise UserError(f"alpha must be in (0, 1); got {alpha!r}")
    ids = sampler(p.unsqueeze(0).expand(n_draws, -1).contiguous())
    if not isinstance(ids, torch.Tensor) or tuple(ids.shape) != (n_draws,):
        raise UserError(f"sampler must return ids of shape ({n_draws},); got {tuple(getattr(ids, 'shape', ()))}")
    ids = ids.cpu().long()
    v = p.numel()
    expected = (p.double().cpu() / p.double().sum()) * n_draws
    valid = (ids >= 0) & (ids < v)
    counts = torch.bincount(ids[valid], minlength=v).double()
    impossible = int((~valid).sum()) + int(counts[expected == 0].sum())
    m = expected > 0
    chi2 = float(((counts[m] - expected[m]) ** 2 / expected[m]).sum())
    dof = int(m.sum()) - 1
    pval = 1.0 if dof < 1 else float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                                             torch.tensor(chi2 / 2, dtype=torch.float64)))
    return FrequencyResult([int(c) for c in counts.tolist()], expected.tolist(), chi2, dof, pval, alpha, impossible,
                           n_draws)


# ================================================================================================================
# pytest helpers
def available_devices() -> list[str]:
    """``["cpu"]`` plus ``"cuda"`` when a GPU is visible (ROCm builds also use ``"cuda"``)."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def supported_dtypes(device: str = "cpu", dtypes: Sequence = MODEL_DTYPES) -> list[str]:
    """The dtype names among ``dtypes`` that run a tiny matmul on ``device``."""
    from kit.hardware import check_dtype_supported

    ok = []
    for d in dtypes:
        name = _dtype(d)
        try:
            check_dtype_supported(torch.float64 if name == "float64" else to_torch(name), device)
            ok.append(name)
        except ValueError:
            pass
    return ok


def device_dtype_params(dtypes: Sequence = MODEL_DTYPES, devices: Sequence[str] | None = None) -> list:
    """``pytest.param(device, dtype)`` for every device × dtype; unsupported pairs are marked skip with the reason.

    Use: ``@pytest.mark.parametrize("device,dtype", device_dtype_params())``. Ids read ``cpu-bfloat16``.
    """
    import pytest

    out = []
    for dev in (devices or available_devices()):
        ok = set(supported_dtypes(dev, dtypes))
        for d in dtypes:
            name = _dtype(d)
            marks = () if name in ok else (pytest.mark.skip(reason=f"{name} does not run on {dev}"),)
            out.append(pytest.param(dev, name, id=f"{dev}-{name}", marks=marks))
    return out


def mode_params(modes: Sequence[str] = MODES, compile_marks: Sequence = ()) -> list:
    """``pytest.param(mode)`` for eager / compile; ``compile_marks`` are added to the compile one (e.g. your
    suite's ``pytest.mark.slow``)."""
    import pytest

    bad = [m for m in modes if m not in MODES]
    if bad:
        raise UserError(f"modes {bad!r} not allowed; use {MODES}")
    return [pytest.param(m, id=m, marks=tuple(compile_marks) if m == "compile" else ()) for m in modes]


def assert_matches_reference(op: str, impl: Callable | None = None, *, device: str = "cpu", dtype="float32",
                             mode: str = "eager", **kwargs) -> CheckReport:
    """One cell of :func:`check_op` as a test assertion: raises ``AssertionError`` carrying the summary (op,
    dtype, mode, input, first bad row, expected vs got) when it fails; returns the report otherwise."""
    report = check_op(op, impl, dtypes=(dtype,), modes=(mode,), device=device, **kwargs)
    if not report.passed:
        raise AssertionError(report.summary())
    return report


# ================================================================================================================
# planted bug (for demos and for testing the harness itself)
def top_p_renorm_prob_drops_crossing_token(probs: torch.Tensor, top_p) -> torch.Tensor:
    """A deliberately WRONG top-p: keeps tokens whose *inclusive* cumulative mass is ≤ p, so the token that
    crosses the threshold is dropped (and a row whose top token alone exceeds p comes back all zero). Used by
    the how-to notebook and tests to show what a failing check looks like. Same signature as
    :func:`kit.check.sampling.top_p_renorm_prob`."""
    x = probs.float()
    p = top_p if isinstance(top_p, torch.Tensor) else torch.full((x.shape[0],), float(top_p))
    s, idx = torch.sort(x, -1, descending=True)
    keep_sorted = torch.cumsum(s, -1) <= p.to(x.device).unsqueeze(1) * s.sum(-1, keepdim=True)
    keep = torch.zeros_like(keep_sorted).scatter(1, idx, keep_sorted)
    kept = torch.where(keep, x, torch.zeros_like(x))
    total = kept.sum(-1, keepdim=True)
    return torch.where(total > 0, kept / total.clamp_min(1e-30), kept).to(probs.dtype)


__all__ = [
    "MODES", "DEFAULT_TOL", "Case", "OpSpec", "SPECS", "compiled", "compiled_call", "CheckReport", "check_op",
    "FrequencyResult", "frequency_check", "available_devices", "supported_dtypes", "device_dtype_params",
    "mode_params", "assert_matches_reference", "top_p_renorm_prob_drops_crossing_token",
    # re-exported from kit.check.resolver and kit.check.fp8
    "Backend", "BACKENDS", "REFERENCE", "OpNotFoundError", "ResolvedOp", "resolve_op", "probe_backend",
    "FP8_FORMATS", "fp8_dtype", "fp8_format_for", "to_fp8", "e4m3fn_to_e4m3fnuz",
]
