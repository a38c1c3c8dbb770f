"""Secrets never leave the client: a URL as the kit writes or prints it (no user name or password, no token in
its query string), and the scrubbing of every text the kit keeps (error messages, detail files, printed lines).

Results are made to be shared (CI artefacts, compare views), so a row, a log line or an error message must not
carry a password, an API key or a token. :func:`redact_url` is the form of a URL everywhere the kit shows one;
:func:`secrets_of` collects the secret strings of a run (the URL's password and user, the values of sensitive
query parameters, the API key from the environment); :func:`scrub` replaces them in any text.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

#: what a secret is replaced with
MASK = "***"
#: query parameters whose values are secrets (case-insensitive substring of the name)
SENSITIVE_QUERY = re.compile(r"key|token|secret|passw|pwd|auth|sig|credential|session|code|jwt|bearer", re.I)


def _split(url: str):
    try:
        return urlsplit(str(url))
    except ValueError:  # e.g. an invalid IPv6 literal: nothing is shown of it but its scheme
        return None


def redact_url(url: str) -> str:
    """``url`` without credentials: ``http://user:pw@host:8000/v1?token=abc&x=1`` → ``http://***@host:8000/v1?
    token=***&x=1`` (the user name is masked too; values of query parameters named like a key, token, secret,
    password, signature ... are masked; :data:`SENSITIVE_QUERY`). A URL that cannot be parsed is shown as it is
    when it has no user info, query or fragment (no place for a secret the parsed form would mask: so a typo
    such as ``http://[::1`` stays visible), else as ``<scheme>://***``."""
    parts = _split(url)
    if parts is None:
        if not any(c in str(url) for c in "@?#"):
            return str(url)
        return f"{str(url).split(':', 1)[0]}://{MASK}"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if SENSITIVE_QUERY.search(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def secrets_of(url: str, api_key_env: str | None = None) -> list[str]:
    """The secret strings of a run: the URL's password and user name (raw and percent-decoded) and their HTTP
    Basic form (base64 of ``user:password``, as a server that echoes the Authorization header writes it back), the
    values of sensitive query parameters, and the API key held by the environment variable ``api_key_env``.
    Longest first (so a secret containing another is replaced whole); strings shorter than 3 characters are left
    out (masking them would mangle ordinary text)."""
    found: set[str] = set()
    parts = _split(url)
    if parts is not None:
        userinfo = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
        for s in (userinfo, *userinfo.split(":", 1)) if userinfo else ():
            found.update((s, unquote(s), quote(unquote(s), safe="")))
        if userinfo:
            user, _, password = userinfo.partition(":")
            for cred in (f"{user}:{password}", f"{unquote(user)}:{unquote(password)}"):
                found.add(base64.b64encode(cred.encode()).decode())
        for k, v in parse_qsl(parts.query, keep_blank_values=True):
            if SENSITIVE_QUERY.search(k):
                found.update((v, quote(v, safe=""), quote(v)))
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        found.add(key)
    return sorted((s for s in found if len(s) >= 3), key=len, reverse=True)


def scrub(text, secrets: Iterable[str]):
    """``text`` with every string of ``secrets`` replaced by :data:`MASK` (None and non-strings unchanged), and a
    secret cut by the text's end (its first 3 or more characters ending the text, e.g. an error body truncated on
    receipt) or by its start masked too. Scrub before cutting a text: a cut after scrubbing cannot uncover a secret.
    """
    if not isinstance(text, str):
        return text
    secrets = [s for s in secrets if s]
    for s in secrets:
        if s in text:
            text = text.replace(s, MASK)
    for s in secrets:
        for k in range(min(len(s), len(text)) - 1, 2, -1):  # longest cut piece first
            if text.endswith(s[:k]):
                text = text[:-k] + MASK
                break
            if text.startswith(s[-k:]):
                text = MASK + text[k:]
                break
    return text


def endpoint_url(base_url: str, path: str) -> str:
    """``base_url`` (scheme, host, port, any path prefix and query kept; a trailing ``/`` or ``/v1`` dropped)
    joined with an API ``path`` such as ``/v1/models``."""
    p = urlsplit(str(base_url))
    prefix = p.path.rstrip("/")
    prefix = prefix[:-3] if prefix.endswith("/v1") else prefix
    return urlunsplit((p.scheme, p.netloc, prefix + path, p.query, ""))
