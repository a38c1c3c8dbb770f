"""Error texts of the served client: an exception as one line, an error (or an HTML error page) cut to a summary
line, and what timed out where (:func:`kit.serve.client.stream_request`)."""

from __future__ import annotations

from typing import Any


def describe_exception(e: BaseException) -> str:
    """``"TypeName: message"``, never with an empty message (then the repr of its args, or "no details")."""
    msg = str(e).strip()
    if not msg:
        msg = ", ".join(repr(a) for a in getattr(e, "args", ()) if a not in (None, "")) or "no details"
    return f"{type(e).__name__}: {msg}"


def short_error(text: Any, limit: int = 200) -> str:
    """One line of at most ``limit`` characters from an error text, for summaries (the detail file keeps the
    full text): an HTML page is reduced to its ``<title>`` (else its text without tags), whitespace and line
    breaks are collapsed, and a longer text is cut with "…"."""
    import html
    import re

    s = str(text)
    if re.search(r"<\s*(!doctype|html|head|body|title|h1|p|div|pre|center)\b", s, re.I):
        title = re.search(r"<title[^>]*>(.*?)</title\s*>", s, re.I | re.S)
        if title:  # keep what precedes the page (e.g. "HTTP 502: ") and the page's title
            s = s[: s.find("<")] + title.group(1)
        else:
            s = re.sub(r"(?is)<(script|style)\b.*?</\1\s*>", " ", s)
            s = re.sub(r"<[^>]*>", " ", s)
        s = html.unescape(s)
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: max(1, limit - 1)].rstrip() + "…"


def timeout_text(phase: str, url: str, elapsed_s: float, timeout_s: float, phase_limit_s: float) -> str:
    """What timed out, after how many seconds, and where (one request of :func:`stream_request`; ``url`` is
    already redacted)."""
    if phase == "connect":
        return f"timeout: could not connect to {url} within {phase_limit_s:g} s"
    if elapsed_s >= timeout_s * 0.99:
        state = " (no response received)" if phase == "headers" else ""
        return f"timeout: request to {url} exceeded {timeout_s:g} s (total timeout){state}"
    if phase == "headers":
        return (
            f"timeout: no response from {url} within {phase_limit_s:g} s (first-byte timeout; the server "
            "accepted the connection but sent nothing)"
        )
    return f"timeout: stream from {url} stalled (no data for {phase_limit_s:g} s)"
