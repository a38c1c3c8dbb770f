"""aiter-style signature: top_k_renorm_probs(probs, maybe_top_k_arr, top_k_val)."""
from kit.check.sampling import top_k_renorm_prob as _ref
from kit.check.sampling import top_k_top_p_sampling_from_probs  # noqa: F401

CALLS = []


def top_k_renorm_probs(probs, maybe_top_k_arr, top_k_val):
    CALLS.append((maybe_top_k_arr is not None, top_k_val))
    return _ref(probs, maybe_top_k_arr.long() if maybe_top_k_arr is not None else top_k_val)
