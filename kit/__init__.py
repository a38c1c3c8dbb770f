"""kit: an exploration kit for LLM inference performance.

Modules (one concern each): hardware (devices), catalog (accelerators, prices), models (presets), engine (one
in-process point), sweep (grids, persistence), results (schema, storage), metrics (formulas), plots, cost,
specs (model architectures, weight/KV bytes), planner (memory fit, roofline), serving/loadgen/launch (endpoints),
sampling/resolver/checks/fp8/doctor (kernel and dtype sanity), ui (widgets), cli.
"""

__version__ = "0.1.0"
