"""Qualify N nodes at once through submitit (the Slurm submission library): one job of N tasks, one per node
(Slurm: ``nodes=N``, one task each; submitit's local executor: N tasks on this machine, for tests and a dry run).
Each task qualifies its node into ``OUT/node-<rank>`` (:func:`kit.qualification.node.qualify`; with
``--rdzv-endpoint`` the collectives span the nodes, each task's rank as torchrun's node rank). Then
:func:`compare_nodes` puts the nodes side by side — per item each node's verdict and headline figure, the outlier
named — in ``OUT/cluster.html`` and ``OUT/cluster.json``; with ``--db`` every node's items go to the history.
"""

from __future__ import annotations

import dataclasses
import html
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kit._io import atomic_write_text, check_out_dir
from kit.errors import UserError
from kit.qualification.config import QualifyConfig, Thresholds
from kit.qualification.report import CSS, cell_html

#: minutes a node's job may run beyond its budget (model downloads, compiler caches, start-up)
SLACK_MIN = 15


@dataclass(frozen=True)
class ClusterConfig:
    """How the nodes are reached: ``nodes`` (N), ``executor`` (``slurm`` | ``local``), the Slurm ``partition``
    and ``gpus_per_node`` (None: the cluster's default)."""

    nodes: int
    executor: str = "slurm"
    partition: str | None = None
    gpus_per_node: int | None = None


#: the most nodes of one Slurm job (a typo such as 1000000 must not reach the scheduler)
MAX_SLURM_NODES = 1024
#: the most tasks of the local executor (each imports torch and runs every item on this one machine: a dry run)
MAX_LOCAL_NODES = 8


def check_nodes(cc: ClusterConfig) -> None:
    """Check the node count and that the executor can run here, before any job is submitted.

    Raises:
        UserError: ``nodes`` below 1 or above the executor's cap (local: 8; slurm: 1024), or the
            slurm executor without ``srun`` on this machine (the message suggests ``--executor local``).
    """
    import shutil

    cap = MAX_LOCAL_NODES if cc.executor == "local" else MAX_SLURM_NODES
    if isinstance(cc.nodes, bool) or not isinstance(cc.nodes, int) or not 1 <= cc.nodes <= cap:
        why = "tasks on this one machine" if cc.executor == "local" else "nodes of one Slurm job"
        raise UserError(f"--nodes {cc.nodes!r}: the {cc.executor} executor takes 1 to {cap} ({why})")
    if cc.executor == "slurm" and shutil.which("srun") is None:
        raise UserError(
            f"--nodes {cc.nodes} --executor slurm: no srun on this machine (not a Slurm login node); run on one, "
            "or use --executor local to qualify this machine as N local nodes"
        )


def node_task(config: QualifyConfig) -> dict:
    """What one task runs: its rank from submitit's job environment picks ``OUT/node-<rank>`` (and the node rank
    of cross-node collectives); returns the node's ``qualify.json`` content plus ``node`` and ``host``."""
    import submitit

    from kit.qualification.node import qualify

    env = submitit.JobEnvironment()
    rank = env.global_rank
    node_rank = rank if config.nnodes > 1 else 0  # the rendezvous rank, with cross-node collectives only
    cfg = dataclasses.replace(config, out=str(Path(config.out) / f"node-{rank}"), node_rank=node_rank, db=None)
    s = qualify(cfg, echo=lambda line: print(f"[node-{rank}] {line}", flush=True))
    return {**s, "node": f"node-{rank}", "host": env.hostname}


def _executor(cc: ClusterConfig, out: Path, budget_s: float):
    import submitit

    ex = submitit.AutoExecutor(folder=out / "submitit", cluster=cc.executor)
    minutes = int(budget_s / 60) + SLACK_MIN
    if cc.executor == "local":
        ex.update_parameters(timeout_min=minutes, nodes=1, tasks_per_node=cc.nodes)
    else:
        extra = {"slurm_partition": cc.partition} if cc.partition else {}
        if cc.gpus_per_node is not None:
            extra["gpus_per_node"] = cc.gpus_per_node
        ex.update_parameters(timeout_min=minutes, nodes=cc.nodes, tasks_per_node=1, name="kit-qualify", **extra)
    return ex


def qualify_cluster(config: QualifyConfig, cc: ClusterConfig, echo=print) -> dict:
    """Qualify ``cc.nodes`` nodes (see the module docstring) and compare them.

    Returns:
        ``cluster.json``'s content: ``nodes`` (each node's summary: node, host, overall, exit_code, items),
        ``items`` (per item: each node's verdict and headline, the ``outlier`` and why), ``exit_code`` (1 when any
        node failed an item), ``report`` (``OUT/cluster.html``).

    Raises:
        UserError: an unknown executor, a partition or GPUs with the local executor, a node count out of range or
            no Slurm (:func:`check_nodes`).
    """
    if cc.executor not in ("local", "slurm"):
        raise UserError(f"executor={cc.executor!r}; allowed: local, slurm")
    if cc.executor == "local" and (cc.partition or cc.gpus_per_node):
        raise UserError("--partition and --gpus-per-node are Slurm settings; the local executor takes neither")
    check_nodes(cc)
    config = dataclasses.replace(config, nnodes=cc.nodes if config.rdzv_endpoint else 1).validate()
    out = check_out_dir(config.out, "--out", "results/qualify")
    job = _executor(cc, out, config.budget_s).submit(node_task, config)
    echo(f"kit qualify: {cc.nodes} node(s) submitted to {cc.executor} (job {job.job_id}); logs in {out / 'submitit'}")
    results = job.results()
    nodes = sorted(results, key=lambda s: s["node"])
    if config.db:
        from kit.qualification.history import record

        for s in nodes:
            record(config.db, Path(s["out"]) / "items", s["machine"]["device"], [i["run_id"] for i in s["items"]])
    c = compare_nodes(nodes, config.thresholds)
    c["report"] = str(write_cluster_report(c, out))
    atomic_write_text(out / "cluster.json", json.dumps(c, indent=2, default=str))
    for it in c["items"]:
        if it["outlier"]:
            echo(f"kit qualify: {it['item']}: outlier {it['outlier']} ({it['why']})")
    echo(f"kit qualify: cluster {'FAIL' if c['exit_code'] else 'ok'} — comparison {c['report']}")
    return c


def _outlier(rows: list[dict], frac: float) -> tuple[str | None, str]:
    """The node that stands out for one item: a node failing where others do not, else the node whose headline is
    furthest from the median when more than ``frac`` of it away (equally far: the worse one, by the figure's
    ``higher_is_better``; with two nodes both are equally far); ``(None, why)`` when none does."""
    failing = [r["node"] for r in rows if r["verdict"] == "fail"]
    if failing and len(failing) < len(rows):
        return failing[0], f"fails where {len(rows) - len(failing)} other node(s) do not"
    vals = [r for r in rows if r["value"] is not None]
    if len(vals) < 2:
        return None, "no headline figure to compare" if not vals else "only one node has a figure"
    med = statistics.median(r["value"] for r in vals)
    sign = lambda r: -r["value"] if r.get("higher_is_better", True) else r["value"]  # noqa: E731
    worst = max(vals, key=lambda r: (round(abs(r["value"] - med), 12), sign(r)))
    dev = abs(worst["value"] - med) / abs(med) if med else 0.0
    if dev > frac:
        return worst["node"], f"{worst['value']:.4g} is {dev:.0%} from the median {med:.4g} (more than {frac:.0%})"
    return None, f"all within {frac:.0%} of the median {med:.4g}"


def compare_nodes(nodes: list[dict], th: Thresholds | None = None) -> dict:
    """Per item, each node's verdict and headline figure and the outlier (a node failing where others do not, else
    the one furthest from the median when more than ``th.cluster_outlier_fraction`` away); ``nodes``: the nodes'
    summaries (``node``, ``host``, ``items``, ``exit_code``, ``overall``)."""
    frac = (th or Thresholds()).cluster_outlier_fraction
    names = [i["item"] for i in nodes[0]["items"]] if nodes else []
    items = []
    for name in names:
        rows = []
        for s in nodes:
            it = next(i for i in s["items"] if i["item"] == name)
            h = it.get("headline") or {}
            rows.append({"node": s["node"], "verdict": it["verdict"], "value": h.get("value"), "name": h.get("name"),
                         "unit": h.get("unit"), "higher_is_better": h.get("higher_is_better", True),
                         "reason": it["reason"]})  # fmt: skip
        node, why = _outlier(rows, frac)
        items.append({"item": name, "nodes": rows, "outlier": node, "why": why})
    summary = [{k: s.get(k) for k in ("node", "host", "overall", "exit_code", "out", "report")} for s in nodes]
    return {"nodes": summary, "items": items, "exit_code": int(any(s["exit_code"] for s in nodes))}


def write_cluster_report(c: dict, out: Path) -> Path:
    """``out/cluster.html``: a table item × node (verdict and headline figure; the outlier's cell marked), the
    figure of headline values per node (embedded), and a link to each node's own page."""
    import base64

    from kit.view.files import save_figure
    from kit.view.qualify_plots import node_comparison

    names = [n["node"] for n in c["nodes"]]
    head = "<tr><th>item</th>" + "".join(f"<th>{n}</th>" for n in names) + "<th>outlier</th></tr>"
    body = ""
    for it in c["items"]:
        cells = ""
        for r in it["nodes"]:
            mark = " outlier" if r["node"] == it["outlier"] else ""
            val = "" if r["value"] is None else f"<br>{cell_html(r['value'])} {r['unit'] or ''}"
            cells += f'<td class="v-{r["verdict"]}{mark}">{r["verdict"]}{val}</td>'
        who = f"<b>{it['outlier']}</b>: " if it["outlier"] else "none: "
        body += f"<tr><td>{it['item']}</td>{cells}<td>{who}{html.escape(it['why'])}</td></tr>"
    flat = pd.DataFrame([{**r, "item": it["item"]} for it in c["items"] for r in it["nodes"]])
    outliers = {it["item"]: it["outlier"] for it in c["items"] if it["outlier"]}
    png = save_figure(node_comparison(flat, outliers), out / "cluster.png")
    uri = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    links = "".join(f'<li><a href="{Path(n["report"]).relative_to(out)}">{n["node"]}</a> ({n["host"]}): '
                    f"{n['overall']}</li>" for n in c["nodes"])  # fmt: skip
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>kit qualify: {len(names)} nodes</title>"
        f"<style>{CSS} td.outlier{{outline:3px solid #b00}} #cluster-plot{{max-width:100%}}</style></head><body>"
        f"<h1>Qualification of {len(names)} nodes</h1>"
        f'<table class="kit-cluster"><thead>{head}</thead><tbody>{body}</tbody></table>'
        f'<h2>Headline figure per node</h2><img class="kit-plot" id="cluster-plot" alt="per node" src="{uri}">'
        f"<h2>Each node's report</h2><ul>{links}</ul></body></html>"
    )
    return atomic_write_text(out / "cluster.html", page)
