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
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from kit.errors import InputNotFoundError, ServerError, ServerTimeoutError, UserError
from kit.serve.recipes import LaunchSpec, build_command, redact_argv


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


#: scheduler nice of a server session put behind its client (:func:`behind_the_client`): the lowest priority
BEHIND_NICE = 19


def behind_the_client(pid: int, nice: int = BEHIND_NICE) -> bool:
    """Schedule the session of process ``pid`` (a session leader, as :meth:`Server.start` makes every server) behind
    the other sessions of this machine: Linux schedules each session as one group (autogroup), and this sets that
    group's nice (``/proc/PID/autogroup``; raising it needs no privilege). For a server on the client's own CPUs:
    on 2 cores a busy vLLM CPU engine kept a client that used 3 % of a core waiting for a CPU 50-99 % of a point
    (event-loop lag p99 0.4-1.5 s) with its session at nice 0, and 0.1-2 % (lag p99 ~1 ms) at 19; renicing the
    processes instead did not help, since the groups share the CPUs first.

    Args:
        pid: the server's process id (its session leader).
        nice: the group's nice, -20..19.

    Returns:
        True when set; False where there are no autogroups or the OS refused (nothing changed then).

    Raises:
        ValueError: ``nice`` outside -20..19.
    """
    if not -20 <= int(nice) <= 19:
        raise ValueError(f"nice={nice!r}; must be -20..19")
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(int(nice)))
    except OSError:
        return False
    return True


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

    def __init__(
        self,
        spec: LaunchSpec | None = None,
        log_path: str | Path = "server.log",
        argv: list[str] | None = None,
        env: dict | None = None,
        url: str | None = None,
        ready_path: str | tuple[str, ...] | None = INFERENCE_READY_PATHS,
        cwd: str | Path | None = None,
    ):
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
        self._log.write(("$ " + shlex.join(redact_argv(self.argv)) + "\n").encode())
        self._log.flush()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                cwd=self.cwd,
                start_new_session=True,
            )
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
                raise ServerError(
                    f"server exited with code {self.proc.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self.is_ready():
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise ServerTimeoutError(
                    f"server at {self.url} not ready after {timeout_s:g} s; log {self.log_path}:\n{self.log_tail()}"
                )
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
