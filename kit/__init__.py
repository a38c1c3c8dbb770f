"""kit: an exploration kit for LLM inference performance.

Subpackages by concern (``docs/architecture.md``): :mod:`kit.measure` (the one grid runner, the in-process engine
and sweep, calibration, torchrun ranks), :mod:`kit.serve` (OpenAI-compatible endpoints under load, launch recipes),
:mod:`kit.plan` (architecture specs, memory fit, roofline, cost), :mod:`kit.check` (reference sampling ops, kernel
resolver, check harness, fp8, doctor), :mod:`kit.view` (figures, analysis, panel, dashboard, notebooks). Top level:
cli, errors, metrics, results, store, dtypes, hardware, catalog, models, _io.
"""

__version__ = "0.1.0"
