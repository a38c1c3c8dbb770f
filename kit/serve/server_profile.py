"""Served profiling: ``kit serve-bench --server-profile`` asks the server to profile exactly the measured point.

vLLM and SGLang expose ``POST /start_profile`` and ``POST /stop_profile`` (the torch profiler inside the engine;
the trace is written by the server, on the server's machine). Around each measured point (its warm-up requests
included: they are part of the point's schedule) the kit posts ``/start_profile`` before the first request and
``/stop_profile`` after the last one finished, and records in the row:

- ``x_server_profiled`` (True: the profile was taken; False: asked, not taken), ``x_server_profile`` (what
  happened, in words), ``x_server_profile_dir`` (with ``--launch``: the folder the kit asked the server to write
  to; with ``--url``: the folder ``--server-profile-dir`` names, where the user says the server writes) and
  ``x_server_profile_files`` (the trace files that appeared there during the point, when that folder is on this
  machine).

The endpoints do not say where the trace went: for a server started by someone else (``--url``) the kit cannot know
the server's directory unless the server reports it in its ``/stop_profile`` answer (quoted in the row), so
``--server-profile-dir`` is recorded as the user's word, and the row says when nothing appeared there or the folder
is not on this machine.

The server-side setting each needs (sources: vLLM docs "Profiling vLLM" and ``vllm.config.profiler``; SGLang docs
"Benchmark and Profiling"):

- **vLLM >= 0.13**: ``--profiler-config '{"profiler": "torch", "torch_profiler_dir": "/abs/dir"}'``; before that
  the environment variable ``VLLM_TORCH_PROFILER_DIR``. Without it the endpoints are not registered (HTTP 404):
  the row then says the server was not started with profiling enabled.
- **SGLang**: ``SGLANG_TORCH_PROFILER_DIR`` (the folder; ``/tmp`` when unset): the endpoints are always there.
- **transformers serve** has no profile endpoints.

With ``--launch`` the kit adds the setting itself (:func:`launch_setting`), pointing it at
``OUT/servers/<config>/profile``. A profiled point's timings include the profiler's cost on the server: its rows
carry ``x_server_profiled`` and their point ids differ from unprofiled ones, so a resumed sweep never mixes them.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

from kit.serve.redact import endpoint_url, redact_url

#: the endpoints vLLM and SGLang serve for the torch profiler
START_PATH, STOP_PATH = "/start_profile", "/stop_profile"
#: seconds ``/stop_profile`` may take: the server flushes the trace to disk first (minutes for a large model)
STOP_TIMEOUT_S = 600.0
#: the first vLLM release that takes ``--profiler-config`` (earlier ones read ``VLLM_TORCH_PROFILER_DIR``)
VLLM_PROFILER_CONFIG_SINCE = (0, 13)
#: what a server not started with profiling enabled answers, and what to do about it
NOT_ENABLED = (
    "the server was not started with profiling enabled ({why}): start vLLM with --profiler-config "
    '\'{{"profiler": "torch", "torch_profiler_dir": "/abs/dir"}}\' (vLLM >= 0.13; VLLM_TORCH_PROFILER_DIR before), '
    "SGLang with SGLANG_TORCH_PROFILER_DIR set; or let the kit start it (--launch) with --server-profile"
)


def _version(text: str | None) -> tuple[int, ...] | None:
    m = re.match(r"(\d+)\.(\d+)", str(text or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def launch_setting(server: str, profile_dir: str | Path, engine_version: str | None = None) -> dict:
    """What a launched server needs so ``/start_profile`` works and writes into ``profile_dir``:
    ``{"args": [...], "env": {...}, "note": str, "supported": bool}``.

    vLLM: ``--profiler-config`` JSON (version >= 0.13, or unknown: the current flag), else
    ``VLLM_TORCH_PROFILER_DIR``; SGLang: ``SGLANG_TORCH_PROFILER_DIR``; transformers: none (``supported`` False).
    ``profile_dir`` is made absolute (vLLM requires it).
    """
    d = str(Path(profile_dir).resolve())
    if server == "vllm":
        v = _version(engine_version)
        if v is not None and v < VLLM_PROFILER_CONFIG_SINCE:
            return {"args": [], "env": {"VLLM_TORCH_PROFILER_DIR": d}, "supported": True,
                    "note": f"VLLM_TORCH_PROFILER_DIR={d} (vLLM {engine_version})"}  # fmt: skip
        cfg = json.dumps({"profiler": "torch", "torch_profiler_dir": d})
        return {"args": ["--profiler-config", cfg], "env": {}, "supported": True, "note": f"--profiler-config {cfg}"}
    if server == "sglang":
        return {"args": [], "env": {"SGLANG_TORCH_PROFILER_DIR": d}, "supported": True,
                "note": f"SGLANG_TORCH_PROFILER_DIR={d}"}  # fmt: skip
    return {"args": [], "env": {}, "supported": False, "note": f"{server} serve has no /start_profile endpoint"}


def _post(url: str, headers: dict, timeout_s: float, body: dict | None = None) -> tuple[int, str]:
    """``(HTTP status, body text)`` of a POST; status 0 with the reason when nothing answered."""
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - the server the user named
            return r.status, r.read(4000).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(2000).decode("utf-8", "replace") if e.fp else ""
    except (urllib.error.URLError, OSError) as e:
        return 0, str(getattr(e, "reason", e))


class ServerProfile:
    """One point's server-side profile: :meth:`start` before its first request, :meth:`stop` after its last.

    Args:
        url: the server's base URL.
        headers: HTTP headers (the API key, :func:`kit.serve.client.auth_headers`).
        trace_dir: where the server writes traces, when known (a launched server's, or ``--server-profile-dir``);
            the files that appear there during the point are listed when it is on this machine.
        launched: True when the kit started the server and told it ``trace_dir``; False when ``trace_dir`` is the
            user's word about a server the kit did not start.
        start_timeout_s, stop_timeout_s: limits of the two calls, s.
    """

    def __init__(self, url: str, headers: dict | None = None, trace_dir: str | Path | None = None,
                 start_timeout_s: float = 30.0, stop_timeout_s: float = STOP_TIMEOUT_S,
                 launched: bool = False):  # fmt: skip
        self.url, self.headers, self.launched = url, dict(headers or {}), launched
        self.trace_dir = Path(trace_dir) if trace_dir else None
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.started, self.start_error, self._before = False, None, set()

    def _files(self) -> set:
        if self.trace_dir is None or not self.trace_dir.is_dir():
            return set()
        return {p for p in self.trace_dir.rglob("*") if p.is_file()}

    def start(self) -> bool:
        """POST ``/start_profile``; True when the server accepted it (else :attr:`start_error` says why)."""
        self._before = self._files()
        status, text = _post(endpoint_url(self.url, START_PATH), self.headers, self.start_timeout_s)
        if status == 200:
            self.started = True
        elif status in (404, 405):
            self.start_error = NOT_ENABLED.format(why=f"POST {START_PATH} answered HTTP {status}")
        elif status == 0:
            self.start_error = f"POST {START_PATH} got no answer ({text[:200]})"
        else:
            self.start_error = f"POST {START_PATH} answered HTTP {status}: {text.strip()[:300]}"
        return self.started

    def stop(self) -> dict:
        """POST ``/stop_profile`` (when started) and return the row's ``x_server_profile*`` columns."""
        where = str(self.trace_dir) if self.trace_dir else None
        cols = {"x_server_profiled": False, "x_server_profile_dir": where, "x_server_profile_files": None}
        if not self.started:
            return cols | {"x_server_profile": f"not profiled: {self.start_error}"}
        status, text = _post(endpoint_url(self.url, STOP_PATH), self.headers, self.stop_timeout_s)
        if status != 200:
            why = "no answer" if status == 0 else f"HTTP {status}"
            return cols | {"x_server_profile": f"not profiled: POST {STOP_PATH} {why}: {text.strip()[:300]}"}
        new = sorted(str(p) for p in self._files() - self._before)
        said = self._where(where, new)
        reply = text.strip()
        if reply and reply not in ("{}", "null", '""'):
            said += f"; server said: {reply[:200]}"
        return cols | {"x_server_profiled": True, "x_server_profile": said, "x_server_profile_files": json.dumps(new)}

    def _where(self, where: str | None, new: list) -> str:
        """Where the trace went, in words, saying whose word the folder is."""
        files = f"{len(new)} new file{'s' if len(new) > 1 else ''}"
        if where is None:
            return (
                "profiled; the trace is on the server at its profiler directory (vLLM's torch_profiler_dir / "
                "VLLM_TORCH_PROFILER_DIR, SGLang's SGLANG_TORCH_PROFILER_DIR): the kit cannot know it unless the "
                "server reports it; give --server-profile-dir to record where it is"
            )
        if self.launched:
            if new:
                return f"trace written by the server to {where} ({files}), the folder the kit (--launch) told it"
            return (
                f"profiled; the kit (--launch) told the server to write its trace under {where}; no new file there "
                "yet (it may still flush)"
            )
        if new:
            return f"trace written by the server to {where} ({files} appeared there during the point)"
        if self.trace_dir is not None and not self.trace_dir.is_dir():
            return (
                f"profiled; {where} (--server-profile-dir) does not exist on this machine, so no file is listed: "
                "the kit cannot know the server's directory unless the server reports it (a remote server's folder "
                "is on its machine)"
            )
        return (
            f"profiled; no new file appeared in {where} (--server-profile-dir, where you said the server writes): "
            "the kit cannot know the server's directory unless the server reports it; check the server's "
            "torch_profiler_dir / SGLANG_TORCH_PROFILER_DIR"
        )

    def __repr__(self) -> str:
        return f"ServerProfile({redact_url(self.url)!r}, trace_dir={self.trace_dir!r})"
