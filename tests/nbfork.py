"""Notebook kernels forked from a warm process, for the doc tests (``nbexec``): each notebook still runs in a fresh
kernel process of its own, but one whose interpreter already imported torch, transformers, pandas and the kit.

A kernel of the kit's notebooks spends ~3 s of CPU importing those before its first cell does anything; 30
notebooks pay it 30 times. Here a server process imports them once, and every kernel is a ``fork()`` of it: a new
process (own pid, session, globals, cwd and environment), started at ~0.05 s. matplotlib is not imported before
the fork (ipykernel sets the inline backend through ``MPLBACKEND`` when it starts), nor is anything run that
starts a thread (torch's thread pool starts on first use, in the kernel).

jupyter_client launches the kernelspec's command as always (``kit-fork``, written under a temporary
``JUPYTER_PATH``); that command is a small stand-in: it asks the server to fork the kernel, passes on the
signals it gets (an interrupt is SIGINT to the stand-in's process group), and exits with the kernel's exit code.
If the stand-in dies (killed), the server kills the kernel. Used as ``run_notebook(..., kernel_name=kernel())``.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

NAME = "kit-fork"
#: imported once by the server, before any fork (not matplotlib: see the module docstring)
WARM = (
    "ipykernel.kernelapp",
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "pandas",
    "kit.measure.sweep",
    "kit.store",
)

_lock = threading.Lock()
_server: dict = {}


def kernel() -> str:
    """The kernelspec name to run notebooks with (starts the server on first use; stopped when this process
    exits)."""
    with _lock:
        if not _server:
            root = Path(tempfile.mkdtemp(prefix="kit-nbfork-"))
            sock = root / "server.sock"
            proc = subprocess.Popen([sys.executable, __file__, "serve", str(sock)], stdout=subprocess.PIPE, text=True)
            ready = proc.stdout.readline()
            if ready.strip() != "ready":
                raise RuntimeError(f"the notebook kernel server did not start (exit {proc.wait()})")
            atexit.register(lambda: (proc.kill(), proc.wait()))
            spec = root / "kernels" / NAME
            spec.mkdir(parents=True)
            argv = [sys.executable, __file__, "kernel", str(sock), "{connection_file}"]
            (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": NAME, "language": "python"}))
            os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("JUPYTER_PATH")]))
            _server.update(proc=proc, root=root)
    return NAME


def _send(conn: socket.socket, obj: dict) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


def _serve(sock_path: str) -> None:
    """Import WARM, then fork a kernel per request (one connection per kernel: a JSON line with ``argv``,
    ``cwd``, ``env``; answered with ``{"pid"}`` and, when the kernel ends, ``{"exit"}``)."""
    import importlib
    import selectors

    for name in WARM:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(16)
    print("ready", flush=True)
    os.dup2(2, 1)  # nobody reads the pipe after this line: the kernels' output goes where this process's errors go
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    kernels: dict[int, socket.socket] = {}  # pid -> its stand-in's connection
    while True:
        for key, _ in sel.select(timeout=0.1):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                req = json.loads(conn.makefile().readline())
                pid = os.fork()
                if pid == 0:  # the kernel
                    listener.close()
                    for c in kernels.values():
                        c.close()
                    conn.close()
                    _run_kernel(req)
                kernels[pid] = conn
                _send(conn, {"pid": pid})
                sel.register(conn, selectors.EVENT_READ, pid)
            else:  # a stand-in closed its end: it died, the kernel goes too
                try:
                    os.killpg(key.data, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                sel.unregister(key.fileobj)
        while kernels:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = kernels.pop(pid)
            try:
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                sel.unregister(conn)
            except (OSError, KeyError, ValueError):
                pass
            conn.close()


def _run_kernel(req: dict) -> None:
    """In the forked child: a session of its own, the stand-in's directory and environment, then ipykernel."""
    code = 1
    try:
        os.setsid()
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[0] = os.getcwd()  # what `python -m ipykernel_launcher` puts first, not this file's folder
        # the server is this kernel's parent: the kernel ends if the server does (as a kernel whose parent ends)
        sys.argv = [*req["argv"], f"--IPKernelApp.parent_handle={os.getppid()}"]
        from ipykernel.kernelapp import launch_new_instance

        launch_new_instance()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _stand_in(sock_path: str, connection_file: str) -> int:
    """What jupyter_client starts: asks for a forked kernel, passes signals on, exits with its exit code."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sock_path)
    argv = [importlib.util.find_spec("ipykernel_launcher").origin, "-f", connection_file]
    _send(conn, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)})
    lines = conn.makefile()
    pid = json.loads(lines.readline())["pid"]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    line = lines.readline()
    return json.loads(line)["exit"] if line else 1


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        _serve(sys.argv[2])
    else:
        sys.exit(_stand_in(sys.argv[2], sys.argv[3]))
