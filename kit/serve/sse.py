"""Server-sent events of an OpenAI-compatible stream: the incremental SSE parser (bytes of one network read in,
events out) and the classification of each event (token-bearing chunk, usage-only, role-only, finish, error).
The request that uses them is :func:`kit.serve.client.stream_request`."""

from __future__ import annotations

from typing import Any


def classify_event(obj: Any) -> tuple[str, int | None, dict | None, str | None, str | None]:
    """One parsed SSE JSON payload → ``(text, n_token_ids, usage, finish_reason, error)``.

    ``text`` concatenates every choice's ``text`` (completions) or ``delta.content`` / reasoning content (chat);
    an empty string means the event is not token-bearing. ``choices: []`` (usage-only) is fine.
    """
    if not isinstance(obj, dict):
        return "", None, None, None, f"unexpected event payload {str(obj)[:200]!r}"
    if obj.get("error") is not None or obj.get("object") == "error":
        err = obj.get("error", obj)
        msg = err.get("message", err) if isinstance(err, dict) else err
        return "", None, None, None, f"error event: {str(msg)[:500]}"
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
        finish = ch.get("finish_reason") or finish
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    return text, n_ids, usage, finish, None


class SSEParser:
    """Incremental server-sent-events parser: feed bytes, get complete ``data`` payloads (strings).

    Handles ``\\n`` / ``\\r\\n`` line ends, multi-line ``data:`` fields, comments and other fields; an event is
    complete at a blank line, or at end of stream (:meth:`close`).
    """

    def __init__(self):
        self._buf = b""
        self._data: list[str] = []

    def feed(self, raw: bytes) -> list[str]:
        self._buf += raw
        out = []
        while True:
            i = self._buf.find(b"\n")
            if i < 0:
                break
            line, self._buf = self._buf[:i], self._buf[i + 1 :]
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    out.append("\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                v = line[5:]
                self._data.append((v[1:] if v.startswith(b" ") else v).decode("utf-8", "replace"))
        return out

    def close(self) -> list[str]:
        out = self.feed(b"\n\n") if (self._buf or self._data) else []
        self._buf = b""
        return out
