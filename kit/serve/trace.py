"""Trace replay: a JSONL trace of requests sent at its timestamps (optionally time-scaled) against one server.

Trace format (the Mooncake trace, ``kvcache-ai/Mooncake`` ``FAST25-release/traces``), one JSON object per line:
``timestamp`` (ms since the trace began), ``input_length`` and ``output_length`` (tokens), optional ``hash_ids``
(one id per block of ``block_tokens`` prompt tokens, 512 in Mooncake's traces; requests that share leading ids
share that prefix). Prompts are built so that shared ids give shared prefix blocks (:func:`trace_workload`).
Replay is open-loop: request ``i`` is sent at ``(timestamp_i − timestamp_0) × time_scale`` ms after the start
whatever is in flight (``max_concurrency`` is not applied). :class:`TraceSchedule` is a schedule of the one request
loop (:mod:`kit.serve.schedule`), so a replayed row gets the same guarantees as every served row; each record keeps
``due_s`` (its time in the trace) beside ``sent_s``, and the row reports how late the sends were
(``x_send_late_ms_p50/p99/max``, as every open-loop row does).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kit.errors import InputNotFoundError, UserError
from kit.grid import GridPoint
from kit.serve.load import LoadConfig
from kit.serve.point import served_point_id
from kit.serve.schedule import RunClock, Send, Steady
from kit.serve.sweep import ServedBackend
from kit.serve.workload import ID_RANGE, RequestInput, point_seed

#: prompt tokens per hash id in Mooncake's traces
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceEntry:
    """One request of a trace: send time (ms from the trace's start), lengths (tokens), prefix block hashes."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def load_trace(path: str | Path) -> list[TraceEntry]:
    """The entries of a Mooncake-format JSONL trace, sorted by timestamp (blank lines skipped).

    Raises:
        InputNotFoundError: no such file. UserError: a line that is not a JSON object with a numeric
            ``timestamp`` >= 0 and integer ``input_length`` / ``output_length`` >= 1 (the message names file and
            line), or a trace with no entry.
    """
    p = Path(path)
    if not p.is_file():
        raise InputNotFoundError(f"trace {str(p)!r} not found (a JSONL file, one request per line)")
    out = []
    for k, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            e = TraceEntry(
                float(d["timestamp"]), int(d["input_length"]), int(d["output_length"]), tuple(d.get("hash_ids") or ())
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise UserError(
                f"{p}:{k}: {line[:120]!r} is not a trace entry ({type(err).__name__}: {err}); expected "
                '{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}'
            ) from None
        if not (e.timestamp_ms >= 0 and e.input_length >= 1 and e.output_length >= 1):
            raise UserError(f"{p}:{k}: timestamp must be >= 0 and both lengths >= 1, got {line[:120]!r}")
        out.append(e)
    if not out:
        raise UserError(f"trace {p} has no entries")
    return sorted(out, key=lambda e: e.timestamp_ms)


def trace_workload(
    entries: Sequence[TraceEntry], seed: int = 0, block_tokens: int = MOONCAKE_BLOCK_TOKENS, as_token_ids: bool = True
) -> list[RequestInput]:
    """One prompt per entry: the blocks of its ``hash_ids`` (block ``h`` is the same ``block_tokens`` random token
    ids wherever ``h`` appears), cut to ``input_length``, padded with tokens of the request's own; ids in
    ``ID_RANGE`` sent as ids (``as_token_ids``) or as words ``w<id>`` (token count then unknown)."""
    blocks: dict[int, list[int]] = {}

    def block(h: int) -> list[int]:
        if h not in blocks:
            blocks[h] = [
                int(x) for x in np.random.default_rng(point_seed(seed, f"block{h}")).integers(*ID_RANGE, block_tokens)
            ]
        return blocks[h]

    out = []
    for i, e in enumerate(entries):
        ids = [t for h in e.hash_ids for t in block(h)][: e.input_length]
        own = np.random.default_rng(point_seed(seed, f"request{i}")).integers(*ID_RANGE, e.input_length - len(ids))
        ids += [int(x) for x in own]
        prompt = ids if as_token_ids else " ".join(f"w{t}" for t in ids)
        out.append(RequestInput(prompt, e.input_length if as_token_ids else None, e.output_length))
    return out


class TraceSchedule:
    """A trace's requests at its timestamps: request ``i`` due ``(timestamp_i − timestamp_0) × time_scale`` ms after
    the start, no concurrency cap (a schedule of :mod:`kit.serve.schedule`; the steady window is an open loop's).

    Args:
        entries: the trace (:func:`load_trace`), sorted by timestamp.
        workload: one request per entry (:func:`trace_workload`).
        time_scale: multiplies the trace's time line (> 0; 0.5 replays twice as fast).

    Raises:
        UserError: ``time_scale`` not > 0, or entries and workload of different lengths (or none).
    """

    kind = "trace"
    steady = Steady()

    def __init__(self, entries: Sequence[TraceEntry], workload: Sequence[RequestInput], time_scale: float = 1.0):
        if not (float(time_scale) > 0) or len(entries) != len(workload) or not entries:
            raise UserError(f"time_scale={time_scale} (> 0); {len(entries)} entries for {len(workload)} requests")
        t_first = entries[0].timestamp_ms
        self.at = [(e.timestamp_ms - t_first) / 1000.0 * float(time_scale) for e in entries]
        self.workload, self.planned = list(workload), len(workload)
        self.label = f"trace x{time_scale:g}"
        # requests that share a hash id share that block on purpose: their prefix-cache hits are intended
        ids = [h for e in entries for h in e.hash_ids]
        self.unique_prompts = len(ids) == len(set(ids))

    def planned_max_tokens(self) -> list[tuple[bool, int]]:
        """``(False, output_length)`` of every entry."""
        return [(False, r.max_tokens) for r in self.workload]

    async def sends(self, run: RunClock) -> AsyncIterator[Send]:
        """Every request at its time in the trace."""
        for at, req in zip(self.at, self.workload):
            yield Send(req, at_s=at)

    def columns(self, records: Sequence[dict]) -> dict:
        """The offered request rate (entries / the trace's span, s) and no concurrency (the replay has no cap)."""
        span = self.at[-1] - self.at[0]
        return {"request_rate": len(self.at) / span if span > 0 else float("inf"), "concurrency": None}


class TraceBackend(ServedBackend):
    """A trace replay as one stored, resumable point of the grid runner (``backend = "openai"``).

    Args:
        config: the load settings (model, endpoint, timeouts; its concurrency and rate are not used).
        trace: path of a Mooncake-format JSONL trace (:func:`load_trace`).
        out_dir: the run directory (the detail file ``requests-<point_id>.jsonl`` goes there too).
        time_scale: multiplies the trace's time line (0.5 replays twice as fast).
        block_tokens: prompt tokens per hash id.

    Raises:
        UserError / InputNotFoundError: a bad trace or time_scale (before any network work).
    """

    def __init__(self, config, trace, out_dir, *, time_scale: float = 1.0, block_tokens=MOONCAKE_BLOCK_TOKENS, **kw):
        if not (float(time_scale) > 0):
            raise UserError(f"time_scale={time_scale}; must be > 0 (0.5 replays twice as fast)")
        self.trace_path, self.entries = Path(trace), load_trace(trace)
        self.time_scale, self.block_tokens = float(time_scale), int(block_tokens)
        super().__init__(replace(config, max_concurrency=1), [1], out_dir, **kw)

    def points(self) -> list[GridPoint]:
        """The one point of the replay (its id: the config, the trace's content and the time scale)."""
        if self._points is None:
            self.resolve_model()
            isl = round(float(np.mean([e.input_length for e in self.entries])))
            osl = round(float(np.mean([e.output_length for e in self.entries])))
            c = replace(self.config, max_concurrency=None, num_requests=len(self.entries), warmup_requests=0)
            c = replace(c, isl=isl, osl=osl)  # the row's isl/osl: the trace's mean lengths
            digest = point_seed(0, self.trace_path.read_text()) % 16**8
            pid = f"{served_point_id(c)}-trace{digest:08x}-x{self.time_scale:g}"
            cols = {"model": c.model, "device": "remote", "isl": c.isl, "osl": c.osl, **self.extra}
            cols |= {"x_trace": str(self.trace_path), "x_time_scale": self.time_scale}
            self._points = [GridPoint(pid, cols, f"trace {self.trace_path.name}", replace(c, seed=self.seed))]
        return self._points

    def schedule_for(self, point: GridPoint) -> TraceSchedule:
        """The replay of the trace with this point's prompts (token ids on ``/v1/completions``)."""
        c: LoadConfig = point.config
        wl = trace_workload(self.entries, c.seed, self.block_tokens, c.endpoint == "completions")
        return TraceSchedule(self.entries, wl, self.time_scale)
