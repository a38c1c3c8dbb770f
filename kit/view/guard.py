"""Local-only guards shared by the kit's web pages (``kit dashboard``'s Voilà, ``kit tour``'s page): which
``Host:`` and ``Origin:`` values name this machine. A page on another site that re-points its own name at
127.0.0.1 (DNS rebinding) sends its own name as Host and Origin, so a server that answers only local names refuses
it. Pure functions, no web framework imported.
"""

from __future__ import annotations

from urllib.parse import urlsplit

#: the host names (Host: header, Origin) the kit's pages answer; IP literals must be loopback too
LOCAL_HOSTNAMES = ("127.0.0.1", "localhost", "::1")


def host_is_local(host: str | None) -> bool:
    """Whether a ``Host:`` value (``name``, ``name:port``, ``[::1]:port``, ``::1``) is one of
    :data:`LOCAL_HOSTNAMES` (case-insensitive, a trailing dot ignored)."""
    h = (host or "").strip()
    if h.startswith("["):  # [v6]:port
        name, sep, port = h[1:].partition("]")
        port = port.removeprefix(":") if sep else "x"
    elif h.count(":") == 1:
        name, _, port = h.partition(":")
    else:  # a bare name or a bare IPv6 literal
        name, port = h, ""
    return (port == "" or port.isdigit()) and name.lower().rstrip(".") in LOCAL_HOSTNAMES


def origin_is_local(origin: str | None) -> bool:
    """Whether an ``Origin:`` is absent (a script) or a URL whose host is a local name."""
    if origin is None:
        return True
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return False
    return host_is_local(netloc)
