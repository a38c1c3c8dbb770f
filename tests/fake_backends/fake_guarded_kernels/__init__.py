"""An import guard that left None behind: `try: from ._C import top_k_renorm_prob except ImportError: ... = None`."""
try:
    from ._missing_extension import top_k_renorm_prob  # noqa: F401  (does not exist)
except ImportError:
    top_k_renorm_prob = None
