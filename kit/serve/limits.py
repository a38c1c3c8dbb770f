"""The allowed range of every served-load setting, checked before any network work (``LoadConfig.validate``).

Every numeric setting is finite or has its limit handled explicitly: ``request_rate = inf`` sends all at once,
``burstiness = inf`` gives arrival gaps of exactly 1/rate (the Gamma gaps' variance 1/(rate²·b) → 0); anything
else that is NaN, infinite, negative, zero where it must be positive, fractional where a count is meant, or too
large to build (prompts of ``isl`` tokens that would not fit in memory) is a :class:`kit.errors.UserError` naming
the setting, its value and what is allowed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass
from numbers import Integral, Real
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kit.errors import UserError

if TYPE_CHECKING:  # the type only: kit.serve.load imports this module
    from kit.serve.load import LoadConfig

#: at most this many requests in flight (a TCP connection each)
MAX_CONCURRENCY = 65_536
#: at most this many prompt tokens built for one point's workload (distinct prompts × ISL): ~1 GB as Python ints
MAX_WORKLOAD_TOKENS = 2**24
#: distinct prompts a point builds at most (later requests reuse them round-robin)
MAX_DISTINCT_PROMPTS = 1024
#: longest output asked for (max_tokens) and most requests per point
MAX_OSL = 10_000_000
MAX_REQUESTS = 100_000_000
#: longest a load point's sends may be planned to take (7 days, s): past it a typo (a rate of 1e-9) would never end
MAX_PLAN_S = 7 * 86_400.0
#: the served modes' settings (a value past them would run for days or never end)
MAX_TURNS = 1000
MAX_THINK_TIME_S = 3600.0
MAX_TIME_SCALE = 1000.0


def json_object_arg(text: str) -> dict:
    """argparse ``type=`` of ``--extra-body``: a JSON object (argparse names the option in the message)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} must be a JSON object")
    return value


@dataclass(frozen=True)
class NumberRule:
    """What a number may be (:func:`check_number`).

    Attributes:
        lo, hi: inclusive bounds (``lo_open``: ``lo`` itself is not allowed); None: unbounded on that side.
        integer: a whole number (a bool is not one; a float like 4.0 is taken as 4).
        allow_inf: ``+inf`` is allowed (its meaning given in ``meaning``).
        allow_none: None is allowed (e.g. "no limit").
        meaning: a few words on the value (its unit, what inf or None mean), shown in the message.
    """

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    integer: bool = False
    allow_inf: bool = False
    allow_none: bool = False
    meaning: str = ""

    def allowed(self) -> str:
        """What is allowed, in words: ``"an integer >= 1 and <= 4,096, or None (...)"``."""
        text = "an integer" if self.integer else "a number" if self.allow_inf else "a finite number"
        if self.lo is not None:
            text += f" > {self.lo:g}" if self.lo_open else f" >= {self.lo:g}"
        text += f" and <= {self.hi:,}" if self.hi is not None else ""
        text += (", or inf" if self.allow_inf else "") + (", or None" if self.allow_none else "")
        return text + (f" ({self.meaning})" if self.meaning else "")

    def breaks(self, value) -> bool:
        """True when ``value`` (not None) is not allowed."""
        if isinstance(value, bool) or not isinstance(value, Integral if self.integer else (Integral, Real)):
            return not (self.integer and isinstance(value, float) and value.is_integer())
        v = float(value)
        if math.isnan(v) or (math.isinf(v) and not (self.allow_inf and v > 0)):
            return True
        if math.isinf(v):
            return False
        return (self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo)) or (
            self.hi is not None and v > self.hi
        )


def check_number(name: str, value, **rule):
    """``value`` if it is a number the rule allows (an integral float as an int when ``integer``), else
    :class:`kit.errors.UserError` naming ``name``, the value and what is allowed.

    Args:
        rule: :class:`NumberRule`'s fields (``lo``, ``hi``, ``lo_open``, ``integer``, ``allow_inf``,
            ``allow_none``, ``meaning``).

    Raises:
        UserError: the value is not allowed. TypeError: an unknown rule name.
    """
    r = NumberRule(**rule)
    if value is None and r.allow_none:
        return None
    if value is None or r.breaks(value):
        raise UserError(f"{name}={value!r}; must be {r.allowed()}")
    return int(value) if r.integer and isinstance(value, float) else value


def check_load_config(cfg: LoadConfig, endpoints) -> None:
    """Check every field of a :class:`kit.serve.load.LoadConfig`; see the module docstring.

    Raises:
        UserError: naming the first bad field, its value and what is allowed.
    """
    if cfg.api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(cfg.api_key_env)):
        raise UserError(
            f"api_key_env={cfg.api_key_env!r}: the name of an environment variable (letters, digits, _), e.g. "
            "OPENAI_API_KEY; '' for no key"
        )
    if cfg.endpoint not in endpoints:
        raise UserError(f"endpoint={cfg.endpoint!r}; allowed: {sorted(endpoints)}")
    check_url(cfg.url)
    if cfg.model is not None and (not isinstance(cfg.model, str) or not cfg.model.strip()):
        raise UserError(f"model={cfg.model!r}; give a model id, or None to use the first of /v1/models")
    check_number("max_concurrency", cfg.max_concurrency, lo=1, hi=MAX_CONCURRENCY, integer=True, allow_none=True)
    check_number(
        "request_rate", cfg.request_rate, lo=0, lo_open=True, allow_inf=True, meaning="req/s; inf = all at once"
    )
    check_number(
        "burstiness", cfg.burstiness, lo=0, lo_open=True, allow_inf=True, meaning="1 = Poisson; inf = evenly spaced"
    )
    check_number("seed", cfg.seed, lo=0, hi=2**63 - 1, integer=True, allow_none=True, meaning="None: a new one")
    if cfg.num_requests is None and cfg.duration_s is None:
        raise UserError("give num_requests or duration_s (or both)")
    check_number("num_requests", cfg.num_requests, lo=1, hi=MAX_REQUESTS, integer=True, allow_none=True)
    check_number("duration_s", cfg.duration_s, lo=0, lo_open=True, allow_none=True, meaning="s")
    if cfg.num_requests is not None and math.isfinite(cfg.request_rate):
        days = cfg.num_requests / cfg.request_rate / 86_400
        if days > MAX_PLAN_S / 86_400:
            raise UserError(
                f"request_rate={cfg.request_rate!r} for num_requests={cfg.num_requests}: the sends would take "
                f"{days:.1f} days (at most {MAX_PLAN_S / 86_400:g}); raise the rate or lower the count"
            )
    check_number("warmup_requests", cfg.warmup_requests, lo=0, hi=MAX_REQUESTS, integer=True)
    check_number("isl", cfg.isl, lo=1, hi=MAX_WORKLOAD_TOKENS, integer=True, meaning="input tokens")
    check_number("osl", cfg.osl, lo=1, hi=MAX_OSL, integer=True, meaning="output tokens")
    for name in ("isl_range", "osl_range"):
        v = check_number(name, getattr(cfg, name), lo=0)
        if v >= 1:
            raise UserError(f"{name}={v!r}; must be in [0, 1)")
    for name in ("timeout_s", "stall_timeout_s", "models_timeout_s", "first_byte_timeout_s"):
        check_number(name, getattr(cfg, name), lo=0, lo_open=True, meaning="s")
    for name in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2el_ms"):
        check_number(name, getattr(cfg, name), lo=0, lo_open=True, allow_none=True, meaning="ms; None = no SLO")
    check_number("temperature", cfg.temperature, lo=0)
    check_number("max_event_bytes", cfg.max_event_bytes, lo=1024, hi=2**30, integer=True, meaning="bytes")
    check_number("power_period_ms", cfg.power_period_ms, lo=0, lo_open=True, meaning="ms")
    check_number("usd_per_kwh", cfg.usd_per_kwh, lo=0, allow_none=True, meaning="$/kWh")
    for name in ("ignore_eos", "continuous_usage", "server_metrics"):
        if not isinstance(getattr(cfg, name), bool):
            raise UserError(f"{name}={getattr(cfg, name)!r}; must be True or False")
    if not isinstance(cfg.extra_body, dict):
        raise UserError(f"extra_body={cfg.extra_body!r} must be a dict (a JSON object)")
    distinct = min(int(cfg.num_requests or 256) + int(cfg.warmup_requests), MAX_DISTINCT_PROMPTS)
    tokens = distinct * math.ceil(cfg.isl * (1 + cfg.isl_range))
    if tokens > MAX_WORKLOAD_TOKENS:
        raise UserError(
            f"isl={cfg.isl}: {distinct} distinct prompts of up to {math.ceil(cfg.isl * (1 + cfg.isl_range)):,} "
            f"tokens are {tokens:,} prompt tokens to build, more than the {MAX_WORKLOAD_TOKENS:,} allowed; use a "
            "smaller --isl or fewer --num-requests/--warmup"
        )


def check_url(url) -> None:
    """A server base URL: ``http://`` or ``https://`` with a host (the message shows it redacted).

    Raises:
        UserError: anything else.
    """
    from kit.serve.redact import redact_url

    ok = isinstance(url, str) and url.startswith(("http://", "https://"))
    if ok and any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):  # a line break would end a request line
        raise UserError(f"url={redact_url(url)!r} holds a space, line break or control character; percent-encode it")
    try:
        parts = urlsplit(url) if ok else None
        ok = ok and bool(parts.hostname)
        port = parts.port if ok else None  # urllib raises for a port out of 0-65535 or not a number
    except ValueError as e:  # urllib: "Port out of range 0-65535", "Port could not be cast ...", a bad IPv6 host
        ok, port = "port" in str(e).lower(), 0
    if ok and port == 0:
        raise UserError(f"url={redact_url(url)!r}: its port must be an integer in 1-65535")
    if not ok:
        raise UserError(
            f"url={redact_url(str(url))!r} must be http:// or https:// with a host, e.g. http://127.0.0.1:8000"
        )
