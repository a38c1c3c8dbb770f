"""``kit <subcommand>``: the command line over the same functions the notebooks call.

Each subcommand lives beside its concern: the module named in :data:`COMMANDS` defines
``add_cli(subparsers)``, which adds a parser and sets ``func`` (called with the parsed args; its return value is
the exit code). A module is imported only when its subcommand is named (``kit sweep ...``, ``kit sweep --help``);
``kit --help`` lists the commands from :data:`COMMANDS` alone, without importing torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import math
import os
import re
import sys
import warnings

from kit.errors import KitError, UserError

#: subcommand → (module defining ``add_cli(subparsers)``, one-line help shown by ``kit --help``)
COMMANDS: dict[str, tuple[str, str]] = {
    "sweep": ("kit.measure.cli", "sweep KV-cache length x concurrency in-process; write results and plots"),
    "devices": ("kit.hardware", "show the detected device and the accelerator catalog"),
    "bench": ("kit.measure.bench", "benchmark the kit: harness overhead and speed vs model.generate()"),
    "plan": ("kit.plan.cli", "will it fit, how fast, at what cost (analytic; no GPU needed)"),
    "calibrate": ("kit.measure.calibrate", "measure local memory bandwidth, matmul TFLOPS and step overhead"),
    "kv-stress": ("kit.measure.stress_cli", "largest context that decodes at a batch: memory guard, probes, plots"),
    "profile": (
        "kit.measure.profile_compare",
        "compare two profiled points operator by operator: `kit profile compare A B`",
    ),
    "comm": ("kit.measure.comm", "collective latency and bus bandwidth over message sizes on N ranks (torchrun)"),
    "serve-bench": (
        "kit.serve.cli",
        "benchmark a running OpenAI-compatible server (TTFT, TPOT, ITL, throughput, goodput)",
    ),
    "agree": ("kit.serve.agree_cli", "an endpoint's greedy tokens and logprobs vs the in-process reference checkpoint"),
    "dashboard": ("kit.view.dashboard", "serve the sweep control panel as a web page (Voila, 127.0.0.1)"),
    "history": ("kit.track.cli", "performance per commit: add runs, compare two commits (CI gate), HTML report"),
    "doctor": (
        "kit.check.doctor",
        "is this machine ready? versions, devices, dtypes, fp8, torch.compile, kernel libraries and their sampling ops",
    ),
    "tour": ("kit.tour.cli", "a browser walk through inference performance with a live prompt playground; --check"),
    "qualify": (
        "kit.qualification.cli",
        "qualify a node (or N through submitit): every check and measurement under one budget, verdicts, a report",
    ),
}


def parse_int_list(text: str, name: str | None = None, minimum: int | None = 1, example: str = "128,512") -> list[int]:
    """Parse a list of integers typed by a user: ``"128, 512 2048"`` → ``[128, 512, 2048]``.

    Items are separated by commas (or spaces); duplicates are dropped, order kept. Used by every CLI option and
    widget that takes such a list, so they all accept and reject the same things.

    Args:
        name: what the list is (prefixes the message, e.g. "KV lengths"); None when argparse names the option.
        minimum: smallest allowed value, or None to leave range checks to the caller.
        example: shown in messages as "(expected a comma list like EXAMPLE)".

    Raises:
        ValueError: no item, an empty item ("1,,4"), an item that is not an integer, or one below ``minimum``;
            the message names the item.
    """
    pre = f"{name}: " if name else ""
    hint = f"(expected a comma list like {example})"
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        if len(parts) > 1:
            raise UserError(f"{pre}{text!r} has an empty item {hint}")
        raise UserError(f"{pre}give at least one integer {hint}")
    if not all(parts):
        raise UserError(f"{pre}{text!r} has an empty item {hint}")
    out: list[int] = []
    for item in (x for part in parts for x in part.split()):
        try:
            v = int(item)
        except ValueError:
            raise UserError(f"{pre}{item!r} is not an integer {hint}") from None
        if minimum is not None and v < minimum:
            raise UserError(f"{pre}{item!r} is too small: {v} must be >= {minimum}")
        if v not in out:
            out.append(v)
    return out


def int_list_arg(minimum: int | None = 1, example: str = "128,512"):
    """An argparse ``type=`` for :func:`parse_int_list` (argparse prefixes the option's name to the message)."""

    def parse(text: str) -> list[int]:
        try:
            return parse_int_list(text, None, minimum, example)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def number_arg(kind: type = float, *, minimum=None, above=None, maximum=None, unit: str = "", finite: bool = True):
    """An argparse ``type=``: an int or float (``kind``), never NaN, finite unless ``finite=False`` (then ``inf``
    passes to the config's own check, for settings where it has a meaning, e.g. ``--request-rate inf``), with
    optional bounds — at least ``minimum``, more than ``above``, at most ``maximum``. A bad value is one message
    naming it and what is allowed (argparse prefixes the option): ``'nan' is not a finite number``, ``'-1' must be
    >= 0 ($/GPU-hour)``."""
    what = "an integer" if kind is int else "a finite number" if finite else "a number"
    tail = f" ({unit})" if unit else ""

    def parse(text: str):
        try:
            v = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}{tail}") from None
        if math.isnan(v) or (finite and math.isinf(v)):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}{tail}")
        if minimum is not None and not v >= minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum}{tail}")
        if above is not None and not v > above:
            raise argparse.ArgumentTypeError(f"{text!r} must be > {above}{tail}")
        if maximum is not None and not v <= maximum:
            raise argparse.ArgumentTypeError(f"{text!r} must be <= {maximum}{tail}")
        return v

    parse.__name__ = kind.__name__  # argparse's fallback wording, should a message ever be missing
    return parse


def _user_type(parse):
    """``parse`` as an argparse ``type=`` whose ValueError message is the one argparse prints (not "invalid
    <function name> value")."""
    if isinstance(parse, type):
        return parse

    def wrapped(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    wrapped.__name__ = getattr(parse, "__name__", "value")
    return wrapped


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: …)" to an option's help unless its help already names a default, or the default is
    None / False (nothing to show)."""

    def _get_help_string(self, action):
        h = action.help or ""
        d = action.default
        if not action.option_strings or d is None or d is False or d is argparse.SUPPRESS or "default" in h.lower():
            return action.help
        return (h + " " if h else "") + "(default: %(default)s)"


def config_field(
    default=dataclasses.MISSING,
    *,
    help: str,
    flag: str | None = None,
    parse=None,
    choices=None,
    cli: bool = True,
    default_factory=dataclasses.MISSING,
):
    """A dataclass field of a config (``SweepConfig``, ``LoadConfig``, ...) that also defines its CLI option.

    Args:
        help: the one help text: the dataclass's documentation, ``--help`` and the panel's tooltips.
        flag: the option (default ``--field-name``).
        parse: argparse ``type=`` (default from the annotation: int, float, str); required for lists.
        choices: allowed values (argparse ``choices=``).
        cli: False for fields that have no option (e.g. set only from Python).
    """
    meta = {"help": help, "flag": flag, "parse": parse, "choices": choices, "cli": cli}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def config_flag(cls, name: str) -> str:
    """The CLI option of field ``name`` of config dataclass ``cls`` (``"--kv"`` for ``SweepConfig.kv_lens``)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return f.metadata.get("flag") or "--" + name.replace("_", "-")


def _scalar_type(annotation: str):
    """int / float / str / bool of a field annotation string such as ``"int | None"``."""
    names = {a.strip() for a in str(annotation).split("|")} - {"None"}
    for name, typ in (
        ("bool", bool),
        ("int", number_arg(int)),
        ("float", number_arg(float, finite=False)),
        ("str", str),
    ):
        if names == {name}:
            return typ
    return None


def add_config_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """Add one option per :func:`config_field` of dataclass ``cls``, with the field's default and help, so flags,
    defaults and help text have one source (the dataclass). Booleans get ``--flag`` / ``--no-flag``."""
    d = cls()
    for f in dataclasses.fields(cls):
        m = f.metadata
        if not m.get("cli", False) or f.name in skip:
            continue
        flag = config_flag(cls, f.name)
        default = getattr(d, f.name)
        typ = _user_type(m["parse"]) if m.get("parse") else _scalar_type(f.type)
        if typ is bool:
            parser.add_argument(
                flag, dest=f.name, default=default, action=argparse.BooleanOptionalAction, help=m["help"]
            )
            continue
        if typ is None:
            raise TypeError(f"{cls.__name__}.{f.name}: give parse= for a field of type {f.type}")
        parser.add_argument(flag, dest=f.name, default=default, type=typ, choices=m.get("choices"), help=m["help"])


def add_run_dir_args(parser: argparse.ArgumentParser, default_out: str) -> None:
    """The options every command that writes a run directory shares: ``--out``, ``--no-resume`` and
    ``--retry-killed`` (the grid runner's resume rules, :func:`kit.grid.run_grid`)."""
    parser.add_argument("--out", default=default_out, help="output directory (created; a re-run resumes)")
    parser.add_argument(
        "--no-resume",
        action="store_true",
        help="measure every point again (an earlier run's files move to OUT/previous/)",
    )
    parser.add_argument(
        "--retry-killed",
        action="store_true",
        help="measure again points an earlier run died on (recorded as killed, skipped by default)",
    )


def config_from_args(cls, args: argparse.Namespace, **overrides):
    """An instance of ``cls`` from the options :func:`add_config_args` added (plus ``overrides``)."""
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    kw.update(overrides)
    return cls(**kw)


def config_with(cls, config, options: dict) -> tuple:
    """``(config, rest)`` for a library front door that takes a config object or its fields as keywords:
    ``config`` (default ``cls()``) with those of ``options`` that are fields of ``cls`` set (a new object; the
    given one is not changed), and the other options.

    Raises:
        UserError: ``config`` is not a ``cls``.
    """
    if config is not None and not isinstance(config, cls):
        raise UserError(f"config={config!r}: give a {cls.__name__} (or its fields as keywords), or None")
    names = {f.name for f in dataclasses.fields(cls)}
    mine = {k: v for k, v in options.items() if k in names}
    rest = {k: v for k, v in options.items() if k not in names}
    return dataclasses.replace(config if config is not None else cls(), **mine), rest


class _OneLineParser(argparse.ArgumentParser):
    """argparse with the kit's error convention: a bad option is ONE line on stderr naming the option, the value
    and what is allowed (``kit sweep: error: argument --kv: 'abc' is not an integer ...``), exit 2 — not the
    whole usage block (``--help`` shows that)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(message: str) -> str:
    """``message`` on one line: line breaks (a value a user typed, a server's text) shown as ``\\n`` / ``\\r``, so
    an error is always the one line the exit-code convention promises."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the command that ``argv`` names (``kit history add ...`` -> the ``history add`` parser): its
    first word that is not an option, followed through nested subcommands; ``parser`` itself when none matches."""
    words = [w for w in argv if not w.startswith("-")]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and words and words[0] in action.choices:
            return _command_parser(action.choices[words[0]], argv[argv.index(words[0]) + 1 :])
    return parser


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argparse parser. With ``only`` (a subcommand) its module is imported and builds the full parser; without,
    every subcommand is listed with its help line only (``kit --help``, a missing or unknown command)."""
    parser = _OneLineParser(prog="kit", description="LLM inference performance exploration kit.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (mod, help_line) in COMMANDS.items():
        if only is None:
            sub.add_parser(name, help=help_line)
        elif name == only:
            importlib.import_module(mod).add_cli(sub)
    return parser


def _options_by_dest(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{dest: its first long option}`` of ``parser`` and of its subcommands' parsers (a config field's dest is its
    name, e.g. ``warmup_requests`` -> ``--warmup``)."""
    out: dict[str, str] = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs:
            out.setdefault(action.dest, longs[0])
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for dest, opt in _options_by_dest(sub).items():
                    out.setdefault(dest, opt)
    return out


def _as_flag(message: str, parser: argparse.ArgumentParser) -> str:
    """A library message that starts with a setting's field name (``decode_steps=0 must be ...``) names the
    command's option instead (``--decode-steps 0 must be ...``) when the command has that option."""
    m = re.match(r"([a-z][a-z0-9_]*)=(\S+?)([;,]?\s|$)", message)
    if not m:
        return message
    flag = _options_by_dest(parser).get(m.group(1))
    if flag is None or flag in message:
        return message
    return f"{flag} {m.group(2)}{m.group(3)}{message[m.end() :]}"


def main(argv: list[str] | None = None) -> int:
    """Run ``kit <command> ...``; returns the exit code.

    Exit codes: 0 done; 2 a user error (a :class:`kit.errors.KitError`: one line on stderr, no traceback; argparse
    errors exit 2 too); 130 interrupted (Ctrl-C); a command's own non-zero code (e.g. ``--strict``). Any other
    exception is a bug: it propagates with its traceback (Python exits 1).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only)
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's parser (``kit sweep: error: ...``), not the top-level one (``kit: error:``)
        _command_parser(parser, argv).error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(format=f"kit {args.command}: %(message)s", level=logging.INFO)

    def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
        # a warning is one line naming the command, not Python's file:line and source excerpt
        print(f"kit {args.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = one_line_warning
            rc = args.func(args)
    except KitError as e:
        print(f"kit {args.command}: error: {one_line(_as_flag(str(e), parser))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # commands that keep partial results say so themselves and return 130
        out = getattr(args, "out", None)
        saved = f"; what finished before it is in {out}" if out else ""
        print(f"\nkit {args.command}: interrupted{saved}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kit ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
