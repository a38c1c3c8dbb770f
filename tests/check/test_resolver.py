"""kit.check.resolver: a missing symbol is named with every place tried (S1, fake kernel libraries), the resolver never
returns None, alternate symbol names and adapters, and probe_library for kit doctor."""

from pathlib import Path

import pytest
import torch

from kit.check import sampling as S
from kit.check.harness import check_op
from kit.check.resolver import KERNEL_LIBRARIES, REFERENCE, KernelLibrary, OpNotFoundError, probe_library, resolve_op
from kit.errors import KitError


@pytest.fixture
def fakes(monkeypatch):
    """Put tests/fake_backends on sys.path (only for the test using it)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "fake_backends"))


def rocm_like():
    return KernelLibrary(
        "sgl_kernel",
        "fake_rocm_sgl_kernel",
        {
            "top_k_renorm_prob": ("top_k_renorm_prob", "top_k_renorm_probs"),
            "top_p_renorm_prob": ("top_p_renorm_prob", "top_p_renorm_probs"),
        },
    )


def test_s1_missing_symbol_raises_naming_symbol_and_every_place(fakes):
    guarded = KernelLibrary("guarded", "fake_guarded_kernels", {"top_k_renorm_prob": ("top_k_renorm_prob",)})
    absent = KernelLibrary(
        "flashinfer", "no_such_flashinfer_module.sampling", {"top_k_renorm_prob": ("top_k_renorm_probs",)}
    )
    with pytest.raises(OpNotFoundError) as ei:
        resolve_op("top_k_renorm_prob", [absent, rocm_like(), guarded], fallback=False)
    msg = str(ei.value)
    for needle in (
        "top_k_renorm_prob",
        "no_such_flashinfer_module.sampling",
        "not installed",
        "fake_rocm_sgl_kernel.top_k_renorm_prob: module imported but has no attribute",
        "fake_rocm_sgl_kernel.top_k_renorm_probs",
        "fake_guarded_kernels.top_k_renorm_prob: attribute is None",
        "kit.reference",
    ):
        assert needle in msg, (needle, msg)
    assert len(ei.value.tried) == 5
    assert isinstance(ei.value, KitError) and isinstance(ei.value, LookupError)


def test_op_not_found_with_no_library_listing_the_op():
    with pytest.raises(OpNotFoundError, match="no implementation of op 'min_p_renorm_prob' found"):
        resolve_op("min_p_renorm_prob", [rocm_like()], fallback=False)


def test_s1_resolver_never_returns_none_and_records_what_ran(fakes):
    r = resolve_op("top_k_renorm_prob", [rocm_like()])
    assert r is not None and r.library == "kit.reference" == REFERENCE and r.fn is S.top_k_renorm_prob
    assert any("has no attribute 'top_k_renorm_prob'" in t for t in r.tried)
    # the op the ROCm-like build does have is taken from it
    r2 = resolve_op("top_p_renorm_prob", [rocm_like()])
    assert r2.library == "sgl_kernel" and r2.where == "fake_rocm_sgl_kernel.top_p_renorm_prob" and r2.tried == ()
    p = torch.tensor([[0.2, 0.3, 0.5]])
    torch.testing.assert_close(r2(p, 0.4), S.top_p_renorm_prob(p, 0.4))


def test_resolver_default_libraries_fall_back_here_and_list_them():
    assert [b.name for b in KERNEL_LIBRARIES] == ["flashinfer", "sgl_kernel", "aiter"]
    r = resolve_op("top_k_renorm_prob")
    if r.library == "kit.reference":  # nothing installed (this machine, CI)
        names = " ".join(r.tried)
        assert "flashinfer" in names and "sgl_kernel" in names and "aiter" in names
    with pytest.raises(ValueError, match="unknown op 'top_k_renorm_probz'; known ops"):
        resolve_op("top_k_renorm_probz")


def test_resolver_alternate_symbol_names_and_adapter(fakes):
    full = KernelLibrary("flashinfer", "fake_full_kernels", KERNEL_LIBRARIES[0].symbols)
    r = resolve_op("top_k_renorm_prob", [full])
    assert r.where == "fake_full_kernels.top_k_renorm_probs"
    aiter = KernelLibrary("aiter", "fake_aiter_ops", KERNEL_LIBRARIES[2].symbols, KERNEL_LIBRARIES[2].adapters)
    r = resolve_op("top_k_renorm_prob", [aiter])
    assert r.library == "aiter"
    report = check_op("top_k_renorm_prob", r.fn, modes=("eager",), dtypes=("float32",))
    assert report.passed, report.summary()
    import fake_aiter_ops

    assert (True, 0) in fake_aiter_ops.CALLS  # per-row tensor went to maybe_top_k_arr


def test_probe_library_reports_missing_ops(fakes):
    info = probe_library(KernelLibrary("sgl_kernel", "fake_rocm_sgl_kernel", KERNEL_LIBRARIES[1].symbols))
    assert info["importable"] and info["version"] == "0.0-fake-rocm"
    assert info["missing"] == ["top_k_renorm_prob"]
    assert "lacks top_k_renorm_prob" in info["problems"][0]
    assert info["ops"]["top_p_renorm_prob"] == "fake_rocm_sgl_kernel.top_p_renorm_prob"
    gone = probe_library(KernelLibrary("x", "definitely_not_installed_mod", {"top_k_renorm_prob": ("a",)}))
    assert not gone["importable"] and "not installed" in gone["error"]
