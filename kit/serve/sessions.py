"""Multi-turn sessions: conversations of ``turns`` turns, each turn's prompt the history so far plus a new user
message, with a think time between a reply and the next turn; per-turn TTFT and each session's totals.

:class:`SessionSchedule` is a schedule of the one request loop (:mod:`kit.serve.schedule`), so session rows get the
same guarantees as every served row (early stop, self-check, ``/metrics``, power, steady window, validity).
``max_concurrency`` is the number of conversations in flight (users); ``num_requests`` the measured turns in all
(``ceil(num_requests / turns)`` conversations); every turn asks for ``osl`` tokens and adds an ``isl``-token
message. On ``/v1/chat/completions`` the history is the message list (user, assistant, user, ...); on
``/v1/completions`` it is their texts joined by newlines. A server with a prefix cache finds the history in its
cache, so later turns' TTFT measures the cache's effect; the row says so (``x_prefix_sharing = "history"``) and its
validity does not count those hits against it. A failed turn ends its conversation: its later turns are recorded as
failed, not sent (so ``failed`` counts every planned turn that did not complete).
Records add ``session_id``, ``turn`` (1-based), ``think_s``; warm-up requests are not sent. The steady window is
where all ``max_concurrency`` conversations were in progress.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import pandas as pd

from kit import metrics as M
from kit.errors import UserError
from kit.grid import GridPoint
from kit.serve.limits import MAX_THINK_TIME_S, MAX_TURNS
from kit.serve.load import LoadConfig
from kit.serve.schedule import RunClock, Send, Steady
from kit.serve.sweep import ServedBackend
from kit.serve.workload import PromptSpec, RequestInput, build_workload, point_seed

#: per-turn TTFT columns ``x_turn<k>_ttft_ms_p50`` are written for turns 1..MAX_TURN_COLUMNS
MAX_TURN_COLUMNS = 16


def session_messages(cfg: LoadConfig, n_sessions: int, turns: int, seed: int, tokenizer=None) -> list[list[str]]:
    """The user messages of each conversation (``n_sessions`` lists of ``turns`` texts of ~``cfg.isl`` tokens),
    distinct from each other (drawn from ``seed``)."""
    spec = PromptSpec(cfg.isl, cfg.osl, group_size=1)
    msgs = build_workload(n_sessions * turns, spec, tokenizer, seed, as_token_ids=False)
    return [[str(m.prompt) for m in msgs[s * turns : (s + 1) * turns]] for s in range(n_sessions)]


class SessionSchedule:
    """The conversations ``messages`` (one list of user messages each), ``users`` at a time, turns in order, a
    think time between a reply and the next turn (a schedule of :mod:`kit.serve.schedule`).

    Args:
        messages: each conversation's user messages (text).
        users: conversations in flight at once (>= 1).
        osl: output tokens asked for per turn.
        think_time_s: pause between a reply and the next turn (s, >= 0).

    Raises:
        UserError: no conversation, users < 1, or think_time_s < 0.
    """

    kind = "sessions"
    unique_prompts = False  # each turn resends its conversation's history: prefix-cache hits are intended

    def __init__(self, messages: Sequence[Sequence[str]], users: int, osl: int, think_time_s: float = 0.0):
        if not messages or int(users) < 1 or not (0 <= float(think_time_s) <= MAX_THINK_TIME_S):
            raise UserError(
                f"{len(messages)} conversations (>= 1), users={users} (>= 1), think_time_s={think_time_s} (in [0, "
                f"{MAX_THINK_TIME_S:g}] s)"
            )
        self.messages, self.osl = [list(m) for m in messages], int(osl)
        self.users = min(int(users), len(self.messages))  # never more users than conversations (the row's concurrency)
        self.think_time_s = float(think_time_s)
        self.turns = max(len(m) for m in self.messages)
        self.planned = sum(len(m) for m in self.messages)
        self.label = f"{self.users} users x {self.turns} turns"
        self.steady = Steady(target=self.users, unit="session_id")

    def planned_max_tokens(self) -> list[tuple[bool, int]]:
        """``(False, osl)`` for every planned turn."""
        return [(False, self.osl)] * self.planned

    async def sends(self, run: RunClock) -> AsyncIterator[Send]:
        """Each conversation's turns as their replies (and think times) allow, ``users`` conversations at once."""
        ready: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        todo = iter(range(len(self.messages)))
        live = {"open": 0}

        def start_next() -> None:
            s = next(todo, None)
            if s is None:
                if live["open"] == 0:
                    ready.put_nowait(None)  # every conversation has ended
                return
            live["open"] += 1
            ready.put_nowait(self.turn(s, 0, [], on_end))

        def on_end(s: int, k: int, history: list[dict], cap) -> None:
            if cap is not None and cap.error is None and k + 1 < len(self.messages[s]):
                history = history + [{"role": "assistant", "content": "".join(cap.chunk_texts)}]
                nxt = self.turn(s, k + 1, history, on_end)
                loop.call_later(0.0 if run.stopped else self.think_time_s, ready.put_nowait, nxt)
                return
            if k + 1 < len(self.messages[s]):  # its later turns: failed, not sent (counted, never silently dropped)
                why = "not sent: an earlier turn of its conversation failed"
                ready.put_nowait(self.turn(s, k + 1, history, on_end, skip=why))
                return
            live["open"] -= 1
            start_next()

        for _ in range(min(self.users, len(self.messages))):
            start_next()
        while (item := await ready.get()) is not None:
            yield item

    def turn(self, s: int, k: int, history: list[dict], on_end, skip: str | None = None) -> Send:
        """Turn ``k`` of conversation ``s`` after ``history`` (user and assistant messages so far); ``skip``: a
        turn recorded as failed without being sent."""
        msgs = history + [{"role": "user", "content": self.messages[s][k]}]
        req = RequestInput("\n".join(m["content"] for m in msgs), None, self.osl)
        fields = {"session_id": s, "turn": k + 1, "think_s": self.think_time_s if k else 0.0}
        return Send(req, messages=msgs, fields=fields, on_done=lambda cap: on_end(s, k, msgs, cap), skip=skip)

    def columns(self, records: Sequence[dict]) -> dict:
        """:func:`session_columns` and the row's ``concurrency``: the conversations in flight."""
        return session_columns(records, self.turns, self.think_time_s) | {"concurrency": self.users}


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
    conversations), each with its own fresh messages (seeded by its ``point_id``), measured like every served
    point (:meth:`kit.serve.sweep.ServedBackend.measure`).

    Args:
        turns: turns per conversation (>= 1). think_time_s: pause between a reply and the next turn (s, >= 0).
        options: the options of :class:`kit.serve.sweep.ServedBackend` (no explicit workload, no prefix axis).

    Raises:
        UserError: turns < 1, think_time_s < 0, a workload or prefix fractions, or ServedBackend's errors.
    """

    def __init__(self, config, concurrencies, out_dir, *, turns: int = 3, think_time_s: float = 0.0, **options):
        if not (1 <= int(turns) <= MAX_TURNS and 0 <= float(think_time_s) <= MAX_THINK_TIME_S):
            raise UserError(
                f"turns={turns} (an integer in [1, {MAX_TURNS}]), think_time_s={think_time_s} (in [0, "
                f"{MAX_THINK_TIME_S:g}] s)"
            )
        if options.get("workload") is not None or list(options.get("prefix_fractions", [0.0])) != [0.0]:
            raise UserError("sessions draw their own messages: give no workload and no prefix fractions")
        super().__init__(replace(config, warmup_requests=0), concurrencies, out_dir, **options)
        self.turns, self.think_time_s = int(turns), float(think_time_s)

    def points(self) -> list[GridPoint]:
        """One point per concurrency; ids carry turns and think time."""
        if self._points is None:
            self._points = [
                GridPoint(f"{p.point_id}-turns{self.turns}-think{self.think_time_s:g}", p.columns, p.label, p.config)
                for p in super().points()
            ]
        return self._points

    def schedule_for(self, point: GridPoint) -> SessionSchedule:
        """The point's conversations: ``ceil(num_requests / turns)`` of them, ``max_concurrency`` at a time, with
        ``num_requests`` turns in all (never more: the last conversation may be shorter)."""
        c: LoadConfig = point.config
        n = int(c.num_requests or 1)  # exactly this many turns in all: the last conversation may be shorter
        turns = min(self.turns, n)
        n_sessions = math.ceil(n / turns)
        msgs = session_messages(c, n_sessions, turns, point_seed(c.seed, point.point_id), self.tokenizer)
        msgs[-1] = msgs[-1][: n - (n_sessions - 1) * turns]
        return SessionSchedule(msgs, int(c.max_concurrency or n_sessions), c.osl, self.think_time_s)
