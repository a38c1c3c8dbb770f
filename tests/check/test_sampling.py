"""kit.check.sampling: cases S1–S5 (eager and torch.compile, float32/float16/bfloat16), documented edge semantics, and
strict validation of every op's arguments."""

import pytest
import torch

from kit.check import sampling as S
from kit.check.harness import DEFAULT_TOL, compiled_call
from kit.check.stats import frequency_check

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MODES = ["eager", pytest.param("compile", marks=pytest.mark.compile)]

S1_PROBS = [
    [0.2499, 0.2592, 0.1085, 0.2718, 0.1106],
    [0.2205, 0.0942, 0.2912, 0.3452, 0.0489],
    [0.2522, 0.1602, 0.2346, 0.1532, 0.2000],
    [0.1543, 0.3182, 0.2062, 0.0958, 0.2255],
]
S1_TOPK3 = [
    [0.3201, 0.3319, 0, 0.3480, 0],
    [0.2573, 0, 0.3398, 0.4028, 0],
    [0.3672, 0, 0.3416, 0, 0.2912],
    [0, 0.4243, 0.2750, 0, 0.3007],
]
S1_TOPP03 = [[0, 0.4882, 0, 0.5118, 0], [0, 0, 0, 1, 0], [0.5181, 0, 0.4819, 0, 0], [0, 1, 0, 0, 0]]


def run(fn, mode, *args, **kwargs):
    return fn(*args, **kwargs) if mode == "eager" else compiled_call(fn, *args, **kwargs)


def per_dtype(x):
    """The same values in float32, float16 and bfloat16. Compiled tests pass all three to ONE function, so each
    case is one torch.compile graph covering every dtype (inductor compiles cost seconds each on CPU)."""
    return [torch.as_tensor(x, dtype=torch.float64).to(d) for d in DTYPES]


def close(out, expected, dtype, atol=1e-3):
    """The case's atol plus the dtype's rtol (inputs and outputs are rounded to the dtype)."""
    torch.testing.assert_close(
        out.float(),
        torch.tensor(expected, dtype=torch.float32),
        atol=atol,
        rtol=DEFAULT_TOL[str(dtype).removeprefix("torch.")][1],
    )


# ----------------------------------------------------------------------------------------------------------- S1
def _s1(ps, k, p):
    return [(S.top_k_renorm_prob(x, k), S.top_p_renorm_prob(x, p)) for x in ps]


@pytest.mark.parametrize("mode", MODES)
def test_s1_top_k_and_top_p_renorm(mode):
    outs = run(_s1, mode, per_dtype(S1_PROBS), torch.full((4,), 3), torch.full((4,), 0.3))
    for dtype, (out_k, out_p) in zip(DTYPES, outs):
        assert out_k.dtype == dtype and out_p.dtype == dtype
        close(out_k, S1_TOPK3, dtype)
        close(out_p, S1_TOPP03, dtype)


def test_s1_scalar_parameters_match_per_row():
    import numpy as np

    p = torch.tensor(S1_PROBS)
    close(S.top_k_renorm_prob(p, 3), S1_TOPK3, torch.float32)
    close(S.top_p_renorm_prob(p, 0.3), S1_TOPP03, torch.float32)
    close(S.top_k_renorm_prob(p, np.int64(3)), S1_TOPK3, torch.float32)  # numpy scalars are numbers too
    close(S.top_p_renorm_prob(p, np.float32(0.3)), S1_TOPP03, torch.float32)


# ----------------------------------------------------------------------------------------------------------- S2
S2_X = [[0.1, 0.6, 0.3], [0.2, 0.5, 0.3]]


def _s2(xs, k):
    return [S.top_k_renorm_prob(x, k) for x in xs]


def _s2_one_hot(p, u):
    return S.top_k_top_p_sampling_from_probs(p, 2**30, 1.0, uniform=u), S.top_k_renorm_prob(p, 2**30)


@pytest.mark.parametrize("mode", MODES)
def test_s2_k_zero_k_ge_vocab_mixed_k(mode):
    xs = per_dtype(S2_X)
    for ks, row2 in (([0, 2], [0, 0.625, 0.375]), ([3, 2], [0, 0.625, 0.375]), ([2**30, 1], [0, 1, 0])):
        outs = run(_s2, mode, xs, torch.tensor(ks))
        flipped = run(_s2, mode, [x.flip(0) for x in xs], torch.tensor(ks).flip(0))
        for dtype, out, fl in zip(DTYPES, outs, flipped):
            close(out, [S2_X[0], row2], dtype)
            torch.testing.assert_close(fl.flip(0), out)  # results do not depend on row order


@pytest.mark.parametrize("mode", MODES)
def test_s2_one_hot_row_always_yields_its_token(mode):
    p = torch.zeros(1, 32000)
    p[0, 1] = 1.0
    for u in (0.0, 0.3, 0.999999):
        ids, renormed = run(_s2_one_hot, mode, p, torch.tensor([u]))
        assert ids.tolist() == [1]
        assert renormed[0, 1].item() == 1.0


def test_s2_vocab_permutation_equivariant_with_ties():
    x = torch.tensor([[0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05]])
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    for fn, arg in ((S.top_k_renorm_prob, 2), (S.top_p_renorm_prob, 0.3), (S.min_p_renorm_prob, 0.9)):
        torch.testing.assert_close(fn(x[:, perm], arg), fn(x, arg)[:, perm])
    # ties at the pivot are all kept: k = 2 keeps the three 0.2 tokens
    torch.testing.assert_close(S.top_k_renorm_prob(x, 2), torch.tensor([[1 / 3] * 3 + [0.0] * 5]))


# ----------------------------------------------------------------------------------------------------------- S3
def _s3(ps):
    return [S.top_k_renorm_prob(x, 3) for x in ps]


@pytest.mark.parametrize("mode", MODES)
def test_s3_int_top_k_and_wrong_shape(mode):
    torch.manual_seed(42)
    p = torch.rand(2, 4)
    p /= p.sum(-1, keepdim=True)
    for dtype, out in zip(DTYPES, run(_s3, mode, [p.to(d) for d in DTYPES])):
        close(out, [[0.3201, 0.3319, 0, 0.3480], [0.2187, 0.3366, 0, 0.4446]], dtype)
    with pytest.raises(ValueError, match=r"top_k .*shape \(batch,\).*\(2, 4\)"):
        run(S.top_k_renorm_prob, mode, p, torch.full((2, 4), 3))


# every per-row parameter of every op refuses a (batch, vocab) tensor — the whole kind of fault, not one op
PER_ROW = [
    (S.top_k_renorm_prob, "top_k", torch.long),
    (S.top_k_mask_logits, "top_k", torch.long),
    (S.top_p_renorm_prob, "top_p", torch.float32),
    (S.min_p_renorm_prob, "min_p", torch.float32),
    (S.apply_temperature, "temperature", torch.float32),
    (S.softmax_with_temperature, "temperature", torch.float32),
]


@pytest.mark.parametrize("fn,name,dt", PER_ROW, ids=[f"{f.__name__}-{n}" for f, n, _ in PER_ROW])
def test_s3_kind_every_per_row_parameter_rejects_matrix(fn, name, dt):
    x = torch.rand(2, 4)
    with pytest.raises(ValueError, match=rf"{name} must be a scalar or a tensor of shape \(batch,\)"):
        fn(x, torch.ones(2, 4, dtype=dt))
    with pytest.raises(ValueError, match=name):
        fn(x, torch.ones(3, dtype=dt))  # wrong batch
    fn(x, torch.ones((), dtype=dt))  # 0-d is a scalar: fine


@pytest.mark.parametrize("kw", ["top_k", "top_p", "uniform"])
def test_s3_kind_sampler_parameters_reject_matrix(kw):
    x = torch.rand(2, 4)
    bad = {"top_k": torch.ones(2, 4, dtype=torch.long), "top_p": torch.ones(2, 4), "uniform": torch.rand(2, 4)}[kw]
    with pytest.raises(ValueError, match=kw):
        S.top_k_top_p_sampling_from_probs(x, **{kw: bad})


# ----------------------------------------------------------------------------------------------------------- S4
def _s4(xs, lgs, mp_hi, mp_lo, t):
    return [
        (S.min_p_renorm_prob(x, mp_hi), S.min_p_renorm_prob(x, mp_lo), S.softmax_with_temperature(lg, t))
        for x, lg in zip(xs, lgs)
    ]


@pytest.mark.parametrize("mode", MODES)
def test_s4_min_p_and_temperature_once(mode):
    outs = run(
        _s4,
        mode,
        per_dtype([[0.9, 0, 0, 0.1]]),
        per_dtype([[2.0, 1.0, 0.0]]),
        torch.tensor([0.8]),
        torch.tensor([0.05]),
        torch.tensor([2.0]),
    )
    twice = torch.softmax(torch.tensor([[2.0, 1.0, 0.0]]) / 4, -1)
    for dtype, (hi, lo, probs) in zip(DTYPES, outs):
        close(hi, [[1, 0, 0, 0]], dtype)
        close(lo, [[0.9, 0, 0, 0.1]], dtype)
        close(probs, [[0.5065, 0.3072, 0.1863]], dtype)
        assert not torch.allclose(probs.float(), twice, atol=1e-2)  # [.4192, .3265, .2543]: T applied twice


def test_s4_apply_temperature_then_softmax_is_the_same_single_division():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    once = torch.softmax(S.apply_temperature(logits, 2.0), -1)
    torch.testing.assert_close(once, S.softmax_with_temperature(logits, 2.0))


# ----------------------------------------------------------------------------------------------------------- S5
def _s5(ps, k, tp, u):
    return [(S.top_k_top_p_sampling_from_probs(x, k, tp, uniform=u), S.top_k_renorm_prob(x, k)) for x in ps]


@pytest.mark.compile
def test_s5_same_explicit_noise_same_ids_in_eager_and_compiled():
    g = torch.Generator().manual_seed(1)
    p = torch.rand(16, 50, generator=g)
    k = torch.randint(0, 50, (16,), generator=g)
    tp = torch.rand(16, generator=g)
    u = torch.rand(16, generator=g)
    args = ([p.to(d) for d in DTYPES], k, tp, u)
    for dtype, (ids_e, pr_e), (ids_c, pr_c) in zip(DTYPES, _s5(*args), compiled_call(_s5, *args)):
        assert torch.equal(ids_e, ids_c), dtype
        # compare renormalised probabilities (never ids drawn from a generator)
        torch.testing.assert_close(pr_c, pr_e)


def _sample_eager(probs):
    return S.sampling_from_probs(probs, generator=torch.Generator().manual_seed(7))


def _sample_global_rng(probs):
    return S.sampling_from_probs(probs)


@pytest.mark.parametrize("mode", MODES)
def test_s5_sampled_frequencies_pass_chi_square(mode):
    probs = torch.tensor([0.25, 0.25, 0.5])
    if mode == "eager":
        res = frequency_check(_sample_eager, probs, n_draws=1000)
    else:
        torch.manual_seed(3)
        res = frequency_check(lambda p: compiled_call(_sample_global_rng, p), probs, n_draws=1000)
    assert res.passed, str(res)
    assert sum(res.counts) == 1000 and res.dof == 2


def test_s5_frequency_check_catches_a_biased_sampler():
    def biased(probs):  # ignores the given distribution
        return S.sampling_from_probs(
            torch.tensor([[0.5, 0.25, 0.25]]).expand_as(probs).contiguous(), generator=torch.Generator().manual_seed(0)
        )

    res = frequency_check(biased, torch.tensor([0.25, 0.25, 0.5]), n_draws=1000)
    assert not res.passed and res.p_value < 1e-6

    def impossible(probs):
        return torch.zeros(probs.shape[0], dtype=torch.long)

    res = frequency_check(impossible, torch.tensor([0.0, 0.5, 0.5]), n_draws=100)
    assert res.impossible == 100 and not res.passed


# ----------------------------------------------------------------------------------------------- documented edges
def test_edge_semantics():
    nan = float("nan")
    bad = torch.tensor([[nan, 0.5, 0.5], [0, 0, 0], [float("inf"), 1, 0], [0.2, 0.3, 0.5]])
    for fn, arg in ((S.top_k_renorm_prob, 2), (S.top_p_renorm_prob, 0.5), (S.min_p_renorm_prob, 0.1)):
        out = fn(bad, arg)
        assert torch.isnan(out[0]).all() and torch.isnan(out[2]).all()  # NaN/inf rows → all NaN
        assert torch.equal(out[1], torch.zeros(3))  # all-zero rows → zeros, no division by zero
    ids = S.sampling_from_probs(bad, uniform=torch.full((4,), 0.5))
    assert ids.tolist()[:3] == [-1, -1, -1] and ids[3].item() == 2
    # p = 0 keeps only the top token; p = 1 keeps all; min_p = 1 keeps the max
    x = torch.tensor([[0.1, 0.6, 0.3]])
    assert S.top_p_renorm_prob(x, 0.0).tolist() == [[0, 1, 0]]
    torch.testing.assert_close(S.top_p_renorm_prob(x, 1.0), x)
    assert S.min_p_renorm_prob(x, 1.0).tolist() == [[0, 1, 0]]
    # the token whose mass crosses p is kept
    torch.testing.assert_close(S.top_p_renorm_prob(x, 0.61), torch.tensor([[0, 0.6667, 0.3333]]), atol=1e-4, rtol=0)
    # logits: all -inf stays all -inf; NaN row → NaN; softmax of all -inf is NaN
    ninf = float("-inf")
    lg = torch.tensor([[ninf, ninf, ninf], [1.0, nan, 0.0], [3.0, 1.0, 2.0]])
    m = S.top_k_mask_logits(lg, 1)
    assert torch.isinf(m[0]).all() and torch.isnan(m[1]).all() and m[2].tolist() == [3.0, ninf, ninf]
    assert torch.isnan(S.softmax_with_temperature(lg[:1], 1.0)).all()
    # zero-probability tokens are never sampled, whatever the noise
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).expand(5, -1).contiguous()
    u = torch.tensor([0.0, 0.25, 0.5, 0.75, 0.99999994])
    assert set(S.sampling_from_probs(p, uniform=u).tolist()) <= {1, 3}


def test_sampling_with_generator_is_reproducible():
    p = torch.rand(8, 20)
    a = S.top_k_top_p_sampling_from_probs(p, 5, 0.9, generator=torch.Generator().manual_seed(5))
    b = S.top_k_top_p_sampling_from_probs(p, 5, 0.9, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.dtype == torch.int64 and a.shape == (8,)


# ----------------------------------------------------------------------------------------------------- validation
X = torch.rand(2, 5)
U = torch.rand(2)
BAD = [
    # (op, args, kwargs, message pattern)
    (S.top_k_renorm_prob, ([[0.5, 0.5]], 1), {}, r"probs must be a torch\.Tensor"),
    (S.top_k_renorm_prob, (torch.rand(5), 1), {}, r"probs must have shape \(batch, vocab\)"),
    (S.top_k_renorm_prob, (torch.ones(2, 5, dtype=torch.long), 1), {}, r"probs must be a floating tensor"),
    (S.top_k_renorm_prob, (X, -1), {}, r"top_k=-1 is out of range; allowed: integers ≥ 0"),
    (S.top_k_renorm_prob, (X, 2.5), {}, r"top_k must be .*int"),
    (S.top_k_renorm_prob, (X, True), {}, r"top_k must be"),
    (S.top_k_renorm_prob, (X, torch.tensor([1.0, 2.0])), {}, r"top_k must be an integer tensor"),
    (S.top_k_renorm_prob, (X, torch.tensor([1, -3])), {}, r"top_k\[1\]=-3 is out of range"),
    (S.top_p_renorm_prob, (X, 1.5), {}, r"top_p=1\.5 is out of range; allowed: floats in \[0, 1\]"),
    (S.top_p_renorm_prob, (X, -0.1), {}, r"top_p=-0\.1 is out of range"),
    (S.top_p_renorm_prob, (X, float("nan")), {}, r"top_p=nan is out of range"),
    (S.top_p_renorm_prob, (X, torch.tensor([0.5, 2.0])), {}, r"top_p\[1\]=2\.0 is out of range"),
    (S.top_p_renorm_prob, (X, torch.tensor([1, 1])), {}, r"top_p must be a floating tensor"),
    (S.top_p_renorm_prob, (X, "0.5"), {}, r"top_p must be a probability"),
    (S.top_p_renorm_prob, (X.int(), 0.5), {}, r"probs must be a floating tensor"),
    (S.min_p_renorm_prob, (X, 2), {}, r"min_p=2 is out of range"),
    (S.min_p_renorm_prob, (X, torch.rand(2, 5)), {}, r"min_p must be a scalar or a tensor of shape \(batch,\)"),
    (S.top_k_mask_logits, (X, -2), {}, r"top_k=-2 is out of range"),
    (S.top_k_mask_logits, (torch.zeros(2, 0), 1), {}, r"logits must have vocab ≥ 1"),
    (S.apply_temperature, (X, 0.0), {}, r"temperature=0\.0 is out of range; allowed: finite floats > 0"),
    (S.softmax_with_temperature, (X, -1.0), {}, r"temperature=-1\.0 is out of range"),
    (S.softmax_with_temperature, (X, float("inf")), {}, r"temperature=inf is out of range"),
    (S.softmax_with_temperature, (X, torch.tensor([1.0, 0.0])), {}, r"temperature\[1\]=0\.0 is out of range"),
    (S.sampling_from_probs, (X,), {"uniform": torch.rand(3)}, r"uniform must be a floating tensor of shape"),
    (S.sampling_from_probs, (X,), {"uniform": torch.tensor([0.5, 1.0])}, r"uniform\[1\]=1\.0 is out of range"),
    (S.sampling_from_probs, (X,), {"uniform": torch.tensor([1, 0])}, r"uniform must be a floating tensor"),
    (S.sampling_from_probs, (X,), {"uniform": U, "generator": torch.Generator()}, r"either uniform .* or generator"),
    (S.top_k_top_p_sampling_from_probs, (X, 1, 1.1), {}, r"top_p=1\.1 is out of range"),
    (S.top_k_top_p_sampling_from_probs, (X, -1, 0.5), {}, r"top_k=-1 is out of range"),
    (S.top_k_top_p_sampling_from_probs, (torch.rand(2, 3, 4), 1, 0.5), {}, r"probs must have shape"),
]


@pytest.mark.parametrize("fn,args,kwargs,pattern", BAD, ids=[f"{i}-{b[0].__name__}" for i, b in enumerate(BAD)])
def test_bad_input_raises_value_error_naming_argument(fn, args, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        fn(*args, **kwargs)
