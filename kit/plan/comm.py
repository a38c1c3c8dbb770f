"""The planner's communication model: per collective ``t = α + S × factor / busbw`` on a link class.

Two link classes per accelerator (:class:`Link`): **scale-up** within a node (NVLink, xGMI / Infinity Fabric) and
**scale-out** between nodes (InfiniBand / RoCE). α (µs, the per-call latency that dominates decode-sized
messages) and busbw (GB/s, nccl-tests bus bandwidth) come from the catalog (``kit/data/accelerators.csv``,
columns ``scaleup_alpha_us`` ... with ``link_source`` and UNSURE ``link_flags``) or from a saved ``kit comm``
measurement (:func:`apply_comm_calibration`). ``S`` is the whole buffer and ``factor`` the nccl-tests bus factor
(:func:`kit.metrics.busbw_factor`), so ``S × factor / busbw`` is the time the bytes take on the wire.

One decode step (:func:`decode_messages`) sends, per rank:

- **TP all-reduce**: after attention in every layer, and after the MLP in dense layers and (when experts are not
  expert-parallel) in MoE layers: ``B × hidden × act bytes`` each;
- **EP dispatch + combine** (all-to-all) in every MoE layer when ``ep > 1``: the batch's routed copies
  ``B × top-k × hidden × act bytes`` spread over the EP ranks, so one rank's whole send buffer is that ÷ ep
  (DeepEP-style dispatch/combine);
- **pipeline hand-offs**: ``pp − 1`` send/recv of ``B × hidden × act bytes``.

A group spanning more GPUs than one scale-up domain holds (a node; an NVL72 rack) uses the scale-out link (its
slowest hop); pipeline hand-offs use it when the stages together span more than one domain (``tp × pp`` > domain).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kit import dtypes, metrics
from kit.errors import InputNotFoundError, UserError
from kit.plan.device import DeviceModel
from kit.plan.spec import ArchSpec


@dataclass(frozen=True)
class Link:
    """One link class: ``alpha_us`` per-call latency (µs), ``busbw_gb_s`` nccl-tests bus bandwidth (GB/s)."""

    name: str  # scale-up | scale-out
    alpha_us: float
    busbw_gb_s: float


@dataclass(frozen=True)
class Message:
    """One kind of collective a decode step sends: ``count`` calls of ``op`` over ``n_ranks`` on ``link``, each
    of ``size_bytes`` (the whole buffer, nccl-tests convention)."""

    term: str  # tp_allreduce | ep_alltoall | pp_handoff
    op: str
    size_bytes: float
    count: int
    n_ranks: int
    link: Link

    def time_parts_ms(self) -> tuple[float, float]:
        """(latency part count × α, bandwidth part count × S × factor / busbw), ms."""
        lat = self.count * self.link.alpha_us * 1e-3
        bw = self.count * self.size_bytes * metrics.busbw_factor(self.op, self.n_ranks) / (self.link.busbw_gb_s * 1e9)
        return lat, bw * 1e3


def collective_ms(op: str, size_bytes: float, n_ranks: int, link: Link) -> float:
    """``α + S × factor(op, n) / busbw`` in ms for one call; 0 for a single rank.

    Raises:
        UserError: unknown ``op`` (see :func:`kit.metrics.busbw_factor`).
    """
    if n_ranks <= 1:
        return 0.0
    lat, bw = Message("x", op, size_bytes, 1, n_ranks, link).time_parts_ms()
    return lat + bw


def links(dev: DeviceModel) -> dict[str, Link | None]:
    """``{"scale-up": Link | None, "scale-out": Link | None}`` of a device model (None where α or busbw is
    unknown, e.g. the CPU)."""
    out: dict[str, Link | None] = {}
    for name, a, b in (
        ("scale-up", dev.scaleup_alpha_us, dev.scaleup_busbw_gb_s),
        ("scale-out", dev.scaleout_alpha_us, dev.scaleout_busbw_gb_s),
    ):
        out[name] = Link(name, float(a), float(b)) if a is not None and b else None
    return out


def step_collectives(
    spec: ArchSpec, tokens: float, tp: int, ep: int, pp: int = 1, act_dtype="bfloat16"
) -> list[tuple[str, str, float, int, int]]:
    """``[(term, op, size_bytes, count, n_ranks)]`` of one forward over ``tokens`` tokens under TP/EP/PP, per rank
    (see the module docstring): what a decode step sends, before any link is chosen. ``kit comm --model`` times
    exactly these sizes."""
    act = dtypes.bytes_per_element(act_dtype)
    hidden = tokens * spec.hidden_size * act
    out = []
    if tp > 1:
        per_layer_ar = spec.num_layers + spec.n_dense_layers + (spec.n_moe_layers if ep <= 1 else 0)
        out.append(("tp_allreduce", "all_reduce", hidden, per_layer_ar, tp))
    if ep > 1 and spec.is_moe:
        out.append(("ep_alltoall", "all_to_all", hidden * spec.experts_per_token / ep, 2 * spec.n_moe_layers, ep))
    if pp > 1:
        out.append(("pp_handoff", "send_recv", hidden, pp - 1, 2))
    return out


def decode_messages(
    spec: ArchSpec, dev: DeviceModel, tokens: float, tp: int, ep: int, pp: int, act_dtype="bfloat16"
) -> list[Message]:
    """:func:`step_collectives` on their links (a decode step: ``tokens`` = the batch B; a verify step:
    B × (k + 1)). A group wider than the scale-up domain
    (:meth:`~kit.plan.device.DeviceModel.scaleup_size`: a node, or an NVL72 rack) uses scale-out; pipeline hand-offs
    use scale-out when the stages together span more than one domain. Messages over a link with no figures are left
    out (their time is unknown, not zero: the assumptions say so).
    """
    ls, domain = links(dev), dev.scaleup_size()
    out = []
    for term, op, size, count, n in step_collectives(spec, tokens, tp, ep, pp, act_dtype):
        wide = (tp * pp > domain) if term == "pp_handoff" else (n > domain)
        link = ls["scale-out"] if wide else ls["scale-up"]
        if link is not None:
            out.append(Message(term, op, size, count, n, link))
    return out


def comm_terms(messages: list[Message]) -> dict[str, float]:
    """Per-term ms of a step: ``t_<term>_lat_ms`` / ``t_<term>_bw_ms`` for each message kind, and totals
    ``t_comm_lat_ms``, ``t_comm_bw_ms``, ``t_comm_ms``."""
    out: dict[str, float] = {}
    for m in messages:
        lat, bw = m.time_parts_ms()
        out[f"t_{m.term}_lat_ms"] = out.get(f"t_{m.term}_lat_ms", 0.0) + lat
        out[f"t_{m.term}_bw_ms"] = out.get(f"t_{m.term}_bw_ms", 0.0) + bw
    out["t_comm_lat_ms"] = sum(v for k, v in out.items() if k.endswith("_lat_ms"))
    out["t_comm_bw_ms"] = sum(v for k, v in out.items() if k.endswith("_bw_ms") and k != "t_comm_bw_ms")
    out["t_comm_ms"] = out["t_comm_lat_ms"] + out["t_comm_bw_ms"]
    return out


def describe(messages: list[Message]) -> str:
    """One line per message kind for a prediction's assumptions: ``"TP all-reduce 186 × 14.3 kB on scale-up
    (α 7 µs, 940 GB/s)"``."""
    if not messages:
        return "no collectives (one rank, or no link figures)"
    return "; ".join(
        f"{m.term} {m.count} × {m.op} {m.size_bytes / 1e3:,.1f} kB over {m.n_ranks} ranks on {m.link.name} "
        f"(α {m.link.alpha_us:g} µs, busbw {m.link.busbw_gb_s:g} GB/s)"
        for m in messages
    )


def load_comm_calibration(path: str | Path) -> dict:
    """A saved ``kit comm`` link calibration (:func:`kit.measure.comm.save_comm_calibration`).

    Raises:
        InputNotFoundError: no such file. UserError: a directory, unreadable, not UTF-8 JSON, or not a link
            calibration (names the missing keys).
    """
    p = Path(path)
    if not p.exists():
        raise InputNotFoundError(f"comm calibration {path}: no such file (write one with `kit comm --save-links`)")
    if not p.is_file():
        raise UserError(f"comm calibration {path} is a directory; give the JSON file `kit comm --save-links` wrote")
    try:
        cal = json.loads(p.read_text())
    except OSError as e:
        raise UserError(f"comm calibration {path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:  # UnicodeDecodeError (not UTF-8) is a ValueError
        raise UserError(f"comm calibration {path}: not UTF-8 JSON ({e})") from None
    if not isinstance(cal, dict) or not isinstance(cal.get("links"), dict):
        raise UserError(f"comm calibration {path}: needs a 'links' object with 'scale-up' and/or 'scale-out'")
    cal["path"] = str(p)
    return cal


def _positive_finite(v) -> bool:
    """A JSON number (not a boolean) that is finite and > 0."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")


def apply_comm_calibration(dev: DeviceModel, cal: dict | str | Path) -> DeviceModel:
    """Set ``dev``'s link α / busbw from a ``kit comm`` measurement (a dict or JSON path); returns ``dev``.

    Raises:
        UserError: a link entry without finite positive ``alpha_us`` and ``busbw_gb_s``, or an unknown link name.
    """
    if not isinstance(cal, dict):
        cal = load_comm_calibration(cal)
    where = f"comm calibration {cal.get('path') or '(dict)'}"
    for name, fig in cal["links"].items():
        if name not in ("scale-up", "scale-out"):
            raise UserError(f"{where}: unknown link {name!r}; allowed: 'scale-up', 'scale-out'")
        if not isinstance(fig, dict):
            raise UserError(f"{where}: link {name} is {fig!r}, not an object with alpha_us and busbw_gb_s")
        a, b = fig.get("alpha_us"), fig.get("busbw_gb_s")
        if not (_positive_finite(a) and _positive_finite(b)):
            raise UserError(f"{where}: link {name} alpha_us={a!r} and busbw_gb_s={b!r} must be finite numbers > 0")
        prefix = "scaleup" if name == "scale-up" else "scaleout"
        setattr(dev, f"{prefix}_alpha_us", float(a))
        setattr(dev, f"{prefix}_busbw_gb_s", float(b))
    dev.link_source = f"kit comm measurement {cal.get('path', '')} ({cal.get('created_utc', '')})".strip()
    return dev
