"""``kit dashboard``: the sweep control panel (:class:`kit.view.panel.ControlPanel`) as a standalone web page,
served by Voilà on 127.0.0.1 only.

Voilà runs a one-cell notebook that displays the panel in a fresh kernel per browser tab and shows only the
widgets (no code). Enter a workload, press Run, and the latency/throughput plot and the results table fill in point
by point; the runs land under ``--out`` (one ``run-YYYYmmdd-HHMMSS`` directory per Run). The panel's initial values
are a :class:`kit.measure.sweep.SweepConfig`: its defaults, or the options given (``kit dashboard``'s sweep
options are derived from that dataclass, like ``kit sweep``'s).

The page runs code on this machine, so it is guarded (:mod:`kit.view.voila_app`, the Voilà application it runs):
a token made at random for each launch (printed in the URL, ``http://127.0.0.1:PORT/?token=...``, as Jupyter does;
a request without it is refused; it is passed in the environment, never on a command line or into a file), only
local names as ``Host:`` and websocket ``Origin:`` (no DNS rebinding), idle kernels of gone clients culled, and
Voilà stops when the process that started it is gone.

Voilà is started and stopped by the kit's one launcher, :class:`kit.serve.launch.Server` (own process group, log
file, readiness wait, stop by process group); ``kit dashboard`` stops it on SIGTERM and Ctrl-C. Programmatic use
(the browser test does this)::

    from kit.view.dashboard import launch
    with launch(out_dir="results/dashboard", port=0) as srv:   # returns once the server answers
        print(srv.page_url)                                     # http://127.0.0.1:PORT/?token=...
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import secrets
import shlex
import signal
import sys
from pathlib import Path

from kit._io import atomic_write_text, check_out_dir, free_port
from kit.cli import DefaultsHelpFormatter, add_config_args, config_from_args, number_arg
from kit.errors import OutputPathError, UserError
from kit.measure.profile_select import add_profile_arg
from kit.measure.sweep import SweepConfig
from kit.serve.launch import Server

HOST = "127.0.0.1"
DEFAULT_PORT = 8866
DASHBOARD_OUT = "results/dashboard"
#: a static asset Voilà serves as soon as it listens, without starting a kernel (a GET of any other path renders
#: the notebook: it starts a kernel and runs the panel, so it must not be the readiness probe)
READY_PATH = "/voila/static/voila.js"
#: seconds to wait for Voilà to answer (its start imports jupyter_server; no kernel starts before a page load)
READY_TIMEOUT_S = 60.0
#: seconds a kernel with no client connected and no output is kept before it is shut down (jupyter_server's culler;
#: a running sweep's output counts as activity)
CULL_IDLE_S = 1800
#: the environment variable the token travels in (read by jupyter_server's identity provider)
TOKEN_ENV = "JUPYTER_TOKEN"


def dashboard_notebook(out_dir: str | Path, config: SweepConfig | None = None):
    """The one-cell notebook Voilà serves (kernelspec python3): a :class:`kit.view.panel.ControlPanel` writing under
    ``out_dir`` (made absolute), starting from ``config`` (default ``SweepConfig()``), every field spelled out.

    Raises: UserError / UnknownNameError for a setting ``SweepConfig.validate`` refuses (e.g. an unknown model
    preset that is not a checkpoint directory; the message lists the presets).
    """
    from kit.view.notebooks import new_notebook

    cfg = dataclasses.replace(config if config is not None else SweepConfig()).validate()  # fail before serving
    settings = ", ".join(f"{f.name}={getattr(cfg, f.name)!r}" for f in dataclasses.fields(SweepConfig))
    src = (
        "from kit.view.panel import ControlPanel\n\n"
        f"panel = ControlPanel(out_dir={str(Path(out_dir).resolve())!r}, {settings})\npanel"
    )
    return new_notebook(
        [("md", "# kit dashboard\nA sweep control panel: enter a workload and press **Run**."), ("code", src)]
    )


def voila_command(notebook: str | Path, port: int, open_browser: bool = False, cull_idle_s: int = CULL_IDLE_S):
    """The Voilà command line (:mod:`kit.view.voila_app`): bound to 127.0.0.1, token required (the token itself
    comes in :data:`TOKEN_ENV`, never on this line), no port retries (a busy port is an error), code hidden, kernels
    of gone clients culled after ``cull_idle_s`` s idle (checked every ``min(60, cull_idle_s)`` s)."""
    cmd = [
        sys.executable,
        "-m",
        "kit.view.voila_app",
        str(Path(notebook).resolve()),
        f"--port={int(port)}",
        f"--Voila.ip={HOST}",
        "--Voila.port_retries=0",
        "--Voila.auto_token=True",
        "--strip_sources=True",
        "--show_tracebacks=True",
        f"--MappingKernelManager.cull_idle_timeout={int(cull_idle_s)}",
        f"--MappingKernelManager.cull_interval={max(1, min(60, int(cull_idle_s)))}",
        "--MappingKernelManager.cull_connected=False",
    ]
    if not open_browser:
        cmd.append("--no-browser")
    return cmd


def write_notebook(out_dir: str | Path, config: SweepConfig | None = None) -> Path:
    """Write the dashboard notebook to ``out_dir/dashboard.ipynb`` (creating ``out_dir``); returns its path.

    Raises: OutputPathError (one line naming the path) when ``out_dir`` (or a parent) is a file, cannot be created
    or is not writable (a read-only file system); what :func:`dashboard_notebook` raises.
    """
    import nbformat

    out = check_out_dir(out_dir, "--out", DASHBOARD_OUT)
    nb = dashboard_notebook(out, config)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"--out {out}: cannot create the directory: {e.strerror or e}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise OutputPathError(f"--out {out}: the directory is not writable (a read-only file system?); give another")
    return atomic_write_text(out / "dashboard.ipynb", nbformat.writes(nb), "--out", "dashboard.ipynb")


class DashboardServer(Server):
    """The :class:`kit.serve.launch.Server` running the dashboard's Voilà, with its launch's ``token``.

    ``url`` is the base URL (readiness, scripts); :attr:`page_url` is the page with the token, the URL to open.
    """

    def __init__(self, token: str, **kwargs):
        super().__init__(**kwargs)
        self.token = token

    @property
    def page_url(self) -> str:
        """``http://127.0.0.1:PORT/?token=...``: the page, with the token this launch needs."""
        return f"{self.url}/?token={self.token}"


def voila_server(
    notebook: str | Path,
    port: int,
    log_path: str | Path,
    open_browser: bool = False,
    cull_idle_s: int = CULL_IDLE_S,
    token: str | None = None,
) -> DashboardServer:
    """A :class:`DashboardServer` (not started) running Voilà on ``notebook`` at 127.0.0.1:``port``, its output in
    ``log_path``, working directory the notebook's folder, ready when :data:`READY_PATH` answers. ``token``: the
    page's token (default: a new random one, 32 bytes from :func:`secrets.token_urlsafe`)."""
    token = token or secrets.token_urlsafe(32)
    return DashboardServer(
        token,
        argv=voila_command(notebook, port, open_browser, cull_idle_s),
        url=f"http://{HOST}:{int(port)}",
        log_path=log_path,
        env={"PYTHONUNBUFFERED": "1", TOKEN_ENV: token},
        ready_path=READY_PATH,
        cwd=Path(notebook).parent,
    )


def launch(
    out_dir: str | Path = DASHBOARD_OUT,
    port: int = DEFAULT_PORT,
    timeout_s: float = READY_TIMEOUT_S,
    log_path: str | Path | None = None,
    config: SweepConfig | None = None,
    cull_idle_s: int = CULL_IDLE_S,
    **settings,
) -> DashboardServer:
    """Start Voilà serving the panel in the background and wait until it answers; returns the running
    :class:`DashboardServer` (``.page_url`` is the page with its token; ``.stop()`` or leaving ``with`` stops the
    process group).

    Args:
        port: TCP port on 127.0.0.1; 0 picks a free one.
        log_path: file for Voilà's output (default ``out_dir/voila.log``).
        config, settings: the panel's initial values: a SweepConfig (default ``SweepConfig()``) and fields
            overriding it (``kv_lens=[16]``).
        cull_idle_s: seconds an idle kernel without a client is kept (see :data:`CULL_IDLE_S`).

    Raises: ServerError (Voilà exited, e.g. the port is taken) or ServerTimeoutError (not ready within
    ``timeout_s``); the process group is then stopped. What :func:`write_notebook` raises.
    """
    cfg = dataclasses.replace(config if config is not None else SweepConfig(), **settings)
    nb = write_notebook(out_dir, cfg)
    srv = voila_server(nb, port or free_port(), log_path or nb.parent / "voila.log", cull_idle_s=cull_idle_s)
    return srv.start_ready(timeout_s)


# ------------------------------------------------------------------------------------------------ CLI
def add_cli(sub) -> None:
    """``kit dashboard``: serve the control panel as a web page on 127.0.0.1; sweep options from SweepConfig."""
    p = sub.add_parser(
        "dashboard",
        description="Serve the sweep control panel as a standalone web page with Voila on "
        "127.0.0.1 (not reachable from other machines; use an SSH tunnel for a remote "
        "node: ssh -L PORT:127.0.0.1:PORT host). Open the printed URL (it carries this "
        "launch's random token; a request without it, or naming another host, is refused), enter a workload, "
        "press Run. Runs are written under --out. The sweep options set the panel's "
        "initial values. Ctrl-C or SIGTERM stops the server.",
        formatter_class=DefaultsHelpFormatter,
    )
    add_config_args(p, SweepConfig)
    add_profile_arg(p)  # the panel's initial --profile, as kit sweep's
    p.add_argument(
        "--port", type=number_arg(int), default=DEFAULT_PORT, help="TCP port on 127.0.0.1 (0: any free port)"
    )
    p.add_argument("--out", default=DASHBOARD_OUT, help="directory for the runs and voila.log (created)")
    p.add_argument(
        "--ready-timeout",
        type=number_arg(float, above=0, unit="s"),
        default=READY_TIMEOUT_S,
        help="seconds to wait for Voila to answer",
    )
    p.add_argument(
        "--cull-idle",
        type=number_arg(int, minimum=1, maximum=7 * 86_400, unit="s"),
        default=CULL_IDLE_S,
        help="seconds (1 to 604800, 7 days) a kernel with no browser connected and no output is kept before it is "
        "shut down",
    )
    p.add_argument("--open", action="store_true", help="open a browser on this machine")
    p.add_argument("--print-command", action="store_true", help="write the notebook, print the Voila command, exit")
    p.set_defaults(func=_cli_dashboard)


def _raise_interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _cli_dashboard(args: argparse.Namespace) -> int:
    cfg = config_from_args(SweepConfig, args)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: give a TCP port 0..65535 (0: any free port)")
    if not (args.ready_timeout > 0 and math.isfinite(args.ready_timeout)):
        raise UserError(f"--ready-timeout {args.ready_timeout}: give a number of seconds > 0")
    nb = write_notebook(args.out, cfg)
    port = args.port or free_port()
    if args.print_command:  # the token is made per launch; it is not part of the command
        print(shlex.join(voila_command(nb, port, open_browser=args.open, cull_idle_s=args.cull_idle)))
        return 0
    log_path = nb.parent / "voila.log"
    # SIGTERM (a job scheduler, `kill`) stops Voila like Ctrl-C does: leaving the `with` stops its process group
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with voila_server(nb, port, log_path, open_browser=args.open, cull_idle_s=args.cull_idle) as srv:
            srv.wait_ready(args.ready_timeout)
            print(
                f"kit dashboard: serving on {srv.page_url}\n  (runs under {nb.parent}; log {log_path}; Ctrl-C stops)",
                flush=True,
            )
            rc = srv.proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    if rc == 0:  # stopped from outside
        return 0
    print(f"kit dashboard: voila exited with code {rc}; log {log_path}:\n{srv.log_tail()}", file=sys.stderr)
    return 1
