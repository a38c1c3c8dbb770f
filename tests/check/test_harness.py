"""kit.check.harness: the op resolver (S1, fake backends), the harness (report, summary, planted bug, eager and compiled),
the pytest helpers as a user's suite would use them, and fp8 (F1)."""
import pytest
import torch

from kit.check import harness as C
from kit.check import sampling as S
from kit.check.harness import (Backend, OpNotFoundError, assert_matches_reference, check_op, device_dtype_params,
                        mode_params, resolve_op)


@pytest.fixture
def fakes(monkeypatch):
    """Put tests/fake_backends on sys.path (only for the test using it)."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "fake_backends"))


# ------------------------------------------------------------------------------------------------ resolver (S1)
def rocm_like():
    return Backend("sgl_kernel", "fake_rocm_sgl_kernel", {
        "top_k_renorm_prob": ("top_k_renorm_prob", "top_k_renorm_probs"),
        "top_p_renorm_prob": ("top_p_renorm_prob", "top_p_renorm_probs")})


def test_s1_missing_symbol_raises_naming_symbol_and_every_place(fakes):
    guarded = Backend("guarded", "fake_guarded_kernels", {"top_k_renorm_prob": ("top_k_renorm_prob",)})
    absent = Backend("flashinfer", "no_such_flashinfer_module.sampling", {"top_k_renorm_prob": ("top_k_renorm_probs",)})
    with pytest.raises(OpNotFoundError) as ei:
        resolve_op("top_k_renorm_prob", [absent, rocm_like(), guarded], fallback=False)
    msg = str(ei.value)
    for needle in ("top_k_renorm_prob", "no_such_flashinfer_module.sampling", "not installed",
                   "fake_rocm_sgl_kernel.top_k_renorm_prob: module imported but has no attribute",
                   "fake_rocm_sgl_kernel.top_k_renorm_probs",
                   "fake_guarded_kernels.top_k_renorm_prob: attribute is None",
                   "kit.reference"):
        assert needle in msg, (needle, msg)
    assert len(ei.value.tried) == 5


def test_s1_resolver_never_returns_none_and_records_what_ran(fakes):
    r = resolve_op("top_k_renorm_prob", [rocm_like()])
    assert r is not None and r.backend == "kit.reference" and r.fn is S.top_k_renorm_prob
    assert any("has no attribute 'top_k_renorm_prob'" in t for t in r.tried)
    # the op the ROCm-like build does have is taken from it
    r2 = resolve_op("top_p_renorm_prob", [rocm_like()])
    assert r2.backend == "sgl_kernel" and r2.where == "fake_rocm_sgl_kernel.top_p_renorm_prob" and r2.tried == ()
    p = torch.tensor([[.2, .3, .5]])
    torch.testing.assert_close(r2(p, 0.4), S.top_p_renorm_prob(p, 0.4))


def test_resolver_default_backends_fall_back_here_and_list_them():
    r = resolve_op("top_k_renorm_prob")
    if r.backend == "kit.reference":  # nothing installed (this machine, CI)
        names = " ".join(r.tried)
        assert "flashinfer" in names and "sgl_kernel" in names and "aiter" in names
    with pytest.raises(ValueError, match="unknown op 'top_k_renorm_probz'; known ops"):
        resolve_op("top_k_renorm_probz")


def test_resolver_alternate_symbol_names_and_adapter(fakes):
    full = Backend("flashinfer", "fake_full_kernels", C.BACKENDS[0].symbols)
    r = resolve_op("top_k_renorm_prob", [full])
    assert r.where == "fake_full_kernels.top_k_renorm_probs"
    aiter = Backend("aiter", "fake_aiter_ops", C.BACKENDS[2].symbols, C.BACKENDS[2].adapters)
    r = resolve_op("top_k_renorm_prob", [aiter])
    assert r.backend == "aiter"
    report = check_op("top_k_renorm_prob", r.fn, modes=("eager",), dtypes=("float32",))
    assert report.passed, report.summary()
    import fake_aiter_ops
    assert (True, 0) in fake_aiter_ops.CALLS  # per-row tensor went to maybe_top_k_arr


def test_probe_backend_reports_missing_ops(fakes):
    info = C.probe_backend(Backend("sgl_kernel", "fake_rocm_sgl_kernel", C.BACKENDS[1].symbols))
    assert info["importable"] and info["version"] == "0.0-fake-rocm"
    assert info["missing"] == ["top_k_renorm_prob"]
    assert "lacks top_k_renorm_prob" in info["problems"][0]
    assert info["ops"]["top_p_renorm_prob"] == "fake_rocm_sgl_kernel.top_p_renorm_prob"
    gone = C.probe_backend(Backend("x", "definitely_not_installed_mod", {"top_k_renorm_prob": ("a",)}))
    assert not gone["importable"] and "not installed" in gone["error"]


# ------------------------------------------------------------------------------------------------------ harness
def test_reference_passes_every_op_every_dtype_eager():
    for op in C.SPECS:
        rep = check_op(op, modes=("eager",))
        assert rep.passed, rep.summary()
        assert set(rep.df["dtype"]) == {"float32", "float16", "bfloat16"}
        assert set(rep.df["input"]) == {"generated", "edge"}


REPORT_COLUMNS = {"op", "impl", "device", "dtype", "mode", "input", "status", "passed", "max_abs_err", "max_rel_err",
                  "mismatches", "n_elements", "nonfinite_ref", "nonfinite_out", "first_bad_row", "first_bad_label",
                  "atol", "rtol", "expected", "got", "error"}


def test_planted_bug_is_caught_and_named():
    rep = check_op("top_p_renorm_prob", C.top_p_renorm_prob_drops_crossing_token, impl_name="drops-crossing-token",
                   modes=("eager",))
    assert not rep.passed and REPORT_COLUMNS <= set(rep.df.columns)
    assert set(rep.failures["dtype"]) == {"float32", "float16", "bfloat16"}
    first = rep.first_failure()
    assert first["first_bad_row"] == 0 and first["mismatches"] > 0
    import json
    assert json.loads(json.dumps(first))["first_bad_row"] == 0  # plain Python values, JSON-ready
    text = rep.summary()
    assert "top_p_renorm_prob" in text and "drops-crossing-token" in text
    assert "dtype=float16 mode=eager input=generated first bad row=" in text
    assert "input=edge first bad row=0 (p=0)" in text  # edge rows carry their names
    assert "expected tokens" in text and "got      tokens" in text
    # non-finite counts: the edge batch has a NaN row the reference keeps NaN
    edge = rep.df[(rep.df["input"] == "edge") & (rep.df["dtype"] == "float32")].iloc[0]
    assert edge["nonfinite_ref"] == 8


@pytest.mark.compile
def test_planted_bug_caught_in_compiled_mode_reference_passes():
    bad = check_op("top_p_renorm_prob", C.top_p_renorm_prob_drops_crossing_token, modes=("compile",),
                   dtypes=("float32",))
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

    def fake(dtype, device):
        if dtype == torch.bfloat16:
            raise ValueError("dtype=bfloat16 is not supported on FakeGPU; use float16 or float32")
    monkeypatch.setattr(H, "check_dtype_supported", fake)
    rep = check_op("top_k_renorm_prob", modes=("eager",))
    sk = rep.df[rep.df["status"] == "skipped"]
    assert list(sk["dtype"]) == ["bfloat16"] and rep.passed and "skipped dtype=bfloat16" in rep.summary()


def test_custom_inputs_and_tolerances():
    case = C.Case("mine", (torch.tensor([[.1, .2, .7]]), torch.tensor([2])))
    rep = check_op("top_k_renorm_prob", modes=("eager",), inputs=[case], dtypes=("bf16", torch.float16))
    assert rep.passed and list(rep.df["input"]) == ["mine", "mine"]
    # a tolerance looser than the bug lets it through on finite values (the report shows the tolerance used),
    # but NaN is never within tolerance of a number: the NaN row (kept NaN by the reference) still fails
    rep = check_op("top_p_renorm_prob", C.top_p_renorm_prob_drops_crossing_token, modes=("eager",),
                   dtypes=("float32",), tol={"float32": (1.0, 0.0)})
    assert (rep.df["atol"] == 1.0).all() and list(rep.df["passed"]) == [True, False]
    assert rep.first_failure()["first_bad_label"] == "NaN row"


@pytest.mark.parametrize("kwargs,pattern", [
    ({"op": "nope"}, r"unknown op 'nope'; checkable ops"),
    ({"op": "top_k_renorm_prob", "modes": ("jit",)}, r"modes \['jit'\] not allowed"),
    ({"op": "top_k_renorm_prob", "dtypes": ("int8",)}, r"dtype 'int8' is not checked; allowed"),
])
def test_check_op_bad_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        check_op(**kwargs)


def test_frequency_check_bad_arguments():
    with pytest.raises(ValueError, match="probs must be a 1-d"):
        C.frequency_check(S.sampling_from_probs, torch.rand(2, 3))
    with pytest.raises(ValueError, match="n_draws"):
        C.frequency_check(S.sampling_from_probs, torch.tensor([.5, .5]), n_draws=0)
    with pytest.raises(ValueError, match="sampler must return ids of shape"):
        C.frequency_check(lambda p: p, torch.tensor([.5, .5]), n_draws=10)


# ------------------------------------------------------------------------- pytest helpers, used as a user would
def my_top_k(probs, top_k):
    """Stand-in for a user's kernel."""
    return S.top_k_renorm_prob(probs, top_k)


@pytest.mark.parametrize("device,dtype", device_dtype_params())
def test_user_suite_style(device, dtype):
    rep = assert_matches_reference("top_k_renorm_prob", my_top_k, device=device, dtype=dtype)
    assert rep.passed


def test_helpers_shapes_and_failure_message():
    params = device_dtype_params(devices=["cpu"])
    assert [p.id for p in params] == ["cpu-float32", "cpu-bfloat16", "cpu-float16"]
    modes = mode_params(compile_marks=[pytest.mark.compile])
    assert [m.id for m in modes] == ["eager", "compile"] and modes[1].marks
    with pytest.raises(ValueError, match="modes"):
        mode_params(["graph"])
    with pytest.raises(AssertionError, match=r"op=top_p_renorm_prob dtype=bfloat16 mode=eager"):
        assert_matches_reference("top_p_renorm_prob", C.top_p_renorm_prob_drops_crossing_token, dtype="bf16")


# -------------------------------------------------------------------------------------------------------- F1
def test_f1_fp8_bytes_and_clamping():
    x = torch.tensor([1, -0.0, 448, 0.5, -2])
    as_fnuz = C.to_fp8(x, "e4m3fn").view(torch.float8_e4m3fnuz).float()
    torch.testing.assert_close(as_fnuz, torch.tensor([0.5, float("nan"), 224, 0.25, -1]), equal_nan=True)
    assert C.to_fp8(torch.tensor([500.0]), "e4m3fn").float().item() == 448.0
    assert C.to_fp8(torch.tensor([250.0]), "e4m3fnuz").float().item() == 240.0  # raw cast gives NaN here
    assert C.to_fp8(torch.tensor([-1e6]), "e4m3fnuz").float().item() == -240.0
    assert torch.isnan(C.to_fp8(torch.tensor([float("nan")]), "e4m3fn").float()).all()
    assert C.fp8_format_for("rocm", "gfx942") == "e4m3fnuz"
    assert C.fp8_format_for("rocm", "gfx950") == "e4m3fn" and C.fp8_format_for("cuda") == "e4m3fn"
    with pytest.raises(ValueError, match="unknown fp8 format 'e4m3'"):
        C.to_fp8(x, "e4m3")
    with pytest.raises(ValueError, match="x must be a floating tensor"):
        C.to_fp8(torch.tensor([1, 2]), "e4m3fn")


def test_f1_kind_e4m3fn_checkpoint_to_fnuz_keeps_values():
    x = torch.tensor([1, -0.0, 448, 0.5, -2, 3.25e-3, -100, float("nan")])
    q = C.to_fp8(x, "e4m3fn")
    q2, s2 = C.e4m3fn_to_e4m3fnuz(q, 0.5)
    assert q2.dtype == torch.float8_e4m3fnuz and s2 == 1.0
    torch.testing.assert_close(q2.float() * s2, q.float() * 0.5, equal_nan=True)  # -0 → +0 compares equal
    with pytest.raises(ValueError, match="float8_e4m3fn tensor"):
        C.e4m3fn_to_e4m3fnuz(x)


def _fp8_both(x):
    return C.to_fp8(x, "e4m3fn").float(), C.to_fp8(x, "e4m3fnuz").float()


@pytest.mark.compile
def test_f1_fp8_clamp_then_cast_compiled():
    x = torch.tensor([1.0, -2.0, 0.5, 500.0, 250.0, -1e4])
    (fn_c, fnuz_c), (fn_e, fnuz_e) = C.compiled_call(_fp8_both, x), _fp8_both(x)
    torch.testing.assert_close(fn_c, fn_e)
    torch.testing.assert_close(fnuz_c, fnuz_e)
    assert fn_c.tolist()[3:] == [448.0, 256.0, -448.0] and fnuz_c.tolist()[3:] == [240.0, 240.0, -240.0]


def test_compiled_cache_takes_dict_options():
    """torch.compile's ``options=`` is a dict: the cache key must not need it hashable (compiles lazily: no compile here)."""
    def f(x):
        return x + 1

    a = C.compiled(f, "inductor", options={"max_autotune": False})
    assert C.compiled(f, "inductor", options={"max_autotune": False}) is a
    assert C.compiled(f, "inductor", options={"max_autotune": True}) is not a
