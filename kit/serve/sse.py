"""Server-sent events of an OpenAI-compatible stream, on the client's hot path: the incremental SSE parser (bytes
of one network read in, event payloads out), the classification of each event (token-bearing chunk, usage-only,
role-only, finish, error) and :class:`StreamCapture`, what one streamed request produced. The request that uses
them is :func:`kit.serve.client.stream_request`.

The work is per network read, not per event (a read from a fast server holds hundreds of events): a read is
stamped once (every event of a read arrived when its last byte did). Once a stream's layout is known (the bytes
around the text of a plain token chunk: one id, one model, one choice, the usual shape), a read made only of
such events is taken with a few byte operations (:meth:`StreamCapture.add_read`); any other read is split
into events once and each event that repeats the layout with only the text changed is taken without a JSON
parse, the rest parsed. Both shortcuts are exact, not guesses (see :meth:`StreamCapture.add_events`). An event
larger than ``max_event_bytes`` ends the request as failed (:class:`EventTooLarge`), so an endless line cannot
grow the client's memory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import methodcaller
from typing import Any

#: default cap on one SSE event (or an unfinished line) in bytes: 4 MiB; a bigger event fails the request
MAX_EVENT_BYTES = 4 * 2**20
#: finish reasons that mean the server gave up on the request (vLLM "abort"/"error", SGLang's abort)
FAILED_FINISH = ("error", "abort")
_DECODER = json.JSONDecoder()
_DECODE = methodcaller("decode", "utf-8", "replace")
_BOM = b"\xef\xbb\xbf"  # UTF-8 byte-order mark
_SURROGATE = re.compile("[\ud800-\udfff]")
#: the text of a fast-path event: no quote, backslash or control character (JSON would escape them)
_PLAIN_TEXT = rb'([^"\\\x00-\x1f]+)'
_PLAIN_RX = re.compile(_PLAIN_TEXT)


class EventTooLarge(Exception):
    """An SSE event (or an unfinished line) grew past the parser's ``max_event_bytes``."""


class TooManyEvents(EventTooLarge):
    """A stream sent more events than its request can need (:attr:`StreamCapture.max_events`): an endless stream."""


class ErrorEvent(str):
    """The data of an SSE frame typed ``event: error`` (any data, possibly empty)."""


#: longest piece of a server's text an error message quotes, characters; it ends the message, so a secret cut here is
#: still masked (:func:`kit.serve.redact.scrub` masks a secret's start ending a text)
ERROR_PIECE_CHARS = 2000


def _error_text(obj: Any) -> str:
    """The message of an error payload (``{"error": {"message": ..}}``, ``{"message": ..}``, a string ...)."""
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        err = err.get("message", err.get("detail", err))
    return str(err)[:ERROR_PIECE_CHARS]


def classify_event(obj: Any) -> tuple[str, int | None, dict | None, str | None, str | None]:
    """One parsed SSE JSON payload → ``(text, n_token_ids, usage, finish_reason, error)``.

    ``text`` concatenates every choice's ``text`` (completions) or ``delta.content`` / reasoning content (chat);
    an empty string means the event is not token-bearing. ``choices: []`` (usage-only) is fine. ``error`` is set
    for every error shape the OpenAI and SSE conventions allow: ``{"error": ..}`` (vLLM, SGLang, OpenAI),
    ``{"object": "error", ..}``, ``{"type": "error", ..}`` (typed events), a finish reason in
    :data:`FAILED_FINISH` (a string, or SGLang's ``{"type": "abort", "message": ..}``), and a payload that is
    not a JSON object.
    """
    if not isinstance(obj, dict):
        return "", None, None, None, f"unexpected event payload: {str(obj)[:ERROR_PIECE_CHARS]}"
    if obj.get("error") is not None or obj.get("object") == "error" or obj.get("type") == "error":
        return "", None, None, None, f"error event: {_error_text(obj)}"
    text, n_ids, finish = "", None, None
    for ch in obj.get("choices") or []:
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta")
        if isinstance(delta, dict):
            for key in ("content", "reasoning_content", "reasoning"):
                v = delta.get(key)
                if isinstance(v, str):
                    text += v
        v = ch.get("text")
        if isinstance(v, str):
            text += v
        ids = ch.get("token_ids")
        if isinstance(ids, list) and ids:
            n_ids = (n_ids or 0) + len(ids)
        fr = ch.get("finish_reason")
        if isinstance(fr, dict):  # SGLang: {"type": "abort", "message": ...}
            if fr.get("type") in FAILED_FINISH:
                return "", None, None, None, f"finish_reason {fr.get('type')}: {_error_text(fr)}"
            fr = fr.get("type")
        if fr in FAILED_FINISH:
            return "", None, None, None, f"finish_reason {fr!r}: the server ended the request as failed"
        finish = fr or finish
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    return text, n_ids, usage, finish, None


class SSEParser:
    """Incremental server-sent-events parser: feed the bytes of each network read, get complete events.

    Each event is its ``data`` (bytes; several ``data:`` lines joined by ``\\n``), or an :class:`ErrorEvent`
    (str) for a frame typed ``event: error``. Follows the SSE stream format (WHATWG HTML, "Server-sent events":
    ``\\n``, ``\\r\\n`` and ``\\r`` line ends, also split across reads; a leading byte-order mark ignored;
    comments and other fields skipped; an event whose data is empty is not dispatched); an event is complete at a
    blank line, or at end of stream (:meth:`close`). A read's line ends are normalised as it arrives (a read that
    ends in ``\\r`` ends its line there; a ``\\n`` that starts the next read is then the rest of that ``\\r\\n``),
    so no event waits for the next read. A read is split once; an unfinished event is kept as pieces (at most
    ``max_event_bytes``) and joined only when a blank line can have arrived, so an event that trickles in over
    many reads costs linear time.

    Raises (from :meth:`feed`):
        EventTooLarge: an event or an unfinished line longer than ``max_event_bytes``.
    """

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES):
        self._pieces: list[bytes] = []  # an unfinished event, line ends normalised
        self._held = 0  # bytes in _pieces
        self._skip_lf = False  # the last read ended in \r: a \n starting the next one completes that \r\n
        self._head: bytes | None = b""  # the stream's first bytes until a byte-order mark is ruled out (then None)
        self.max_event_bytes = int(max_event_bytes)

    def feed(self, raw: bytes) -> list:
        if self._head is not None:  # a byte-order mark at the start of the stream is not part of it
            raw = self._head + raw
            if len(raw) < 3 and _BOM.startswith(raw):
                self._head = raw
                return []
            self._head = None
            if raw[:3] == _BOM:
                raw = raw[3:]
        if self._skip_lf:
            self._skip_lf = False
            if raw[:1] == b"\n":
                raw = raw[1:]
        if b"\r" in raw:
            self._skip_lf = raw[-1:] == b"\r"
            raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cap = self.max_event_bytes
        if self._pieces:
            if b"\n\n" not in raw and not (raw[:1] == b"\n" and self._pieces[-1][-1:] == b"\n"):
                if raw:  # still unfinished: kept, not joined and searched again
                    self._pieces.append(raw)
                    self._held += len(raw)
                    if self._held > cap:
                        self._pieces, self._held = [], 0
                        raise EventTooLarge(f"an SSE event or line exceeded {cap} bytes (max_event_bytes)")
                return []
            self._pieces.append(raw)
            data = b"".join(self._pieces)
            self._pieces, self._held = [], 0
        else:
            data = raw
        blocks = data.split(b"\n\n")
        tail = blocks.pop()
        if len(tail) > cap or (len(data) > cap and max(map(len, blocks), default=0) > cap):
            raise EventTooLarge(f"an SSE event or line exceeded {cap} bytes (max_event_bytes)")
        if tail:
            self._pieces, self._held = [tail], len(tail)
        out = []
        for b in blocks:
            if b[:6] == b"data: " and b"\n" not in b and len(b) > 6:
                out.append(b[6:])
            elif b:
                self._block(b, out)
        return out

    @staticmethod
    def _block(block: bytes, out: list) -> None:
        """One event's lines (the general case: several fields, comments, ``event:`` types)."""
        event, data = None, []
        for line in block.split(b"\n"):
            if not line or line[:1] == b":":
                continue
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                data.append(value)
            elif name == b"event":
                event = value
        if event == b"error":  # an error even without data (it says the request failed)
            out.append(ErrorEvent(b"\n".join(data).decode("utf-8", "replace")))
        elif data and (len(data) > 1 or data[0]):  # empty data: no event (SSE dispatch rule)
            out.append(b"\n".join(data))

    def close(self) -> list:
        """The last event of a stream that ended without a blank line (if any)."""
        tail = b"".join(self._pieces)
        self._pieces, self._held, self._skip_lf = [], 0, False
        if not tail.strip():
            return []
        out: list = []
        self._block(tail.strip(b"\n"), out)
        return out


@dataclass
class StreamCapture:
    """What one streamed request produced (times are ``time.perf_counter()`` seconds).

    ``chunk_times`` / ``chunk_texts``: one entry per token-bearing chunk; ``chunk_usage`` / ``chunk_token_ids``:
    ``{chunk index: cumulative completion_tokens | number of token ids}`` for the chunks that carried them.
    ``max_events``: most events one request may bring (0: no cap); more raise :class:`TooManyEvents`.
    """

    t_send: float = 0.0
    t_end: float = 0.0
    http_status: int | None = None
    error: str | None = None
    chunk_times: list = field(default_factory=list)
    chunk_texts: list = field(default_factory=list)
    chunk_usage: dict = field(default_factory=dict)
    chunk_token_ids: dict = field(default_factory=dict)
    usage: dict | None = None
    finish_reason: str | None = None
    done: bool = False
    n_events: int = 0
    max_events: int = 0
    _pre: bytes = field(default=b"", repr=False)
    _suf: bytes = field(default=b"", repr=False)
    _head: bytes = field(default=b"", repr=False)  # b"data: " + _pre
    _tail: bytes = field(default=b"", repr=False)  # _suf + the blank line
    _sep: bytes | None = field(default=None, repr=False)  # _tail + _head: between two events of the layout

    def add_read(self, parser: SSEParser, raw: bytes, now: float) -> None:
        """Record the SSE bytes of one network read that arrived at ``now`` (s), parsed by ``parser``.

        Fast path, once the stream's layout is known (see :meth:`add_events`): a read made only of whole events
        ``data: <prefix><text><suffix>`` + blank line, with nothing held from earlier reads, is taken with a few
        byte operations and no per-event Python: the read must start with ``data: <prefix>`` and end with
        ``<suffix>`` + blank line, and what lies between, split at ``<suffix>`` + blank line + ``data: <prefix>``,
        must be non-empty texts without a quote, backslash or control character. That is exact: such a text cannot
        hold the separator (it has a quote), so the pieces are the events' texts, each event the learnt layout with
        another text. No regular expression is built per request (compiling one cost ~180 µs, three times the
        whole per-chunk work of a 64-token request). Any other read goes through ``parser`` and
        :meth:`add_events`.

        Raises:
            EventTooLarge: from ``parser`` (see :class:`SSEParser`).
        """
        sep = self._sep
        if (
            sep is not None
            and not (parser._pieces or parser._skip_lf)
            and len(raw) <= parser.max_event_bytes
            and raw.startswith(self._head)
            and raw.endswith(self._tail)
        ):
            mid = raw[len(self._head) : len(raw) - len(self._tail)]
            if _PLAIN_RX.fullmatch(mid):  # one event, a paced stream's read
                self.n_events += 1
                self.chunk_times.append(now)
                self.chunk_texts.append(mid.decode("utf-8", "replace"))
                if self.n_events > self.max_events > 0:
                    self.too_many()
                return
            texts = mid.split(sep)
            n = len(texts)
            if n > 1 and b"" not in texts and _PLAIN_RX.fullmatch(b"".join(texts)):
                self.n_events += n
                self.chunk_times.extend(repeat(now, n))
                self.chunk_texts.extend(map(_DECODE, texts))
                if self.n_events > self.max_events > 0:
                    self.too_many()
                return
        self.add_events(parser.feed(raw), now)
        if self.n_events > self.max_events > 0:
            self.too_many()

    def too_many(self) -> None:
        """Raise :class:`TooManyEvents`: more events than :attr:`max_events` (the stream is cut, the request fails
        instead of filling the client's memory)."""
        raise TooManyEvents(
            f"the server sent more than {self.max_events} events for one request (an endless stream?); the kit "
            "stops reading it"
        )

    def add_events(self, payloads: Sequence, now: float) -> None:
        """Record the complete events of one network read that arrived at ``now`` (s).

        ``[DONE]`` is not parsed as JSON; only token-bearing chunks get a time stamp; the first error (an error
        event in any shape, see :func:`classify_event`; bad JSON) is kept. Fast path: once a plain token chunk
        (one text field, no usage, finish or error) has been parsed, its bytes before and after the text are the
        stream's layout; a later payload made of that prefix, a text without ``"``, ``\\`` or a control character,
        and that suffix is the same JSON with another text, so it is taken as such without parsing (exact).
        """
        self.n_events += len(payloads)
        pre, suf = self._pre, self._suf
        lp, ls = len(pre), len(suf)
        times, texts = self.chunk_times, self.chunk_texts
        plain = _PLAIN_RX.fullmatch
        for p in payloads:
            if type(p) is not bytes:
                if isinstance(p, ErrorEvent):
                    self._error_event(p)
                    continue
                p = p.encode()
            if lp and p.startswith(pre) and p.endswith(suf) and len(p) > lp + ls:
                mid = p[lp : len(p) - ls]
                if plain(mid):
                    times.append(now)
                    texts.append(mid.decode("utf-8", "replace"))
                    continue
            self._parse(p, now)
            if not lp and self._pre:  # the layout was just learnt: use it for the rest of this read
                pre, suf = self._pre, self._suf
                lp, ls = len(pre), len(suf)

    def _parse(self, p: bytes, now: float) -> None:
        s = p.decode("utf-8", "replace").strip()
        if s == "[DONE]":
            self.done = True
            return
        try:
            obj, end = _DECODER.raw_decode(s)
            if end != len(s):
                raise ValueError("extra data")
        except ValueError:
            self.error = self.error or f"malformed event (not JSON): {s[:ERROR_PIECE_CHARS]}"
            return
        text, n_ids, usage, finish, err = classify_event(obj)
        if err:
            self.error = self.error or err
            return
        if not text.isascii():
            # a lone surrogate escape ("\\ud800" is valid JSON) is no character: U+FFFD, as for bad UTF-8 bytes
            text = _SURROGATE.sub("\ufffd", text)
        if usage is not None:
            self.usage = usage
        if finish:
            self.finish_reason = finish
        if text or n_ids:
            i = len(self.chunk_times)
            self.chunk_times.append(now)
            self.chunk_texts.append(text)
            ct = usage.get("completion_tokens") if usage else None
            if isinstance(ct, (int, float)):
                self.chunk_usage[i] = int(ct)
            if n_ids is not None:
                self.chunk_token_ids[i] = n_ids
            elif not (usage or finish) and "\\" not in text and '"' not in text:
                self._learn(p, text)

    def _learn(self, p: bytes, text: str) -> None:
        """Take the layout of a plain token chunk (its bytes around the text) for the fast path."""
        tb = text.encode()
        for key in (b'"text":"', b'"content":"', b'"text": "', b'"content": "'):
            mark = key + tb + b'"'
            i = p.find(mark)
            if i >= 0 and p.find(mark, i + 1) < 0 and p.count(key) == 1:
                self._pre, self._suf = p[: i + len(key)], p[i + len(key) + len(tb) :]
                if b"\n" not in p and b"\r" not in p:  # one data line: the read fast path can take its events
                    self._head, self._tail = b"data: " + self._pre, self._suf + b"\n\n"
                    self._sep = self._tail + self._head
                return

    def _error_event(self, data: str) -> None:
        try:
            msg = _error_text(json.loads(data)) if data.strip() else "(no data)"
        except ValueError:
            msg = data[:ERROR_PIECE_CHARS]
        self.error = self.error or f"error event: {msg}"

    def finish(self) -> None:
        """Called at a clean end of stream: a stream with no [DONE], finish reason or usage was cut short."""
        if self.error is None and not (self.done or self.finish_reason or self.usage):
            self.error = "stream ended without [DONE], finish_reason or usage (truncated?)"
