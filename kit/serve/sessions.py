"""Multi-turn sessions: conversations of ``turns`` turns, each turn's prompt the history so far plus a new user
message, with a think time between a reply and the next turn; per-turn TTFT and each session's totals.

``max_concurrency`` is the number of conversations in flight (users); ``num_requests`` the measured turns in all
(``ceil(num_requests / turns)`` conversations); every turn asks for ``osl`` tokens and adds an ``isl``-token
message. On ``/v1/chat/completions`` the history is the message list (user, assistant, user, ...); on
``/v1/completions`` it is their texts joined by newlines. A server with a prefix cache finds the history in its
cache, so later turns' TTFT measures the cache's effect; the row says so (``x_prefix_sharing = "history"``).
Records add ``session_id``, ``turn`` (1-based), ``think_s``; warm-up requests are not sent.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import replace

import pandas as pd

from kit import metrics as M
from kit.errors import UserError
from kit.grid import GridPoint
from kit.serve.aggregate import aggregate
from kit.serve.client import get_model_id, request_record, token_counter
from kit.serve.http1 import StreamPool
from kit.serve.load import LoadConfig, run_coro
from kit.serve.prefix import build_prefix_workload, point_seed
from kit.serve.sweep import ServedBackend, write_detail
from kit.serve.trace import stream_one
from kit.serve.workload import RequestInput

#: per-turn TTFT columns ``x_turn<k>_ttft_ms_p50`` are written for turns 1..MAX_TURN_COLUMNS
MAX_TURN_COLUMNS = 16


def session_messages(cfg: LoadConfig, n_sessions: int, turns: int, seed: int, tokenizer=None) -> list[list[str]]:
    """The user messages of each conversation (``n_sessions`` lists of ``turns`` texts of ~``cfg.isl`` tokens),
    distinct from each other (drawn from ``seed``)."""
    msgs = build_prefix_workload(n_sessions * turns, cfg.isl, cfg.osl, 0.0, 1, tokenizer, seed, as_token_ids=False)
    return [[str(m.prompt) for m in msgs[s * turns : (s + 1) * turns]] for s in range(n_sessions)]


async def run_sessions_async(
    cfg: LoadConfig, messages: Sequence[Sequence[str]], think_time_s: float = 0.0, tokenizer=None
) -> tuple[list[dict], dict]:
    """Run the conversations ``messages`` (one list of user messages each), ``cfg.max_concurrency`` at a time
    (None: all at once), turns in order, ``think_time_s`` between a reply and the next turn. A failed turn ends its
    conversation (the later turns are not sent). Returns ``(records, run_info)`` like
    :func:`kit.serve.load.run_load_async`.

    Raises:
        UserError: think_time_s < 0, no conversation, or no model id.
    """

    if not (think_time_s >= 0) or not messages:
        raise UserError(f"think_time_s={think_time_s} (>= 0); {len(messages)} conversations (>= 1)")
    model = cfg.model or await get_model_id(cfg.url, cfg.api_key_env, cfg.models_timeout_s)
    url, headers = cfg.api_url(), cfg.request_headers()
    sem = asyncio.Semaphore(int(cfg.max_concurrency or len(messages)))
    done: list[tuple] = []  # (session, turn, request, capture)

    async def conversation(s: int, session, t_run: float) -> None:
        history: list[dict] = []
        async with sem:
            for k, text in enumerate(messages[s]):
                if k and think_time_s:
                    await asyncio.sleep(think_time_s)
                history.append({"role": "user", "content": text})
                prompt = "\n".join(m["content"] for m in history)
                req = RequestInput(prompt, None, cfg.osl)
                body = cfg.request_body(model, req)
                if cfg.endpoint == "chat":
                    body["messages"] = list(history)
                cap = await stream_one(session, cfg, url, body, headers)
                done.append((s, k + 1, req, cap))
                if cap.error is not None:
                    return
                history.append({"role": "assistant", "content": "".join(cap.chunk_texts)})

    async with StreamPool() as session:
        t_run = time.perf_counter()
        await asyncio.gather(*(conversation(s, session, t_run) for s in range(len(messages))))
    count = token_counter(tokenizer)
    records = []
    for i, (s, k, req, cap) in enumerate(sorted(done, key=lambda x: (x[0], x[1]))):
        rec = request_record(cap, req, count, t_run, 0.0, i, False)
        records.append({**rec, "session_id": s, "turn": k, "think_s": think_time_s if k > 1 else 0.0})
    dur = max(r["end_s"] for r in records) - min(r["sent_s"] for r in records)
    return records, {"duration_s": dur, "model": model, "url": cfg.shown_url}


def per_turn(records: Sequence[dict]) -> pd.DataFrame:
    """One row per turn number: ``n`` completed, ``ttft_ms_p50``/``p90``, ``input_tokens_mean``,
    ``cached_tokens_mean`` (None unless the server reports them)."""
    rows = []
    for k in sorted({int(r["turn"]) for r in records}):
        rs = [r for r in records if r["turn"] == k and r.get("ok")]
        p = M.percentiles([r.get("ttft_ms") for r in rs], (50, 90))
        cached = [r["cached_tokens"] for r in rs if r.get("cached_tokens") is not None]
        ins = [r["input_tokens"] for r in rs if r.get("input_tokens") is not None]
        rows.append(
            {"turn": k, "n": p["n"], "ttft_ms_p50": p["p50"], "ttft_ms_p90": p["p90"]}
            | {"input_tokens_mean": sum(ins) / len(ins) if ins else None}
            | {"cached_tokens_mean": sum(cached) / len(cached) if cached else None}
        )
    return pd.DataFrame(rows)


def session_totals(records: Sequence[dict]) -> pd.DataFrame:
    """One row per conversation: ``turns`` sent, ``completed`` (all turns ok), ``duration_s`` (first send to
    last token, think times included), ``output_tokens``, ``ttft_ms_sum``."""
    rows = []
    for s in sorted({r["session_id"] for r in records}):
        rs = [r for r in records if r["session_id"] == s]
        rows.append(
            {"session_id": s, "turns": len(rs), "completed": all(r.get("ok") for r in rs)}
            | {"duration_s": max(r["end_s"] for r in rs) - min(r["sent_s"] for r in rs)}
            | {"output_tokens": sum(int(r.get("output_tokens") or 0) for r in rs if r.get("ok"))}
            | {"ttft_ms_sum": sum(r.get("ttft_ms") or 0.0 for r in rs if r.get("ok"))}
        )
    return pd.DataFrame(rows)


def session_columns(records: Sequence[dict], turns: int, think_time_s: float) -> dict:
    """The row's session columns: ``x_turns``, ``x_think_time_s``, ``x_sessions``, ``x_sessions_completed``,
    ``x_session_duration_s_p50``, ``x_prefix_sharing``, and ``x_turn<k>_ttft_ms_p50`` / ``x_turn<k>_n`` per turn."""
    tot = session_totals(records)
    out = {"x_turns": turns, "x_think_time_s": think_time_s, "x_prefix_sharing": "history"}
    out |= {"x_sessions": len(tot), "x_sessions_completed": int(tot["completed"].sum())}
    out["x_session_duration_s_p50"] = M.percentiles(tot["duration_s"], (50,))["p50"]
    for _, r in per_turn(records).head(MAX_TURN_COLUMNS).iterrows():
        out[f"x_turn{int(r['turn'])}_ttft_ms_p50"], out[f"x_turn{int(r['turn'])}_n"] = r["ttft_ms_p50"], int(r["n"])
    return out


class SessionBackend(ServedBackend):
    """Multi-turn sessions as stored, resumable points of the grid runner: one point per concurrency (concurrent
    conversations), each with its own fresh messages (seeded by its ``point_id``).

    Args:
        turns: turns per conversation (>= 1). think_time_s: pause between a reply and the next turn (s, >= 0).
        kwargs: the arguments of :class:`kit.serve.sweep.ServedBackend`.

    Raises:
        UserError: turns < 1, think_time_s < 0, or ServedBackend's errors.
    """

    def __init__(self, config, concurrencies, out_dir, *, turns: int = 3, think_time_s: float = 0.0, **kw):
        if int(turns) < 1 or not (float(think_time_s) >= 0):
            raise UserError(f"turns={turns} (>= 1), think_time_s={think_time_s} (>= 0 s)")
        super().__init__(config, concurrencies, out_dir, **kw)
        self.turns, self.think_time_s = int(turns), float(think_time_s)

    def points(self) -> list[GridPoint]:
        """One point per concurrency; ids carry turns and think time."""
        if self._points is None:
            self._points = [
                GridPoint(f"{p.point_id}-turns{self.turns}-think{self.think_time_s:g}", p.columns, p.label, p.config)
                for p in super().points()
            ]
        return self._points

    def measure(self, point: GridPoint) -> dict:
        """Run the point's conversations; the row of :func:`kit.serve.aggregate.aggregate` plus
        :func:`session_columns`."""
        c: LoadConfig = replace(point.config, warmup_requests=0)
        n_sessions = math.ceil(int(c.num_requests or 1) / self.turns)
        msgs = session_messages(c, n_sessions, self.turns, point_seed(c.seed, point.point_id), self.tokenizer)
        records, info = run_coro(run_sessions_async(c, msgs, self.think_time_s, self.tokenizer))
        detail = write_detail(self.out_dir, point.point_id, records, c)
        row = {**aggregate(records, c, info), **self.extra, "point_id": point.point_id, "x_detail_file": str(detail)}
        return row | session_columns(records, self.turns, self.think_time_s)
