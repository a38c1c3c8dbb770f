"""Which GPUs this process uses: the visibility variables resolved to physical device indices.

One function, :func:`resolve_visible_devices`, turns ``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES`` and
``ROCR_VISIBLE_DEVICES`` into the list of physical devices a process's device 0, 1, ... are; device detection
(:func:`kit.hardware.detect`), the power sampler (:mod:`kit.measure.power_readers`: NVML and amd-smi number every
GPU of the machine, ignoring these variables) and the ranks of a tensor-parallel point all use it. Torch-free, so
the served layer's power sampling does not import torch.

Rules (sources: ROCm docs, "GPU isolation techniques"; CUDA C++ Programming Guide, "CUDA Environment Variables"):

- ROCm: ``ROCR_VISIBLE_DEVICES`` filters at the runtime level first (physical indices), then
  ``HIP_VISIBLE_DEVICES`` — for which HIP also reads ``CUDA_VISIBLE_DEVICES`` — indexes into what is left. So
  ``ROCR_VISIBLE_DEVICES=2,3 HIP_VISIBLE_DEVICES=1`` is physical GPU 3.
- CUDA: only ``CUDA_VISIBLE_DEVICES`` counts (physical indices).
- A variable set to the empty string hides every GPU (the process then runs on the CPU): an empty list, not an
  error. A device named by UUID (``GPU-...``, ``MIG-...``) stays a string: its physical index is unknown here.

Errors (:class:`kit.errors.UserError`, naming the variables and values): HIP and CUDA lists that disagree on ROCm
(which one HIP obeys depends on its version), an index past what ROCR leaves (``ROCR_VISIBLE_DEVICES=1
HIP_VISIBLE_DEVICES=1`` leaves no device), an item that is neither an index >= 0 nor a UUID, a device named twice.
"""

from __future__ import annotations

import os
import re

from kit.errors import UserError

#: environment variables that decide which GPUs a process sees
VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
#: a device named by UUID: NVIDIA ``GPU-<uuid>`` / ``MIG-<uuid>``, AMD ``GPU-<hex>``
_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z./-]+")


def parse_list(var: str, value: str) -> list[int | str]:
    """The devices one variable names, in order: integers (indices) and UUID strings; ``""`` names none.

    Raises:
        UserError: an empty item, an item that is neither an index >= 0 nor a UUID, or a device named twice.
    """
    if value.strip() == "":
        return []
    out: list[int | str] = []
    for item in (x.strip() for x in value.split(",")):
        dev: int | str
        if item.isdigit():
            dev = int(item)
        elif _UUID.fullmatch(item):
            dev = item
        else:
            raise UserError(
                f"{var}={value!r}: item {item!r} is not a device index (an integer >= 0) or a UUID (GPU-...); "
                f"give a comma list such as 0,1"
            )
        if dev in out:
            raise UserError(f"{var}={value!r} names device {dev!r} twice; name each device once")
        out.append(dev)
    return out


def _rocm(env) -> list[int | str] | None:
    hip, cuda = env.get("HIP_VISIBLE_DEVICES"), env.get("CUDA_VISIBLE_DEVICES")
    if (
        hip is not None
        and cuda is not None
        and parse_list("HIP_VISIBLE_DEVICES", hip) != parse_list("CUDA_VISIBLE_DEVICES", cuda)
    ):
        raise UserError(
            f"HIP_VISIBLE_DEVICES={hip!r} and CUDA_VISIBLE_DEVICES={cuda!r} disagree on this ROCm machine; "
            "set one of them (HIP_VISIBLE_DEVICES), or both to the same list"
        )
    var, sel = ("HIP_VISIBLE_DEVICES", hip) if hip is not None else ("CUDA_VISIBLE_DEVICES", cuda)
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    base = None if rocr is None else parse_list("ROCR_VISIBLE_DEVICES", rocr)
    if sel is None:
        return base
    picks = parse_list(var, sel)
    if base is None:
        return picks
    out: list[int | str] = []
    for p in picks:
        if isinstance(p, str):  # a UUID names a physical device itself
            out.append(p)
            continue
        if p >= len(base):
            left = f"indices 0 to {len(base) - 1}" if base else "none"
            raise UserError(
                f"{var}={sel!r} selects device {p}, but ROCR_VISIBLE_DEVICES={rocr!r} leaves {len(base)} "
                f"device(s) ({left}): no such device. {var} indexes into the ROCR list (e.g. "
                f"ROCR_VISIBLE_DEVICES=2,3 {var}=1 is physical GPU 3)"
            )
        out.append(base[p])
    return out


def resolve_visible_devices(platform: str, env=None) -> list[int | str] | None:
    """The physical devices this process's GPUs 0, 1, ... are (see the module docstring for the rules).

    Args:
        platform: ``"rocm"``, ``"cuda"`` or ``"cpu"`` (the torch build's GPU API; ``"cpu"``: no GPU, None).
        env: mapping to read (default ``os.environ``).

    Returns:
        None when no variable that applies is set (every device, in physical order); else the list, in the order
        the process numbers them: physical indices (int) or UUIDs (str); empty when a variable hides every GPU.

    Raises:
        UserError: see the module docstring (conflicts, an index past the ROCR list, malformed or repeated items).
    """
    env = os.environ if env is None else env
    if platform == "rocm":
        return _rocm(env)
    if platform == "cuda" and "CUDA_VISIBLE_DEVICES" in env:
        return parse_list("CUDA_VISIBLE_DEVICES", env["CUDA_VISIBLE_DEVICES"])
    return None


def physical_gpus(platform: str, n: int, env=None) -> list[int | str] | None:
    """The physical devices of this process's first ``n`` GPUs (device 0 of a point; ranks 0 .. n-1 of a TP point,
    rank r on GPU r): None on ``"cpu"`` (the power sampler then reads every CPU package).

    Raises:
        UserError: as :func:`resolve_visible_devices`, or fewer than ``n`` devices visible.
    """
    if platform == "cpu":
        return None
    vis = resolve_visible_devices(platform, env)
    if vis is None:
        return list(range(n))
    if len(vis) < n:
        raise UserError(f"{n} GPU(s) needed but the visibility variables leave {len(vis)}: {vis}")
    return vis[:n]


def visible_devices(platform: str, env=None) -> dict:
    """Which GPUs this process may see, and why.

    Returns:
        ``{"set": {var: value} (only the variables that are set), "physical": resolve_visible_devices(...),
        "explanation": text}``.

    Raises:
        UserError: as :func:`resolve_visible_devices`.
    """
    env = os.environ if env is None else env
    found = {v: env[v] for v in VISIBLE_DEVICE_VARS if v in env}
    physical = resolve_visible_devices(platform, env)
    notes = []
    if platform == "rocm":
        if "ROCR_VISIBLE_DEVICES" in found:
            notes.append(f"ROCR_VISIBLE_DEVICES={found['ROCR_VISIBLE_DEVICES']!r} filters first")
        hip = "HIP_VISIBLE_DEVICES" in found
        if hip or "CUDA_VISIBLE_DEVICES" in found:
            var = "HIP_VISIBLE_DEVICES" if hip else "CUDA_VISIBLE_DEVICES"
            notes.append(f"{var + ('' if hip else ' (read by HIP)')}={found[var]!r} selects from what is left")
    elif platform == "cuda":
        if "CUDA_VISIBLE_DEVICES" in found:
            which = "these devices" if physical else "no device"
            notes.append(f"CUDA_VISIBLE_DEVICES={found['CUDA_VISIBLE_DEVICES']!r} selects {which}")
        ignored = [v for v in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES") if v in found]
        if ignored:
            notes.append(f"{', '.join(ignored)} set but ignored by a CUDA build")
    elif found:
        notes.append(f"{', '.join(found)} set; this torch build has no GPU API, so they change nothing")
    if physical is not None:
        notes.append(f"physical devices {physical}" if physical else "no device: every GPU is hidden")
    text = "; ".join(notes) or "no visibility variable set: every device is visible"
    return {"set": found, "physical": physical, "explanation": text}
