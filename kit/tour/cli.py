"""``kit tour``: serve the tour on 127.0.0.1 (:mod:`kit.tour.server`), or with ``--check`` run every lesson headless
(:mod:`kit.tour.check`) and exit non-zero naming the first lesson that failed (1), ``--json`` for CI."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from kit.cli import DefaultsHelpFormatter, number_arg
from kit.errors import UserError

#: exit code of a failed ``--check``
CHECK_FAILED = 1
#: exit code of a tour stopped by Ctrl-C or SIGTERM (as every kit command: :func:`kit.cli.main`)
INTERRUPTED = 130


def add_cli(sub) -> None:
    """``kit tour [--check [--json]] [--url URL] [--model M] [--op-impl OP=MODULE:FUNCTION] ...``."""
    from kit.tour.server import DEFAULT_PORT

    p = sub.add_parser(
        "tour",
        description="A walk through inference performance in the browser: a live prompt playground (tokens, "
        "TTFT, ITL, tok/s as they happen), prefill vs decode, KV-cache length, concurrency, will it fit, what a "
        "million tokens cost, is the stack sane. Served on 127.0.0.1 only (use an SSH tunnel for a remote node); "
        "open the printed URL (it carries this launch's token). --check runs every lesson headless with small "
        "settings instead (the smoke test: exit 1 naming the failed lesson).",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--check", action="store_true", help="run every lesson headless, in order, and exit")
    p.add_argument("--json", action="store_true", help="with --check: print the outcome as JSON")
    p.add_argument("--url", default="", help="an OpenAI-compatible endpoint for the playground (--check: its source)")
    p.add_argument("--served-model", default="", help="the model id to ask --url for (default: the first it lists)")
    p.add_argument("--stall-timeout", type=number_arg(float, minimum=1, maximum=600), default=30.0, metavar="S",
                   help="seconds without data after which an endpoint's stream is called stalled (the page's "
                   "starting value; --check's playground)")  # fmt: skip
    p.add_argument("--model", default="tiny-llama", help="in-process model: a kit preset or a checkpoint directory")
    p.add_argument("--dtype", default="float32", help="in-process dtype (float32, bfloat16, float16)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--op-impl", dest="op_impls", action="append", default=[], metavar="OP=MODULE:FUNCTION",
                   help="check this implementation of OP in 'Is the stack sane' (e.g. a planted fault)")  # fmt: skip
    p.add_argument("--compile-backend", default=None, help="torch.compile backend of the op check "
                   "(default: aot_eager on CPU, inductor on a GPU)")  # fmt: skip
    p.add_argument(
        "--port", type=number_arg(int, minimum=0, maximum=65535), default=DEFAULT_PORT, help="TCP port (0: any)"
    )
    p.add_argument("--server-python", default=None, help="python of the environment with the engine the playground "
                   "launches (vLLM, SGLang; default: this one)")  # fmt: skip
    p.add_argument("--out", default="results/tour", help="directory for the logs of servers the tour launches")
    p.add_argument("--open", action="store_true", help="open a browser on this machine")
    p.set_defaults(func=_cli_tour)


def _context(args):
    import torch

    from kit.qualification.items_check import op_impls
    from kit.tour.context import TourContext

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":  # as a sweep does: one torch thread per free core (a busy core makes every step wait)
        from kit import hardware

        n, why, _ = hardware.cpu_threads_for_timing()
        torch.set_num_threads(n)
        if not args.json:
            print(f"kit tour: {n} torch thread(s) on this CPU ({why})", flush=True)
    return TourContext(
        device=device, model=args.model, dtype=args.dtype, op_impls=op_impls(args.op_impls),
        compile_backend=args.compile_backend,
    )  # fmt: skip


def _check_args(args: argparse.Namespace) -> None:
    """Refuse bad options before any work (exit 2), each named with what is allowed."""
    from kit import dtypes
    from kit.models import PRESETS, is_checkpoint_dir

    if args.json and not args.check:
        raise UserError("--json goes with --check (the page itself is the tour's output)")
    if args.url and not args.url.startswith(("http://", "https://")):
        raise UserError(f"--url {args.url!r}: give an http:// or https:// URL, e.g. http://127.0.0.1:8000")
    if args.model not in PRESETS and not is_checkpoint_dir(args.model):
        raise UserError(
            f"--model {args.model!r}: not a preset ({', '.join(sorted(PRESETS))}) nor a checkpoint directory"
        )
    try:
        args.dtype = dtypes.canonical(args.dtype)
        dtypes.to_torch(args.dtype)  # a model dtype (float32, bfloat16, float16)
    except UserError as e:
        raise UserError(f"--dtype: {e}") from None
    if args.device is not None:
        import torch

        try:
            torch.device(args.device)
        except RuntimeError:
            raise UserError(f"--device {args.device!r}: give a torch device such as cpu, cuda, cuda:1") from None


def _cli_tour(args: argparse.Namespace) -> int:
    _check_args(args)
    ctx = _context(args)
    if args.check:
        return _check(ctx, args)
    return _serve(ctx, args)


def _check(ctx, args) -> int:
    from kit.tour.check import run_check

    def show(o):
        if not args.json:
            print(f"{'PASS' if o.ok else 'FAIL'}  {o.title:<28} {o.seconds:5.1f} s  {o.line}", flush=True)

    outcomes = run_check(
        ctx, args.url or None, on_lesson=show, served_model=args.served_model or None, stall_s=args.stall_timeout
    )
    failed = [o for o in outcomes if not o.ok]
    if args.json:
        doc = {"ok": not failed, "failed": [o.lesson for o in failed], "lessons": [o.as_dict() for o in outcomes]}
        print(json.dumps(doc, indent=1, default=str, ensure_ascii=False))
    if failed:
        f = failed[0]
        print(
            f"kit tour --check: FAILED lesson '{f.title}' ({f.lesson}): {f.problems[0].strip().splitlines()[-1]}"
            + (f" (and {len(failed) - 1} more: {', '.join(o.lesson for o in failed[1:])})" if len(failed) > 1 else ""),
            file=sys.stderr,
        )
        return CHECK_FAILED
    if not args.json:
        print(f"kit tour --check: all {len(outcomes)} lessons passed in {sum(o.seconds for o in outcomes):.1f} s")
    return 0


def _raise_interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _serve(ctx, args) -> int:
    """Serve until Ctrl-C or SIGTERM; then stop everything the tour started (generations, launches, servers) with
    further Ctrl-Cs ignored while it does, and return :data:`INTERRUPTED`."""
    from kit.tour.server import TourServer

    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    tour = TourServer(
        args.port, ctx, url=args.url, out_dir=args.out, server_python=args.server_python,
        served_model=args.served_model or None, stall_s=args.stall_timeout,
    )  # fmt: skip
    tour.start()
    try:
        print(f"kit tour: serving on {tour.page_url}\n  (127.0.0.1 only; Ctrl-C stops)", flush=True)
        if args.open:
            import webbrowser

            webbrowser.open(tour.page_url)
        tour.wait()
    except KeyboardInterrupt:
        pass
    finally:
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the clean-up
        try:
            print("kit tour: stopping (generations, launches, servers) ...", file=sys.stderr, flush=True)
            tour.stop()
        finally:
            signal.signal(signal.SIGINT, before)
            signal.signal(signal.SIGTERM, previous)
    print("kit tour: interrupted; stopped", file=sys.stderr, flush=True)
    return INTERRUPTED
