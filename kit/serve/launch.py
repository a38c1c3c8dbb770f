"""Launch recipes for the inference servers :mod:`kit.serve.sweep` benchmarks: vLLM and SGLang on ROCm (MI355X,
MI300X) and CUDA (B300, B200, H200), and ``transformers serve`` (runs on CPU); and :class:`Server`, the kit's one
process launcher and readiness wait (inference servers, the dashboard's Voila).

A recipe is data first: :func:`build_command` turns a :class:`LaunchSpec` into ``(argv, env)``, which
:func:`shell_line` prints for a job script, and :class:`Server` starts in its own process group with its
output in a log file, waits for readiness (``/health``, then ``/v1/models``; or any path, or just an open port)
with a timeout, and stops by process group (SIGTERM, then SIGKILL), so no worker process outlives it. ("Server"
here is vLLM, SGLang or transformers serve; the kit's in-process measurement engine is :mod:`kit.measure.engine`.)

Vendor environment variables (:func:`vendor_env`) are defaults a user can override with ``LaunchSpec.env``;
each has a reason beside it. Sources (read, not copied): the vLLM and SGLang server-argument docs, AMD's
ROCm vLLM/SGLang benchmark guides for MI300X/MI355X, InferenceX launch scripts. Flags follow vLLM >= 0.11
(multi-node without Ray: ``--nnodes/--node-rank/--master-addr/--master-port``, ``--headless`` on the other
nodes) and SGLang >= 0.4 (``--tp-size/--ep-size/--nnodes/--node-rank/--dist-init-addr``).
"""
from __future__ import annotations

import atexit
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kit import dtypes
from kit.errors import InputNotFoundError, ServerError, ServerTimeoutError, UserError

#: the inference servers a :class:`LaunchSpec` can start
SERVERS = ("vllm", "sglang", "transformers")
#: accelerator → platform the recipes target
ACCELERATORS: dict[str, str] = {"MI355X": "rocm", "MI300X": "rocm", "B300": "cuda", "B200": "cuda",
                                "H200": "cuda", "CPU": "cpu"}
DTYPES = ("auto", *dtypes.MODEL_DTYPES)
#: KV-cache block (page) size, tokens, the transformers recipe uses when it sizes the cache
TRANSFORMERS_CB_BLOCK = 32


@dataclass
class LaunchSpec:
    """What to serve and how.

    Attributes:
        server: ``vllm`` | ``sglang`` | ``transformers`` (:data:`SERVERS`).
        model: checkpoint directory or model id.
        accelerator: ``MI355X`` | ``MI300X`` | ``B300`` | ``B200`` | ``H200`` | ``CPU``.
        tp: tensor-parallel size per model replica; ep: expert-parallel size (MoE; vLLM turns EP on over the
            TP×DP group, SGLang takes the size); dp: data-parallel replicas.
        dtype: activation/weight dtype (``auto`` derives it from the checkpoint).
        quantization: e.g. ``fp8``, ``mxfp4``, ``modelopt_fp4`` (passed through); kv_cache_dtype: e.g. ``fp8``.
        max_model_len: context length cap (tokens); max_num_seqs: concurrent sequences cap; max_batch_tokens:
            tokens per scheduler step (vLLM ``--max-num-batched-tokens``, SGLang ``--chunked-prefill-size``,
            transformers ``--cb-max-batch-tokens``). For ``transformers serve`` give max_model_len and
            max_num_seqs: its KV cache is then sized to them (its default on CPU is large and makes the first
            request take many seconds).
        nnodes, node_rank, master_addr, master_port: multi-node: the same spec runs on every node with its
            ``node_rank``; ``master_addr`` is node 0's address.
        env: extra/overriding environment variables; extra_args: appended verbatim.
    """

    server: str
    model: str
    accelerator: str = "CPU"
    tp: int = 1
    ep: int = 1
    dp: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_batch_tokens: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 29500
    served_model_name: str | None = None
    trust_remote_code: bool = False
    continuous_batching: bool = True
    env: dict = field(default_factory=dict)
    extra_args: list = field(default_factory=list)

    def validate(self) -> LaunchSpec:
        """Check the combination; returns self.

        Raises:
            UserError: naming the bad field and value, and what is allowed.
        """
        if self.server not in SERVERS:
            raise UserError(f"server={self.server!r}; allowed: {SERVERS}")
        if self.accelerator not in ACCELERATORS:
            raise UserError(f"accelerator={self.accelerator!r}; allowed: {sorted(ACCELERATORS)}")
        if self.server in ("vllm", "sglang") and ACCELERATORS[self.accelerator] == "cpu":
            raise UserError(f"server={self.server!r} recipes target GPUs (ROCm or CUDA), not accelerator='CPU'; "
                            "use server='transformers' on CPU")
        for name in ("tp", "ep", "dp", "nnodes"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"{name}={getattr(self, name)}; must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise UserError(f"node_rank={self.node_rank}; must be in [0, nnodes={self.nnodes})")
        if self.nnodes > 1 and not self.master_addr:
            raise UserError(f"nnodes={self.nnodes} needs master_addr (node 0's address)")
        if self.nnodes > 1 and self.server == "transformers":
            raise UserError("server='transformers' serves from one process; nnodes must be 1")
        if self.dtype not in DTYPES:
            raise UserError(f"dtype={self.dtype!r}; allowed: {DTYPES}")
        if not 0 < int(self.port) < 65536:
            raise UserError(f"port={self.port}; must be in 1..65535")
        return self

    @property
    def platform(self) -> str:
        """``rocm`` | ``cuda`` | ``cpu``: the platform the recipe targets."""
        return ACCELERATORS[self.accelerator]

    @property
    def url(self) -> str:
        """The server's base URL as a client on this machine reaches it (``0.0.0.0`` → ``127.0.0.1``)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


def vendor_env(server: str, accelerator: str, quantization: str | None = None) -> dict[str, str]:
    """Environment variables that matter for ``server`` on ``accelerator`` (defaults; override per spec).

    Raises:
        UserError: unknown server or accelerator.
    """
    if server not in SERVERS:
        raise UserError(f"server={server!r}; allowed: {SERVERS}")
    if accelerator not in ACCELERATORS:
        raise UserError(f"accelerator={accelerator!r}; allowed: {sorted(ACCELERATORS)}")
    plat = ACCELERATORS[accelerator]
    env: dict[str, str] = {}
    if plat == "rocm":
        # RCCL on MEC firmware older than 177 cannot reclaim scratch memory and may crash (ROCm 6.4 notes);
        # harmless on newer firmware.
        env["HSA_NO_SCRATCH_RECLAIM"] = "1"
        # load safetensors straight to GPU memory (AMD's vLLM guides)
        env["SAFETENSORS_FAST_GPU"] = "1"
        if server == "vllm":
            env["VLLM_ROCM_USE_AITER"] = "1"  # AITER kernels (attention, MoE, GEMM) on MI300X/MI355X
            # not set by default: VLLM_ROCM_QUICK_REDUCE_QUANTIZATION=INT4 (quantised TP all-reduce, used by
            # InferenceX's MI355X recipes) is faster but lossy; opt in with LaunchSpec(env={...})
        elif server == "sglang":
            env["SGLANG_USE_AITER"] = "1"  # AITER kernels in SGLang's ROCm build
    elif plat == "cuda":
        if server == "vllm" and accelerator in ("B300", "B200") and quantization and "fp4" in quantization:
            env["VLLM_USE_FLASHINFER_MOE_FP4"] = "1"  # FlashInfer NVFP4 MoE kernels (Blackwell, SM100+)
    return env  # CPU: nothing; the caller's environment (e.g. OMP_NUM_THREADS) passes through


#: LaunchSpec field -> the server's flag: an unset field (None, "", False; a dp/ep size of 1) adds nothing, True adds
#: the bare flag, any other value ``flag value``
_SPEC_FLAGS = {
    "vllm": (("dp", "--data-parallel-size"),  # EP is the bare --enable-expert-parallel, added in build_command
             ("quantization", "--quantization"), ("kv_cache_dtype", "--kv-cache-dtype"),
             ("max_model_len", "--max-model-len"), ("max_num_seqs", "--max-num-seqs"),
             ("max_batch_tokens", "--max-num-batched-tokens"), ("served_model_name", "--served-model-name"),
             ("trust_remote_code", "--trust-remote-code")),
    "sglang": (("dp", "--dp-size"), ("ep", "--ep-size"),
               ("quantization", "--quantization"), ("kv_cache_dtype", "--kv-cache-dtype"),
               ("max_model_len", "--context-length"), ("max_num_seqs", "--max-running-requests"),
               ("max_batch_tokens", "--chunked-prefill-size"), ("served_model_name", "--served-model-name"),
               ("trust_remote_code", "--trust-remote-code")),
}
#: values a server spells differently
_FLAG_VALUES = {("sglang", "kv_cache_dtype"): {"fp8": "fp8_e4m3"}}


def build_command(spec: LaunchSpec, python: str | None = None) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` that start ``spec``'s server; ``env`` holds only the variables the recipe sets.

    Raises:
        UserError: an invalid spec (see :meth:`LaunchSpec.validate`).
    """
    spec.validate()
    py = python or sys.executable
    env = {**vendor_env(spec.server, spec.accelerator, spec.quantization), **{k: str(v) for k, v in spec.env.items()}}
    if spec.server in _SPEC_FLAGS:
        if spec.server == "vllm":
            a = ["vllm", "serve", spec.model, "--host", spec.host, "--port", str(spec.port),
                 "--tensor-parallel-size", str(spec.tp), "--dtype", spec.dtype]
        else:
            a = [py, "-m", "sglang.launch_server", "--model-path", spec.model, "--host", spec.host,
                 "--port", str(spec.port), "--tp-size", str(spec.tp), "--dtype", spec.dtype]
        for field_name, flag in _SPEC_FLAGS[spec.server]:
            value = getattr(spec, field_name)
            if field_name in ("dp", "ep") and value <= 1:
                continue
            if value is True:
                a.append(flag)
            elif value:
                a += [flag, _FLAG_VALUES.get((spec.server, field_name), {}).get(value, str(value))]
        if spec.server == "vllm":
            a += ["--enable-expert-parallel"] if spec.ep > 1 else []
            a += ["--no-enable-prefix-caching"]  # random prompts: a prefix cache would only add noise
        if spec.nnodes > 1 and spec.server == "vllm":
            a += ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank),
                  "--master-addr", spec.master_addr, "--master-port", str(spec.master_port)]
            if spec.node_rank > 0:
                a += ["--headless"]  # only node 0 serves HTTP
        elif spec.nnodes > 1:
            a += ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank),
                  "--dist-init-addr", f"{spec.master_addr}:{spec.master_port}"]
    else:  # transformers serve
        exe = Path(py).with_name("transformers")
        a = [str(exe) if exe.exists() else "transformers", "serve", spec.model, "--host", spec.host,
             "--port", str(spec.port), "--dtype", spec.dtype,
             "--device", "cpu" if spec.platform == "cpu" else "auto"]
        a += ["--continuous-batching"] if spec.continuous_batching else ["--no-continuous-batching"]
        if spec.continuous_batching and spec.max_model_len and spec.max_num_seqs:
            block = TRANSFORMERS_CB_BLOCK
            n_blocks = -(-int(spec.max_model_len) * int(spec.max_num_seqs) // block)
            a += ["--cb-block-size", str(block), "--cb-num-blocks", str(n_blocks)]
        if spec.continuous_batching and spec.max_batch_tokens:
            a += ["--cb-max-batch-tokens", str(spec.max_batch_tokens)]
        if spec.quantization:
            a += ["--quantization", spec.quantization]
        if spec.trust_remote_code:
            a += ["--trust-remote-code"]
    a += [str(x) for x in spec.extra_args]
    return a, env


def shell_line(spec: LaunchSpec) -> str:
    """The recipe as one shell line (``VAR=value ... command args``), for a job script or a README."""
    argv, env = build_command(spec, python="python3")
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.join(argv)])


def _redact(argv: list[str]) -> list[str]:
    """argv with the value after ``--api-key`` (and ``--api-key=...``) hidden, for logs."""
    return ["***" if prev == "--api-key" else ("--api-key=***" if a.startswith("--api-key=") else a)
            for prev, a in zip([None, *argv], argv)]


def http_status(url: str, timeout_s: float = 2.0) -> int:
    """The HTTP status of ``GET url`` (an error status too), or 0 when nothing answered within ``timeout_s``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - local URL the caller chose
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


def port_open(url: str, timeout_s: float = 1.0) -> bool:
    """Whether the host and port of ``url`` accept a TCP connection (nothing is sent)."""
    u = urllib.parse.urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


#: what :class:`Server` polls by default: an inference server's health route, then its model list
INFERENCE_READY_PATHS = ("/health", "/v1/models")


class Server:
    """A server process (an inference server from a recipe, or any argv): own process group, log file, readiness,
    stop. The kit's one process launcher and readiness wait.

    Args:
        spec: a :class:`LaunchSpec` (its command, environment and url); or give ``argv`` and ``url``.
        log_path: file for the process's stdout + stderr (appended; the command line is written first, with an
            ``--api-key`` value hidden).
        argv: the command (with ``spec``: ignored); env: variables added to this process's environment (with
            ``spec``: over the recipe's).
        url: base URL the server answers on, e.g. ``http://127.0.0.1:8866``.
        ready_path: path (or paths; any answering HTTP 200) :meth:`wait_ready` polls under ``url``; default
            ``/health`` then ``/v1/models``; ``None``: ready when the port accepts a TCP connection (for a server
            where each GET does work, e.g. Voila starting a kernel per page view).
        cwd: working directory of the process (default: this process's).

    Use as a context manager: ``with Server(spec, log_path) as srv: srv.wait_ready(); ... srv.url ...``; leaving
    the block (also by an exception) stops the whole process group. :meth:`start_ready` starts and waits in one
    call, stopping the group if the server never becomes ready.

    Raises:
        UserError: neither ``spec`` nor ``argv``, or an ``argv`` without ``url``.
    """

    def __init__(self, spec: LaunchSpec | None = None, log_path: str | Path = "server.log",
                 argv: list[str] | None = None, env: dict | None = None, url: str | None = None,
                 ready_path: str | tuple[str, ...] | None = INFERENCE_READY_PATHS, cwd: str | Path | None = None):
        if spec is None and argv is None:
            raise UserError("give a LaunchSpec or an argv")
        if spec is not None:
            argv, env_r = build_command(spec)
            env = {**env_r, **(env or {})}
            url = url or spec.url
        if url is None:
            raise UserError("with an explicit argv, give the server's base url too")
        self.argv, self.env, self.url = list(argv), dict(env or {}), url.rstrip("/")
        self.ready_paths = (ready_path,) if isinstance(ready_path, str) else (tuple(ready_path) if ready_path else ())
        self.log_path = Path(log_path)
        self.cwd = str(cwd) if cwd is not None else None
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> Server:
        """Start the process in a new session (its own process group), stdout+stderr to the log file.

        Raises:
            InputNotFoundError: the executable does not exist (the message names it).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log.write(("$ " + shlex.join(_redact(self.argv)) + "\n").encode())
        self._log.flush()
        try:
            self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **self.env}, cwd=self.cwd,
                                         start_new_session=True)
        except FileNotFoundError as e:
            self._log.close()
            raise InputNotFoundError(f"cannot start {self.argv[0]!r}: not found (is it installed?)") from e
        atexit.register(self.stop)  # a kernel or script that exits without stop() leaves no server behind
        return self

    def log_tail(self, n_chars: int = 3000) -> str:
        """The last ``n_chars`` characters of the log file ("" when it cannot be read)."""
        try:
            return self.log_path.read_bytes()[-n_chars:].decode("utf-8", "replace")
        except OSError:
            return ""

    def is_ready(self) -> bool:
        """One readiness probe: a ready path answers HTTP 200 (or, with ``ready_path=None``, the port is open)."""
        if not self.ready_paths:
            return port_open(self.url)
        return any(http_status(self.url + p, 2.0) == 200 for p in self.ready_paths)

    def wait_ready(self, timeout_s: float = 600.0, poll_s: float = 0.5) -> float:
        """Block until :meth:`is_ready`.

        Returns: seconds waited.

        Raises:
            ServerError: the process exited first (with the log's tail).
            ServerTimeoutError: not ready within ``timeout_s`` (the process is left running; call :meth:`stop`).
        """
        t0 = time.monotonic()
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(f"server exited with code {self.proc.returncode} before it was ready; "
                                  f"log {self.log_path}:\n{self.log_tail()}")
            if self.is_ready():
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise ServerTimeoutError(f"server at {self.url} not ready after {timeout_s:g} s; log "
                                         f"{self.log_path}:\n{self.log_tail()}")
            time.sleep(poll_s)

    def start_ready(self, timeout_s: float = 600.0, poll_s: float = 0.5) -> Server:
        """:meth:`start`, then :meth:`wait_ready`; on any failure (exit, timeout, Ctrl-C) the process group is
        stopped before the exception propagates. Returns self.

        Raises:
            InputNotFoundError, ServerError, ServerTimeoutError: see :meth:`start` and :meth:`wait_ready`.
        """
        self.start()
        try:
            self.wait_ready(timeout_s, poll_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM the process group, wait up to ``timeout_s``, then SIGKILL it. Returns the exit code (None if
        never started)."""
        if self.proc is None:
            return None
        if self.proc.returncode is not None and self._log.closed:
            return self.proc.returncode
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                # the leader is gone; make sure no child of the group lingers
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                break
            except subprocess.TimeoutExpired:
                continue
        if not self._log.closed:
            self._log.close()
        atexit.unregister(self.stop)
        return self.proc.returncode

    def __enter__(self) -> Server:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
