"""A library exposing the renorm ops under flashinfer-style names (delegating to the kit reference)."""
from kit.check.sampling import top_k_mask_logits  # noqa: F401
from kit.check.sampling import top_k_renorm_prob as top_k_renorm_probs  # noqa: F401
from kit.check.sampling import top_k_top_p_sampling_from_probs, sampling_from_probs  # noqa: F401
from kit.check.sampling import top_p_renorm_prob as top_p_renorm_probs  # noqa: F401

__version__ = "9.9-fake"
