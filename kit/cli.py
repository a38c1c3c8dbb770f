"""``kit <subcommand>``: the command line over the same functions the notebooks call.

Each subcommand lives beside its concern: the module named in :data:`COMMANDS` defines
``add_cli(subparsers)``, which adds a parser and sets ``func`` (called with the parsed args; its return value is
the exit code). Modules are imported only when their subcommand runs or ``--help`` is asked for.
"""
from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand → module defining ``add_cli(subparsers)``
COMMANDS: dict[str, str] = {
    "sweep": "kit.sweep",
    "devices": "kit.hardware",
    "bench": "kit.bench",
    "plan": "kit.planner",
    "calibrate": "kit.calibrate",
    "serve-bench": "kit.loadgen",
    "dashboard": "kit.dashboard",
    "doctor": "kit.doctor",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argparse parser; with ``only`` set, import just that subcommand's module (fast start-up)."""
    parser = argparse.ArgumentParser(prog="kit", description="LLM inference performance exploration kit.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    seen = set()
    for name, mod in COMMANDS.items():
        if only is not None and name != only:
            continue
        if mod in seen:
            continue
        seen.add(mod)
        importlib.import_module(mod).add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only)
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except (ValueError, KeyError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"kit {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kit ... | head`: the reader left; not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
