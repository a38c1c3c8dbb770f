"""The playground's request (``POST /api/generate``): its fields, their ranges, the check that refuses a bad one
before any work (:func:`check_generate`), and strict JSON for what goes back to the page (:func:`dumps`)."""

from __future__ import annotations

import json
import math

from kit.errors import UserError
from kit.tour.context import json_ready
from kit.tour.generate import check_request

#: where the playground's tokens come from
#: seconds of silence after which an endpoint's stream is called stalled (the page can set it per request)
DEFAULT_STALL_S = 30.0
SOURCES = ("in-process", "url", "sim", "launch")
#: the engines a playground launch can start
LAUNCH_SERVERS = ("vllm", "sglang", "transformers")
#: the stall timeout's range (s), as the page's field
STALL_RANGE = (1.0, 600.0)
#: the fields ``POST /api/generate`` takes
GENERATE_FIELDS = ("prompt", "source", "model", "dtype", "url", "server", "max_tokens", "stall_s")


def dumps(obj) -> str:
    """``obj`` as strict JSON: every non-finite number None (:func:`kit.tour.context.json_ready`)."""
    return json.dumps(json_ready(obj), allow_nan=False)


def json_response(obj, status: int = 200):
    """An aiohttp response of ``obj`` as strict JSON (:func:`dumps`)."""
    from aiohttp import web

    return web.Response(text=dumps(obj), status=status, content_type="application/json")


async def read_json(request) -> object:
    """The JSON body of an aiohttp ``request``.

    Raises:
        UserError: the body is not JSON (the message says where it broke).
    """
    try:
        return await request.json()
    except ValueError as e:
        raise UserError(f"the request body is not JSON ({e})") from None


def check_generate(req) -> dict:
    """The playground's request, validated before any work: a JSON object with only :data:`GENERATE_FIELDS`;
    returns it with ``max_tokens`` an int and ``stall_s`` a float (s).

    Raises:
        UserError: not an object, an unknown field, a non-text prompt/model/url, ``source`` not in :data:`SOURCES`,
            ``server`` not in :data:`LAUNCH_SERVERS`, ``max_tokens`` not an integer in 1..4096, ``stall_s`` not a
            number in :data:`STALL_RANGE`; the prompt checks of :func:`kit.tour.generate.check_request`.
    """
    if not isinstance(req, dict):
        raise UserError("send the request as a JSON object")
    bad = sorted(set(req) - set(GENERATE_FIELDS))
    if bad:
        raise UserError(f"unknown field(s) {bad}; the request takes {', '.join(GENERATE_FIELDS)}")
    out = dict(req)
    for name in ("prompt", "model", "dtype", "url", "server", "source"):
        if out.get(name) is not None and not isinstance(out[name], str):
            raise UserError(f"{name}={out[name]!r}: give text")
    mt = out.get("max_tokens", 48)
    if isinstance(mt, str) and mt.strip().isdigit():
        mt = int(mt)
    if isinstance(mt, float) and mt.is_integer():
        mt = int(mt)
    check_request(out.get("prompt", ""), mt)
    out["max_tokens"] = mt
    source = out.get("source") or "in-process"
    if source not in SOURCES:
        raise UserError(f"source {source!r}: choose one of {', '.join(SOURCES)}")
    out["source"] = source
    server = out.get("server") or "vllm"
    if server not in LAUNCH_SERVERS:
        raise UserError(f"server {server!r}: choose one of {', '.join(LAUNCH_SERVERS)}")
    out["server"] = server
    stall = out.get("stall_s")
    lo, hi = STALL_RANGE
    if stall is None or stall == "":
        stall = DEFAULT_STALL_S
    number = isinstance(stall, (int, float)) and not isinstance(stall, bool) and math.isfinite(stall)
    if not number or not lo <= stall <= hi:
        raise UserError(f"stall_s={stall!r}: give a number of seconds from {lo:g} to {hi:g}")
    out["stall_s"] = float(stall)
    return out
