"""A ROCm-like sgl_kernel build: has top_p_renorm_prob, lacks top_k_renorm_prob (case S1)."""
from kit.check.sampling import top_k_top_p_sampling_from_probs, top_p_renorm_prob  # noqa: F401

__version__ = "0.0-fake-rocm"
