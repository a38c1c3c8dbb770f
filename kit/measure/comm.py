"""``kit comm``: collective probes on ``torch.distributed`` — latency and bus bandwidth of all_reduce,
all_gather, reduce_scatter, all_to_all, broadcast and send/recv over message sizes (8 B … 1 GiB, doubling).

Ranks start through :func:`kit.measure.ranks.run_ranks` (torchrun): ``nproc`` local ranks; several nodes run the
same command with ``nnodes``, ``node_rank`` and node 0's ``rdzv_endpoint``. Backend: gloo on CPU, nccl on CUDA
and ROCm (RCCL). Each rank runs :mod:`kit.measure.comm_worker`: per (collective, size) a warm-up, a barrier, then
timed calls (device events on a GPU, ``perf_counter`` on CPU); p50 / p99 latency in µs with n, and algbw / busbw
in GB/s in the nccl-tests convention. **Sizes are the whole buffer S** (nccl-tests): the reduced buffer of
all_reduce, the gathered output of all_gather, the input of reduce_scatter, one rank's whole send buffer of
all_to_all, the broadcast buffer, the message each rank sends in send/recv; algbw = S / t, busbw = algbw ×
:func:`kit.metrics.busbw_factor`.

With a ``model`` (and ``batch``) the probe also times exactly the messages one decode step sends
(:func:`kit.plan.comm.step_collectives`: TP all-reduce of B × hidden, EP dispatch/combine of B × top-k × hidden
÷ ep) and :func:`decode_summary` says "per decode step this model pays N × t µs in collectives". Rows are stored
in ``out`` like every other run (``points.jsonl`` + ``results.parquet``, ``backend="comm"``, ``x_`` columns); a
run that dies keeps the points rank 0 finished. :func:`fit_links` turns the all_reduce rows into the planner's
link figures (α, busbw) and :func:`save_comm_calibration` writes them for ``kit plan --comm-calibration``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from kit import dtypes
from kit._io import atomic_write_text, check_out_dir, check_out_file
from kit.cli import DefaultsHelpFormatter, add_config_args, config_field, config_from_args
from kit.errors import UserError
from kit.measure.ranks import Rendezvous, check_local_ranks, run_ranks

log = logging.getLogger("kit")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
GPU_MAX_BYTES, CPU_MAX_BYTES = 1 << 30, 16 << 20
#: the largest message :func:`parse_bytes` accepts (1 TiB, more than any one device holds); below it
#: :meth:`CommConfig.validate` checks the largest size's buffers against the memory free on this node
MAX_SIZE_BYTES = 1 << 40


def parse_bytes(text) -> int:
    """``"8"``, ``"64K"``, ``"16M"``, ``"1G"`` (binary units) → bytes.

    Raises:
        UserError: not a size from 1 byte to :data:`MAX_SIZE_BYTES` (NaN, inf, 0, 1e30; names the value and the
            allowed form).
    """
    t = str(text).strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        v = int(float(t[:-1] if mult > 1 else t) * mult)
    except (ValueError, OverflowError):  # OverflowError: inf
        raise UserError(
            f"size {text!r} must be a number of bytes, optionally with K, M or G (e.g. 8, 64K, 1G)"
        ) from None
    if not 0 < v <= MAX_SIZE_BYTES:
        raise UserError(f"size {text!r} must be > 0 bytes and at most {MAX_SIZE_BYTES >> 30}G (1 TiB)")
    return v


def _ops_arg(text) -> list[str]:
    ops = [o.strip() for o in str(text).split(",") if o.strip()] if isinstance(text, str) else list(text)
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        what = f"has unknown collective(s) {bad}" if bad else "names no collective"
        raise UserError(f"{text!r} {what}; allowed: {', '.join(OPS)}")
    return ops


@dataclass
class CommConfig:
    """The settings of ``kit comm`` (each field's ``help`` is also the CLI's)."""

    ops: list = config_field(default_factory=lambda: list(OPS), parse=_ops_arg, help="collectives, comma list")
    min_bytes: int = config_field(8, parse=parse_bytes, help="smallest message S (whole buffer), e.g. 8, 1K")
    max_bytes: int | None = config_field(
        None, parse=parse_bytes, help="largest message (default 1G with nccl, 16M with gloo on CPU); sizes double"
    )
    dtype: str = config_field("float32", help="element dtype of the buffers (float32, bfloat16, ...)")
    warmup: int = config_field(5, help="untimed calls per size")
    iters: int = config_field(20, help="timed calls per size (p50/p99 over them)")
    nproc: int = config_field(2, help="ranks on this node")
    nnodes: int = config_field(1, help="nodes (run the same command on each, with --node-rank)")
    node_rank: int = config_field(0, help="this node's rank in [0, nnodes)")
    rdzv_endpoint: str | None = config_field(None, help="node 0's host:port (needed with --nnodes > 1)")
    backend: str | None = config_field(None, help="gloo or nccl (default: nccl with a GPU, else gloo)")
    timeout_s: float = config_field(600.0, help="limit of the whole run, s")
    join_timeout_s: float = config_field(60.0, help="how long the rendezvous waits for every node, s")
    model: str | None = config_field(None, help="also time one decode step's messages of this model")
    batch: int = config_field(1, help="decode batch B for --model")
    accelerator: str | None = config_field(None, help="catalog accelerator whose planner figure to print beside")
    save_links: str | None = config_field(None, help="write the fitted link α/busbw here (for kit plan)")
    out: str = config_field("results/comm", help="output directory (rows stored; plots written)")
    resume: bool = config_field(
        True,
        help="skip (collective, size) points already stored in OUT, on one node (--no-resume measures all again; "
        "the earlier files move to OUT/previous/)",
    )
    fail_rank: int | None = config_field(None, cli=False, help="a rank that exits early (tests)")

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    def sizes(self) -> list[int]:
        """Doubling sizes from ``min_bytes`` to ``max_bytes`` (default per backend)."""
        hi = self.max_bytes or (GPU_MAX_BYTES if self.dist_backend() == "nccl" else CPU_MAX_BYTES)
        out, s = [], self.min_bytes
        while s <= hi:
            out.append(s)
            s *= 2
        return out

    def dist_backend(self) -> str:
        if self.backend:
            return self.backend
        from kit.measure.ranks import default_backend

        return default_backend()

    def validate(self) -> CommConfig:
        """Raises UserError for a bad size range, dtype, count, backend, a single rank, more ranks than this node runs
        (:func:`kit.measure.ranks.check_local_ranks`) or buffers past its free memory."""
        self.ops = _ops_arg(self.ops)
        self.dtype = dtypes.canonical(self.dtype)
        if self.max_bytes is not None and self.max_bytes < self.min_bytes:
            raise UserError(f"max_bytes={self.max_bytes} must be >= min_bytes={self.min_bytes}")
        for name in ("warmup", "iters", "nproc", "nnodes", "batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < (0 if name == "warmup" else 1):
                raise UserError(f"{name}={v!r} must be an integer >= {0 if name == 'warmup' else 1}")
        if self.world < 2:
            raise UserError(f"nproc × nnodes = {self.world}: a collective needs at least 2 ranks")
        if self.backend not in (None, "gloo", "nccl"):
            raise UserError(f"backend={self.backend!r}; allowed: gloo, nccl (nccl is RCCL on ROCm)")
        check_local_ranks(self.nproc, "nproc", self.dist_backend())
        self._check_memory()
        if self.rdzv_endpoint:
            host, _, port = str(self.rdzv_endpoint).rpartition(":")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise UserError(f"rdzv_endpoint={self.rdzv_endpoint!r} must be host:port with a port in 1-65535")
        if self.save_links:
            check_out_file(self.save_links, "--save-links", "links.json")  # before measuring, like --out
        for name in ("timeout_s", "join_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
                raise UserError(f"{name}={v!r} must be a number of seconds > 0")
        if self.accelerator:
            from kit.catalog import load_catalog

            self.accelerator = load_catalog().resolve(self.accelerator)  # UnknownNameError lists the known ones
        return self

    def _check_memory(self) -> None:
        """The largest size's buffers fit in the memory free on this node, before any rank starts: each rank holds
        the message, a 1/world part and (all_to_all, send_recv) an output as large as the message; gloo ranks
        share this machine's memory, nccl ranks have a GPU each. A margin stays free
        (:func:`kit.measure.memguard.default_margin_gb`).

        Raises:
            UserError: naming the largest size, the bytes it needs and the GB free (with their source).
        """
        from kit.measure import memguard

        sizes = self.sizes()
        if not sizes:
            return
        nccl = self.dist_backend() == "nccl"
        per_rank = sizes[-1] * (1 + 1 / self.world + any(op in ("all_to_all", "send_recv") for op in self.ops))
        need_gb = per_rank * (1 if nccl else self.nproc) / memguard.GB
        free = memguard.available_memory("cuda" if nccl else "cpu")
        margin = memguard.default_margin_gb(free.total_gb)
        if need_gb > free.free_gb - margin:
            where = "one GPU" if nccl else f"this machine ({self.nproc} ranks)"
            raise UserError(
                f"max_bytes={self.max_bytes or sizes[-1]}: the largest size probed, {sizes[-1]:,} bytes, needs "
                f"{need_gb:.2f} GB of buffers on {where} but {free.free_gb:.2f} GB are free ({free.source}) minus a "
                f"{margin:.2f} GB margin; give a smaller size"
            )


def decode_points(model, batch: int, world: int) -> list[dict]:
    """The messages one decode step of ``model`` at batch ``batch`` sends with TP = EP = ``world`` ranks
    (:func:`kit.plan.comm.step_collectives`, bfloat16 activations), as probe points with their count per step."""
    from kit.plan.comm import step_collectives
    from kit.plan.spec import get_spec

    spec = get_spec(model)
    ep = world if spec.is_moe else 1
    return [
        {"op": op, "size_bytes": int(round(size)), "decode_term": term, "decode_count": count, "model": spec.name}
        for term, op, size, count, _ in step_collectives(spec, batch, world, ep, 1, "bfloat16")
    ]


def comm_point_id(point: dict, cfg: CommConfig) -> str:
    """The stored identity of one probe point: collective, size (B), ranks, nodes, dtype, backend and decode term
    (a re-run with the same settings finds it and skips it)."""
    size = int(point.get("requested_bytes", point["size_bytes"]))  # the size asked for (a rank may round it)
    key = [point["op"], size, cfg.world, cfg.nnodes, cfg.dtype, cfg.dist_backend()]
    return hashlib.sha1(json.dumps([*key, point.get("decode_term")]).encode()).hexdigest()[:16]


def _record(row: dict, cfg: CommConfig, run_id: str) -> dict:
    from kit.hardware import detect

    info = detect("cuda" if row["backend"] == "nccl" else "cpu")
    return {
        "run_id": run_id,
        "point_id": comm_point_id(row, cfg),
        "backend": "comm",
        "status": "ok",
        "model": row.get("model"),
        "dtype": cfg.dtype,
        "device": info.platform,
        "device_name": info.name,
        "n_gpus": row["n_ranks"],
        "concurrency": cfg.batch if row.get("decode_term") else None,
        **{f"x_{k}": row.get(k) for k in ("op", "size_bytes", "n_ranks", "lat_us_p50", "lat_us_p99", "n")},
        "x_algbw_gb_s": row["algbw_gb_s"],
        "x_busbw_gb_s": row["busbw_gb_s"],
        "x_dist_backend": row["backend"],
        "x_nnodes": cfg.nnodes,
        "x_decode_term": row.get("decode_term"),
        "x_decode_count": row.get("decode_count"),
    }


def run_comm(cfg: CommConfig | None = None, **kw) -> pd.DataFrame:
    """Run the probes (see the module docstring) and return the rows of every requested point, measured now or
    stored by an earlier run with the same settings (a :mod:`kit.results` frame; empty on a node other than 0).
    Rows rank 0 finished are stored in ``cfg.out`` even when the run fails.

    Raises:
        UserError: bad settings (:meth:`CommConfig.validate`), a bad output path.
        RankError: a rank died, the rendezvous did not complete, or the run passed ``timeout_s``.
    """
    from kit.results import to_frame
    from kit.store import ResultStore, run_lock, run_metadata

    cfg = (cfg or CommConfig(**kw)).validate()
    out = check_out_dir(cfg.out, "out", "results/comm")
    points = [{"op": op, "size_bytes": s} for op in cfg.ops for s in cfg.sizes()]
    if cfg.model:
        points += decode_points(cfg.model, cfg.batch, cfg.world)
    wanted = {comm_point_id(p, cfg) for p in points}
    if cfg.nnodes == 1:  # (across nodes every node must call the same collectives: all are measured)
        with run_lock(out):
            if not cfg.resume:
                from kit.grid import archive_previous

                archive_previous(out)
            done = ResultStore(out).finished_ids(("ok",)) if (out / "points.jsonl").exists() else set()
        todo = [p for p in points if comm_point_id(p, cfg) not in done]
        if len(todo) < len(points):
            log.info("resuming: %d of %d points already stored in %s (--no-resume to measure all again)",
                     len(points) - len(todo), len(points), out)  # fmt: skip
        if not todo:
            return _stored_rows(out, wanted)
        points = todo
    run_id = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S%f")
    work = out / "runs" / run_id
    work.mkdir(parents=True, exist_ok=True)
    rows_path = work / "rows.jsonl"
    job = {**asdict(cfg), "rows_path": str(rows_path), "points": points}
    atomic_write_text(work / "config.json", json.dumps(job, indent=1))
    try:
        rdzv = Rendezvous(cfg.nnodes, cfg.node_rank, cfg.rdzv_endpoint, cfg.join_timeout_s)
        run_ranks(["-m", "kit.measure.comm_worker", str(work / "config.json")], cfg.nproc, log_dir=work / "logs",
                  rdzv=rdzv, timeout_s=cfg.timeout_s)  # fmt: skip
    finally:
        rows = [json.loads(ln) for ln in rows_path.read_text().splitlines()] if rows_path.exists() else []
        if rows:
            meta = run_metadata(kind="comm", config={k: v for k, v in job.items() if k != "points"})
            with run_lock(out):
                store = ResultStore(out, meta)
                for r in rows:
                    store.append(_record(r, cfg, run_id))
            log.info("comm: %d rows stored in %s", len(rows), out)
    if not rows:
        return to_frame([])
    return _stored_rows(out, wanted)


def _stored_rows(out: Path, point_ids: set[str]) -> pd.DataFrame:
    """The latest stored row of each of ``point_ids`` in the run directory ``out``."""
    from kit.store import latest_rows, load_results

    df = load_results(out)
    return latest_rows(df, point_ids).reset_index(drop=True)


def fit_links(df: pd.DataFrame) -> dict:
    """The planner's link figures from a probe's all_reduce rows: α = p50 latency at the smallest size (µs),
    busbw = the largest busbw over the sizes (GB/s); the link is scale-out when the run spanned nodes.

    Raises:
        UserError: no all_reduce rows.
    """
    ar = df[(df["x_op"] == "all_reduce") & df["x_decode_term"].isna()] if "x_op" in df.columns else df.iloc[:0]
    if ar.empty:
        raise UserError("fitting link figures needs all_reduce rows (run kit comm with all_reduce in --ops)")
    name = "scale-out" if int(ar["x_nnodes"].max()) > 1 else "scale-up"
    smallest = ar.sort_values("x_size_bytes").iloc[0]
    return {
        name: {
            "alpha_us": float(smallest["x_lat_us_p50"]),
            "busbw_gb_s": float(ar["x_busbw_gb_s"].max()),
            "n_ranks": int(ar["x_n_ranks"].max()),
            "alpha_size_bytes": int(smallest["x_size_bytes"]),
            "device_name": str(smallest["device_name"]),
        }
    }


def save_comm_calibration(df: pd.DataFrame, path: str | Path) -> Path:
    """Write :func:`fit_links` of ``df`` as JSON (read by :func:`kit.plan.comm.apply_comm_calibration`)."""
    p = check_out_file(path, "--save-links", "links.json")
    doc = {"created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "links": fit_links(df)}
    atomic_write_text(p, json.dumps(doc, indent=2))
    return Path(p)


def decode_summary(df: pd.DataFrame) -> list[str]:
    """One line per decode-step message kind and a total: ``"per decode step this model pays 187 × 310.2 µs in
    TP all-reduce (14,336 B, all_reduce over 2 ranks) = 58.0 ms"``; [] without decode rows."""
    d = df[df["x_decode_term"].notna()] if "x_decode_term" in df.columns else df.iloc[:0]
    lines, total = [], 0.0
    for _, r in d.iterrows():
        t = float(r["x_lat_us_p50"])
        n = int(r["x_decode_count"])
        total += n * t
        lines.append(
            f"per decode step this model pays {n} × {t:,.1f} µs in {r['x_decode_term']} ({int(r['x_size_bytes']):,} B, "
            f"{r['x_op']} over {int(r['x_n_ranks'])} ranks) = {n * t / 1e3:,.2f} ms"
        )
    if lines:
        lines.append(f"per decode step this model pays {total / 1e3:,.2f} ms in collectives (measured p50 sum)")
    return lines


def planner_line(cfg: CommConfig) -> str | None:
    """The planner's figure for the same model, batch and ranks on ``cfg.accelerator`` (catalog links, no stack
    profile):
    ``"planner (B300, TP2): 187 collectives, 1.31 ms latency + 0.00 ms bandwidth of a 4.10 ms step"``."""
    if not (cfg.model and cfg.accelerator):
        return None
    import warnings

    from kit.plan.config import PredictConfig
    from kit.plan.roofline import predict_point

    # no serving-stack profile: the catalog's links, and EP = TP for a MoE, as the decode path measured above
    plan = PredictConfig(accelerator=cfg.accelerator, n_gpus=cfg.world, tp=cfg.world, prefill=False, stack="none")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heads that do not split over a small test world
        r = predict_point(cfg.model, cfg.batch, 1024, plan)
    return (
        f"planner ({r['accelerator']}, TP{r['tp']} EP{r['x_ep']}): collectives {r['x_t_comm_lat_ms']:.2f} ms "
        f"latency + {r['x_t_comm_bw_ms']:.2f} ms bandwidth of a {r['x_step_ms']:.2f} ms decode step"
    )


def add_cli(sub) -> None:
    """``kit comm``: collective latency and bus bandwidth over message sizes, through torchrun."""
    p = sub.add_parser(
        "comm",
        formatter_class=DefaultsHelpFormatter,
        description="Probe collectives (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv) "
        "over message sizes on N ranks started by torchrun: p50/p99 latency (µs, n) and algbw/busbw (GB/s, "
        "nccl-tests convention; a size is the whole buffer). Two nodes: run on each node "
        "`kit comm --nproc 8 --nnodes 2 --node-rank R --rdzv-endpoint node0:29500` (R = 0 on node0, 1 on the "
        "other). Writes OUT/results.parquet, OUT/comm_latency.png, OUT/comm_busbw.png.",
    )
    add_config_args(p, CommConfig)
    p.set_defaults(func=_cli_comm)


def _cli_comm(args) -> int:
    cfg = config_from_args(CommConfig, args)
    df = run_comm(cfg)
    if df.empty:
        print(f"node {cfg.node_rank}: done (node 0 stores the rows)")
        return 0
    from kit.view.comm_plots import save_comm_plots

    t = df[df["x_decode_term"].isna()]
    cols = ["x_op", "x_size_bytes", "x_lat_us_p50", "x_lat_us_p99", "x_n", "x_algbw_gb_s", "x_busbw_gb_s"]
    with pd.option_context("display.max_rows", 500, "display.width", 140):
        print(t[cols].rename(columns=lambda c: c[2:]).to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
    for line in decode_summary(df):
        print(line)
    pl = planner_line(cfg)
    if pl:
        print(pl)
    for png in save_comm_plots(df, cfg.out):
        print(f"plot: {png}")
    if cfg.save_links:
        print(f"link figures: {save_comm_calibration(df, cfg.save_links)} ({fit_links(df)})")
    print(f"stored: {cfg.out}/results.parquet ({len(df)} rows of this run)")
    return 0
