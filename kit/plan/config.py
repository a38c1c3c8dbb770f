"""The planner's settings: :class:`PredictConfig`, the deployment and the assumptions one prediction is made under.

One object instead of two dozen keyword arguments: :func:`kit.plan.roofline.predict_point`,
:func:`~kit.plan.roofline.predict_grid`, :func:`~kit.plan.roofline.predict_like`,
:class:`~kit.plan.roofline.PlannerBackend`, :func:`kit.plan.fit.memory_fit` and :func:`kit.plan.fit.min_gpus`
all take it, so a deployment described once is predicted, fitted and stored the same way everywhere. Every field
has a default; ``None`` means "derived" (from the device, the model or another field, as each field says).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kit import dtypes
from kit.errors import UserError
from kit.plan.device import DeviceModel, get_device_model

if TYPE_CHECKING:
    from kit.catalog import Catalog
    from kit.plan.spec import ArchSpec

DEFAULT_MEM_UTIL = 0.90  # fraction of device memory the engine may use (vLLM's gpu_memory_utilization default)
DEFAULT_MAX_BATCHED_TOKENS = 8192  # tokens of one forward the activation workspace is sized for (an assumption)


@dataclass(frozen=True)
class PredictConfig:
    """Where and how a model is served, as the planner assumes it. Checked where it is used (a bad value raises
    :class:`kit.errors.UserError` from :func:`kit.plan.roofline.predict_point` / :func:`kit.plan.fit.memory_fit`,
    naming the value and what is allowed). Deployment first, then dtypes (names or aliases of :mod:`kit.dtypes`),
    memory (:func:`kit.plan.fit.memory_fit`), step time (:func:`kit.plan.decode.decode_step`) and rows.

    Attributes:
        accelerator: catalog name (``"MI355X"``, ``"B300"``, ``"H200"``, ...) or ``"local"`` / ``"cpu"`` (this
            machine: its ``kit calibrate`` figures, else its catalog row). Ignored when ``device_model`` is given.
        n_gpus: accelerators in total (tp × pp).
        tp, ep, pp: tensor-, expert- and pipeline-parallel sizes; None: tp = min(n_gpus, GPUs per node),
            pp = n_gpus // tp, ep = tp for a MoE model and 1 for a dense one (:func:`kit.plan.fit.parallel_layout`).
        device_model: a ready :class:`kit.plan.device.DeviceModel` (wins over ``accelerator``, ``catalog`` and
            ``calibration``). catalog: a :class:`kit.catalog.Catalog` to look ``accelerator`` up in (default: the
            kit's). calibration: a ``kit calibrate`` result (dict or JSON path) describing the device (wins over
            ``accelerator``).
        comm_calibration: a ``kit comm --save-links`` measurement (dict or JSON path) replacing the catalog's link
            latency α (µs) and bus bandwidth (GB/s).
        dtype: one dtype for weights, KV cache, activations and compute (the in-process engine's setting); the
            finer fields below win over it.
        weight_dtypes: per-group weight dtypes, text (``"default=bf16;routed_experts=mxfp4"``) or a dict; None:
            the model's published dtypes (or ``default=dtype``).
        kv_dtype: KV-cache dtype; None: ``dtype``, else bfloat16.
        state_dtype: dtype of a linear-attention / recurrent state (default bfloat16).
        compute_dtype: which TFLOPS figure applies; None: the attention weights' dtype.
        act_dtype: activations (collective message sizes); None: ``dtype``, else bfloat16.
        mem_util: fraction of device memory usable, in (0, 1] (default :data:`DEFAULT_MEM_UTIL`).
        reserve_gb: GB per GPU kept outside weights and KV; None: runtime (2 GB on GPUs, 0 on CPU) + the
            activation workspace of ``max_batched_tokens`` tokens.
        max_batched_tokens: tokens per forward the workspace is sized for.
        eff_bw, eff_flops: fractions of the device's peak bandwidth / TFLOPS, in (0, 1]; None: the device's
            (0.7 / 0.6 for catalog figures, 1.0 for a calibration).
        overhead_ms: per decode step, ms, >= 0; None: the device's fixed + per-layer overhead.
        attend_len: positions each decode step attends over; None: the context length (the kit's engine attends
            over its whole static cache, ``context_len + decode_steps``). Prefill attention is then C × attend_len.
        prefill: also predict the batch prefill (``prefill_ms``, ``ttft_ms``, ``prefill_tok_s``).
        spec_k, spec_accept, draft_layers: speculative decoding — draft tokens per verify step (None/0: off),
            mean tokens emitted per verify step in [1, k + 1] (default 1.85 capped at k + 1), decoder layers of
            the draft (:mod:`kit.plan.decode`).
        stack: the serving stack's profile (:mod:`kit.plan.stack`): a name in ``kit/data/stacks.csv``, ``"local"``
            (the calibration's), ``"none"``, a dict or a :class:`kit.plan.stack.StackProfile`; None: the
            calibration's local profile, else the profile marked default for the accelerator, else none.
        speculative: run speculative decoding as the stack does (its method, k, acceptance and draft), where the
            stack runs it with the layout (else off, and the row says why); ``spec_k`` / ``spec_accept`` given
            win over the stack's figures.
        model_label: the ``model`` column of predicted rows (default: the model's name).
    """

    accelerator: str = "local"
    n_gpus: int = 1
    tp: int | None = None
    ep: int | None = None
    pp: int | None = None
    device_model: DeviceModel | None = None
    catalog: Catalog | None = None
    calibration: dict | str | Path | None = None
    comm_calibration: dict | str | Path | None = None
    dtype: str | None = None
    weight_dtypes: str | dict | None = None
    kv_dtype: str | None = None
    state_dtype: str = "bfloat16"
    compute_dtype: str | None = None
    act_dtype: str | None = None
    mem_util: float = DEFAULT_MEM_UTIL
    reserve_gb: float | None = None
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    eff_bw: float | None = None
    eff_flops: float | None = None
    overhead_ms: float | None = None
    attend_len: int | None = None
    prefill: bool = True
    spec_k: int | None = None
    spec_accept: float | None = None
    draft_layers: int = 1
    stack: object = None
    speculative: bool = False
    model_label: str | None = None

    def device(self) -> DeviceModel:
        """``device_model``, else the one :func:`kit.plan.device.get_device_model` builds from ``accelerator``,
        ``catalog`` and ``calibration`` (without ``comm_calibration``).

        Raises:
            UnknownNameError: unknown accelerator. InputNotFoundError: a calibration path that does not exist.
        """
        if self.device_model is not None:
            return self.device_model
        return get_device_model(self.accelerator, catalog=self.catalog, calibration=self.calibration)

    def dtypes(self, spec: ArchSpec) -> tuple[dict[str, str], str, str, str]:
        """``(weight dtype per group, kv_dtype, act_dtype, compute_dtype)`` settled for ``spec``, canonical names.

        Raises:
            UserError: an unknown dtype or weight group.
        """
        weights = self.weight_dtypes
        dtype = None if self.dtype is None else dtypes.canonical(self.dtype)
        if dtype is not None:
            weights = weights or f"default={dtype}"
        dts = spec.dtypes(weights)
        kv = dtypes.canonical(self.kv_dtype or dtype or "bfloat16")
        act = dtypes.canonical(self.act_dtype or dtype or "bfloat16")
        return dts, kv, act, dtypes.canonical(self.compute_dtype or dts["attn"])


def as_predict_config(config) -> PredictConfig:
    """``config``, or the default :class:`PredictConfig` for None.

    Raises:
        UserError: anything else (e.g. an accelerator name where the config goes), naming it and what to pass.
    """
    if config is None:
        return PredictConfig()
    if not isinstance(config, PredictConfig):
        hint = f"PredictConfig(accelerator={config!r})" if isinstance(config, str) else "PredictConfig(...)"
        raise UserError(f"config={config!r}: give a PredictConfig, e.g. {hint}, or None")
    return config
