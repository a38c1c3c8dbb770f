"""kit.check.stats: the χ² frequency check (S5) — a right sampler passes, a wrong one and impossible draws fail, bad
arguments are user errors, and the p-value matches known χ² quantiles."""

import pytest
import torch

from kit.check import sampling as S
from kit.check.stats import frequency_check
from kit.errors import UserError


def test_frequency_check_bad_arguments():
    with pytest.raises(ValueError, match="probs must be a 1-d"):
        frequency_check(S.sampling_from_probs, torch.rand(2, 3))
    with pytest.raises(ValueError, match="n_draws"):
        frequency_check(S.sampling_from_probs, torch.tensor([0.5, 0.5]), n_draws=0)
    with pytest.raises(ValueError, match="sampler must return ids of shape"):
        frequency_check(lambda p: p, torch.tensor([0.5, 0.5]), n_draws=10)
    with pytest.raises(UserError, match="alpha must be in"):
        frequency_check(S.sampling_from_probs, [0.5, 0.5], alpha=1.0)


def test_p_value_is_pearsons_chi_square_test():
    """The reported chi2 and p-value equal scipy.stats.chisquare on the same counts (a known quantile too)."""
    import scipy.stats

    fixed = torch.tensor([0] * 30 + [1] * 20 + [2] * 50)  # counts 30, 20, 50 against expected 25, 25, 50
    r = frequency_check(lambda p: fixed, [0.25, 0.25, 0.5], n_draws=100)
    ref = scipy.stats.chisquare([30, 20, 50], [25, 25, 50])
    assert r.chi2 == pytest.approx(ref.statistic) == pytest.approx(2.0) and r.dof == 2
    assert r.p_value == pytest.approx(ref.pvalue) == pytest.approx(0.36787944117144233)  # dof 2: exp(-chi2/2)


def test_s5_right_sampler_passes_wrong_one_and_impossible_draws_fail():
    probs = [0.25, 0.25, 0.5]
    g = torch.Generator().manual_seed(0)
    ok = frequency_check(lambda p: S.sampling_from_probs(p, generator=g), probs, n_draws=1000)
    assert ok.passed and ok.dof == 2 and sum(ok.counts) == 1000 and ok.expected == [250.0, 250.0, 500.0]
    assert "frequency check pass" in str(ok)
    uniform = frequency_check(lambda p: torch.randint(0, 3, (p.shape[0],), generator=g), probs, n_draws=1000)
    assert not uniform.passed and uniform.p_value < 1e-3 and uniform.impossible == 0
    zero = frequency_check(lambda p: torch.full((p.shape[0],), 2), [0.5, 0.5, 0.0], n_draws=50)
    assert not zero.passed and zero.impossible == 50 and "FAIL" in str(zero)
    single = frequency_check(lambda p: torch.zeros(p.shape[0], dtype=torch.long), [1.0, 0.0], n_draws=20)
    assert single.passed and single.dof == 0 and single.p_value == 1.0
