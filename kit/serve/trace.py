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
from kit.serve.limits import MAX_OSL, MAX_TIME_SCALE, MAX_WORKLOAD_TOKENS, check_number
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


#: longest trace a replay accepts: 7 days of timestamps (ms), and this many requests
MAX_TRACE_MS = 7 * 24 * 3600 * 1000
MAX_TRACE_ENTRIES = 1_000_000


def load_trace(path: str | Path) -> list[TraceEntry]:
    """The entries of a Mooncake-format JSONL trace, sorted by timestamp (blank lines skipped).

    Every value is bounded before anything is allocated: ``timestamp`` a finite number of ms in [0,
    :data:`MAX_TRACE_MS`], ``input_length`` an integer in [1, :data:`kit.serve.limits.MAX_WORKLOAD_TOKENS`],
    ``output_length`` an integer in [1, :data:`kit.serve.limits.MAX_OSL`], ``hash_ids`` a list of at most
    ``input_length`` integers (each stands for at least one prompt token), at most :data:`MAX_TRACE_ENTRIES` lines.

    Raises:
        InputNotFoundError: no such file. UserError: a line that is not UTF-8 or not such a JSON object (the message
            names file, line and value), too many lines, or a trace with no entry.
    """
    p = Path(path)
    if p.is_dir():
        raise UserError(f"trace {str(p)!r} is a directory; give a JSONL file, one request per line")
    if not p.is_file():
        raise InputNotFoundError(f"trace {str(p)!r} not found (a JSONL file, one request per line)")
    out = []
    for k, raw in enumerate(p.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        if len(out) >= MAX_TRACE_ENTRIES:
            raise UserError(f"{p}: more than {MAX_TRACE_ENTRIES:,} requests; split the trace")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"{p}:{k}: not UTF-8 text ({e.reason} at byte {e.start}); a trace is JSON lines") from None
        out.append(trace_entry(line, f"{p}:{k}"))
    if not out:
        raise UserError(f"trace {p} has no entries")
    return sorted(out, key=lambda e: e.timestamp_ms)


def trace_entry(line: str, where: str) -> TraceEntry:
    """One trace line as a :class:`TraceEntry`, every value checked (see :func:`load_trace`).

    Raises:
        UserError: naming ``where`` (file:line), the field, its value and what is allowed.
    """
    expected = '{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}'
    try:
        d = json.loads(line)
    except ValueError as err:
        raise UserError(f"{where}: {line[:120]!r} is not JSON ({err}); expected {expected}") from None
    if not isinstance(d, dict) or not {"timestamp", "input_length", "output_length"} <= set(d):
        raise UserError(f"{where}: {line[:120]!r} is not a trace entry; expected {expected}")
    ts = check_number(f"{where}: timestamp", d["timestamp"], lo=0, hi=MAX_TRACE_MS, meaning="ms")
    isl = check_number(f"{where}: input_length", d["input_length"], lo=1, hi=MAX_WORKLOAD_TOKENS, integer=True)
    osl = check_number(f"{where}: output_length", d["output_length"], lo=1, hi=MAX_OSL, integer=True)
    ids = d.get("hash_ids") or []
    if not isinstance(ids, list) or len(ids) > isl:
        size = len(ids) if isinstance(ids, list) else type(ids).__name__
        raise UserError(f"{where}: hash_ids ({size}) must be a list of at most input_length={isl} integers")
    for h in ids:
        check_number(f"{where}: hash id", h, lo=-(2**63), hi=2**63 - 1, integer=True)
    return TraceEntry(float(ts), int(isl), int(osl), tuple(int(h) for h in ids))


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
        used = e.hash_ids[: -(-e.input_length // block_tokens)]  # the blocks past the prompt's length are not needed
        ids = [t for h in used for t in block(h)][: e.input_length]
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
        if not (0 < float(time_scale) <= MAX_TIME_SCALE):
            raise UserError(f"time_scale={time_scale}; must be in (0, {MAX_TIME_SCALE:g}] (0.5 replays twice as fast)")
        self.trace_path, self.entries = Path(trace), load_trace(trace)
        span = (self.entries[-1].timestamp_ms - self.entries[0].timestamp_ms) * float(time_scale)
        if span > MAX_TRACE_MS:
            raise UserError(
                f"time_scale={time_scale}: the replay would last {span / 86_400_000:.1f} days (at most "
                f"{MAX_TRACE_MS / 86_400_000:g}); give a smaller --time-scale"
            )
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
            pid = f"{served_point_id(c, self.options.server_key)}-trace{digest:08x}-x{self.time_scale:g}"
            cols = {"model": c.model, "device": "remote", "isl": c.isl, "osl": c.osl, **self.extra}
            cols |= {"x_trace": str(self.trace_path), "x_time_scale": self.time_scale}
            self._points = [GridPoint(pid, cols, f"trace {self.trace_path.name}", replace(c, seed=self.seed))]
        return self._points

    def schedule_for(self, point: GridPoint) -> TraceSchedule:
        """The replay of the trace with this point's prompts (token ids on ``/v1/completions``)."""
        c: LoadConfig = point.config
        wl = trace_workload(self.entries, c.seed, self.block_tokens, c.endpoint == "completions")
        return TraceSchedule(self.entries, wl, self.time_scale)
