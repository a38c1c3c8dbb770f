"""Tensor-parallel points: one in-process point measured with the model sharded over N ranks.

How (the parent side; each rank runs :mod:`kit.measure.tp_worker`):

- **The model**: transformers' own tensor-parallel plan, ``from_pretrained(path, tp_plan="auto")`` under
  ``torch.distributed`` (attention heads and MLP columns split over the ranks, all-reduce after each block; the
  KV cache of a rank holds its heads only). A local checkpoint is loaded as is. A preset (random weights) is
  first written as a local checkpoint (:func:`tp_checkpoint`: built on CPU with the sweep's seed, saved once
  under the kit's cache directory), so TP and single-process points measure the same weights.
- **The ranks**: :func:`kit.measure.ranks.run_ranks` starts N ranks through torchrun for each point (own process
  group, gloo on CPU, nccl/RCCL on GPUs; a rank that dies ends the point with its message; a timeout or Ctrl-C
  stops every rank). The model is loaded once per point (for a large model: its load time per point).
- **The row**: every rank runs every prefill and decode step (the collectives inside each forward keep them in
  lock step) and times each with the device synchronised; per step the slowest rank's time is kept (all-reduce
  MAX), KV bytes are summed over ranks, weight bytes are each rank's local shards summed plus the tensors every
  rank holds whole once (the single-process figure; :func:`kit.models.shard_bytes`), peak memory is the largest
  rank's. Rank 0 writes the record; the grid stores it with ``tp = n_gpus = N``.
- **Out of memory** on any rank: that rank writes ``oom-rank<r>.txt`` before it exits, and the parent raises
  ``torch.OutOfMemoryError`` so the grid records the point as ``oom``; any other failure is a ``RankError``
  recorded as ``error`` with the failing rank's message.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kit import dtypes, models
from kit._io import atomic_write_text, cache_dir
from kit.grid import oom_error_type
from kit.measure.engine import Forward, PointConfig, new_cache, prefill
from kit.measure.ranks import RankError, run_ranks

WORKER = "kit.measure.tp_worker"


def tp_checkpoint(model: str, dtype: str, seed: int = 0, root: str | Path | None = None) -> Path:
    """The local checkpoint directory a TP point loads: ``model`` itself when it is a checkpoint directory, else
    the preset built with random weights (``seed``) in ``dtype`` and saved (once) under
    ``root`` (default ``<kit cache dir>/tp-checkpoints``). A preset of B parameters takes B x bytes-per-element
    on disk and in CPU memory while it is written.

    Raises:
        UserError: unknown preset (:func:`kit.models.get_config`).
    """
    if models.is_checkpoint_dir(model):
        return Path(model)
    models.get_config(model)
    root = Path(root) if root else cache_dir() / "tp-checkpoints"
    dest = root / f"{model}-{dtypes.name_of(dtype)}-seed{seed}"
    if (dest / "config.json").exists() and any(dest.glob("*.safetensors")):
        return dest
    tmp = root / f".{dest.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    models.save_checkpoint(models.build_model(model, dtype, "cpu", seed), tmp)
    if dest.exists():  # a torn earlier write
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def last_step_logits(model, ids: torch.Tensor, device: str | torch.device = "cpu") -> torch.Tensor:
    """Logits (B x vocab, float32, on CPU) of one cached decode step: prefill ``ids[:, :-1]`` into a static cache,
    then decode ``ids[:, -1:]``. The same procedure on every rank of a TP run and in a single process, so the two
    can be compared (the TP equality test)."""
    B, L = ids.shape
    ids = ids.to(device)
    pos = torch.arange(L, device=device).unsqueeze(0).expand(B, -1)
    fwd, cache = Forward(model), new_cache(model, L)
    with torch.inference_mode():
        prefill(fwd, ids[:, :-1], pos, cache)
        return fwd(ids[:, -1:], pos[:, -1:], cache)[:, -1].float().cpu()


def _run(job: dict, nproc: int, work_dir: Path, timeout_s: float, threads: int | None) -> None:
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    atomic_write_text(work_dir / "job.json", json.dumps(job))
    env = {"OMP_NUM_THREADS": str(threads or max(1, (os.cpu_count() or 1) // nproc))}
    try:
        run_ranks(["-m", WORKER, str(work_dir / "job.json")], nproc, log_dir=work_dir / "logs",
                  timeout_s=timeout_s, env=env)  # fmt: skip
    except RankError as e:
        ooms = sorted(work_dir.glob("oom-rank*.txt"))
        if ooms:
            raise oom_error_type()(f"{ooms[0].stem}: {ooms[0].read_text().strip()[:300]}") from None
        raise RankError(str(e)) from None


@dataclass(frozen=True)
class TPRanks:
    """How the ranks of a tensor-parallel point run.

    Attributes:
        tp: ranks (the model is sharded over them). threads: CPU torch threads per rank (None: cores / tp).
        timeout_s: the whole point's limit (load + measure), s. seed: the seed of the measured inputs.
        trust_remote_code: let the checkpoint's own Python code run (``auto_map`` in config.json).
    """

    tp: int
    threads: int | None = None
    timeout_s: float = 1800.0
    seed: int = 0
    trust_remote_code: bool = False


def run_tp_point(checkpoint: str | Path, dtype: str, point: PointConfig, work_dir: str | Path, ranks: TPRanks) -> dict:
    """Measure ``point`` with the model of ``checkpoint`` sharded over ``ranks.tp`` ranks; return rank 0's record.

    Args:
        checkpoint: a local checkpoint directory (:func:`tp_checkpoint` writes one for a preset).
        work_dir: the point's job file and rank logs (emptied first).
        ranks: how many ranks and how they run (:class:`TPRanks`).

    Raises:
            torch.OutOfMemoryError: a rank ran out of memory. RankError: a rank failed (named, with its message),
            hung past ``timeout_s``. KeyboardInterrupt: after every rank is stopped.
    """
    work_dir = Path(work_dir)
    job = {"mode": "point", "checkpoint": str(checkpoint), "dtype": dtypes.name_of(dtype), "point": asdict(point),
           "seed": ranks.seed, "threads": ranks.threads, "trust_remote_code": ranks.trust_remote_code}  # fmt: skip
    _run(job, ranks.tp, work_dir, ranks.timeout_s, ranks.threads)
    return json.loads((work_dir / "result.json").read_text())


def tp_logits(checkpoint: str | Path, dtype: str, ids: torch.Tensor, tp: int, work_dir: str | Path) -> torch.Tensor:
    """:func:`last_step_logits` of ``ids`` (B x L token ids) computed by ``tp`` ranks (rank 0's, B x vocab).

    Raises:
        RankError: a rank failed."""
    work_dir = Path(work_dir)
    job = {"mode": "logits", "checkpoint": str(checkpoint), "dtype": dtypes.name_of(dtype), "ids": ids.tolist()}
    _run(job, tp, work_dir, 600.0, None)
    return torch.load(work_dir / "logits.pt")
