"""Trace replay: a JSONL trace of requests sent at its timestamps (optionally time-scaled) against one server.

Trace format (the Mooncake trace, ``kvcache-ai/Mooncake`` ``FAST25-release/traces``), one JSON object per line:
``timestamp`` (ms since the trace began), ``input_length`` and ``output_length`` (tokens), optional ``hash_ids``
(one id per block of ``block_tokens`` prompt tokens, 512 in Mooncake's traces; requests that share leading ids
share that prefix). Prompts are built so that shared ids give shared prefix blocks (:func:`trace_workload`).
Replay is open-loop: request ``i`` is sent at ``(timestamp_i − timestamp_0) × time_scale`` ms after the start
whatever is in flight (``max_concurrency`` is not applied); each record keeps ``scheduled_s`` beside ``sent_s``
and the row reports how late the sends were (``x_trace_late_ms_p50/p99/max``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kit import metrics as M
from kit.errors import InputNotFoundError, UserError
from kit.grid import GridPoint
from kit.serve.aggregate import aggregate
from kit.serve.client import get_model_id, request_record, stream_request, token_counter
from kit.serve.http1 import StreamPool
from kit.serve.load import LoadConfig, run_coro
from kit.serve.prefix import ID_RANGE, point_seed
from kit.serve.sweep import ServedBackend, served_point_id, write_detail
from kit.serve.workload import RequestInput

#: prompt tokens per hash id in Mooncake's traces
MOONCAKE_BLOCK_TOKENS = 512
#: a request wakes this long before its time and yields to the event loop until it is due (the loop's timer
#: rounds to whole milliseconds)
SPIN_S = 0.002


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


async def replay_async(
    cfg: LoadConfig, entries: Sequence[TraceEntry], workload: Sequence[RequestInput], tokenizer=None, time_scale=1.0
) -> tuple[list[dict], dict]:
    """Send ``workload[i]`` at ``(entries[i].timestamp_ms − entries[0].timestamp_ms) × time_scale`` ms after the
    start (open loop). Returns ``(records, run_info)`` like :func:`kit.serve.load.run_load_async`; each record
    adds ``scheduled_s`` (s since the start). Never raises for server faults (they are failed records).

    Raises:
        UserError: ``time_scale`` not > 0, entries and workload of different lengths, or no model id.
    """

    if not (time_scale > 0) or len(entries) != len(workload) or not entries:
        raise UserError(f"time_scale={time_scale} (> 0); {len(entries)} entries for {len(workload)} requests")
    model = cfg.model or await get_model_id(cfg.url, cfg.api_key_env, cfg.models_timeout_s)
    url, headers, t_first = cfg.api_url(), cfg.request_headers(), entries[0].timestamp_ms
    at = [(e.timestamp_ms - t_first) / 1000.0 * time_scale for e in entries]
    caps: list = [None] * len(entries)

    async def one(i: int, session, t_run: float) -> None:
        due = t_run + at[i]
        await asyncio.sleep(max(0.0, due - time.perf_counter() - SPIN_S))
        while time.perf_counter() < due:  # the last SPIN_S: yield to the loop rather than trust its timer's ms
            await asyncio.sleep(0)
        body = cfg.request_body(model, workload[i])
        caps[i] = await stream_one(session, cfg, url, body, headers)

    async with StreamPool() as session:
        t_run = time.perf_counter()
        await asyncio.gather(*(one(i, session, t_run) for i in range(len(entries))))
    count = token_counter(tokenizer)
    records = []
    for i, cap in enumerate(caps):
        rec = request_record(cap, workload[i], count, t_run, 0.0, i, False)
        records.append({**rec, "scheduled_s": at[i]})
    dur = max(r["end_s"] for r in records) - min(r["sent_s"] for r in records)
    return records, {"duration_s": dur, "model": model, "url": cfg.shown_url}


async def stream_one(session, cfg: LoadConfig, url: str, body: dict, headers: dict):
    """:func:`kit.serve.client.stream_request` of one request under ``cfg``'s timeouts, event-size cap and
    secrets (scrubbed from error texts)."""
    return await stream_request(
        session,
        url,
        body,
        headers,
        cfg.timeout_s,
        cfg.stall_timeout_s,
        first_byte_timeout_s=cfg.first_byte_timeout_s,
        max_event_bytes=cfg.max_event_bytes,
        secrets=tuple(cfg.secrets()),
    )


def lateness_ms(records: Sequence[dict]) -> dict:
    """Percentiles (p50, p99, n) and max of how late each request was sent: (sent_s − scheduled_s) × 1000 ms."""
    late = [(r["sent_s"] - r["scheduled_s"]) * 1000.0 for r in records if "scheduled_s" in r]
    return {**M.percentiles(late, (50, 99)), "max": max(late) if late else None}


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
            self._points = [GridPoint(pid, cols, f"trace {self.trace_path.name}", c)]
        return self._points

    def measure(self, point: GridPoint) -> dict:
        """Replay the trace; the row of :func:`kit.serve.aggregate.aggregate` plus the lateness columns."""
        c: LoadConfig = point.config
        wl = trace_workload(self.entries, c.seed, self.block_tokens, c.endpoint == "completions")
        records, info = run_coro(replay_async(c, self.entries, wl, self.tokenizer, self.time_scale))
        detail = write_detail(self.out_dir, point.point_id, records, c)
        late = lateness_ms(records)
        span = (self.entries[-1].timestamp_ms - self.entries[0].timestamp_ms) / 1000.0 * self.time_scale
        row = aggregate(records, replace(c, request_rate=len(records) / span if span > 0 else float("inf")), info)
        row |= {**self.extra, **point.columns, "point_id": point.point_id, "x_detail_file": str(detail)}
        row |= {
            "x_trace_late_ms_p50": late["p50"],
            "x_trace_late_ms_p99": late["p99"],
            "x_trace_late_ms_max": late["max"],
        }
        return row
