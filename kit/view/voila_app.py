"""The Voilà application ``kit dashboard`` runs (``python -m kit.view.voila_app NOTEBOOK ...``): Voilà's own
application with five guards a page that runs code on this machine needs.

- **Token.** Every page and kernel request needs the launch's token (``?token=...`` once, then Jupyter's login
  cookie); without it the page is refused with 403 (no login form), the kernel API and websocket with 403. The
  token comes in the environment variable ``JUPYTER_TOKEN`` (never on the command line, so never in ``ps`` or the
  log) and is removed from this process's environment before any kernel starts, so no kernel, sweep or results
  file sees it.
- **Local names only.** A request whose ``Host:`` is not one of :data:`kit.view.guard.LOCAL_HOSTNAMES` (with any
  port) is refused with 403 on every route, static files included; the kernel websocket also refuses an ``Origin:`` that
  is not a local name. A page on another site that re-points its own name at 127.0.0.1 (DNS rebinding) sends its
  own name as Host and Origin, so it is refused. ``/voila/files/`` (files beside the notebook, served without a
  token by Voilà) is not served at all.
- **Bounded work per message.** Voilà 0.5's websocket handler reads every binary message it sends as if it were in
  the v1 kernel protocol; a client that connects with the legacy protocol (no subprotocol) and opens the widget
  control channel gets the widget states as a legacy binary message, whose first 8 bytes then read as an offset
  count of ~10^17, and the handler builds that list: the server grows ~30-50 MB/s at 100 % CPU and serves nobody,
  for good (the client may even be gone). jupyter_server reads what a client sends the same way (one 24-byte v1
  frame saying 2^60 offsets wedged it). :class:`KitKernelWebsocketHandler` reads the header of either protocol
  with its bounds checked, and refuses a client's binary frame whose length fields do not fit it
  (:func:`frame_problem`) before jupyter_server reads it, closing that websocket.
- **No token in logs or kernels.** Beside the environment variable above, the token is scrubbed from each
  request's URI and query string before any handler reads them (:func:`forget_token`): tornado's log line of an
  uncaught exception and Voilà's page-kernel environment (``QUERY_STRING``, ``VOILA_REQUEST_URL``) read them.
- **No orphan.** The server stops (and shuts its kernels down) when the process that started it is gone, so a
  ``kit dashboard`` killed by any signal leaves nothing serving. Idle kernels of disconnected clients are culled
  by jupyter_server's culler (``--MappingKernelManager.cull_idle_timeout``, set by :mod:`kit.view.dashboard`).
"""

from __future__ import annotations

import json
import os
import re
import struct

from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import PeriodicCallback
from voila.app import Voila
from voila.static_file_handler import AllowListFileHandler
from voila.tornado.kernel_websocket_handler import VoilaKernelWebsocketHandler

from kit.view.guard import LOCAL_HOSTNAMES, host_is_local, origin_is_local

#: the v1 kernel websocket subprotocol (jupyter_server)
WS_V1 = "v1.kernel.websocket.jupyter.org"
#: seconds between checks that the starting process is still alive
PARENT_POLL_S = 1.0


def _json_header(data: bytes | str) -> dict | None:
    try:
        msg = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return msg if isinstance(msg, dict) else None


def v1_parts(b: bytes) -> list[bytes] | None:
    """The parts of a v1 kernel-protocol websocket message (``protocol`` = :data:`WS_V1`: an 8-byte little-endian
    offset count ``n``, ``n`` 8-byte offsets, then the parts: channel, header, parent_header, metadata, content,
    buffers...; each part runs from one offset to the next, the last offset is the message's end), or None when the
    count or an offset is out of bounds. The count is checked against the message's length before any offset is
    read, so the work is bounded by the message's size whatever the length fields say."""
    if len(b) < 8:
        return None
    n = int.from_bytes(b[:8], "little")
    if n < 2 or 8 * (n + 1) > len(b):
        return None
    offsets = [int.from_bytes(b[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(n)]
    if offsets[0] < 8 * (n + 1) or offsets[-1] > len(b) or any(a > z for a, z in zip(offsets, offsets[1:])):
        return None
    return [b[a:z] for a, z in zip(offsets, offsets[1:])]


def legacy_parts(b: bytes) -> list[bytes] | None:
    """The parts of a legacy binary kernel websocket message (a 4-byte big-endian part count, 4-byte big-endian
    offsets, the first part the JSON message without buffers, each part to the next offset, the last to the end),
    or None when the count or an offset is out of bounds (bounded by the message's size, as :func:`v1_parts`)."""
    if len(b) < 4:
        return None
    n = struct.unpack("!i", b[:4])[0]  # signed, as jupyter_server reads it
    if n < 1 or 4 * (n + 1) > len(b):
        return None
    offsets = [*struct.unpack(f"!{n}I", b[4 : 4 * (n + 1)]), len(b)]
    if offsets[0] < 4 * (n + 1) or any(a > z for a, z in zip(offsets, offsets[1:])):
        return None
    return [b[a:z] for a, z in zip(offsets, offsets[1:])]


def message_header(message, protocol: str | None) -> dict | None:
    """The Jupyter message header of a websocket message, or None when it cannot be read.

    ``message``: a dict (already unpacked), a str (legacy JSON text) or bytes: the v1 format (``protocol`` =
    :data:`WS_V1`, :func:`v1_parts`) or the legacy binary format (:func:`legacy_parts`). Every count and offset is
    checked against the message's length before use, so the work is bounded by the message's size.
    """
    if isinstance(message, dict):
        return message.get("header")
    if isinstance(message, str):
        msg = _json_header(message)
        return msg.get("header") if msg else None
    if not isinstance(message, (bytes, bytearray, memoryview)):
        return None
    b = bytes(message)
    if protocol == WS_V1:
        parts = v1_parts(b)
        return _json_header(parts[1]) if parts and len(parts) >= 2 else None
    parts = legacy_parts(b)
    msg = _json_header(parts[0]) if parts else None
    return msg.get("header") if msg else None


def frame_problem(message, protocol: str | None) -> str | None:
    """Why a message a client sent on the kernel websocket cannot be read in bounded work, or None when it can.

    jupyter_server reads a v1 binary message's offset count and builds that many offsets before checking any
    against the message (a 24-byte frame saying 2^60 grows the server for good), and a legacy binary message's part
    count into a format string of that many characters; :class:`KitKernelWebsocketHandler` refuses such a frame
    first. A v1 message needs its channel and the four message parts (header, parent_header, metadata, content).
    Text frames (JSON) are bounded by their size and left to the server."""
    if not isinstance(message, (bytes, bytearray, memoryview)):
        return None
    b = bytes(message)
    if protocol == WS_V1:
        parts = v1_parts(b)
        if parts is None or len(parts) < 5:
            return f"a {len(b)}-byte v1 frame whose offsets do not fit it (or fewer than 5 parts)"
        return None
    if legacy_parts(b) is None:
        return f"a {len(b)}-byte legacy binary frame whose part count or offsets do not fit it"
    return None


class KitKernelWebsocketHandler(VoilaKernelWebsocketHandler):
    """Voilà's kernel websocket with a bounded header reader (still dropping ``execute_input``, so no source
    leaks) and an Origin allow-list of local names."""

    def check_origin(self, origin: str | None = None) -> bool:  # noqa: D102 - tornado hook
        if not origin_is_local(origin if origin is not None else self.get_origin()):
            self.log.warning("Blocking kernel websocket from a non-local Origin %r", origin)
            return False
        return super().check_origin(origin)

    def write_message(self, message, binary: bool = False):  # noqa: D102 - tornado hook
        if self.ws_connection is None or self.ws_connection.is_closing():  # closed (e.g. a refused frame): dropped
            return None
        header = message_header(message, self.selected_subprotocol)
        if header and header.get("msg_type") == "execute_input":
            return None
        return super(VoilaKernelWebsocketHandler, self).write_message(message, binary)

    def on_message(self, message):  # noqa: D102 - tornado hook
        why = frame_problem(message, self.selected_subprotocol)
        if why is not None:  # never handed to jupyter_server's reader; the client is told why and dropped
            self.log.warning("Closing kernel websocket %s: refused %s", self._request_summary(), why)
            self.close(1007, "malformed kernel message framing")
            return None
        return super().on_message(message)


#: a token in a query string (``token=...``, also ``auth=``/``key=``), for scrubbing log lines
_SECRET_PARAM = re.compile(r"(?i)([?&](?:token|auth|key)=)[^&#]*")


def scrub_uri(uri: str) -> str:
    """``uri`` with the value of a ``token``/``auth``/``key`` query parameter replaced by ``[secret]``."""
    return _SECRET_PARAM.sub(r"\1[secret]", uri)


def forget_token(request) -> None:
    """Scrub the token from a tornado request's ``uri`` and ``query`` (:func:`scrub_uri`), in place.

    What reads those strings after the request is parsed would carry the token on: tornado's log line of an
    uncaught exception (the request's repr), Voilà's page-kernel environment (``QUERY_STRING``,
    ``VOILA_REQUEST_URL``). The login reads the parsed arguments (``request.arguments``), which are kept."""
    request.uri = scrub_uri(request.uri or "")
    request.query = scrub_uri("?" + (request.query or ""))[1:]


class _Guard:
    """Mixin for every handler: the token scrubbed from the request's strings before anything reads them
    (:func:`forget_token`), 403 for a non-local Host (before the handler's own prepare), 403 instead of a login form
    for a request without the token, and log lines with the token scrubbed."""

    def prepare(self, *args, **kwargs):
        forget_token(self.request)
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
