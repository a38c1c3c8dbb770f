"""``kit qualify``: qualify this node (or N nodes through submitit) with one command; exit 0 when nothing failed,
1 when something failed, 2 for a user error."""

from __future__ import annotations

import argparse
import dataclasses

from kit.cli import DefaultsHelpFormatter, int_list_arg, number_arg
from kit.errors import UserError
from kit.qualification.config import ITEMS, LAUNCHERS, QualifyConfig, Thresholds, parse_budget

EXECUTORS = ("local", "slurm")


def _budget(text: str) -> float:
    try:
        return parse_budget(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _items(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in str(text).split(",") if t.strip())
    bad = [n for n in names if n not in ITEMS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give a comma list of {', '.join(ITEMS)}")
    return names


def add_cli(sub) -> None:
    p = sub.add_parser(
        "qualify",
        formatter_class=DefaultsHelpFormatter,
        description="Qualify a node: doctor, sampling ops eager and compiled, the seed workload in-process (and "
        "served with --url/--launch), KV stress, collectives, power, calibration and the planner's prediction, "
        "each under its share of --budget, each with a verdict (pass | warn | fail | skip) and the threshold that "
        "decided it. Writes OUT/index.html, OUT/qualify.json and every item's raw results under OUT; a re-run "
        "resumes finished items. Exit 0: nothing failed; 1: something failed; 2: a user error.",
    )
    p.add_argument("--budget", type=_budget, default=900.0, help="time budget, e.g. 90s, 5m, 1h30m (default 15m)")
    p.add_argument("--out", default="results/qualify", help="output directory (a re-run resumes)")
    p.add_argument("--no-resume", action="store_true", help="run every item again (earlier files move aside)")
    p.add_argument(
        "--model", default=None, help="model preset or checkpoint (default: tiny-llama on CPU, llama-3.1-8b on GPU)"
    )
    p.add_argument("--dtype", default=None, help="dtype (default: float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | rocm")
    p.add_argument("--isl", type=number_arg(int, minimum=1), default=None, help="prompt tokens (default 1024; CPU 128)")
    p.add_argument("--osl", type=number_arg(int, minimum=1), default=None, help="output tokens (default 400; CPU 16)")
    p.add_argument("--concurrency", type=int_list_arg(example="1,24,64"), default=None,
                   help="concurrencies (default 1,24,64; CPU 1,4,8)")  # fmt: skip
    p.add_argument("--url", default=None, help="a running OpenAI-compatible endpoint to run the seed workload against")
    p.add_argument("--served-model", default=None, help="served model id (default: the server's first; with --launch "
                   "the checkpoint or model id to serve)")  # fmt: skip
    p.add_argument("--launch", choices=LAUNCHERS, default=None, help="start this server, benchmark it, stop it")
    p.add_argument("--items", type=_items, default=tuple(ITEMS), help="comma list of items to run (default: all)")
    p.add_argument("--op-impl", dest="op_impls", action="append", default=[], metavar="OP=MODULE:FUNCTION",
                   help="check this implementation of an op instead of the resolved one; repeatable")  # fmt: skip
    p.add_argument("--compile-backend", default=None, help="torch.compile backend of the op checks")
    p.add_argument("--compile-ops", type=number_arg(int, minimum=0), default=None,
                   help="compile-check at most N ops (0: eager only; default: what the budget allows)")  # fmt: skip
    p.add_argument("--kv-budget-gb", type=number_arg(float, above=0), default=None,
                   help="memory the KV stress may use, GB (default: free memory minus the guard's margin)")  # fmt: skip
    p.add_argument(
        "--threads",
        type=number_arg(int, minimum=1),
        default=None,
        help="CPU only: torch threads of the in-process items (default: one per core free at the start)",
    )
    p.add_argument(
        "--compile-timeout",
        type=number_arg(float, above=0),
        default=None,
        metavar="S",
        help="seconds the doctor's torch.compile check may take (default: 60%% of its share, at most 25)",
    )
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="override a threshold (--list-thresholds: each with its source); repeatable")  # fmt: skip
    p.add_argument("--list-thresholds", action="store_true", help="print the thresholds and their sources, exit")
    p.add_argument("--db", default=None, help="history database: one row per item; compared with the previous run")
    p.add_argument("--nodes", type=number_arg(int, minimum=1), default=None, help="qualify N nodes through submitit")
    p.add_argument("--executor", choices=EXECUTORS, default="slurm", help="with --nodes: slurm, or local (one machine)")
    p.add_argument("--partition", default=None, help="with --executor slurm: the Slurm partition")
    p.add_argument("--gpus-per-node", type=number_arg(int, minimum=0), default=None, help="with --executor slurm")
    p.add_argument("--rdzv-endpoint", default=None, help="with --nodes: host:port for cross-node collectives")
    p.set_defaults(func=_cli)


def config_from(args) -> QualifyConfig:
    """The :class:`QualifyConfig` of parsed ``kit qualify`` options (checked by its ``validate``)."""
    return QualifyConfig(
        out=args.out, budget_s=args.budget, model=args.model, dtype=args.dtype, device=args.device, isl=args.isl,
        osl=args.osl, concurrencies=tuple(args.concurrency) if args.concurrency else None, url=args.url,
        served_model=args.served_model, launch=args.launch, items=args.items, op_impls=tuple(args.op_impls),
        compile_backend=args.compile_backend, compile_ops=args.compile_ops, kv_budget_gb=args.kv_budget_gb,
        threads=args.threads, compile_timeout_s=args.compile_timeout,
        rdzv_endpoint=args.rdzv_endpoint, db=args.db, thresholds=Thresholds().with_overrides(args.threshold),
        resume=not args.no_resume,
    ).validate()  # fmt: skip


def _cli(args) -> int:
    if args.list_thresholds:
        for f in dataclasses.fields(Thresholds):
            lo, hi = Thresholds.allowed(f.name)
            print(f"{f.name} = {f.default:g}\n    {Thresholds.source(f.name)}\n    allowed: {lo:g} to {hi:g}")
        return 0
    if args.nodes is None and (args.rdzv_endpoint or args.partition or args.gpus_per_node is not None):
        raise UserError("--rdzv-endpoint, --partition and --gpus-per-node go with --nodes N (a cluster run)")
    if args.nodes is not None:
        from kit.qualification.cluster import ClusterConfig, check_nodes, qualify_cluster

        cc = ClusterConfig(args.nodes, args.executor, args.partition, args.gpus_per_node)
        check_nodes(cc)
        config = config_from(args)
        return qualify_cluster(config, cc)["exit_code"]
    from kit.qualification.node import qualify

    return qualify(config_from(args))["exit_code"]
