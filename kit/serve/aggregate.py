"""One results row from a served point's request records: latency percentiles with n, throughputs, goodput,
failures with their distinct errors, the client self-check, per-token accounting, the prompt lengths asked for,
sent and counted by the server, and the concurrency the client achieved (formulas in :mod:`kit.metrics`;
definitions in docs/metrics.md, "Served")."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kit import metrics as M
from kit.serve.redact import redact_url, scrub
from kit.serve.steady import inflight_steps, timed
from kit.serve.texts import short_error
from kit.serve.workload import ID_RANGE

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
    request; ITL pools the tokens of all requests (the first chunk's extra tokens as 0-ms entries; docs/metrics.md,
    "Served"). Requests whose per-token ITL is unknown (several tokens per chunk, no per-chunk usage, no
    tokenizer) add nothing to the ITL columns: ``x_itl_unknown`` counts them, ``x_itl_warning`` says what to pass,
    and a warning is logged; the chunk gaps keep their own columns (``x_chunk_gap_ms_*``). A point stopped early
    (``info["stopped_early"]``) says so in ``x_stopped_early`` and ``error``. Times in ms, throughputs in tok/s
    and requests/s.

    Args:
        records: request records (:func:`kit.serve.record.request_record`, or failed ones), warm-up ones flagged.
        info: the run facts of :func:`kit.serve.loop.run_schedule` (``duration_s``, ``model``, ``url``, self-check).
    """
    meas = [r for r in records if not r.get("warmup")]
    ok = [r for r in meas if r.get("ok")]
    dur = float(info.get("duration_s") or 0.0)
    row = {
        "backend": "openai",
        "status": "ok" if ok else "error",
        "error": scrub(error_summary(meas, info.get("stopped_early")), cfg.secrets()),
        "model": info.get("model") or cfg.model,
        "device": "remote",
        "concurrency": cfg.max_concurrency,
        "isl": cfg.isl,
        "osl": cfg.osl,
        "request_rate": float(cfg.request_rate),
        "completed": len(ok),
        "failed": len(meas) - len(ok),
        "duration_s": dur,
        "tok_s_basis": "output_tok_s",
        "x_endpoint": cfg.endpoint,
        "x_url": redact_url(info["url"]) if info.get("url") else None,
        "x_seed": cfg.seed,
        "x_burstiness": cfg.burstiness,
        "x_warmup_requests": sum(1 for r in records if r.get("warmup")),
        "x_ignore_eos": cfg.ignore_eos,
        "x_stopped_early": info.get("stopped_early"),
        "x_prefix_hit_rate_achieved": achieved_hit_rate(records),
    }
    row |= latency_columns(ok, meas) | token_columns(ok, dur) | slo_columns(ok, cfg, dur) | lateness_columns(meas)
    row |= prompt_columns(ok) | concurrency_columns(records)
    for k in SELFCHECK_COLUMNS:
        row[k] = info.get(k)
    return row


#: the client self-check's columns, copied from the run facts (:mod:`kit.serve.selfcheck`)
SELFCHECK_COLUMNS = (
    "x_client_cpu_frac",
    "x_loop_lag_ms_p50",
    "x_loop_lag_ms_p99",
    "x_loop_lag_ms_max",
    "x_loop_lag_own_ms_p99",
    "x_client_run_queue_frac",
    "x_machine_load_per_core",
    "x_client_bound",
    "x_client_warning",
    "x_machine_contention",
    "x_contention_warning",
    "x_client_check",
)

#: a request's prompt is off its target when the count differs by more than this many tokens (the must-show bound
#: of issue 29: server-counted prompt tokens equal ``--isl`` ± 1)
PROMPT_TOKEN_SLACK = 1


def prompt_columns(ok: Sequence[dict]) -> dict:
    """The prompt lengths of the completed requests built to a length (``prompt_tokens_target`` set): the mean
    asked for (``x_prompt_tokens_target_mean``), the client's count of what it sent (``_sent_mean``, None when it
    could not count: no tokenizer), the server's (``_server_mean``, from ``usage.prompt_tokens``; None without
    usage), and how far the server's count (else the client's) is from the target: ``x_prompt_tokens_excess_mean``
    (mean of count − target, tokens, signed), ``x_prompt_tokens_off`` (requests more than
    :data:`PROMPT_TOKEN_SLACK` away) and ``x_prompt_tokens_basis`` (``server`` | ``client``). All None when no
    request had a target (a conversation, a trace, an explicit workload)."""
    rs = [r for r in ok if r.get("prompt_tokens_target") is not None]
    cols = ("target_mean", "sent_mean", "server_mean", "excess_mean", "off", "basis")
    out: dict = {f"x_prompt_tokens_{k}": None for k in cols}
    if not rs:
        return out

    def mean(key: str) -> float | None:
        v = [r[key] for r in rs if r.get(key) is not None]
        return float(np.mean(v)) if v else None

    basis = "server" if any(r.get("prompt_tokens_server") is not None for r in rs) else "client"
    key = "prompt_tokens_server" if basis == "server" else "prompt_tokens_sent"
    pairs = [(r["prompt_tokens_target"], r[key]) for r in rs if r.get(key) is not None]
    out |= {f"x_prompt_tokens_{k}_mean": mean(f"prompt_tokens_{k}") for k in ("target", "sent", "server")}
    if pairs:
        out["x_prompt_tokens_excess_mean"] = float(np.mean([n - t for t, n in pairs]))
        out["x_prompt_tokens_off"] = sum(1 for t, n in pairs if abs(n - t) > PROMPT_TOKEN_SLACK)
        out["x_prompt_tokens_basis"] = basis
    return out


def concurrency_columns(records: Sequence[dict]) -> dict:
    """The concurrency the client achieved while it offered load: the in-flight count from its own send and end
    times (warm-up requests counted while they run), time-weighted from the first measured send to the last send
    (``x_concurrency_achieved_mean``; the drain after the last send is left out: no request is offered then), its
    maximum (``x_concurrency_achieved_max``) and that span (``x_concurrency_span_s``). The mean is None when every
    measured request was sent at once (no span); the maximum is then the count after the sends."""
    rs = timed(records)
    sends = [r["sent_s"] for r in rs if not r.get("warmup")]
    out = {"x_concurrency_achieved_mean": None, "x_concurrency_achieved_max": None, "x_concurrency_span_s": None}
    if not sends:
        return out
    t0, t1 = min(sends), max(r["sent_s"] for r in rs)
    t, n = inflight_steps(records)
    at = (t >= t0) & (t <= t1)
    out["x_concurrency_achieved_max"] = int(n[at].max()) if at.any() else None
    if t1 > t0:
        edges = np.clip(np.append(t, t1), t0, t1)  # count n[i] holds from t[i] to t[i + 1]
        out["x_concurrency_achieved_mean"] = float(np.sum(n * np.diff(edges)) / (t1 - t0))
        out["x_concurrency_span_s"] = t1 - t0
    return out


#: how servers word a prompt token id outside the model's vocabulary (vLLM: "Token id 19704 is out of vocabulary";
#: SGLang and others: "... out of range" of the vocabulary)
_VOCAB_ERROR = re.compile(r"out of vocab|vocab\w* size|not in vocab", re.IGNORECASE)
#: what the error summary adds when the server refused a prompt's token ids
VOCAB_HINT = (
    "the prompts' token ids are outside the served model's vocabulary: give the kit that model's tokenizer "
    "(--tokenizer PATH, or tokenizer= in Python); without one, prompts to /v1/completions are token ids drawn "
    f"in {ID_RANGE[0]}-{ID_RANGE[1] - 1}"
)


def error_summary(meas: Sequence[dict], stopped: str | None) -> str | None:
    """``"k of n requests failed: <distinct errors, sent ones first>"`` (at most three, each one short line), with
    the early-stop reason first when the point stopped early and :data:`VOCAB_HINT` last when the server refused a
    prompt's token ids; None when nothing failed."""
    bad = [r for r in meas if not r.get("ok")]
    if not bad:
        return None
    errors = sorted({short_error(r.get("error"), ERROR_SUMMARY_CHARS) for r in bad if not r.get("not_sent")})
    errors += sorted({short_error(r.get("error"), ERROR_SUMMARY_CHARS) for r in bad if r.get("not_sent")})
    error = f"{len(bad)} of {len(meas)} requests failed: " + " | ".join(errors[:3])
    if any(_VOCAB_ERROR.search(e or "") for e in errors):
        error += f" ({VOCAB_HINT})"
    return f"{stopped}; {error}" if stopped and stopped not in error else error


def latency_columns(ok: Sequence[dict], meas: Sequence[dict]) -> dict:
    """TTFT, TPOT, ITL, E2E latency, chunk-gap, per-user tok/s and client-queue statistics of the completed
    requests ``ok`` (queue times: of every measured request), ms, each with its n."""
    vals = {k: [r[f"{k}_ms"] for r in ok if r.get(f"{k}_ms") is not None] for k in ("ttft", "tpot", "e2el")}
    itl = [x for r in ok for x in r.get("itl_ms") or []]
    p = {k: M.percentiles(v) for k, v in vals.items()} | {"itl": M.percentiles(itl)}
    gap = M.percentiles([x for r in ok for x in r.get("chunk_gaps_ms") or []], (50, 99))
    queue = M.percentiles([r.get("client_queue_ms") for r in meas if r.get("client_queue_ms") is not None])
    user = M.percentiles([r["tok_s_per_user"] for r in ok if r.get("tok_s_per_user")], (10, 50, 90))
    tpot = vals["tpot"]
    out = {"ttft_ms": p["ttft"]["p50"], "ttft_ms_p90": p["ttft"]["p90"], "ttft_ms_p99": p["ttft"]["p99"]}
    for k in ("tpot", "itl", "e2el"):
        out |= {f"{k}_ms_p50": p[k]["p50"], f"{k}_ms_p90": p[k]["p90"], f"{k}_ms_p99": p[k]["p99"]}
    out |= {"tpot_ms_min": min(tpot) if tpot else None, "tpot_ms_mean": float(np.mean(tpot)) if tpot else None}
    out |= {"tpot_n": p["tpot"]["n"], "itl_n": p["itl"]["n"], "x_ttft_n": p["ttft"]["n"], "x_e2el_n": p["e2el"]["n"]}
    out["tok_s_per_stream"] = M.tok_s_per_stream(p["tpot"]["p50"]) if tpot else None
    for k, v in (("ttft", vals["ttft"]), ("e2el", vals["e2el"]), ("itl", itl)):
        out[f"x_{k}_ms_mean"] = float(np.mean(v)) if v else None
    out |= {"x_chunk_gap_ms_p50": gap["p50"], "x_chunk_gap_ms_p99": gap["p99"], "x_chunk_gap_n": gap["n"]}
    out |= {"client_queue_ms_p50": queue["p50"], "x_client_queue_ms_p99": queue["p99"]}
    out |= {"x_tok_s_per_user_p10": user["p10"], "x_tok_s_per_user_p50": user["p50"]}
    out["x_tok_s_per_user_p90"] = user["p90"]
    return out | itl_warning(ok)


def lateness_columns(meas: Sequence[dict]) -> dict:
    """How late the measured requests with a due time (open loop, ramp, trace) were sent: ``x_send_late_ms_p50``,
    ``_p99``, ``_max`` (ms after the due time; the client's own timing error) and ``x_send_late_n``; None for a
    schedule with no due times (a closed loop: its wait for a slot is ``client_queue_ms``)."""
    late = [r["send_late_ms"] for r in meas if r.get("send_late_ms") is not None]
    p = M.percentiles(late, (50, 99))
    return {"x_send_late_ms_p50": p["p50"], "x_send_late_ms_p99": p["p99"], "x_send_late_n": p["n"]} | {
        "x_send_late_ms_max": max(late) if late else None
    }


def itl_warning(ok: Sequence[dict]) -> dict:
    """``x_itl_unknown`` (completed requests whose per-token ITL is unknown) and ``x_itl_warning`` (what to pass;
    also logged), None when every ITL is known or the unknown ones are only buffered streams (whose timing no
    option recovers: the validity check says so)."""
    n = sum(1 for r in ok if r.get("itl_unknown"))
    counts = n - sum(1 for r in ok if r.get("itl_unknown") and r.get("buffered"))
    warning = None
    if counts:
        warning = (
            f"per-token ITL unknown for {counts} of {len(ok)} requests: their chunks carried several tokens "
            "and neither per-chunk usage nor a tokenizer says how many (pass --tokenizer, or --continuous-usage "
            "on vLLM); chunk gaps are in x_chunk_gap_ms_*"
        )
        log.warning("%s", warning)
    return {"x_itl_unknown": n, "x_itl_warning": warning}


def token_columns(ok: Sequence[dict], dur: float) -> dict:
    """Throughputs (tok/s, requests/s over ``dur`` s) and token accounting of the completed requests ``ok``."""
    in_tok = sum(int(r.get("input_tokens") or 0) for r in ok)
    out_tok = sum(int(r.get("output_tokens") or 0) for r in ok)
    chunks = sum(r.get("n_chunks") or 0 for r in ok)
    thr = M.throughputs(len(ok), in_tok, out_tok, dur)
    return {
        "output_tok_s": thr["output_tok_s"],
        "total_tok_s": thr["total_tok_s"],
        "request_throughput": thr["request_throughput"],
        "x_input_tokens_total": in_tok,
        "x_output_tokens_total": out_tok,
        "x_tokens_per_chunk_mean": out_tok / chunks if chunks else None,
        "x_output_tokens_estimated": sum(bool(r.get("output_tokens_estimated")) for r in ok),
        "x_osl_mismatch": sum(bool(r.get("osl_mismatch")) for r in ok),
        # completed with output tokens in usage but no token-bearing chunk (e.g. text a detokeniser withheld):
        # they count in throughput but have no TTFT/TPOT
        "x_requests_without_text": sum(1 for r in ok if not r.get("n_chunks") and (r.get("output_tokens") or 0) > 0),
        # every token-bearing chunk in one network read (a buffering proxy): per-token timing unknown
        "x_buffered_requests": sum(1 for r in ok if r.get("buffered")),
        "x_tokens_per_chunk_source": ",".join(sorted({str(r.get("tokens_per_chunk_source")) for r in ok})) or None,
    }


def slo_columns(ok: Sequence[dict], cfg: LoadConfig, dur: float) -> dict:
    """Goodput (requests/s meeting every SLO of ``cfg``, inclusive; :func:`kit.metrics.meets_slo`) and the SLOs;
    None without any SLO (goodput is then undefined, not the throughput)."""
    slos = (cfg.slo_ttft_ms, cfg.slo_tpot_ms, cfg.slo_e2el_ms)
    good = sum(
        M.meets_slo(r.get("ttft_ms"), r.get("tpot_ms"), r.get("e2el_ms"), int(r.get("output_tokens") or 0), *slos)
        for r in ok
    )
    any_slo = any(s is not None for s in slos)
    return {
        "goodput_rps": M.goodput_rps(good, dur) if any_slo else None,
        "x_good_requests": good if any_slo else None,
        "x_slo_ttft_ms": cfg.slo_ttft_ms,
        "x_slo_tpot_ms": cfg.slo_tpot_ms,
        "x_slo_e2el_ms": cfg.slo_e2el_ms,
    }


def achieved_hit_rate(records: Sequence[dict]) -> float | None:
    """Σ cached_tokens / Σ input_tokens over measured, completed requests whose record carries ``cached_tokens``
    (the server's ``usage.prompt_tokens_details.cached_tokens``); None when no record does."""
    rs = [r for r in records if r.get("ok") and not r.get("warmup") and r.get("cached_tokens") is not None]
    tot = sum(int(r.get("input_tokens") or 0) for r in rs)
    return sum(int(r["cached_tokens"]) for r in rs) / tot if rs and tot else None
