"""The settings of one served load point (:class:`LoadConfig`): the server, the workload, the load, timeouts, SLOs.

:class:`LoadConfig` describes one load point against an OpenAI-compatible server; its fields are also
``kit serve-bench``'s options (one source of defaults and help). What is sent when is a schedule
(:mod:`kit.serve.schedule`: :meth:`kit.serve.schedule.Arrivals.from_config` makes the closed or open loop of a
config); the one request loop that sends it is :mod:`kit.serve.loop`; :func:`kit.serve.point.measure_point` turns
a point into one row of the shared results schema (``backend = "openai"``), so a concurrency sweep against vLLM,
SGLang or ``transformers serve`` plots beside an in-process sweep. Every formula comes from :mod:`kit.metrics`
(definitions in docs/metrics.md, "Served").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kit.cli import config_field
from kit.serve.client import DEFAULT_API_KEY_ENV, ENDPOINTS, StreamLimits, request_body, request_headers
from kit.serve.limits import check_load_config, json_object_arg
from kit.serve.redact import endpoint_url, redact_url, secrets_of
from kit.serve.sse import MAX_EVENT_BYTES
from kit.serve.workload import RequestInput


# ---------------------------------------------------------------- configuration
@dataclass
class LoadConfig:
    """One served load point: what to send, how fast, and how it is judged (a sweep varies ``max_concurrency``).

    Each field's help is also ``kit serve-bench``'s option (one source of defaults). The defaults are for a real
    server: the seed workload (1024 in / 400 out tokens), 64 measured requests after 2 warm-up ones, 600 s per
    request; tests and notebooks pass their small values explicitly. The API key is read from the environment
    variable ``api_key_env`` and never written to results or logs.
    """

    url: str = config_field(
        "", help="server base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)", cli=False
    )
    model: str | None = config_field(None, help="served model id (default: first of /v1/models)")
    endpoint: str = config_field(
        "completions",
        choices=tuple(sorted(ENDPOINTS)),
        help="API to call: " + ", ".join(f"{k}={v}" for k, v in sorted(ENDPOINTS.items())),
    )
    max_concurrency: int | None = config_field(
        1,
        cli=False,
        help="at most this many requests in flight (None: unbounded); a sweep sets it per point (--concurrency)",
    )
    request_rate: float = config_field(
        math.inf, help="requests/s offered, arrival gaps drawn with --burstiness (default inf: all at once)"
    )
    burstiness: float = config_field(1.0, help="Gamma shape b of the arrival gaps, Gamma(b, 1/(rate*b)); 1 = Poisson")
    seed: int | None = config_field(
        None,
        help="seed of prompts and arrival gaps (default: a new one per run, recorded in x_seed, so a re-run sends "
        "prompts no earlier run sent and a prefix cache cannot answer them; give one to repeat a run's prompts)",
    )
    num_requests: int | None = config_field(64, help="measured requests per concurrency point")
    duration_s: float | None = config_field(
        None,
        help="stop sending after this many seconds (in-flight requests finish; --num-requests still caps the count)",
    )
    warmup_requests: int = config_field(2, flag="--warmup", help="warm-up requests per point (excluded)")
    isl: int = config_field(1024, help="input tokens per request")
    osl: int = config_field(400, help="output tokens per request (max_tokens)")
    isl_range: float = config_field(0.0, help="draw each request's ISL uniformly in isl*(1±r), 0 <= r < 1")
    osl_range: float = config_field(0.0, help="draw each request's OSL uniformly in osl*(1±r), 0 <= r < 1")
    ignore_eos: bool = config_field(
        False,
        help="ask the server to ignore EOS (vLLM, SGLang); an output length "
        "other than max_tokens is flagged either way",
    )
    timeout_s: float = config_field(600.0, help="total time one request may take, s")
    stall_timeout_s: float = config_field(60.0, help="longest silence within a stream, s")
    first_byte_timeout_s: float = config_field(
        60.0, help="longest wait for a response to start (its headers) after a request is sent, s"
    )
    models_timeout_s: float = config_field(30.0, help="longest wait for the /v1/models listing, s")
    max_event_bytes: int = config_field(
        MAX_EVENT_BYTES, help="largest SSE event (or unfinished line) accepted, bytes; a bigger one fails the request"
    )
    api_key_env: str = config_field(DEFAULT_API_KEY_ENV, help="environment variable with the API key")
    server_metrics: bool = config_field(True, help="scrape the server's /metrics before, during and after each point")
    power_period_ms: float = config_field(50.0, help="power sampling period when the server runs on this host, ms")
    usd_per_kwh: float | None = config_field(None, help="electricity price for the energy cost column, $/kWh")
    slo_ttft_ms: float | None = config_field(None, help="goodput SLO on TTFT (ms, inclusive; default: none)")
    slo_tpot_ms: float | None = config_field(None, help="goodput SLO on TPOT (ms, inclusive; default: none)")
    slo_e2el_ms: float | None = config_field(
        None, help="goodput SLO on end-to-end latency (ms, inclusive; default: none)"
    )
    temperature: float = config_field(0.0, help="sampling temperature sent with each request")
    continuous_usage: bool = config_field(
        False, help="ask for usage in every chunk (vLLM): exact tokens per chunk without a tokenizer"
    )
    extra_body: dict = config_field(
        default_factory=dict, parse=json_object_arg, help="JSON object merged into every request body"
    )

    def validate(self) -> LoadConfig:
        """Check every value (ranges in :mod:`kit.serve.limits`); returns self.

        Raises:
            UserError: naming the bad field, its value and what is allowed.
        """
        check_load_config(self, ENDPOINTS)
        self.request_headers()  # an API key that would inject headers is refused now, before any network work
        return self

    @property
    def base_url(self) -> str:
        """``url`` without a trailing ``/`` or ``/v1`` (string form; :meth:`api_url` joins paths properly)."""
        u = str(self.url).rstrip("/")
        return u[:-3] if u.endswith("/v1") else u

    def api_url(self, path: str | None = None) -> str:
        """The URL of an API path (default: this config's streaming endpoint), query string kept."""
        return endpoint_url(self.url, path or ENDPOINTS[self.endpoint])

    @property
    def shown_url(self) -> str:
        """The base URL as the kit writes and prints it (:func:`kit.serve.redact.redact_url`)."""
        return redact_url(self.base_url)

    def secrets(self) -> list[str]:
        """The secret strings of this config (URL credentials, token query values, the API key)."""
        return secrets_of(self.url, self.api_key_env)

    def request_body(self, model: str, req: RequestInput) -> dict:
        """The JSON body of ``req`` under this config (:func:`kit.serve.client.request_body`)."""
        return request_body(
            self.endpoint,
            model,
            req,
            temperature=self.temperature,
            ignore_eos=self.ignore_eos,
            continuous_usage=self.continuous_usage,
            extra_body=self.extra_body,
        )

    def request_headers(self) -> dict:
        """The HTTP headers of every request (:func:`kit.serve.client.request_headers`; the key from
        ``api_key_env``, unless the URL carries credentials)."""
        return request_headers(self.api_key_env, self.url)

    def stream_limits(self) -> StreamLimits:
        """The per-request limits of this config (timeouts, event-size cap) and its secrets, for
        :func:`kit.serve.client.stream_request`."""
        return StreamLimits(
            self.timeout_s, self.stall_timeout_s, self.first_byte_timeout_s, self.max_event_bytes, tuple(self.secrets())
        )
