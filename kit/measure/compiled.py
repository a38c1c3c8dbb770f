"""Compiled decode: one point's decode step through ``torch.compile`` over the static cache.

On a GPU (CUDA or ROCm) the step is compiled with ``mode="reduce-overhead"``, which captures it as a CUDA/HIP
graph (one launch per step instead of one per kernel; PyTorch docs, "torch.compile", mode); on CPU with the
default mode (inductor's C++/OpenMP kernels; no graphs exist there). The shape is fixed per point: token ids and
positions are copied into buffers of B x 1 allocated once, the cache is one ``StaticCache`` whose buffers
transformers marks as static addresses, and ``dynamic=False``, so the timed steps replay one graph and never
recompile. Whether they did is counted from dynamo's own counters (:func:`dynamo_compiles`); a point that
recompiled inside its timed steps carries ``x_recompiles_timed > 0`` and is flagged
(:data:`kit.results.PROBLEM_FLAGS`). Prefill stays eager (its shape changes with the context). A row says how its
decode steps ran in ``x_engine_mode``: ``eager``, ``compiled`` (CPU) or ``compiled+graphs`` (GPU).
"""

from __future__ import annotations

import torch


def compile_mode(device: str | torch.device) -> tuple[str, str]:
    """``(torch.compile mode, engine mode)`` for ``device``: ``("reduce-overhead", "compiled+graphs")`` on a GPU
    (CUDA/HIP graphs), ``("default", "compiled")`` on CPU."""
    if torch.device(device).type == "cuda":
        return "reduce-overhead", "compiled+graphs"
    return "default", "compiled"


def dynamo_compiles() -> int:
    """Frames dynamo has compiled in this process so far (``torch._dynamo.utils.counters["frames"]["total"]``):
    a rise across timed steps is a recompilation inside the timed region."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


class CompiledDecode:
    """A decode step ``(ids B x 1, positions B x 1, cache) -> logits B x 1 x vocab`` compiled for one point.

    Construction resets dynamo (each point compiles its own shape; a run of many points never reaches dynamo's
    recompile limit, past which it silently runs eagerly). The first call compiles (seconds on CPU per graph,
    cached on disk by inductor for the same shapes); callers time it apart from the measured steps.

    Args:
        fwd: a :class:`kit.measure.engine.Forward`.
        batch: B, fixed for the point.
        device: where the model lives (chooses the mode: :func:`compile_mode`).
        backend: torch.compile backend ("inductor"; "eager" traces with dynamo only).
    """

    def __init__(self, fwd, batch: int, device: str | torch.device, backend: str = "inductor"):
        torch._dynamo.reset()
        self.mode, self.engine_mode = compile_mode(device)
        if backend != "inductor":
            self.mode, self.engine_mode = "default", "compiled"  # graphs are inductor's
        self.graphs = self.engine_mode == "compiled+graphs"
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.fn = torch.compile(fwd.__call__, mode=self.mode, dynamic=False, backend=backend)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        self.ids.copy_(ids)
        self.pos.copy_(positions)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs may be overwritten now
        return self.fn(self.ids, self.pos, cache)
