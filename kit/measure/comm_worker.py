"""What each rank of ``kit comm`` runs (started by :func:`kit.measure.ranks.run_ranks` through torchrun):
``python -m kit.measure.comm_worker CONFIG.json``.

Per (collective, size): build the buffers, ``warmup`` untimed calls, a barrier, then ``iters`` timed calls, each
timed on its own (CUDA/HIP events on a GPU, ``time.perf_counter`` on the CPU, where gloo calls block); a call's
time is the slowest rank's (a MAX all-reduce of the samples). Rank 0 appends one JSON line per point to the rows
file as soon as the point is done, so a run that dies later keeps what finished. Sizes follow nccl-tests: ``S``
is the whole buffer (:func:`kit.metrics.busbw_factor`); send/recv is a ring (rank r sends S to r + 1).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from kit import dtypes, metrics


def _buffers(op: str, size: int, n: int, dt, dev):
    """(callable running the collective once, the size actually used in bytes)."""
    el = torch.empty((), dtype=dt).element_size()
    count = max(n, -(-size // (el * n)) * n)  # elements: a multiple of n, at least S bytes
    big, part = torch.ones(count, dtype=dt, device=dev), torch.ones(count // n, dtype=dt, device=dev)
    rank = dist.get_rank()
    if op == "all_reduce":
        fn = lambda: dist.all_reduce(big)  # noqa: E731
    elif op == "all_gather":
        fn = lambda: dist.all_gather_into_tensor(big, part)  # noqa: E731
    elif op == "reduce_scatter":
        fn = lambda: dist.reduce_scatter_tensor(part, big)  # noqa: E731
    elif op == "all_to_all":
        out = torch.empty_like(big)
        fn = lambda: dist.all_to_all_single(out, big)  # noqa: E731
    elif op == "broadcast":
        fn = lambda: dist.broadcast(big, src=0)  # noqa: E731
    elif op == "send_recv":
        recv = torch.empty_like(big)

        def fn():
            ops = [dist.P2POp(dist.isend, big, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
    else:
        raise ValueError(op)
    return fn, count * el


def _time(fn, gpu: bool) -> float:
    if gpu:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3  # ms -> µs
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def measure(op: str, size: int, cfg: dict, dev, gpu: bool) -> dict:
    """One point: latency percentiles (µs, slowest rank per call) and algbw / busbw (GB/s) at the median."""
    n = dist.get_world_size()
    fn, used = _buffers(op, size, n, dtypes.to_torch(cfg["dtype"]), dev)
    for _ in range(cfg["warmup"]):
        fn()
    if gpu:
        torch.cuda.synchronize()
    dist.barrier()
    samples = torch.tensor([_time(fn, gpu) for _ in range(cfg["iters"])], dtype=torch.float64)
    dist.all_reduce(samples, op=dist.ReduceOp.MAX)  # a call ends when its slowest rank ends
    pc = metrics.percentiles(samples.tolist(), (50, 99))
    alg, bus = metrics.bus_bandwidth_gb_s(op, used, pc["p50"] / 1e6, n)
    return {"op": op, "size_bytes": used, "lat_us_p50": pc["p50"], "lat_us_p99": pc["p99"], "n": pc["n"],
            "algbw_gb_s": alg, "busbw_gb_s": bus, "n_ranks": n}  # fmt: skip


def main(argv: list[str]) -> int:
    cfg = json.loads(open(argv[0]).read())
    backend = cfg.get("backend") or ("nccl" if torch.cuda.is_available() else "gloo")
    gpu = backend == "nccl"
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dev = torch.device("cuda") if gpu else torch.device("cpu")
    dist.init_process_group(backend)
    rank = dist.get_rank()
    if cfg.get("fail_rank") == rank:  # for the tests: a rank that dies after the rendezvous
        raise SystemExit(f"rank {rank} exits early (fail_rank)")
    out = open(cfg["rows_path"], "a") if rank == 0 else None
    for point in cfg["points"]:
        row = measure(point["op"], int(point["size_bytes"]), cfg, dev, gpu)
        if out is not None:
            row = {**point, **row, "requested_bytes": int(point["size_bytes"]), "backend": backend}
            out.write(json.dumps(row) + "\n")
            out.flush()
            os.fsync(out.fileno())
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
