"""One results row from a served point's request records: latency percentiles with n, throughputs, goodput,
failures with their distinct errors, the client self-check and per-token accounting (formulas in
:mod:`kit.metrics`; definitions in METRICS.md, "Served")."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kit import metrics as M
from kit.serve.redact import redact_url, scrub
from kit.serve.texts import short_error

if TYPE_CHECKING:  # the type only: kit.serve.load imports this module's callers
    from kit.serve.load import LoadConfig

log = logging.getLogger("kit")

#: longest text of one distinct error in a row's ``error`` (the detail file keeps the full text)
ERROR_SUMMARY_CHARS = 200


def aggregate(records: Sequence[dict], cfg: LoadConfig, info: dict) -> dict:
    """One results-schema row (``backend = "openai"``) from a run's request records.

    Failed and warm-up requests are excluded from every latency statistic; failures are counted in ``failed``
    and the first distinct error texts kept in ``error``, each cut to one line
    (:func:`kit.serve.texts.short_error`: an HTML error page becomes its title; the records keep the full text).
    Formulas: :mod:`kit.metrics` (throughputs, goodput, SLOs, percentiles with n). Means of TTFT/TPOT/E2EL are per
    request; ITL pools the tokens of all requests (the first chunk's extra tokens as 0-ms entries, METRICS.md).
    Requests whose per-token ITL is unknown (several tokens per chunk, no per-chunk usage, no tokenizer; case E7)
    add nothing to the ITL columns: ``x_itl_unknown`` counts them, ``x_itl_warning`` says what to pass, and a
    warning is logged; the chunk gaps keep their own columns (``x_chunk_gap_ms_*``). A point stopped early
    (``info["stopped_early"]``) says so in ``x_stopped_early`` and ``error``. Times in ms, throughputs in tok/s
    and requests/s.

    Args:
        records: request records (:func:`kit.serve.client.request_record`, or failed ones), warm-up ones flagged.
        info: the run facts of :func:`run_load_async` (``duration_s``, ``model``, ``url``, self-check columns).
    """
    meas = [r for r in records if not r.get("warmup")]
    ok = [r for r in meas if r.get("ok")]
    bad = [r for r in meas if not r.get("ok")]
    dur = float(info.get("duration_s") or 0.0)
    ttft = [r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]
    tpot = [r["tpot_ms"] for r in ok if r.get("tpot_ms") is not None]
    e2el = [r["e2el_ms"] for r in ok if r.get("e2el_ms") is not None]
    itl = [x for r in ok for x in r.get("itl_ms") or []]
    itl_unknown = sum(1 for r in ok if r.get("itl_unknown"))
    itl_warning = None
    if itl_unknown:
        itl_warning = (
            f"per-token ITL unknown for {itl_unknown} of {len(ok)} requests: their chunks carried several tokens "
            "and neither per-chunk usage nor a tokenizer says how many (pass --tokenizer, or --continuous-usage "
            "on vLLM); chunk gaps are in x_chunk_gap_ms_*"
        )
        log.warning("%s", itl_warning)
    gaps = [x for r in ok for x in r.get("chunk_gaps_ms") or []]
    queue = [r.get("client_queue_ms") for r in meas if r.get("client_queue_ms") is not None]
    users = [r["tok_s_per_user"] for r in ok if r.get("tok_s_per_user")]
    in_tok = sum(int(r.get("input_tokens") or 0) for r in ok)
    out_tok = sum(int(r.get("output_tokens") or 0) for r in ok)
    thr = M.throughputs(len(ok), in_tok, out_tok, dur)
    n_good = sum(
        M.meets_slo(
            r.get("ttft_ms"),
            r.get("tpot_ms"),
            r.get("e2el_ms"),
            int(r.get("output_tokens") or 0),
            cfg.slo_ttft_ms,
            cfg.slo_tpot_ms,
            cfg.slo_e2el_ms,
        )
        for r in ok
    )
    any_slo = any(s is not None for s in (cfg.slo_ttft_ms, cfg.slo_tpot_ms, cfg.slo_e2el_ms))
    p_ttft, p_tpot, p_itl, p_e2el = (M.percentiles(v) for v in (ttft, tpot, itl, e2el))
    p_user = M.percentiles(users, (10, 50, 90))
    p_gap = M.percentiles(gaps, (50, 99))
    p_queue = M.percentiles(queue)
    errors = sorted({short_error(r.get("error"), ERROR_SUMMARY_CHARS) for r in bad if not r.get("not_sent")})
    errors += sorted({short_error(r.get("error"), ERROR_SUMMARY_CHARS) for r in bad if r.get("not_sent")})
    rate = float(cfg.request_rate)
    stopped = info.get("stopped_early")
    error = (f"{len(bad)} of {len(meas)} requests failed: " + " | ".join(errors[:3])) if bad else None
    if stopped and error and stopped not in error:
        error = f"{stopped}; {error}"
    row = {
        "backend": "openai",
        "status": "ok" if ok else "error",
        "error": scrub(error, cfg.secrets()),
        "model": info.get("model") or cfg.model,
        "device": "remote",
        "concurrency": cfg.max_concurrency,
        "isl": cfg.isl,
        "osl": cfg.osl,
        "request_rate": rate,
        "ttft_ms": p_ttft["p50"],
        "ttft_ms_p90": p_ttft["p90"],
        "ttft_ms_p99": p_ttft["p99"],
        "tpot_ms_p50": p_tpot["p50"],
        "tpot_ms_p90": p_tpot["p90"],
        "tpot_ms_p99": p_tpot["p99"],
        "tpot_ms_min": min(tpot) if tpot else None,
        "tpot_ms_mean": float(np.mean(tpot)) if tpot else None,
        "tpot_n": p_tpot["n"],
        "itl_ms_p50": p_itl["p50"],
        "itl_ms_p90": p_itl["p90"],
        "itl_ms_p99": p_itl["p99"],
        "itl_n": p_itl["n"],
        "e2el_ms_p50": p_e2el["p50"],
        "e2el_ms_p90": p_e2el["p90"],
        "e2el_ms_p99": p_e2el["p99"],
        "client_queue_ms_p50": p_queue["p50"],
        "tok_s_per_stream": M.tok_s_per_stream(p_tpot["p50"]) if tpot else None,
        "output_tok_s": thr["output_tok_s"],
        "total_tok_s": thr["total_tok_s"],
        "request_throughput": thr["request_throughput"],
        "goodput_rps": M.goodput_rps(n_good, dur) if any_slo else None,
        "completed": len(ok),
        "failed": len(bad),
        "duration_s": dur,
        "tok_s_basis": "output_tok_s",
        # extras
        "x_endpoint": cfg.endpoint,
        "x_url": redact_url(info["url"]) if info.get("url") else None,
        "x_seed": cfg.seed,
        "x_burstiness": cfg.burstiness,
        "x_warmup_requests": cfg.warmup_requests,
        "x_ignore_eos": cfg.ignore_eos,
        "x_ttft_n": p_ttft["n"],
        "x_e2el_n": p_e2el["n"],
        "x_ttft_ms_mean": float(np.mean(ttft)) if ttft else None,
        "x_e2el_ms_mean": float(np.mean(e2el)) if e2el else None,
        "x_itl_ms_mean": float(np.mean(itl)) if itl else None,
        "x_chunk_gap_ms_p50": p_gap["p50"],
        "x_chunk_gap_ms_p99": p_gap["p99"],
        "x_chunk_gap_n": p_gap["n"],
        "x_tokens_per_chunk_mean": (out_tok / sum(r.get("n_chunks") or 0 for r in ok))
        if ok and sum(r.get("n_chunks") or 0 for r in ok)
        else None,
        "x_tok_s_per_user_p10": p_user["p10"],
        "x_tok_s_per_user_p50": p_user["p50"],
        "x_tok_s_per_user_p90": p_user["p90"],
        "x_client_queue_ms_p99": p_queue["p99"],
        "x_input_tokens_total": in_tok,
        "x_output_tokens_total": out_tok,
        "x_output_tokens_estimated": sum(bool(r.get("output_tokens_estimated")) for r in ok),
        "x_osl_mismatch": sum(bool(r.get("osl_mismatch")) for r in ok),
        # completed with output tokens in usage but no token-bearing chunk (e.g. text a detokeniser withheld):
        # they count in throughput but have no TTFT/TPOT
        "x_requests_without_text": sum(1 for r in ok if not r.get("n_chunks") and (r.get("output_tokens") or 0) > 0),
        "x_tokens_per_chunk_source": ",".join(sorted({str(r.get("tokens_per_chunk_source")) for r in ok})) or None,
        "x_good_requests": n_good if any_slo else None,
        "x_slo_ttft_ms": cfg.slo_ttft_ms,
        "x_slo_tpot_ms": cfg.slo_tpot_ms,
        "x_slo_e2el_ms": cfg.slo_e2el_ms,
        "x_itl_unknown": itl_unknown,
        "x_itl_warning": itl_warning,
        "x_stopped_early": stopped,
    }
    for k in (
        "x_client_cpu_frac",
        "x_loop_lag_ms_p50",
        "x_loop_lag_ms_p99",
        "x_loop_lag_ms_max",
        "x_client_bound",
        "x_client_warning",
        "x_client_check",
    ):
        row[k] = info.get(k)
    # imported here: kit.serve.prefix imports kit.serve.sweep, which imports this module
    from kit.serve.prefix import achieved_hit_rate
    from kit.serve.steady import steady_columns

    row["x_prefix_hit_rate_achieved"] = achieved_hit_rate(records)
    row.update(steady_columns(records, cfg))
    return row
