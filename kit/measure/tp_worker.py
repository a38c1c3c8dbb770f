"""One rank of a tensor-parallel point (started by :func:`kit.measure.tp.run_tp_point` through torchrun):
``python -m kit.measure.tp_worker JOB.json``. See :mod:`kit.measure.tp` for what it measures and how."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from kit import dtypes
from kit._io import atomic_write_text
from kit.grid import is_out_of_memory
from kit.measure.engine import PointConfig, point_record, time_point
from kit.measure.ranks import default_backend
from kit.measure.tp import last_step_logits
from kit.models import shard_bytes


def load_sharded(checkpoint: str, dtype: str, trust_remote_code: bool = False):
    """The checkpoint's causal LM with transformers' tensor-parallel plan over the initialised process group."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        checkpoint, tp_plan="auto", dtype=dtypes.to_torch(dtype), attn_implementation="sdpa",
        local_files_only=True, trust_remote_code=trust_remote_code,
    )  # fmt: skip
    return model.eval()


def _reduce(values: list[float], op, device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.cpu().tolist()


def across_ranks(raw: dict, device, weights: tuple[int, int]) -> dict:
    """``raw`` (:func:`kit.measure.engine.time_point`) with each step's time the slowest rank's (MAX), KV bytes
    summed over ranks, weight bytes the model's once (``weights`` is this rank's
    :func:`kit.models.shard_bytes`: local shards summed over ranks, plus the tensors every rank holds whole
    counted once — not each rank's global sizes summed, which counted the model ``tp`` times), peak memory the
    largest rank's and logits finite only if finite on every rank."""
    R = dist.ReduceOp
    n = len(raw["step_ms"])
    slow = _reduce(raw["step_ms"] + raw["prefill_ms"], R.MAX, device)
    kv, sharded = _reduce([raw["kv_bytes"], weights[0]], R.SUM, device)
    w = sharded + weights[1]
    (peak,) = _reduce([raw["peak_gb"]], R.MAX, device)
    (finite,) = _reduce([float(raw["finite"])], R.MIN, device)
    extras = {**raw["extras"], "x_step_ms_rank0": raw["step_ms"], "x_tp_ranks": dist.get_world_size()}
    return {**raw, "step_ms": slow[:n], "prefill_ms": slow[n:], "kv_bytes": int(kv), "weights_bytes": int(w),
            "peak_gb": peak, "finite": bool(finite), "extras": extras}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    job_path = Path((argv if argv is not None else sys.argv[1:])[0])
    job = json.loads(job_path.read_text())
    work = job_path.parent
    backend = default_backend()
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = f"cuda:{torch.cuda.current_device()}"
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    dist.init_process_group(backend)
    rank = dist.get_rank()
    try:
        model = load_sharded(job["checkpoint"], job["dtype"], job.get("trust_remote_code", False))
        if job["mode"] == "logits":
            logits = last_step_logits(model, torch.tensor(job["ids"]), device)
            if rank == 0:
                torch.save(logits, work / "logits.pt")
        else:
            raw = time_point(model, PointConfig(**job["point"]), device, job["seed"])
            rec = point_record(across_ranks(raw, device, shard_bytes(model)))
            if rank == 0:
                atomic_write_text(work / "result.json", json.dumps(rec))
        dist.barrier()
    except Exception as e:
        if is_out_of_memory(e):
            atomic_write_text(work / f"oom-rank{rank}.txt", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        raise
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
