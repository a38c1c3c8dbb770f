"""``kit dashboard``: the sweep control panel (:class:`kit.view.panel.ControlPanel`) as a standalone web page, served by
Voilà on 127.0.0.1 only.

Voilà runs a one-cell notebook that displays the panel in a fresh kernel per browser tab and shows only the
widgets (no code). Enter a workload, press Run, and the latency/throughput plot and the results table fill in point
by point; the runs land under ``--out`` (one ``run-YYYYmmdd-HHMMSS`` directory per Run).

Programmatic use (the browser test does this)::

    from kit.view.dashboard import launch
    proc, url = launch(out_dir="results/dashboard", port=0)   # waits until the page answers
    ...
    proc.terminate()
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from kit.errors import OutputPathError, ServerError, ServerTimeoutError
from kit import models
from kit.cli import int_list_arg
from kit._io import free_port

#: --kv / --concurrency: comma lists of integers >= 1
_int_list = int_list_arg(minimum=1, example="128,512")

HOST = "127.0.0.1"
DEFAULT_PORT = 8866


def dashboard_notebook(out_dir: str | Path, model: str = models.DEFAULT_PRESET, kv_lens=(128, 512),
                       concurrencies=(1, 4), decode_steps: int = 8, repeats: int = 2, device: str = "auto"):
    """The one-cell notebook Voilà serves (kernelspec python3). ``out_dir`` is made absolute.

    Raises: ValueError for an unknown model preset that is not a checkpoint directory.
    """
    from kit.view.notebooks import new_notebook

    models.get_config(model)  # fail early, naming the presets
    src = ("from kit.view.panel import ControlPanel\n\n"
           f"panel = ControlPanel(out_dir={str(Path(out_dir).resolve())!r}, model={model!r}, "
           f"kv_lens={list(kv_lens)!r}, concurrencies={list(concurrencies)!r}, decode_steps={int(decode_steps)}, "
           f"repeats={int(repeats)}, device={device!r})\npanel")
    return new_notebook([("md", "# kit dashboard\nA sweep control panel: enter a workload and press **Run**."),
                         ("code", src)])


def voila_command(notebook: str | Path, port: int, open_browser: bool = False) -> list[str]:
    """The Voilà command line: bound to 127.0.0.1, no port retries (a busy port is an error), code hidden."""
    cmd = [sys.executable, "-m", "voila", str(notebook), f"--port={int(port)}", f"--Voila.ip={HOST}",
           "--Voila.port_retries=0", "--strip_sources=True", "--show_tracebacks=True"]
    if not open_browser:
        cmd.append("--no-browser")
    return cmd


def write_notebook(out_dir: str | Path, **panel_kw) -> Path:
    """Write the dashboard notebook to ``out_dir/dashboard.ipynb`` (creating ``out_dir``); returns its path."""
    import nbformat

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"--out {str(out)!r} exists and is a file; give a directory")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "dashboard.ipynb"
    nbformat.write(dashboard_notebook(out, **panel_kw), str(path))
    return path


def wait_ready(port: int, proc: subprocess.Popen | None = None, timeout_s: float = 60.0) -> None:
    """Wait until the server accepts TCP connections on 127.0.0.1:``port``.

    (Each GET of the page starts a kernel and runs the notebook, so readiness is checked on the socket, not by
    fetching the page.)

    Raises: RuntimeError if ``proc`` exits first (with its output); TimeoutError after ``timeout_s``.
    """
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise ServerError(f"voila exited with code {proc.returncode} before serving:\n{out[-3000:]}")
        try:
            with socket.create_connection((HOST, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise ServerTimeoutError(f"nothing listens on {HOST}:{port} after {timeout_s} s")


def launch(out_dir: str | Path = "results/dashboard", port: int = DEFAULT_PORT, timeout_s: float = 60.0,
           log_path: str | Path | None = None, **panel_kw) -> tuple[subprocess.Popen, str]:
    """Start Voilà serving the panel in the background and wait until it answers; returns (process, url).

    Args:
        port: TCP port on 127.0.0.1; 0 picks a free one.
        log_path: file for Voilà's output (default: a pipe, read on failure).
        panel_kw: initial panel values (model, kv_lens, concurrencies, decode_steps, repeats, device).

    Raises: RuntimeError (Voilà exited, e.g. the port is taken) or TimeoutError; the process is then stopped.
    """
    nb = write_notebook(out_dir, **panel_kw)
    port = port or free_port()
    url = f"http://{HOST}:{port}/"
    out = open(log_path, "wb") if log_path else subprocess.PIPE
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(voila_command(nb, port), stdout=out, stderr=subprocess.STDOUT, cwd=str(nb.parent),
                            env=env)
    try:
        wait_ready(port, proc, timeout_s)
    except BaseException:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    return proc, url


# ------------------------------------------------------------------------------------------------ CLI
def add_cli(sub) -> None:
    """``kit dashboard``: serve the control panel as a web page on 127.0.0.1."""
    p = sub.add_parser("dashboard", description="Serve the sweep control panel as a standalone web page with Voila on "
                                   "127.0.0.1 (not reachable from other machines; use an SSH tunnel for a remote "
                                   "node: ssh -L PORT:127.0.0.1:PORT host). Open the printed URL, enter a workload, "
                                   "press Run. Runs are written under --out. Ctrl-C stops the server.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port on 127.0.0.1 (0: any free port)")
    p.add_argument("--out", default="results/dashboard", help="directory for the runs (created)")
    p.add_argument("--model", default=models.DEFAULT_PRESET,
                   help=f"initial model: a preset ({', '.join(models.PRESETS)}) or a checkpoint directory")
    p.add_argument("--kv", type=_int_list, default=[128, 512], help="initial KV-cache lengths (comma list)")
    p.add_argument("--concurrency", type=_int_list, default=[1, 4], help="initial concurrencies (comma list)")
    p.add_argument("--decode-steps", type=int, default=8, help="initial timed decode steps per repeat")
    p.add_argument("--device", default="auto", help="initial device: auto | cpu | cuda | rocm")
    p.add_argument("--open", action="store_true", help="open a browser on this machine")
    p.add_argument("--print-command", action="store_true", help="write the notebook, print the Voila command, exit")
    p.set_defaults(func=_cli_dashboard)


def _cli_dashboard(args) -> int:
    port = args.port or free_port()
    nb = write_notebook(args.out, model=args.model, kv_lens=args.kv, concurrencies=args.concurrency,
                        decode_steps=args.decode_steps, device=args.device)
    cmd = voila_command(nb, port, open_browser=args.open)
    if args.print_command:
        print(" ".join(cmd))
        return 0
    print(f"kit dashboard: serving on http://{HOST}:{port}/  (runs under {Path(args.out).resolve()}; Ctrl-C stops)",
          flush=True)
    try:
        return subprocess.call(cmd, cwd=str(nb.parent))
    except KeyboardInterrupt:
        return 0
