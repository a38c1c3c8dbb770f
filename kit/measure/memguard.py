"""Will a point fit? Predict its bytes before allocating, compare with the memory that is free, and read the
caching allocator's fragmentation statistics after it ran.

Why: on Linux a CPU allocation beyond memory does not fail, it overcommits, and the kernel's OOM killer later kills
the process (or a neighbour) instead of raising; on a GPU an allocation failure is an exception, but a fragmented
cache can fail while enough bytes are free. So ``kit kv-stress`` asks first: a point predicted not to fit is
recorded ``refused`` and never allocated.

- Prediction (:func:`predict_memory`): weights + KV cache (the planner's per-token bytes,
  :func:`kit.plan.sizes.kv_bytes_per_token`, times batch × cache length, plus the constant per-sequence state,
  :func:`kit.plan.sizes.state_bytes_per_seq`) + a workspace estimate (:func:`workspace_bytes`).
- Free memory (:func:`available_memory`): CUDA/HIP ``torch.cuda.mem_get_info``; on CPU ``MemAvailable``
  (``psutil.virtual_memory().available``) and, when this process's cgroup or an ancestor sets one (v1 or v2,
  :func:`cgroup_memory`), the cgroup limit minus its working set (usage minus inactive file cache, as the kubelet
  counts it).
- Fragmentation (:func:`fragmentation_columns`): reserved vs allocated peaks, inactive split bytes and allocation
  retries from ``torch.cuda.memory_stats``; ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_HIP_ALLOC_CONF``
  ``expandable_segments`` set by :func:`set_expandable_segments`.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from kit import dtypes
from kit.errors import UserError
from kit.plan.sizes import kv_bytes_per_token, state_bytes_per_seq, weight_bytes

log = logging.getLogger("kit")
GB = 1e9
#: cgroup limits at or above this are "no limit" (cgroup v1 writes 2**63 rounded down to a page)
NO_LIMIT = 2**60
#: the safety margin when none is given: max(MARGIN_MIN_GB, MARGIN_FRACTION × device memory)
MARGIN_MIN_GB = 1.0
MARGIN_FRACTION = 0.05
NOT_AVAILABLE_CPU = "not available on cpu (no caching allocator statistics)"


@dataclass(frozen=True)
class MemoryPrediction:
    """Bytes one point needs, GB (1e9 bytes). ``kv_gb`` includes the per-sequence state; ``weights_gb`` is 0 when
    the weights are already resident (then free memory already excludes them)."""

    weights_gb: float
    kv_gb: float
    workspace_gb: float
    kv_bytes_per_token: float

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.kv_gb + self.workspace_gb


@dataclass(frozen=True)
class FreeMemory:
    """What is free now, GB: ``free_gb`` (the tightest of the sources), ``total_gb`` (the device or the cgroup
    limit) and ``source`` (which figure won, as text)."""

    free_gb: float
    total_gb: float
    source: str


def workspace_bytes(spec, batch: int, cache_len: int, dtype="float32", q_tokens: int = 1) -> float:
    """Transient bytes of one forward of ``batch`` × ``q_tokens`` tokens against a static cache of ``cache_len``
    tokens, as transformers' sdpa attention computes it (one layer's temporaries alive at a time):

    - decode (one token): scores and softmax in float32, ``2 × B × heads × cache_len × 4``, plus the boolean mask
      ``B × cache_len`` (GQA groups are packed into the query, so k/v are not repeated; transformers
      ``sdpa_attention.pack_gqa``);
    - a prefill chunk of ``q`` tokens: sdpa's fused kernels (flash on CPU, memory-efficient on GPUs, which take a
      mask) keep no q × cache_len score matrix; the mask is, as booleans and as an additive float mask,
      ``B × q × cache_len × (1 + 4)`` bytes; with grouped kv heads k and v are repeated to every head,
      ``2 × B × heads × cache_len × head_dim`` elements (transformers ``sdpa_attention.repeat_kv``). A kernel that
      falls back to sdpa's math path materialises the scores too: on a GPU that is an OOM exception, recorded;
    - MLA, which transformers expands from the latent every step (``DeepseekV3Attention.expand_kv``): per cached
      token ``heads × (nope + v)`` (kv_b_proj out) + ``heads × (nope + rope)`` (keys) + ``heads × v`` (contiguous
      values) + ``kv_lora_rank`` (latent copy) elements of ``dtype``;
    - activations ``B × q × (6 × hidden + 2 × widest MLP)`` and logits ``B × vocab × 4``.

    An estimate calibrated on the CPU presets (decode at 262,144 tokens: tiny-llama 16 B/token measured vs 65
    predicted, tiny-deepseek 2,654 vs 2,609; a 2,048-token chunk at 65,536 tokens, tiny-llama: 0.88 GB measured).
    """
    b = dtypes.bytes_per_element(dtype)
    heads = spec.num_attention_heads
    if q_tokens == 1:  # decode: scores + softmax of every head over the cache, and the boolean mask
        attn = batch * cache_len * (2 * heads * 4 + 1)
    else:  # a chunk: fused kernel (no scores); boolean mask and its float form, q x cache_len each
        attn = batch * q_tokens * cache_len * (1 + 4)
        if spec.attention == "gqa" and spec.num_kv_heads < heads:  # sdpa repeats k/v to every head (repeat_kv)
            attn += batch * cache_len * heads * spec.head_dim * 2 * b
    if spec.attention == "mla":
        nope, v, rope = spec.qk_nope_head_dim, spec.v_head_dim, spec.qk_rope_head_dim
        attn += batch * cache_len * (heads * (2 * nope + 2 * v + rope) + spec.kv_lora_rank) * b
    widest = max(spec.intermediate_size or 0, (spec.moe_intermediate_size or 0) * max(1, spec.experts_per_token))
    act = batch * q_tokens * (6 * spec.hidden_size + 2 * widest) * b + 2 * batch * spec.vocab_size * 4
    return float(attn + act)


def predict_memory(
    spec, dtype: str, batch: int, cache_len: int, weights_resident: bool = False, q_tokens: int = 1
) -> MemoryPrediction:
    """What a point of ``batch`` sequences with a static cache of ``cache_len`` tokens needs (GB), from the
    architecture: weights (:func:`kit.plan.sizes.weight_bytes` in ``dtype``; 0 if ``weights_resident``), KV cache
    ``B × (cache_len × kv_bytes_per_token + state_bytes_per_seq)`` (:mod:`kit.plan.sizes`, cache in ``dtype``) and
    :func:`workspace_bytes` for a forward of ``q_tokens`` tokens per sequence (1: decode; a prefill chunk)."""
    per_tok = kv_bytes_per_token(spec, dtype)
    kv = batch * (cache_len * per_tok + state_bytes_per_seq(spec, cache_len, dtype, dtype))
    w = 0.0 if weights_resident else sum(weight_bytes(spec, f"default={dtypes.name_of(dtype)}").values())
    ws = workspace_bytes(spec, batch, cache_len, dtype, q_tokens)
    return MemoryPrediction(w / GB, kv / GB, ws / GB, per_tok)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat(stat: Path, key: str) -> int | None:
    """One counter of a cgroup ``memory.stat`` file (None: absent or unreadable)."""
    try:
        for line in stat.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key and v.strip().isdigit():
                return int(v)
    except OSError:
        pass
    return None


def _unescape(field: str) -> str:
    """A path field of ``/proc/self/mountinfo`` (space, tab, newline and backslash written as octal escapes)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _memory_cgroups(proc_cgroup: Path, mountinfo: Path) -> list[tuple[str, Path, Path]]:
    """``(version, this process's cgroup directory, the mount point)`` of each memory hierarchy this process is in:
    cgroup v2 (``0::/path`` in ``/proc/self/cgroup``, a ``cgroup2`` mount) and v1 (``N:...memory...:/path``, a
    ``cgroup`` mount with the ``memory`` option). The directory is the mount point joined with the process's path
    relative to the mount's root (mountinfo field 4: ``/`` with a cgroup namespace, the container's own path
    without one)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
        mounts = mountinfo.read_text().splitlines()
    except OSError:
        return []
    paths = {}
    for line in lines:
        _, ctrls, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if ctrls == "" and line.startswith("0::"):
            paths["v2"] = path.strip()
        elif "memory" in ctrls.split(","):
            paths["v1"] = path.strip()
    out = []
    for line in mounts:
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) < 5 or len(r) < 3:
            continue
        version = "v2" if r[0] == "cgroup2" else "v1" if r[0] == "cgroup" and "memory" in r[2].split(",") else None
        if version is None or version not in paths:
            continue
        root, point, path = _unescape(f[3]).rstrip("/"), Path(_unescape(f[4])), paths[version]
        inside = path == root or path.startswith(root + "/")
        out.append((version, point / path[len(root) :].lstrip("/") if inside else point, point))
    return out


def _level_memory(version: str, d: Path) -> tuple[int, int] | None:
    """``(limit, working set)`` bytes of one cgroup directory, or None without a limit (v2 ``max``, or >=
    :data:`NO_LIMIT`): v2 ``memory.max`` and ``memory.current`` − ``inactive_file``; v1 the smaller of
    ``memory.limit_in_bytes`` and ``memory.stat``'s ``hierarchical_memory_limit`` (its ancestors' limits, also
    those above a container's mount) and ``memory.usage_in_bytes`` − ``total_inactive_file``."""
    if version == "v2":
        limit, used = _read_int(d / "memory.max"), _read_int(d / "memory.current")
        inactive = _stat(d / "memory.stat", "inactive_file")
    else:
        limits = [_read_int(d / "memory.limit_in_bytes"), _stat(d / "memory.stat", "hierarchical_memory_limit")]
        limit = min((v for v in limits if v is not None), default=None)
        used, inactive = _read_int(d / "memory.usage_in_bytes"), _stat(d / "memory.stat", "total_inactive_file")
    if limit is None or limit >= NO_LIMIT:
        return None
    return limit, max(0, (used or 0) - (inactive or 0))


def cgroup_memory(proc_cgroup: str | Path = "/proc/self/cgroup", mountinfo: str | Path = "/proc/self/mountinfo"):
    """This process's cgroup memory ``(limit bytes, working-set bytes)``, or None when no limit applies.

    The process's own cgroup is found from ``/proc/self/cgroup`` and the mount table (:func:`_memory_cgroups`;
    cgroup v1 and v2, hybrid hosts included), and its limit is the tightest of it and every ancestor up to the
    mount point: the level with the least room (limit − working set) wins (:func:`_level_memory`). Reading the
    hierarchy's root instead (issue 28: a v1 host's root has no limit) took a 5 GiB group's host for 20 GB free.
    """
    best = None
    for version, d, point in _memory_cgroups(Path(proc_cgroup), Path(mountinfo)):
        for level in (d, *[a for a in d.parents if a == point or point in a.parents]):
            got = _level_memory(version, level)
            if got is not None and (best is None or got[0] - got[1] < best[0] - best[1]):
                best = got
    return best


def available_memory(device: str | torch.device = "cpu") -> FreeMemory:
    """Memory free for a new allocation on ``device`` now (see the module docstring for the sources).

    Returns:
        :class:`FreeMemory` (GB). On cuda/rocm: ``torch.cuda.mem_get_info`` (free and total of the device).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        api = "hip" if getattr(torch.version, "hip", None) else "cuda"
        return FreeMemory(free / GB, total / GB, f"{api} mem_get_info")
    import psutil

    vm = psutil.virtual_memory()
    free, total, source = vm.available / GB, vm.total / GB, "MemAvailable"
    cg = cgroup_memory()
    if cg is not None:
        limit, used = cg
        if (limit - used) / GB < free:
            free, source = (limit - used) / GB, f"cgroup limit {limit / GB:.2f} GB minus its working set"
        total = min(total, limit / GB)
    return FreeMemory(max(0.0, free), total, source)


def default_margin_gb(total_gb: float) -> float:
    """The safety margin kept free: max(:data:`MARGIN_MIN_GB`, :data:`MARGIN_FRACTION` × ``total_gb``), GB."""
    return max(MARGIN_MIN_GB, MARGIN_FRACTION * total_gb)


def refusal(pred: MemoryPrediction, free: FreeMemory, margin_gb: float) -> str | None:
    """Why a point does not fit (text naming the predicted and available GB), or None when it fits:
    it fits when ``pred.total_gb <= free.free_gb - margin_gb``."""
    room = free.free_gb - margin_gb
    if pred.total_gb <= room:
        return None
    return (
        f"refused by the memory guard: predicted {pred.total_gb:.2f} GB (weights {pred.weights_gb:.2f} + KV "
        f"{pred.kv_gb:.2f} + workspace {pred.workspace_gb:.2f}) > available {free.free_gb:.2f} GB ({free.source}) "
        f"minus a {margin_gb:.2f} GB margin; not allocated (--no-guard attempts it anyway)"
    )


def largest_point(spec, points, per_device: int = 1) -> tuple[MemoryPrediction, str, object]:
    """The point of a sweep that needs the most memory: ``(prediction, dtype, point)`` over ``points`` (``(dtype,
    PointConfig)`` pairs, :meth:`kit.measure.sweep.SweepConfig.points`). Each point needs its weights, its KV cache
    and the larger workspace of a decode step and of its prefill (the whole context in one forward, or one chunk;
    none for a synthetic fill). ``per_device`` > 1 (tensor parallelism on GPUs): weights and KV split over that
    many devices, the figure is one device's."""
    best = None
    for dt, p in points:
        q = 1 if p.kv_fill == "synthetic" else min(p.prefill_chunk or p.context_len, p.context_len)
        pred = max((predict_memory(spec, dt, p.concurrency, p.cache_len, False, n) for n in {1, q}),
                   key=lambda m: m.total_gb)  # fmt: skip
        pred = MemoryPrediction(pred.weights_gb / per_device, pred.kv_gb / per_device, pred.workspace_gb,
                                pred.kv_bytes_per_token)  # fmt: skip
        if best is None or pred.total_gb > best[0].total_gb:
            best = (pred, dt, p)
    return best


def check_sweep_memory(config, device: str, resident_bytes: int = 0, margin_gb: float | None = None) -> None:
    """``kit sweep``'s memory pre-flight: refuse before any work when the sweep's largest point
    (:func:`largest_point`) is predicted not to fit in the memory free now (:func:`available_memory`, plus
    ``resident_bytes``: a model the sweep frees before building its own) minus a margin (default
    :func:`default_margin_gb`). On the CPU an allocation past memory is not an error but the kernel's OOM killer
    (a 70B preset on a 24 GB host); on a GPU it is an OOM after minutes of building.

    Args:
        config: a validated :class:`kit.measure.sweep.SweepConfig` (``model``, ``trust_remote_code``, ``tp``,
            ``points()``). device: ``"cpu"`` or ``"cuda"``.

    Raises:
        UserError: one line naming the predicted and available bytes, the point, and how to override
            (``--no-guard``). A model the planner cannot size is let through (logged).
    """
    from kit.models import get_config
    from kit.plan.spec import get_spec

    try:
        spec = get_spec(get_config(config.model, config.trust_remote_code), f"default={config.dtypes[0]}")
    except UserError as e:
        log.warning("memory pre-flight skipped: the planner cannot size %s (%s)", config.model, e)
        return
    per_device = config.tp if device != "cpu" else 1  # on the CPU every rank shares the host's memory
    pred, dt, p = largest_point(spec, config.points(), per_device)
    free = available_memory(device)
    avail = free.free_gb * GB + resident_bytes
    source = free.source + (f" + {resident_bytes / GB:.2f} GB of a loaded model, freed first" if resident_bytes else "")
    margin = margin_gb if margin_gb is not None else default_margin_gb(free.total_gb)
    if pred.total_gb * GB <= avail - margin * GB:
        return
    raise UserError(
        f"memory pre-flight: the largest point ({dtypes.name_of(dt)} kv={p.context_len} B={p.concurrency}"
        f"{f' tp={config.tp}' if config.tp > 1 else ''}) needs a predicted {pred.total_gb * GB:,.0f} bytes (weights "
        f"{pred.weights_gb:.2f} + KV {pred.kv_gb:.2f} + workspace {pred.workspace_gb:.2f} GB) but "
        f"{avail:,.0f} bytes are available ({source}) minus a {margin:.2f} GB margin; refused before any "
        "work (smaller --kv / --concurrency / --dtype, more --tp GPUs, or --no-guard to run it anyway)"
    )


def alloc_conf_var(platform: str) -> str:
    """The allocator settings variable of a platform: ``PYTORCH_HIP_ALLOC_CONF`` on rocm, else
    ``PYTORCH_CUDA_ALLOC_CONF``."""
    return "PYTORCH_HIP_ALLOC_CONF" if platform == "rocm" else "PYTORCH_CUDA_ALLOC_CONF"


def expandable_segments(platform: str, env=None) -> bool | None:
    """Whether the allocator settings ask for expandable segments (None on cpu: no caching allocator)."""
    if platform == "cpu":
        return None
    env = os.environ if env is None else env
    items = dict(kv.split(":", 1) for kv in env.get(alloc_conf_var(platform), "").split(",") if ":" in kv)
    return items.get("expandable_segments", "False").strip().lower() == "true"


def set_expandable_segments(platform: str, on: bool, env=None) -> str:
    """Set ``expandable_segments:True|False`` in the platform's allocator variable (other settings kept) and, when
    CUDA is already initialised, in the running allocator (``torch.cuda.memory._set_allocator_settings``, the
    call the variable is parsed by). Returns the variable's new value.

    Raises:
        UserError: on cpu (there is no caching allocator to configure).
    """
    if platform == "cpu":
        raise UserError("expandable_segments applies to the CUDA/HIP caching allocator; this device is the CPU")
    env = os.environ if env is None else env
    var = alloc_conf_var(platform)
    items = [kv for kv in env.get(var, "").split(",") if kv and not kv.startswith("expandable_segments:")]
    items.append(f"expandable_segments:{'True' if on else 'False'}")
    env[var] = ",".join(items)
    if env is os.environ and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(f"expandable_segments:{'True' if on else 'False'}")
    return env[var]


def fragmentation_columns(stats: dict | None, retries_before: int = 0, expandable: bool | None = None) -> dict:
    """Row columns from ``torch.cuda.memory_stats()`` taken after a point (peaks since its reset), or the
    "not available" row on cpu (``stats`` None):

    ``x_mem_reserved_gb`` / ``x_mem_allocated_gb`` (peaks), ``x_inactive_split_gb`` (peak bytes in split blocks
    that are free but cannot serve a larger request), ``x_alloc_retries`` (cudaMalloc retries after freeing the
    cache during the point), ``x_frag_ratio`` = 1 − allocated peak / reserved peak, ``x_expandable_segments`` and
    ``x_alloc_stats`` (what the numbers are, or why there are none). Key names: PyTorch docs,
    ``torch.cuda.memory_stats``."""
    if stats is None:
        keys = ("x_mem_reserved_gb", "x_mem_allocated_gb", "x_inactive_split_gb", "x_alloc_retries", "x_frag_ratio")
        return {**dict.fromkeys(keys), "x_expandable_segments": None, "x_alloc_stats": NOT_AVAILABLE_CPU}
    reserved = float(stats.get("reserved_bytes.all.peak", 0))
    allocated = float(stats.get("allocated_bytes.all.peak", 0))
    return {
        "x_mem_reserved_gb": reserved / GB,
        "x_mem_allocated_gb": allocated / GB,
        "x_inactive_split_gb": float(stats.get("inactive_split_bytes.all.peak", 0)) / GB,
        "x_alloc_retries": int(stats.get("num_alloc_retries", 0)) - retries_before,
        "x_frag_ratio": 1.0 - allocated / reserved if reserved > 0 else None,
        "x_expandable_segments": expandable,
        "x_alloc_stats": "caching allocator peaks over the point (torch.cuda.memory_stats)",
    }


def reset_rss_peak() -> bool:
    """Reset this process's resident-set high-water mark (Linux: ``5`` to ``/proc/self/clear_refs``, which resets
    ``VmHWM`` and ``ru_maxrss``), so the next :func:`kit.hardware.peak_memory_gb` on cpu is the peak of what runs
    after it. Returns False where the kernel does not offer it (the peak is then the process's lifetime peak)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def allocator_stats(device: str | torch.device) -> dict | None:
    """``torch.cuda.memory_stats(device)`` on cuda/rocm, None on cpu."""
    dev = torch.device(device)
    return torch.cuda.memory_stats(dev) if dev.type == "cuda" else None
