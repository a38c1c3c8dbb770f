"""The Voilà application ``kit dashboard`` runs (``python -m kit.view.voila_app NOTEBOOK ...``): Voilà's own
application with four guards a page that runs code on this machine needs.

- **Token.** Every page and kernel request needs the launch's token (``?token=...`` once, then Jupyter's login
  cookie); without it the page is refused with 403 (no login form), the kernel API and websocket with 403. The
  token comes in the environment variable ``JUPYTER_TOKEN`` (never on the command line, so never in ``ps`` or the
  log) and is removed from this process's environment before any kernel starts, so no kernel, sweep or results
  file sees it.
- **Local names only.** A request whose ``Host:`` is not one of :data:`LOCAL_HOSTNAMES` (with any port) is
  refused with 403 on every route, static files included; the kernel websocket also refuses an ``Origin:`` that
  is not a local name. A page on another site that re-points its own name at 127.0.0.1 (DNS rebinding) sends its
  own name as Host and Origin, so it is refused. ``/voila/files/`` (files beside the notebook, served without a
  token by Voilà) is not served at all.
- **Bounded work per message.** Voilà 0.5's websocket handler reads every binary message it sends as if it were in
  the v1 kernel protocol; a client that connects with the legacy protocol (no subprotocol) and opens the widget
  control channel gets the widget states as a legacy binary message, whose first 8 bytes then read as an offset
  count of ~10^17, and the handler builds that list: the server grows ~30-50 MB/s at 100 % CPU and serves nobody,
  for good (the client may even be gone). :class:`KitKernelWebsocketHandler` reads the header of either protocol
  with its bounds checked.
- **No orphan.** The server stops (and shuts its kernels down) when the process that started it is gone, so a
  ``kit dashboard`` killed by any signal leaves nothing serving. Idle kernels of disconnected clients are culled
  by jupyter_server's culler (``--MappingKernelManager.cull_idle_timeout``, set by :mod:`kit.view.dashboard`).
"""

from __future__ import annotations

import json
import os
import re
import struct
from urllib.parse import urlsplit

from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import PeriodicCallback
from voila.app import Voila
from voila.static_file_handler import AllowListFileHandler
from voila.tornado.kernel_websocket_handler import VoilaKernelWebsocketHandler

#: the host names (Host: header, websocket Origin) the dashboard answers; IP literals must be loopback too
LOCAL_HOSTNAMES = ("127.0.0.1", "localhost", "::1")
#: the v1 kernel websocket subprotocol (jupyter_server)
WS_V1 = "v1.kernel.websocket.jupyter.org"
#: seconds between checks that the starting process is still alive
PARENT_POLL_S = 1.0


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
    """Whether a websocket ``Origin:`` is absent (a script) or a URL whose host is a local name."""
    if origin is None:
        return True
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return False
    return host_is_local(netloc)


def _json_header(data: bytes | str) -> dict | None:
    try:
        msg = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return msg if isinstance(msg, dict) else None


def message_header(message, protocol: str | None) -> dict | None:
    """The Jupyter message header of an outgoing websocket message, or None when it cannot be read.

    ``message``: a dict (already unpacked), a str (legacy JSON text) or bytes: the v1 format (``protocol`` =
    :data:`WS_V1`: 8-byte little-endian offset count, then the offsets) or the legacy binary format (4-byte
    big-endian part count, then 4-byte offsets, the first part the JSON message). Every count and offset is checked
    against the message's length before use, so the work is bounded by the message's size.
    """
    if isinstance(message, dict):
        return message.get("header")
    if isinstance(message, str):
        msg = _json_header(message)
        return msg.get("header") if msg else None
    if not isinstance(message, (bytes, bytearray, memoryview)):
        return None
    b = bytes(message)
    width, order, fmt = (8, "little", None) if protocol == WS_V1 else (4, "big", "!I")
    if len(b) < width:
        return None
    n = int.from_bytes(b[:width], order) if fmt is None else struct.unpack(fmt, b[:4])[0]
    if n < 2 or width * (n + 1) > len(b):
        return None
    offsets = [int.from_bytes(b[width * (i + 1) : width * (i + 2)], order) for i in range(n)]
    if protocol == WS_V1:  # parts: channel, header, parent_header, metadata, content, buffers...
        if n < 3 or not offsets[1] <= offsets[2] <= len(b):
            return None
        return _json_header(b[offsets[1] : offsets[2]])
    if not offsets[0] <= offsets[1] <= len(b):  # legacy: the first part is the whole message without buffers
        return None
    msg = _json_header(b[offsets[0] : offsets[1]])
    return msg.get("header") if msg else None


class KitKernelWebsocketHandler(VoilaKernelWebsocketHandler):
    """Voilà's kernel websocket with a bounded header reader (still dropping ``execute_input``, so no source
    leaks) and an Origin allow-list of local names."""

    def check_origin(self, origin: str | None = None) -> bool:  # noqa: D102 - tornado hook
        if not origin_is_local(origin if origin is not None else self.get_origin()):
            self.log.warning("Blocking kernel websocket from a non-local Origin %r", origin)
            return False
        return super().check_origin(origin)

    def write_message(self, message, binary: bool = False):  # noqa: D102 - tornado hook
        header = message_header(message, self.selected_subprotocol)
        if header and header.get("msg_type") == "execute_input":
            return None
        return super(VoilaKernelWebsocketHandler, self).write_message(message, binary)


#: a token in a query string (``token=...``, also ``auth=``/``key=``), for scrubbing log lines
_SECRET_PARAM = re.compile(r"(?i)([?&](?:token|auth|key)=)[^&#]*")


def scrub_uri(uri: str) -> str:
    """``uri`` with the value of a ``token``/``auth``/``key`` query parameter replaced by ``[secret]``."""
    return _SECRET_PARAM.sub(r"\1[secret]", uri)


class _Guard:
    """Mixin for every handler: 403 for a non-local Host (before the handler's own prepare), 403 instead of a
    login form for a request without the token, and log lines with the token scrubbed."""

    def prepare(self, *args, **kwargs):
        if not host_is_local(self.request.host):
            self.current_user = self._jupyter_current_user = None  # what jupyter_server's error page reads
            raise web.HTTPError(403, f"refused: Host {self.request.host!r} is not a local name")
        return super().prepare(*args, **kwargs)

    def get_login_url(self) -> str:
        raise web.HTTPError(403, "this dashboard needs the token printed by `kit dashboard` (?token=...)")

    def _request_summary(self) -> str:  # tornado's access-log and error-log line
        return f"{self.request.method} {scrub_uri(self.request.uri or '')} ({self.request.remote_ip})"


def _guarded(cls):
    if cls is VoilaKernelWebsocketHandler:
        cls = KitKernelWebsocketHandler
    return type(cls.__name__, (_Guard, cls), {})


class KitVoila(Voila):
    """Voilà with the guards of this module (see the module docstring)."""

    def init_settings(self) -> dict:  # noqa: D102 - Voilà hook
        settings = super().init_settings()
        if not self.identity_provider.token:  # read from JUPYTER_TOKEN (a traitlet default: read on first use)
            raise SystemExit("kit dashboard: no token (JUPYTER_TOKEN is empty); refusing to serve without one")
        os.environ.pop("JUPYTER_TOKEN", None)  # kernels start later, without it
        settings.update(allow_remote_access=False, local_hostnames=list(LOCAL_HOSTNAMES))
        return settings

    def init_handlers(self) -> list:  # noqa: D102 - Voilà hook
        dropped = {url_path_join(self.server_url, p) for p in ("/login", "/logout")}  # no form to guess tokens in
        return [
            (h[0], _guarded(h[1]), *h[2:])
            for h in super().init_handlers()
            if h[1] is not AllowListFileHandler and h[0] not in dropped
        ]

    def listen(self):  # noqa: D102 - Voilà hook
        parent = os.getppid()

        def check_parent():
            if os.getppid() != parent:
                self.log.warning("the process that started this dashboard is gone; stopping")
                self.ioloop.stop()

        PeriodicCallback(check_parent, PARENT_POLL_S * 1000).start()
        super().listen()


if __name__ == "__main__":
    KitVoila.launch_instance()
