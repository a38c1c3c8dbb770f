"""The one results schema shared by every backend: columns, validation, verdicts and the definition of an ok row.

One row = one *point*: an in-process measurement (``backend="engine"``), a served-endpoint benchmark at one load
level (``backend="openai"``) or an analytic prediction (``backend="planner"``). All three use the columns below,
so their rows concatenate and plot on the same axes. Units are in the column names; metric formulas are defined
once in :mod:`kit.metrics`. Columns a backend does not produce are missing (NaN/None), never zero.

Reading and writing (the Parquet + JSON round trip, :func:`kit.store.load_results`, the append log, its lock,
crash recovery) is :mod:`kit.store`; this module holds the schema, validation and the one definition of an ok row
(:func:`ok_mask`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kit.errors import UserError

SCHEMA_VERSION = 1
#: ``killed``: the process died while measuring the point (see :mod:`kit.store`); ``refused``: predicted not to fit
#: in the free memory, so never allocated (``kit kv-stress``'s memory guard, :mod:`kit.measure.memguard`)
STATUSES = ("ok", "oom", "error", "killed", "skipped", "refused")
#: what produced a row: the in-process engine, a served endpoint (OpenAI-compatible API), the planner, a
#: collective probe (``kit comm``) or an item of a node's qualification (``kit qualify``: one row per item)
BACKENDS = ("engine", "openai", "planner", "comm", "qualify")


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # pandas dtype: "string", "Int64", "float64", "boolean"
    doc: str


COLUMNS: tuple[Column, ...] = (
    # identity
    Column("run_id", "string", "id of the run (sweep) this row belongs to"),
    Column("point_id", "string", "stable key of the point's configuration; a resumed sweep skips finished ones"),
    Column("backend", "string", "engine (in-process torch) | openai (served endpoint) | planner (analytic)"),
    Column("status", "string", "ok | oom | error | killed | skipped | refused"),
    Column("error", "string", "error text when status is not ok"),
    Column("timestamp", "string", "UTC ISO-8601 time the point finished"),
    # what ran
    Column("model", "string", "model preset name, checkpoint path or served model id"),
    Column("dtype", "string", "weights/activations dtype (float32, bfloat16, float16, ...)"),
    Column("device", "string", "backend of the device: cpu | cuda | rocm | remote"),
    Column("device_name", "string", "device name (e.g. 'NVIDIA H200', 'AMD MI350X/MI355X', CPU model)"),
    Column("accelerator", "string", "catalog accelerator name used for cost/planner (e.g. MI355X, B300, CPU)"),
    Column("n_gpus", "Int64", "devices the point used (tok_s_per_gpu divides by this)"),
    # the point
    Column("concurrency", "Int64", "batch size B (in-process) or max concurrent requests (served)"),
    Column("context_len", "Int64", "KV-cache length at the start of decode (tokens)"),
    Column("decode_steps", "Int64", "decode steps timed per repeat (in-process)"),
    Column("kv_fill", "string", "how the cache reached context_len: prefill | synthetic"),
    Column("isl", "Int64", "input sequence length per request (tokens)"),
    Column("osl", "Int64", "output sequence length requested per request (tokens)"),
    Column("request_rate", "float64", "requests/s offered (inf = all at once)"),
    Column("repeats", "Int64", "how many times the point was measured (interleaved)"),
    # latency (ms)
    Column("prefill_ms", "float64", "median wall time of the batch prefill (B x C tokens), ms"),
    Column("prefill_ms_min", "float64", "minimum prefill wall time over repeats, ms"),
    Column("ttft_ms", "float64", "time to first token, ms (= prefill_ms for a static batch; served: median)"),
    Column("ttft_ms_p90", "float64", "p90 TTFT, ms"),
    Column("ttft_ms_p99", "float64", "p99 TTFT, ms"),
    Column("tpot_ms_p50", "float64", "median time per output token, ms"),
    Column("tpot_ms_p90", "float64", "p90 TPOT, ms"),
    Column("tpot_ms_p99", "float64", "p99 TPOT, ms"),
    Column("tpot_ms_min", "float64", "minimum TPOT (fastest decode step), ms"),
    Column("tpot_ms_mean", "float64", "mean TPOT, ms"),
    Column("tpot_n", "Int64", "sample count behind the TPOT percentiles (steps or requests)"),
    Column("itl_ms_p50", "float64", "median token-normalised inter-token latency, ms (served)"),
    Column("itl_ms_p90", "float64", "p90 ITL, ms"),
    Column("itl_ms_p99", "float64", "p99 ITL, ms"),
    Column("itl_n", "Int64", "sample count behind the ITL percentiles"),
    Column("e2el_ms_p50", "float64", "median end-to-end latency, ms (served)"),
    Column("e2el_ms_p90", "float64", "p90 E2E latency, ms"),
    Column("e2el_ms_p99", "float64", "p99 E2E latency, ms"),
    Column("client_queue_ms_p50", "float64", "median client-side wait for a concurrency slot, ms (served)"),
    # throughput
    Column("decode_tok_s", "float64", "aggregate output tokens/s during decode = B / (tpot_ms_p50/1000)"),
    Column("tok_s_per_stream", "float64", "tokens/s one user sees = 1000 / tpot_ms_p50 (interactivity)"),
    Column("prefill_tok_s", "float64", "B x C / (prefill_ms/1000)"),
    Column("output_tok_s", "float64", "served: sum(output tokens) / duration_s"),
    Column("total_tok_s", "float64", "served: (sum(input) + sum(output) tokens) / duration_s"),
    Column("request_throughput", "float64", "served: completed requests / duration_s"),
    Column("goodput_rps", "float64", "served: requests meeting every SLO / duration_s"),
    Column("completed", "Int64", "served: requests that finished"),
    Column("failed", "Int64", "served: requests that failed (HTTP error, timeout, broken stream)"),
    Column("duration_s", "float64", "served: first request sent -> last finished, s"),
    Column("achieved_gb_s", "float64", "bytes a decode step must read (weights + KV) / step time, GB/s"),
    # memory
    Column("peak_mem_gb", "float64", "device peak memory during the point, GB (method in peak_mem_method)"),
    Column("peak_mem_method", "string", "cuda_max_allocated | cpu_rss_highwater | planner"),
    Column("kv_cache_gb", "float64", "bytes the KV cache holds at the end of the point, GB"),
    Column("weights_gb", "float64", "bytes of model weights, GB"),
    # planner assumptions
    Column("eff_bw", "float64", "planner: fraction of peak memory bandwidth assumed"),
    Column("eff_flops", "float64", "planner: fraction of peak FLOPS assumed"),
    Column("tp", "Int64", "tensor-parallel size"),
    Column("assumptions", "string", "planner: the assumptions behind a prediction, as text"),
    # energy (kit.measure.power)
    Column("avg_power_w", "float64", "mean device power over the point = energy_j / sampled duration, W (all devices)"),
    Column("peak_power_w", "float64", "highest summed device power at one sampling instant, W"),
    Column("energy_j", "float64", "device energy over the point, J (counter difference or power integral)"),
    Column("j_per_output_token", "float64", "energy_j / sum(output tokens), J"),
    Column("j_per_token", "float64", "energy_j / sum(input + output tokens), J"),
    Column("pct_tdp", "float64", "100 x avg_power_w / (catalog TDP x devices), %"),
    # cost
    Column("usd_per_gpu_hr", "float64", "$ per GPU-hour used for the cost columns"),
    Column("price_basis", "string", "basis of usd_per_gpu_hr (tco, assumed-rental, on-demand, user)"),
    Column("tok_s_per_gpu", "float64", "throughput / n_gpus (tok_s_basis says which throughput)"),
    Column("usd_per_mtok", "float64", "$ per million tokens = usd_per_gpu_hr x n_gpus / (tok_s x 3600) x 1e6"),
    Column("tok_per_usd", "float64", "tokens per $ = tok_s x 3600 / (usd_per_gpu_hr x n_gpus)"),
    Column("tok_s_basis", "string", "which tok/s the cost columns use (decode_tok_s, output_tok_s, total_tok_s)"),
)
COLUMN_NAMES = tuple(c.name for c in COLUMNS)
#: the headline measurements of an in-process point, in the order its tables and CI summaries show them
HEADLINE_COLUMNS = (
    "ttft_ms",
    "tpot_ms_p50",
    "tpot_ms_p90",
    "tpot_n",
    "decode_tok_s",
    "tok_s_per_stream",
    "peak_mem_gb",
)
_DTYPES = {c.name: c.dtype for c in COLUMNS}


#: columns that mark a finished row as untrustworthy → (the value that means "problem", what it means). A row
#: whose status is ``ok`` but that carries one of these is *flagged*: shown as such in every summary, table, panel,
#: export and compare, and never counted ok (:func:`ok_mask`).
PROBLEM_FLAGS: dict[str, tuple[object, str]] = {
    "x_logits_finite": (False, "non-finite logits (dtype overflow?): speed figures are not trustworthy"),
    "x_valid": (False, "failed the validity checks of its backend"),
    "x_recompiles_timed": (True, "torch.compile recompiled inside the timed decode steps: they time a compile"),
}


def _is_problem(value, bad) -> bool:
    if value is None or (isinstance(value, float) and value != value) or value is pd.NA:
        return False
    try:
        return bool(value) == bool(bad)
    except (TypeError, ValueError):
        return False


def row_problems(row) -> list[str]:
    """The problem flags a row carries (a dict or a DataFrame row), as text; ``[]`` for a clean row."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    return [why for col, (bad, why) in PROBLEM_FLAGS.items() if _is_problem(get(col, None), bad)]


def ok_mask(df: pd.DataFrame) -> pd.Series:
    """Boolean Series: the rows that count as ok — status ``ok`` and no problem flag (:data:`PROBLEM_FLAGS`).
    The one definition every summary, table, export and compare uses."""
    if df.empty:
        return pd.Series([], dtype=bool, index=df.index)
    clean = pd.Series(True, index=df.index)
    for col, (bad, _) in PROBLEM_FLAGS.items():
        if col in df.columns:
            clean &= ~df[col].map(lambda v, b=bad: _is_problem(v, b)).astype(bool)
    return (df["status"] == "ok") & clean


def verdict(df: pd.DataFrame) -> pd.Series:
    """Per row: ``ok``, ``flagged`` (status ok with a problem flag) or the status (``oom``, ``error``, ...)."""
    ok = ok_mask(df)
    return df["status"].astype(object).where(~(df["status"] == "ok") | ok, "flagged")


def schema_table() -> pd.DataFrame:
    """The schema as a DataFrame (column, dtype, meaning), for docs and the reference notebook."""
    return pd.DataFrame([{"column": c.name, "dtype": c.dtype, "meaning": c.doc} for c in COLUMNS])


def validate_record(rec: dict) -> dict:
    """Check one point record against the schema.

    Unknown keys are allowed only with an ``x_`` prefix (backend extras); required keys are ``backend`` and
    ``status``.

    Raises:
        ValueError: unknown column, bad status or backend (the message lists what is allowed).
    """
    unknown = [k for k in rec if k not in _DTYPES and not k.startswith("x_")]
    if unknown:
        raise UserError(
            f"record has unknown column(s) {unknown}; schema columns are in kit.results.COLUMN_NAMES "
            "(backend-specific extras must start with 'x_')"
        )
    if rec.get("status") not in STATUSES:
        raise UserError(f"status={rec.get('status')!r}; allowed: {STATUSES}")
    if rec.get("backend") not in BACKENDS:
        raise UserError(f"backend={rec.get('backend')!r}; allowed: {BACKENDS}")
    return rec


def to_frame(records: list[dict]) -> pd.DataFrame:
    """Records → tidy DataFrame with every schema column (missing ones as NA) in schema order, extras after."""
    df = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    for c in COLUMNS:
        if c.name not in df.columns:
            df[c.name] = pd.Series([None] * len(df), dtype="object")
    extras = [c for c in df.columns if c not in _DTYPES]
    df = df[list(COLUMN_NAMES) + extras]
    return coerce(df)


def coerce(df: pd.DataFrame) -> pd.DataFrame:
    """Cast schema columns to their declared dtypes (in place on a copy)."""
    df = df.copy()
    for name, dt in _DTYPES.items():
        if name in df.columns:
            if dt == "float64":
                df[name] = pd.to_numeric(df[name], errors="coerce").astype("float64")
            elif dt == "Int64":
                df[name] = pd.to_numeric(df[name], errors="coerce").astype("Int64")
            else:
                df[name] = df[name].astype(dt)
    for name in df.columns:  # extras (x_*): missing values are None whatever the storage round trip made of them
        if name not in _DTYPES and df[name].dtype == object:
            df[name] = df[name].map(lambda v: None if isinstance(v, float) and v != v else v)
    return df
