"""Results records as the history's rows: the typed columns a compare matches and plots on, the raw samples (the
independent units inside a row), the label, the price and the run's start time (:mod:`kit.track.db` stores them;
the benchmark of the statistics uses :func:`frames_of` without a database)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import math
import re
from pathlib import Path

import pandas as pd

from kit.results import ok_mask

log = logging.getLogger("kit")

ROW_COLUMNS = (
    "row_key run_key point_key replicate backend status ok label model dtype concurrency context_len isl osl "
    "n_gpus tok_s tpot_ms ttft_ms usd_per_gpu_hr price_basis usd_per_mtok tok_s_per_usd row_json"
).split()


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _int(v) -> int | None:
    f = _num(v)
    return int(f) if f is not None else None


def row_samples(row: dict, run_dir: Path) -> list[tuple[str, int, float]]:
    """(metric, block, value) raw samples of one row: in-process steps per repeat, served requests."""
    out = []
    steps, per = row.get("x_step_ms"), _int(row.get("decode_steps"))
    if isinstance(steps, (list, tuple)) and len(steps):
        per = per or len(steps)
        out += [("tpot_ms", i // per, float(v)) for i, v in enumerate(steps) if _num(v) is not None]
    pre = row.get("x_prefill_ms")
    if isinstance(pre, (list, tuple)):
        out += [("ttft_ms", i, float(v)) for i, v in enumerate(pre) if _num(v) is not None]
    detail = row.get("x_detail_file")
    if detail:
        path = Path(detail) if Path(detail).is_file() else run_dir / Path(detail).name
        if path.is_file():
            reqs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            reqs = [r for r in reqs if r.get("ok") and not r.get("warmup")]
            for i, r in enumerate(reqs):
                for m in ("tpot_ms", "ttft_ms", "e2el_ms"):
                    if _num(r.get(m)) is not None:
                        out.append((m, i, float(r[m])))
                if _num(r.get("e2el_ms")) and _num(r.get("output_tokens")):
                    out.append(("tok_s", i, float(r["output_tokens"]) / (float(r["e2el_ms"]) / 1000.0)))
        else:
            log.warning("detail file %s of a served row is missing; its per-request samples are not stored", detail)
    return out


def row_label(r: dict) -> str:
    bits = [str(r.get("model")), str(r.get("dtype") or "")]
    if r.get("backend") == "openai":
        bits += [f"c={r.get('concurrency')}", f"isl={r.get('isl')}", f"osl={r.get('osl')}"]
    else:
        bits += [f"kv={r.get('context_len')}", f"B={r.get('concurrency')}"]
    return " ".join(b for b in bits if b) + ("" if r.get("backend") == "engine" else f" [{r.get('backend')}]")


def row_price(r: dict, usd_per_gpu_hr: float | None, basis: str | None) -> tuple[float | None, str | None]:
    if usd_per_gpu_hr is not None:
        return float(usd_per_gpu_hr), "user"
    if _num(r.get("usd_per_gpu_hr")):
        return float(r["usd_per_gpu_hr"]), r.get("price_basis")
    if r.get("accelerator"):
        from kit.plan.cost import get_price

        try:
            p = get_price(str(r["accelerator"]), basis)
            return p.usd_per_gpu_hr, p.basis
        except KeyError:
            return None, None
    return None, None


def created_utc(meta: dict, rec: dict) -> str | None:
    """When a run started, as ISO 8601 UTC to the microsecond (what orders the history): the sidecar's
    ``created_utc``, else the time its ``run_id`` begins with (``YYYYmmddTHHMMSS-...``), else the row's timestamp.
    One format for every run, so the database's text order is time order."""
    for value in (meta.get("created_utc"), rec.get("run_id"), rec.get("timestamp")):
        if not value:
            continue
        compact = re.match(r"(\d{8}T\d{6})(-|$)", str(value))  # a run id: YYYYmmddTHHMMSS-<random>
        try:
            t = _dt.datetime.strptime(compact[1], "%Y%m%dT%H%M%S") if compact else _dt.datetime.fromisoformat(value)
        except (TypeError, ValueError):
            continue
        if t.tzinfo is None:
            t = t.replace(tzinfo=_dt.UTC)
        return t.astimezone(_dt.UTC).isoformat(timespec="microseconds")
    return None


def row_tuple(r: dict, run_key: str, ok: bool, price: tuple, run_dir: Path) -> tuple:
    """The ``rows`` table's values (:data:`ROW_COLUMNS`) of one results record ``r``; ``ok``: its
    :func:`kit.results.ok_mask`; ``price``: ``(usd_per_gpu_hr, basis)`` (:func:`row_price`).

    ``status`` (the typed column and the stored ``row_json``'s) is the row's verdict: ``flagged`` for status ok with
    a problem flag, never ``ok`` (:func:`kit.results.verdict`); the row key is made of the recorded status, so a
    run added before and after this rule is still one run."""
    status = "flagged" if r.get("status") == "ok" and not ok else r.get("status")
    tok = _num(r.get("output_tok_s") if r.get("backend") == "openai" else r.get("decode_tok_s"))
    usd, basis = price
    n = _int(r.get("n_gpus")) or 1
    per_m = usd * n / (tok * 3600.0) * 1e6 if usd and tok else None  # kit.metrics.usd_per_mtok
    key = json.dumps([run_key, r.get("point_id"), r.get("x_run_index"), r.get("timestamp"), r.get("status")])
    return (
        hashlib.sha1(key.encode()).hexdigest()[:16],
        run_key,
        str(r.get("x_point_key") or r.get("point_id")),
        _int(r.get("x_run_index")) or 0,
        r.get("backend"),
        status,
        bool(ok),
        row_label(r),
        r.get("model"),
        r.get("dtype"),
        *(_int(r.get(c)) for c in ("concurrency", "context_len", "isl", "osl")),
        n,
        tok,
        _num(r.get("tpot_ms_p50")),
        _num(r.get("ttft_ms")),
        usd,
        basis,
        per_m,
        tok * 3600.0 / (usd * n) if usd and tok else None,  # kit.metrics.tok_per_usd per hour → per $
        json.dumps({**r, "status": status}, default=str),
    )


def frames_of(records: list[dict], run_key: str, run_dir: Path = Path(".")) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(rows, samples)`` frames, in the history tables' shape, of results records (what
    :func:`kit.track.db.add_run` stores; the benchmark of the statistics uses it without a database). Prices: the
    rows' own."""
    df = pd.DataFrame.from_records(records)
    ok = ok_mask(df.assign(status=df.get("status", "ok")))
    tups = [row_tuple(r, run_key, o, row_price(r, None, None), run_dir) for r, o in zip(records, ok)]
    rows = pd.DataFrame(tups, columns=ROW_COLUMNS)
    smp = [(t[0], *s) for t, r in zip(tups, records) for s in row_samples(r, run_dir)]
    return rows, pd.DataFrame(smp, columns=["row_key", "metric", "block", "value"])
