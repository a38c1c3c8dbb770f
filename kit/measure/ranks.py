"""Starting ``torch.distributed`` ranks through torchrun, the one way the kit runs multi-process work (collective
probes, tensor-parallel sweeps), with the guarantees a long measurement needs:

- the ranks run in their own process group, so a timeout or a Ctrl-C stops every one of them (torchrun's agent,
  its workers and their children) — no orphan keeps a GPU or a port;
- a rank that dies ends the run with a :class:`RankError` naming that rank and the last lines it wrote, never a
  hang: torchrun stops the others (``--max-restarts 0``) and the kit bounds the whole run by ``timeout_s``;
- a rendezvous that never completes (a node that never joins) ends within ``join_timeout_s`` with an error that
  says so.

Single node: ``--nproc N`` local ranks over a c10d rendezvous on 127.0.0.1 and a free port. Multi-node: the same
command on every node with ``nnodes``, ``node_rank`` and one ``rdzv_endpoint`` (``host:port`` of node 0), as
torchrun documents (PyTorch docs, "torchrun (Elastic Launch)"). Backends: gloo on CPU, nccl on CUDA and on ROCm
(PyTorch's ROCm build names RCCL ``nccl`` too); the worker chooses with :func:`default_backend`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kit._io import free_port
from kit.errors import KitError, UserError


class RankError(KitError, RuntimeError):
    """A multi-process run failed: a rank exited with an error, was killed, or the rendezvous never completed."""


def default_backend() -> str:
    """``nccl`` when this torch build sees a GPU (CUDA, or ROCm where it means RCCL), else ``gloo``."""
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


#: the most gloo (CPU) ranks per usable core the kit starts on one node (each is a Python process with torch
#: loaded, ~0.25 GB; more only oversubscribe the cores); 8 at least on any machine
MAX_CPU_RANKS_PER_CORE = 4


def check_local_ranks(n: int, name: str, backend: str) -> None:
    """Refuse ``n`` ranks on this node when it cannot run them: nccl (CUDA, or RCCL on ROCm) one rank per visible
    GPU; gloo at most :data:`MAX_CPU_RANKS_PER_CORE` per core this process may use (``sched_getaffinity``), 8 at
    least. Checked before any rank starts (``kit comm --nproc``, ``kit sweep --tp``, ``kit bench --tp``), so a
    typo never starts a thousand torchrun workers.

    Args:
        name: the setting, as the message names it (``"nproc"``, ``"tp"``; the command line shows its option).

    Raises:
        UserError: ``name=n`` is more than this node runs, with the limit and why.
    """
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count()
        if n > gpus:
            raise UserError(f"{name}={n}: nccl runs one rank per GPU and {gpus} GPU(s) are visible here")
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    top = max(8, MAX_CPU_RANKS_PER_CORE * cores)
    if n > top:
        raise UserError(
            f"{name}={n}: at most {top} gloo ranks on this node's {cores} usable core(s) "
            f"({MAX_CPU_RANKS_PER_CORE} per core, 8 at least); more only oversubscribe it"
        )


@dataclass
class RankRun:
    """A finished multi-process run: torchrun's exit code and output, and each local rank's log."""

    returncode: int
    stdout: str
    stderr: str
    log_dir: Path

    def rank_logs(self) -> dict[int, str]:
        """Local rank → its stdout then its stderr (torchrun writes them under ``log_dir``)."""
        out: dict[int, str] = {}
        for f in sorted(self.log_dir.rglob("std*.log"), key=lambda f: (f.parent.name, f.name != "stdout.log")):
            try:
                rank = int(f.parent.name)
            except ValueError:
                continue
            out[rank] = out.get(rank, "") + f.read_text(errors="replace")
        return out


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of a run meet (torchrun's c10d rendezvous).

    Attributes:
        nnodes: nodes in the run (the same command runs on each). node_rank: this node's index, in [0, nnodes).
        rdzv_endpoint: ``host:port`` of node 0, the same on every node; None: one node, 127.0.0.1 and a free port.
        join_timeout_s: how long the rendezvous waits for every node, s.
    """

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    join_timeout_s: float = 60.0


def torchrun_argv(target: list[str], nproc: int, *, log_dir: Path, rdzv: Rendezvous = Rendezvous()) -> list[str]:
    """The torchrun command line for ``target`` (``["-m", "module", args...]`` or ``["script.py", args...]``) on
    ``nproc`` ranks per node.

    Raises:
        UserError: ``nproc`` or ``nnodes`` < 1, ``node_rank`` outside [0, nnodes), or several nodes without an
            ``rdzv_endpoint``.
    """
    nnodes, node_rank, rdzv_endpoint = rdzv.nnodes, rdzv.node_rank, rdzv.rdzv_endpoint
    for name, v in (("nproc", nproc), ("nnodes", nnodes)):
        if not isinstance(v, int) or v < 1:
            raise UserError(f"{name}={v!r} must be an integer >= 1")
    if not 0 <= node_rank < nnodes:
        raise UserError(f"node_rank={node_rank!r} must be in [0, {nnodes})")
    if nnodes > 1 and not rdzv_endpoint:
        raise UserError("several nodes need rdzv_endpoint='host:port' (node 0's address, the same on every node)")
    endpoint = rdzv_endpoint or f"127.0.0.1:{free_port()}"
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={nproc}", f"--nnodes={nnodes}", f"--node-rank={node_rank}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-conf=join_timeout={int(rdzv.join_timeout_s)}",
        "--max-restarts=0", "--monitor-interval=0.5", f"--log-dir={log_dir}", "--redirects=3", "--tee=3",
        *target,
    ]  # fmt: skip


def _stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the run's process group, then SIGKILL whatever is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)


def _tail(text: str, n: int = 12) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


#: words of an error that is a consequence of another rank's failure (its peer went away), not the cause
_PEER_GONE = ("connection closed", "connection reset", "broken pipe", "peer", "timed out", "watchdog")


#: lines a dying process prints after its real error (C++ runtime at exit, library warnings): never the cause
_EXIT_NOISE = ("terminate called", "Aborted", "[W", "Warning:", "warnings.warn")


def _last_error(text: str) -> str:
    """The last line of a rank's output that reads as an error (the exception line of a traceback, or a
    ``SystemExit`` message), skipping what a dying process prints after it (:data:`_EXIT_NOISE`)."""
    lines = [ln.split("]: ", 1)[-1].strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(_EXIT_NOISE)]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln or "error" in ln:
            return ln
    return lines[-1] if lines else ""


def _failure_text(run: RankRun, elapsed_s: float) -> str:
    """Which rank failed first and why: the first failed rank whose error is not a lost peer (the others usually
    fail *because* it did), with the last error line of every failed rank and the log location."""
    if "rendezvous" in run.stderr.lower() and "timeout" in run.stderr.lower():
        return (
            f"the rendezvous did not complete (not every node joined in time) after {elapsed_s:.1f} s; logs in "
            f"{run.log_dir}. Last output:\n{_tail(run.stderr)}"
        )
    errors = {r: _last_error(text) for r, text in sorted(run.rank_logs().items())}
    errors = {r: e for r, e in errors.items() if e}
    cause = next((r for r, e in errors.items() if not any(w in e.lower() for w in _PEER_GONE)), None)
    if cause is None and errors:
        cause = next(iter(errors))
    head = f"rank {cause} failed: {errors[cause]}" if cause is not None else "a rank failed"
    others = "; ".join(f"rank {r}: {e}" for r, e in errors.items() if r != cause)
    return (
        f"{head} (torchrun exit {run.returncode} after {elapsed_s:.1f} s"
        + (f"; then {others}" if others else "")
        + f"); logs in {run.log_dir}"
    )


def run_ranks(
    target: list[str],
    nproc: int,
    *,
    log_dir: str | Path,
    rdzv: Rendezvous = Rendezvous(),
    timeout_s: float = 600.0,
    env: dict | None = None,
    cwd: str | Path | None = None,
) -> RankRun:
    """Run ``target`` on ``nproc`` local ranks (per node) through torchrun; return when every rank has finished.

    Args:
        target: what each rank runs: ``["-m", "pkg.module", args...]`` or ``["script.py", args...]``.
        nproc: ranks per node.
        log_dir: where torchrun writes each rank's stdout/stderr (created).
        rdzv: the nodes and where they meet (:class:`Rendezvous`; default one node on 127.0.0.1).
        timeout_s: the whole run's limit, s; past it every process of the run is stopped.
        env: extra environment variables for the ranks. cwd: the ranks' working directory (default: this one).

    Returns:
        A :class:`RankRun` (exit code 0).

    Raises:
        RankError: a rank failed (the message names it and ends with its last output lines), the rendezvous did
            not complete, or the run passed ``timeout_s``.
        UserError: bad ``nproc`` / ``nnodes`` / ``node_rank`` (see :func:`torchrun_argv`).
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    argv = torchrun_argv(target, nproc, log_dir=log_dir, rdzv=rdzv)
    out_f, err_f = log_dir / "torchrun.out", log_dir / "torchrun.err"
    with open(out_f, "wb") as out, open(err_f, "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **(env or {})}, cwd=str(cwd) if cwd else None)  # fmt: skip
        t0 = time.monotonic()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            run = RankRun(-1, out_f.read_text(errors="replace"), err_f.read_text(errors="replace"), log_dir)
            raise RankError(
                f"{nproc} ranks did not finish within {timeout_s:g} s (a rank hung, or the rendezvous "
                f"never completed); stopped all of them. Last output:\n{_tail(run.stderr)}"
            ) from None
        except BaseException:  # Ctrl-C: no rank outlives the caller
            _stop_group(proc)
            raise
    run = RankRun(rc, out_f.read_text(errors="replace"), err_f.read_text(errors="replace"), log_dir)
    if rc != 0:
        raise RankError(_failure_text(run, time.monotonic() - t0))
    return run
