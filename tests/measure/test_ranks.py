"""kit.measure.ranks: real torchrun ranks (gloo on this CPU) — a run that works, a rank that dies, a rank that
hangs; every failure ends inside its timeout with the failing rank named and no process left behind."""

import time

import psutil
import pytest

from kit.errors import UserError
from kit.measure.ranks import RankError, Rendezvous, run_ranks, torchrun_argv

WORKER = """
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
x = torch.ones(4) * (r + 1)
dist.all_reduce(x)
print("rank", r, "sum", x[0].item(), flush=True)
if sys.argv[1] == "die" and r == 1:
    raise SystemExit("rank 1 gives up: simulated failure")
if sys.argv[1] == "hang" and r == 1:
    time.sleep(600)
dist.barrier()
dist.destroy_process_group()
"""

pytestmark = pytest.mark.slow


@pytest.fixture
def worker(tmp_path):
    p = tmp_path / "worker.py"
    p.write_text(WORKER)
    return p


def _left_behind(marker: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_two_ranks_all_reduce(worker, tmp_path):
    run = run_ranks([str(worker), "ok"], 2, log_dir=tmp_path / "logs", timeout_s=120)
    logs = run.rank_logs()
    assert run.returncode == 0 and sorted(logs) == [0, 1]
    assert all("sum 3.0" in logs[r] for r in (0, 1))  # 1 + 2 on both ranks


def test_a_dead_rank_is_named_and_ends_the_run(worker, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankError, match=r"rank 1 failed: rank 1 gives up: simulated failure"):
        run_ranks([str(worker), "die"], 2, log_dir=tmp_path / "logs", timeout_s=120)
    assert time.monotonic() - t0 < 60 and not _left_behind(str(worker))


def test_a_hung_rank_is_stopped_at_the_timeout_with_every_process(worker, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankError, match="did not finish within 12 s"):
        run_ranks([str(worker), "hang"], 2, log_dir=tmp_path / "logs", timeout_s=12)
    assert time.monotonic() - t0 < 40
    time.sleep(0.5)
    assert not _left_behind(str(worker))


def test_bad_launch_settings_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="nproc=0"):
        torchrun_argv(["x.py"], 0, log_dir=tmp_path)
    with pytest.raises(UserError, match="rdzv_endpoint"):
        torchrun_argv(["x.py"], 2, log_dir=tmp_path, rdzv=Rendezvous(nnodes=2))
    with pytest.raises(UserError, match="node_rank=2"):
        torchrun_argv(["x.py"], 2, log_dir=tmp_path, rdzv=Rendezvous(nnodes=2, node_rank=2, rdzv_endpoint="h:1"))
