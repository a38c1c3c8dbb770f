"""The qualification's report: ``OUT/qualify.json`` (every verdict, threshold, figure and plot path, the plan,
the machine, versions and commit) and ``OUT/index.html``, one self-contained page — the verdict table first, then
each item's figures and plots (PNGs embedded as data URIs), the choices made, the machine's identity, versions and
commit."""

from __future__ import annotations

import dataclasses
import html
import json
from pathlib import Path

from kit._io import atomic_write_text
from kit.qualification.config import Plan
from kit.qualification.verdicts import exit_code, overall

CSS = """body{font-family:system-ui,sans-serif;margin:24px;max-width:1250px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}img.kit-plot{max-width:560px;border:1px solid #ddd;margin:4px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;vertical-align:top}
td.v-pass{background:#dfd}td.v-fail{background:#fcc;font-weight:bold}td.v-warn{background:#ffe9b3}
td.v-skip{background:#eee;color:#555}.overall-fail{color:#b00}.overall-pass{color:#070}.overall-warn{color:#a60}
pre{font-size:12px;white-space:pre-wrap}"""


def machine_facts(p: Plan, doctor_json: Path | None = None) -> dict:
    """The machine's identity, versions and commit: the doctor's report when the ``doctor`` item wrote one, plus
    :func:`kit.store.run_metadata`'s host, versions and git commit."""
    from kit.store import run_metadata

    meta = run_metadata()
    facts = {"host": meta["host"], "device": p.device_name, "platform": p.platform, "devices": p.n_devices,
             "catalog_name": p.catalog_name, "commit": meta["git_commit"], "kit": meta["kit_version"],
             "torch": meta["torch_version"], "cuda": meta["torch_cuda"], "hip": meta["torch_hip"],
             "transformers": meta["transformers_version"], "python": meta["python"]}  # fmt: skip
    if doctor_json is not None and doctor_json.exists():
        d = json.loads(doctor_json.read_text())
        facts.update(identity=d["device"]["identity"], visibility=d["device"]["visibility"],
                     os=d["platform"]["os"], packages={k: v for k, v in d["packages"].items() if v})  # fmt: skip
    return facts


def summary(p: Plan, items: list[dict], out: Path, budget_s: float, comparison: dict | None) -> dict:
    """The content of ``qualify.json``."""
    vs = [i["verdict"] for i in items]
    return {
        "overall": overall(vs),
        "exit_code": exit_code(vs),
        "budget_s": budget_s,
        "out": str(out),
        "plan": dataclasses.asdict(p),
        "items": items,
        "machine": machine_facts(p, out / "doctor" / "doctor.json"),
        "comparison": comparison,
    }


def cell_html(v) -> str:
    """A value as escaped HTML: floats to 4 significant digits, dicts and lists as JSON (cut at 400 characters)."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        text = json.dumps(v, default=str, ensure_ascii=False)
        return html.escape(text if len(text) < 400 else text[:400] + " …")
    return html.escape(str(v))


def _img(path: str, title: str, item: str, k: int) -> str:
    p = Path(path)
    if not p.exists():
        return f"<p>missing plot {html.escape(path)}</p>"
    from kit.view.render import png_data_uri

    uri = png_data_uri(p.read_bytes())
    t = html.escape(title)
    return f'<img class="kit-plot" id="plot-{item}-{k}" alt="{t}" title="{t}" src="{uri}">'


def verdict_table(items: list[dict]) -> str:
    """The verdict table (``table.kit-verdicts``), one row per item."""
    head = "".join(f"<th>{h}</th>" for h in ("item", "what", "verdict", "why", "threshold", "share s", "took s"))
    head = f"<tr>{head}</tr>"
    rows = "".join(
        f'<tr id="row-{i["item"]}"><td><a href="#item-{i["item"]}">{i["item"]}</a></td><td>{html.escape(i["title"])}'
        f'</td><td class="v-{i["verdict"]}">{i["verdict"]}</td><td>{html.escape(str(i["reason"]))}</td>'
        f"<td>{html.escape(str(i['threshold']))}</td><td>{cell_html(i['share_s'] or '-')}</td>"
        f"<td>{cell_html(i['elapsed_s'] or '-')}</td></tr>"
        for i in items
    )
    return f'<table class="kit-verdicts"><thead>{head}</thead><tbody>{rows}</tbody></table>'


def _item_section(i: dict) -> str:
    figs = "".join(f"<tr><th>{html.escape(k)}</th><td>{cell_html(v)}</td></tr>" for k, v in i["figures"].items())
    plots = "".join(_img(path, title, i["item"], k) for k, (title, path) in enumerate(i["plots"].items()))
    raw = f"<p>raw results: <code>{html.escape(i['raw_dir'])}</code></p>" if i["raw_dir"] else ""
    return (
        f'<h2 id="item-{i["item"]}">{i["item"]}: {i["verdict"]}</h2><p>{html.escape(i["title"])}</p>'
        + (f'<table class="kit-figures">{figs}</table>' if figs else "")
        + plots
        + raw
    )


def _change(v) -> str:
    return "-" if v is None else f"{v:+.1%}"


def _comparison_html(c: dict | None) -> str:
    if not c:
        return ""
    rows = "".join(
        f"<tr><td>{x['item']}</td><td>{x['before']}</td><td>{x['now']}</td><td>{html.escape(str(x['headline']))}</td>"
        f"<td>{cell_html(x['before_value'])}</td><td>{cell_html(x['now_value'])}</td>"
        f"<td>{_change(x['change'])}</td></tr>"
        for x in c["items"]
    )
    return (
        f'<h2 id="previous">Against the previous qualification</h2><p>{html.escape(c["text"])}</p>'
        '<table class="kit-previous"><tr><th>item</th><th>before</th><th>now</th><th>headline</th><th>before</th>'
        f"<th>now</th><th>change</th></tr>{rows}</table>"
    )


def write_report(s: dict, out: Path) -> tuple[Path, Path]:
    """Write ``out/qualify.json`` and ``out/index.html`` from :func:`summary`'s ``s``; returns both paths.

    Raises:
        OutputPathError: a file cannot be written.
    """
    js = atomic_write_text(out / "qualify.json", json.dumps(s, indent=2, default=str))
    m, ov = s["machine"], s["overall"]
    choices = "".join(f"<li>{html.escape(c)}</li>" for c in s["plan"]["choices"])
    facts = "".join(f"<tr><th>{html.escape(k)}</th><td>{cell_html(v)}</td></tr>" for k, v in m.items())
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>kit qualify: {html.escape(m['device'])}</title>"
        f"<style>{CSS}</style></head><body>"
        f"<h1>Qualification of {html.escape(m['host'])} ({html.escape(m['device'])}): "
        f'<span id="overall" class="overall-{ov}">{ov.upper()}</span></h1>'
        f"<p>budget {s['budget_s']:.0f} s; exit code {s['exit_code']}; commit {html.escape(str(m['commit']))}; "
        f"results in <code>{html.escape(s['out'])}</code></p>"
        + verdict_table(s["items"])
        + _comparison_html(s.get("comparison"))
        + "".join(_item_section(i) for i in s["items"])
        + f'<h2 id="choices">Choices</h2><ul>{choices}</ul>'
        + f'<h2 id="machine">Machine, versions, commit</h2><table class="kit-machine">{facts}</table>'
        + "</body></html>"
    )
    return js, atomic_write_text(out / "index.html", page)
