"""kit.check.harness: the report, its summary, the planted bug caught eager and compiled, sampler ids with explicit
noise, impl errors as results, skipped dtypes, custom inputs and tolerances, argument errors, the compile cache;
kit.check.cases: every op has generated and named edge-case inputs."""

import json

import pytest
import torch

from kit.check import sampling as S
from kit.check.cases import Case
from kit.check.harness import OP_CHECKS, check_op, checked_dtype, compiled
from kit.check.planted import top_p_renorm_prob_drops_crossing_token
from kit.errors import UserError


def test_reference_passes_every_op_every_dtype_eager():
    for op in OP_CHECKS:
        rep = check_op(op, modes=("eager",))
        assert rep.passed, rep.summary()
        assert set(rep.df["dtype"]) == {"float32", "float16", "bfloat16"}
        assert set(rep.df["input"]) == {"generated", "edge"}


def test_every_op_check_has_labelled_edge_rows():
    assert set(OP_CHECKS) <= set(S.REFERENCE_OPS)
    assert all(c.reference is S.REFERENCE_OPS[name] for name, c in OP_CHECKS.items())
    for name, c in OP_CHECKS.items():
        cases = c.generate(torch.float32, "cpu", torch.Generator().manual_seed(0))
        gen, edge = cases
        assert (gen.name, edge.name) == ("generated", "edge") and gen.rows is None
        assert len(edge.rows) == edge.args[0].shape[0] and len(set(edge.rows)) == len(edge.rows), name
        assert "NaN row" in edge.rows, name
        assert (c.output == "ids") == (c.support is not None) == ("uniform" in gen.kwargs), name


REPORT_COLUMNS = {
    "op",
    "impl",
    "device",
    "dtype",
    "mode",
    "input",
    "status",
    "passed",
    "max_abs_err",
    "max_rel_err",
    "mismatches",
    "n_elements",
    "nonfinite_ref",
    "nonfinite_out",
    "first_bad_row",
    "first_bad_label",
    "atol",
    "rtol",
    "expected",
    "got",
    "error",
}


def test_planted_bug_is_caught_and_named():
    rep = check_op("top_p_renorm_prob", top_p_renorm_prob_drops_crossing_token, modes=("eager",))
    assert not rep.passed and REPORT_COLUMNS <= set(rep.df.columns)
    assert set(rep.failures["dtype"]) == {"float32", "float16", "bfloat16"}
    first = rep.first_failure()
    assert first["first_bad_row"] == 0 and first["mismatches"] > 0
    assert json.loads(json.dumps(first))["first_bad_row"] == 0  # plain Python values, JSON-ready
    text = rep.summary()
    assert "check top_p_renorm_prob: impl 'top_p_renorm_prob_drops_crossing_token'" in text  # op and impl named
    assert "dtype=float16 mode=eager input=generated first bad row=" in text
    assert "input=edge first bad row=0 (p=0)" in text  # edge rows carry their names
    assert "expected tokens" in text and "got      tokens" in text
    # non-finite counts: the edge batch has a NaN row the reference keeps NaN
    edge = rep.df[(rep.df["input"] == "edge") & (rep.df["dtype"] == "float32")].iloc[0]
    assert edge["nonfinite_ref"] == 8


@pytest.mark.compile
def test_planted_bug_caught_in_compiled_mode_reference_passes():
    bad = check_op("top_p_renorm_prob", top_p_renorm_prob_drops_crossing_token, modes=("compile",), dtypes=("float32",))
    assert not bad.passed and "dtype=float32 mode=compile input=generated first bad row=" in bad.summary()
    good = check_op("top_p_renorm_prob", S.top_p_renorm_prob, modes=("compile",), dtypes=("float32",))
    assert good.passed, good.summary()


def test_sampler_ids_compared_with_explicit_noise():
    def shifted(p, k, tp, uniform):  # uses different noise → wrong ids
        return S.top_k_top_p_sampling_from_probs(p, k, tp, uniform=(uniform + 0.37) % 1)

    def outside_support(p, k, tp, uniform):  # ignores top-k → may pick a filtered-out token
        return S.top_k_top_p_sampling_from_probs(p, 0, 1.0, uniform=uniform)

    assert check_op("top_k_top_p_sampling_from_probs", modes=("eager",)).passed
    for fn in (shifted, outside_support):
        rep = check_op("top_k_top_p_sampling_from_probs", fn, modes=("eager",), dtypes=("float32",))
        assert not rep.passed and "expected id" in rep.summary()


def test_impl_errors_and_wrong_shapes_are_results_not_crashes():
    def raises(p, k):
        raise RuntimeError("no kernel image is available for execution on the device")

    rep = check_op("top_k_renorm_prob", raises, modes=("eager",), dtypes=("float32",))
    assert (rep.df["status"] == "error").all()
    assert "ERROR op=top_k_renorm_prob dtype=float32 mode=eager" in rep.summary()
    assert "no kernel image" in rep.summary()
    rep = check_op("top_k_renorm_prob", lambda p, k: p[:, :2], modes=("eager",), dtypes=("float32",))
    assert not rep.passed and "expected shape" in rep.df["error"].iloc[0]


def test_unsupported_dtype_is_skipped_with_reason(monkeypatch):
    import kit.hardware as H

    def fake(dtype, device):  # raises what kit.hardware.check_dtype_supported raises
        if dtype == torch.bfloat16:
            raise UserError("dtype=bfloat16 is not supported on FakeGPU; use float16 or float32")

    monkeypatch.setattr(H, "check_dtype_supported", fake)
    rep = check_op("top_k_renorm_prob", modes=("eager",))
    sk = rep.df[rep.df["status"] == "skipped"]
    assert list(sk["dtype"]) == ["bfloat16"] and rep.passed and "skipped dtype=bfloat16" in rep.summary()


def test_custom_inputs_and_tolerances():
    case = Case("mine", (torch.tensor([[0.1, 0.2, 0.7]]), torch.tensor([2])))
    rep = check_op("top_k_renorm_prob", modes=("eager",), inputs=[case], dtypes=("bf16", torch.float16))
    assert rep.passed and list(rep.df["input"]) == ["mine", "mine"]
    # a tolerance looser than the bug lets it through on finite values (the report shows the tolerance used),
    # but NaN is never within tolerance of a number: the NaN row (kept NaN by the reference) still fails
    rep = check_op(
        "top_p_renorm_prob",
        top_p_renorm_prob_drops_crossing_token,
        modes=("eager",),
        dtypes=("float32",),
        tol={"float32": (1.0, 0.0)},
    )
    assert (rep.df["atol"] == 1.0).all() and list(rep.df["passed"]) == [True, False]
    assert rep.first_failure()["first_bad_label"] == "NaN row"


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"op": "nope"}, r"unknown op 'nope'; checkable ops"),
        ({"op": "top_k_renorm_prob", "modes": ("jit",)}, r"modes \['jit'\] not allowed"),
        ({"op": "top_k_renorm_prob", "dtypes": ("int8",)}, r"dtype 'int8' is not checked; allowed"),
    ],
)
def test_check_op_bad_arguments(kwargs, pattern):
    with pytest.raises(UserError, match=pattern):
        check_op(**kwargs)


def test_checked_dtype_uses_the_kit_vocabulary():
    assert [checked_dtype(d) for d in ("bf16", "fp16", "half", "float", torch.float32, "float64", torch.float64)] == [
        "bfloat16",
        "float16",
        "float16",
        "float32",
        "float32",
        "float64",
        "float64",
    ]
    with pytest.raises(
        UserError,
        match=r"dtype 'int8' is not checked; allowed: \['bfloat16', 'float16', "
        r"'float32', 'float64'\]",
    ):
        checked_dtype(torch.int8)
    with pytest.raises(UserError, match="dtype 'fp8' is not checked"):
        checked_dtype("fp8")


def test_compiled_cache_takes_dict_options():
    """torch.compile's ``options=`` is a dict: the cache key must not need it hashable (compiles lazily: no
    compile here)."""

    def f(x):
        return x + 1

    a = compiled(f, "inductor", options={"max_autotune": False})
    assert compiled(f, "inductor", options={"max_autotune": False}) is a
    assert compiled(f, "inductor", options={"max_autotune": True}) is not a
