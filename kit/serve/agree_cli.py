"""``kit agree``: the command-line front end of :func:`kit.serve.agree.agree` (an endpoint's greedy tokens vs the
in-process reference of the same checkpoint). Options derive from :class:`kit.serve.agree.AgreeConfig`; one line
per prompt and a summary (or ``--json``).

Exit codes: 0 every prompt passed the gate; 1 (:data:`kit.serve.agree.EXIT_DISAGREE`) a prompt disagreed beyond it
(token agreement below ``--min-agreement``, or a log-prob difference above ``--max-logprob-diff``), so CI can gate
on it; 2 a user error (a bad value, a server that cannot be reached or answers with an error, no checkpoint).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kit.cli import DefaultsHelpFormatter, add_config_args, config_from_args
from kit.errors import InputNotFoundError, UserError
from kit.serve.agree import EXIT_DISAGREE, AgreeConfig, AgreeReport, agree


def read_prompts(path: str) -> list[str]:
    """The prompts of a text file, one per line (blank lines skipped; UTF-8).

    Raises:
        InputNotFoundError: no such file. UserError: not UTF-8 text, or no prompt in it.
    """
    p = Path(path)
    if not p.is_file():
        raise InputNotFoundError(f"--prompts-file {path!r}: no such file")
    try:
        lines = [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise UserError(f"--prompts-file {path!r} is not UTF-8 text (one prompt per line)") from None
    if not lines:
        raise UserError(f"--prompts-file {path!r} holds no prompt (one prompt per line)")
    return lines


def report_lines(report: AgreeReport) -> list[str]:
    """The text ``kit agree`` prints: one line per prompt, then the summary and the verdict."""

    def num(x, fmt=".3g"):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

    lines = ["prompt  new tokens (server/ref)  ids from     first divergence  agreement  max|dlogprob|  gap"]
    for i, p in enumerate(report.prompts):
        lines.append(
            f"{i:>6}  {len(p.server_ids):>10}/{len(p.reference_ids):<12}  {p.ids_source:<11}  "
            f"{num(p.first_divergence, 'd'):>16}  {p.agreement:>9.3f}  {num(p.max_logprob_diff):>13}  "
            f"{num(p.divergence_gap)}{'' if p.passed else '  FAIL'}"
        )
    s, st = report.summary(), report.settings
    lines.append(
        f"{s['agree_fully']}/{s['prompts']} prompts agree fully; agreement min {s['min_agreement']:.3f}, median "
        f"{s['median_agreement']:.3f}; first divergence per prompt {s['first_divergence']}; max |dlogprob| "
        f"{num(s['max_logprob_diff'])} nats ({st['model']} at {st['url']} vs {st['reference']} in {st['dtype']})"
    )
    gate = f"agreement >= {st['min_agreement']:g}" + (
        f", max |dlogprob| <= {st['max_logprob_diff']:g}" if st["max_logprob_diff"] is not None else ""
    )
    verdict = "PASS" if s["passed"] else f"FAIL: prompts {s['failed']} (exit {EXIT_DISAGREE})"
    lines.append(f"{verdict} (gate: {gate})")
    return lines


def run(args) -> int:
    """The handler: prompts from ``--prompt`` / ``--prompts-file`` (default: the built-in ones), the comparison,
    the lines or ``--json``. Returns the exit code (module docstring)."""
    prompts = list(args.prompt or []) + (read_prompts(args.prompts_file) if args.prompts_file else [])
    report = agree(prompts or None, config_from_args(AgreeConfig, args, url=args.url))
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print("\n".join(report_lines(report)))
    return 0 if report.passed else EXIT_DISAGREE


def add_cli(subparsers) -> None:
    """``kit agree``: options from :class:`kit.serve.agree.AgreeConfig`, plus ``--url``, the prompts and
    ``--json``."""
    p = subparsers.add_parser(
        "agree",
        description="Send prompts greedily to an OpenAI-compatible endpoint and through the in-process reference "
        "(transformers, the same checkpoint, --dtype); per prompt the first diverging position, the token agreement "
        "and the max |logprob difference|. Exit 0 when every prompt passes the gate, "
        f"{EXIT_DISAGREE} when one disagrees beyond it, 2 for a user error.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    add_config_args(p, AgreeConfig)
    p.add_argument("--prompt", action="append", help="a prompt text (repeat for several; default: built-in ones)")
    p.add_argument("--prompts-file", help="a UTF-8 text file, one prompt per line (added after --prompt)")
    p.add_argument("--json", action="store_true", help="print one JSON object (summary, settings, every prompt)")
    p.set_defaults(func=run)
