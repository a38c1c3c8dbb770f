"""What the server saw during a served point: its Prometheus ``/metrics`` before, during and after the point.

``snap0 = scrape(url)`` … the point … ``snap1 = scrape(url)``; ``server_columns(snap0, snap1, client_tokens)``
gives the row's ``x_server_*`` columns. :class:`ServerMetricsWatch` does the same around a ``with`` block and
also polls during it, so the gauges' maxima (requests running and waiting, KV-cache usage) are those of the
point, not of the idle server after it.

The exposition text is parsed with ``prometheus_client``'s parser. Which metric of vLLM or SGLang stands for which
kit name is data, ``kit/data/server_metrics.csv`` (each row with its source); a metric a server version does not
export is simply not reported, so a rename never breaks a run (the table lists old and new names). A server
without ``/metrics`` (``transformers serve``; SGLang without ``--enable-metrics``) gives
``x_server_metrics = "not available: <why>"``, never a failure.

Columns: counters as deltas over the point (``x_server_prompt_tokens``, ``x_server_generation_tokens``,
``x_server_preemptions``, ``x_server_prefix_cache_queries`` / ``_hits``, ``x_server_spec_drafts`` /
``_draft_tokens`` / ``_accepted_tokens``), gauges as maxima and means over the scrapes taken while the point ran
(``x_server_<name>_max``, ``_mean``; NaN, never 0, with fewer than :data:`MIN_GAUGE_SAMPLES` such scrapes:
``x_server_gauge_samples`` says how many) and their value
after it (``_last``), the latency histograms as means over the point (:data:`HISTOGRAMS`: ``x_server_ttft_ms_mean``,
``x_server_itl_ms_mean``, ``x_server_tpot_ms_mean``, ``x_server_queue_ms_mean``, ``x_server_e2e_ms_mean``, each
with its ``_n``), and derived:
``x_server_prefix_cache_hit_rate`` = hits / queries; ``x_server_spec_acceptance_rate`` = accepted / draft tokens
(SGLang: its gauge); ``x_server_spec_mean_acceptance_length`` = 1 + accepted tokens / drafts (vLLM's definition,
the bonus token included; SGLang: its gauge); ``x_server_output_tokens_ratio`` = server / client output tokens and
``x_server_output_tokens_diff_frac`` = abs(server − client) / client. Counters count every request the server
served in the window, warm-up ones and other clients' included: pass the client's count over the same requests.
"""

from __future__ import annotations

import base64
import csv
import logging
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from functools import cache

from kit._io import data_path
from kit.serve.redact import endpoint_url, redact_url, scrub, secrets_of

log = logging.getLogger("kit")

#: servers the table names
METRICS_SERVERS = ("vllm", "sglang")


@cache
def metric_table() -> tuple[dict, ...]:
    """Rows of ``kit/data/server_metrics.csv``: kit_name, server, metric, kind (counter | gauge), aggregate (sum |
    mean over the series of one metric, e.g. per TP or DP rank), unit, source."""
    with open(data_path("server_metrics.csv"), newline="") as f:
        return tuple(csv.DictReader(f))


@dataclass
class Snapshot:
    """One scrape: time (s, monotonic), every sample's values by sample name (one value per label set), or the
    error that made the scrape fail."""

    t_s: float
    values: dict[str, list[float]] = field(default_factory=dict)
    error: str | None = None

    @property
    def server(self) -> str | None:
        """``vllm`` | ``sglang`` (by metric prefix) or None."""
        for s in METRICS_SERVERS:
            if any(k.startswith(s + ":") for k in self.values):
                return s
        return None

    def get(self, kit_name: str, server: str) -> float | None:
        """The value of ``kit_name`` in this server's naming: the first of its table rows that is present,
        aggregated over label sets; None when absent."""
        for row in metric_table():
            if row["kit_name"] != kit_name or row["server"] != server:
                continue
            name = row["metric"]
            vals = self.values.get(name) or self.values.get(name.removesuffix("_total"))
            if vals:
                return sum(vals) if row["aggregate"] == "sum" else sum(vals) / len(vals)
        return None


@cache
def _table_line_starts() -> tuple[str, ...]:
    """How the sample lines of the table's metrics start (``name{`` or ``name ``, also without ``_total``)."""
    names = {r["metric"] for r in metric_table()} | {r["metric"].removesuffix("_total") for r in metric_table()}
    return tuple(sorted(n + end for n in names for end in ("{", " ")))


def table_lines(text: str) -> str:
    """Only the sample lines of ``text`` (Prometheus exposition) that :func:`metric_table` names: a server's
    ``/metrics`` carries hundreds of lines (vLLM 0.32 on CPU: ~590 lines, 64 KB, 7 ms to parse in full on a shared
    core, under 1 ms this way). The scrapes taken while a point runs parse only these: the scraper thread then holds
    the interpreter lock briefly, so the client's event loop is not delayed by it (its lag is measured)."""
    starts = _table_line_starts()
    return "".join(line + "\n" for line in text.split("\n") if line.startswith(starts))


def parse_metrics(text: str, t_s: float | None = None) -> Snapshot:
    """A Prometheus exposition text → :class:`Snapshot` (``_created`` samples dropped). A text the parser
    rejects gives a Snapshot with ``error`` set."""
    from prometheus_client.parser import text_string_to_metric_families

    snap = Snapshot(time.monotonic() if t_s is None else t_s)
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if not s.name.endswith("_created"):
                    snap.values.setdefault(s.name, []).append(float(s.value))
    except (ValueError, TypeError, IndexError) as e:
        snap.values, snap.error = {}, f"/metrics is not Prometheus text ({type(e).__name__}: {e})"
    return snap


def metrics_url(base_url: str) -> str:
    """``http://host:port/metrics`` for a server base URL (a trailing ``/v1`` is dropped; any path prefix and
    query kept, as for the API endpoints: :func:`kit.serve.redact.endpoint_url`)."""
    return endpoint_url(base_url, "/metrics")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The kit talks only to the origin it was given: a redirect is an error, never followed."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def scrape(base_url: str, timeout_s: float = 5.0, table_only: bool = False) -> Snapshot:
    """GET the server's ``/metrics`` and parse it (with ``table_only``, only :func:`table_lines`). Never raises
    for a server fault: an HTTP error, a redirect (not followed), a refused connection, a timeout or a
    non-Prometheus body gives a Snapshot whose ``error`` says which. Credentials in ``base_url`` are sent as basic
    auth, only to the server (never through a proxy of the environment's ``HTTP_PROXY``), and never appear in an
    error text."""
    url = metrics_url(base_url)
    parts = urllib.parse.urlsplit(url)
    shown = redact_url(url)
    bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))
    req = urllib.request.Request(bare)
    if parts.username is not None:
        token = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        req.add_header("Authorization", "Basic " + base64.b64encode(token.encode()).decode())
    t = time.monotonic()
    try:
        # no proxy from the environment (HTTP_PROXY ...): the scrape goes to the server, and its credentials with it
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
        with opener.open(req, timeout=timeout_s) as r:
            text = r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        moved = " (a redirect: not followed)" if 300 <= e.code < 400 else ""
        return Snapshot(t, error=f"HTTP {e.code} from {shown}{moved}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = scrub(str(getattr(e, "reason", e)), secrets_of(base_url))
        return Snapshot(t, error=f"{shown} unreachable ({why})")
    snap = parse_metrics(table_lines(text) if table_only else text, t)
    if snap.error is None and snap.server is None:
        snap.error = f"{shown} has no vLLM or SGLang metrics"
    return snap


def client_output_tokens(records) -> int:
    """Output tokens the client counted over every request that completed, warm-up ones included (the server's
    counters count those too): the ``client_output_tokens`` of :func:`server_columns`."""
    return sum(int(r.get("output_tokens") or 0) for r in records if r.get("ok"))


def _kinds(server: str) -> dict[str, str]:
    return {r["kit_name"]: r["kind"] for r in metric_table() if r["server"] == server}


def _ratio(a, b):
    return a / b if a is not None and b else None


#: scrapes taken while a point ran below which its gauges' maxima are "not sampled" (NaN, never 0)
MIN_GAUGE_SAMPLES = 2

#: the server's latency histograms the row reports as means over the point (``x_server_<name>_ms_mean``, from the
#: deltas of ``_sum`` and ``_count``; ``x_server_<name>_n`` observations): TTFT and E2E latency per request, ITL
#: per engine step (vLLM and SGLang observe one ITL per step, so with speculative decoding it spans several
#: tokens, unlike the kit's per-token ITL), TPOT per request (vLLM), queue time per request
HISTOGRAMS = ("ttft", "itl", "tpot", "queue", "e2e")


def server_columns(
    before: Snapshot, after: Snapshot, client_output_tokens: int | None = None, during: list[Snapshot] = ()
) -> dict:
    """The ``x_server_*`` columns of one point from the scrapes around it (see the module docstring).

    Args:
        before / after: the scrapes just before the point's first request and after its last.
        client_output_tokens: output tokens the client counted over the same requests (warm-up included).
        during: scrapes taken while the point ran (gauge maxima; counters use only ``before`` / ``after``).

    Returns: ``x_server_metrics`` (``vllm`` | ``sglang`` | ``not available: <why>``) and, when available, the
    deltas, maxima and derived columns. A counter that went down (server restarted) gives None for its delta.
    """
    bad = before.error or after.error
    server = before.server if not bad else None
    if bad or server is None or after.server != server:
        why = bad or f"the server's metric names changed between scrapes ({before.server} → {after.server})"
        return {"x_server_metrics": f"not available: {why}"}
    cols: dict = {"x_server_metrics": server}
    for name, kind in _kinds(server).items():
        if kind == "counter":
            a, b = before.get(name, server), after.get(name, server)
            d = b - a if a is not None and b is not None and b >= a else None
            if a is not None and b is not None and b < a:
                log.warning("server counter %s went down (%s → %s): server restarted?", name, a, b)
            if a is not None or b is not None:
                cols[f"x_server_{name}"] = d
        else:  # maxima only over scrapes taken while the point ran: an idle server's 0 is not the point's
            seen = [v for s in during if (v := s.get(name, server)) is not None]
            last = after.get(name, server)
            if seen or last is not None:
                # one scrape is not a maximum over the point (it may fall before the load arrived): NaN below two
                cols[f"x_server_{name}_max"] = max(seen) if len(seen) >= MIN_GAUGE_SAMPLES else math.nan
                cols[f"x_server_{name}_mean"] = sum(seen) / len(seen) if len(seen) >= MIN_GAUGE_SAMPLES else math.nan
                cols[f"x_server_{name}_last"] = last if last is not None else seen[-1]
    cols["x_server_gauge_samples"] = len(during)
    cols["x_server_prefix_cache_hit_rate"] = _ratio(
        cols.get("x_server_prefix_cache_hits"), cols.get("x_server_prefix_cache_queries")
    )
    acc = cols.get("x_server_spec_accepted_tokens")
    rate = _ratio(acc, cols.get("x_server_spec_draft_tokens"))
    cols["x_server_spec_acceptance_rate"] = rate if rate is not None else cols.get("x_server_spec_accept_rate_last")
    per_draft = _ratio(acc, cols.get("x_server_spec_drafts"))
    cols["x_server_spec_mean_acceptance_length"] = (
        1.0 + per_draft if per_draft is not None else cols.get("x_server_spec_accept_length_last")
    )
    for name in HISTOGRAMS:  # mean of the observations made in the window, ms
        total, n = cols.pop(f"x_server_{name}_s_sum", None), cols.pop(f"x_server_{name}_s_count", None)
        if n is not None:
            cols[f"x_server_{name}_ms_mean"] = 1000.0 * total / n if total is not None and n > 0 else math.nan
            cols[f"x_server_{name}_n"] = n
    gen = cols.get("x_server_generation_tokens")
    cols |= spec_cross_check(cols, client_output_tokens)
    cols["x_server_client_output_tokens"] = client_output_tokens
    cols["x_server_output_tokens_ratio"] = _ratio(gen, client_output_tokens)
    cols["x_server_output_tokens_diff_frac"] = (
        abs(gen - client_output_tokens) / client_output_tokens if gen is not None and client_output_tokens else None
    )
    cols["x_server_scrape_s"] = after.t_s - before.t_s
    return cols


def spec_cross_check(cols: dict, client_output_tokens: int | None) -> dict:
    """Speculative decoding's acceptance checked against the tokens the client received.

    Every verify step emits its accepted draft tokens plus one (the bonus token), so the server's counters imply
    ``drafts + accepted`` emitted tokens. A server that counts drafts accepted past the end of a sequence (after
    EOS or ``max_tokens``, discarded) implies more than the client got: then ``x_server_spec_overcount_frac`` =
    (drafts + accepted − client tokens) / client tokens is > 0, and the acceptance figures are overstated.
    ``x_spec_tokens_per_step_client`` = client tokens / drafts is the acceptance length the client saw (bonus
    included; comparable to ``x_server_spec_mean_acceptance_length``). Both None without drafts or client tokens.
    """
    drafts, acc = cols.get("x_server_spec_drafts"), cols.get("x_server_spec_accepted_tokens")
    if not drafts or acc is None or not client_output_tokens:
        return {"x_server_spec_overcount_frac": None, "x_spec_tokens_per_step_client": None}
    implied = drafts + acc
    return {
        "x_server_spec_overcount_frac": max(0.0, (implied - client_output_tokens) / client_output_tokens),
        "x_spec_tokens_per_step_client": client_output_tokens / drafts,
    }


#: the "not available" reasons already logged by this process
_TOLD: set[str] = set()


class ServerMetricsWatch:
    """Scrape ``/metrics`` when the ``with`` block starts, every ``period_s`` during it (a background thread) and
    when it ends; :meth:`columns` gives :func:`server_columns`. A server without ``/metrics`` is found at the
    first scrape: nothing is polled and the columns say "not available".

    Args:
        base_url: the server's base URL (as :class:`kit.serve.load.LoadConfig` ``url``).
        period_s: polling period during the point, s; ``enabled=False`` (``--no-server-metrics``) scrapes nothing.
    """

    def __init__(self, base_url: str, period_s: float = 1.0, timeout_s: float = 5.0, enabled: bool = True):
        self.base_url, self.period_s, self.timeout_s, self.enabled = base_url, period_s, timeout_s, enabled
        self.before: Snapshot | None = None
        self.after: Snapshot | None = None
        self.during: list[Snapshot] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ServerMetricsWatch:
        if not self.enabled:
            return self
        self.before = scrape(self.base_url, self.timeout_s)
        if self.before.error is None:
            self._thread = threading.Thread(target=self._loop, name="kit-server-metrics", daemon=True)
            self._thread.start()
        elif self.before.error not in _TOLD:  # said once per process, not at every point of a sweep
            _TOLD.add(self.before.error)
            log.info("server metrics: not available: %s (--no-server-metrics skips the scrape)", self.before.error)
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            s = scrape(self.base_url, self.timeout_s, table_only=True)
            if s.error is None:
                self.during.append(s)

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(self.timeout_s + self.period_s + 1)
            self.after = scrape(self.base_url, self.timeout_s)

    def columns(self, client_output_tokens: int | None = None) -> dict:
        """The point's ``x_server_*`` columns (``not available`` when switched off or never reachable)."""
        if not self.enabled:
            return {"x_server_metrics": "not available: switched off (--no-server-metrics)"}
        if self.before is None:
            return {"x_server_metrics": "not available: not scraped"}
        return server_columns(self.before, self.after or self.before, client_output_tokens, self.during)
