"""The tour's lessons: each one screen with a few sentences, one live control (or a small set), and what you
should see; and the function that produces the lesson's numbers from the kit's own functions.

A lesson function (:mod:`kit.tour.measured`, :mod:`kit.tour.planned`) takes a
:class:`kit.tour.context.TourContext` and the control values as keyword arguments and returns a JSON-ready *result*
(:func:`kit.tour.context.result`): ``ok``, ``problems`` (what failed: no tokens, a non-finite number, a failing
op), ``line`` (one line of text), ``numbers`` (label → value with unit), ``chart`` (series of points, bars or stacked
bars the page draws as they are) and ``table`` (columns, rows). The page draws these and nothing else: every
number comes from here.

- *prefill vs decode*: :func:`kit.measure.engine.time_point` at growing prompt lengths (batch 1): TTFT (the
  prefill) grows with the prompt, ITL (a decode step) barely moves.
- *KV-cache length*: measured TPOT at growing contexts (``kv_fill="synthetic"``: no prefill needed) beside the
  planner's line (:func:`kit.plan.roofline.predict_point` on ``accelerator="local"``).
- *concurrency*: measured points at 1, 2, 4, ... users; per-user tok/s (:func:`kit.metrics.tok_s_per_stream`)
  and total tok/s (:func:`kit.metrics.decode_tok_s`), the knee by :func:`kit.view.analysis.concurrency_knee`.
- *will it fit*: :func:`kit.plan.fit.memory_fit` and its :meth:`~kit.plan.fit.FitResult.memory_parts`.
- *cost*: per catalog accelerator, the planner's grid over concurrency (:func:`kit.plan.roofline.predict_grid`),
  priced by :func:`kit.plan.cost.add_cost_columns` and read at one interactivity by
  :func:`kit.plan.cost.at_interactivity`.
- *is the stack sane*: :func:`kit.check.harness.check_op`, eager and compiled, per dtype.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kit.errors import UserError
from kit.tour.context import DEFAULT_MODEL, TourContext
from kit.tour.measured import concurrency, kv_length, longest_context, prefill_vs_decode, sanity
from kit.tour.planned import cost, will_it_fit

#: prompts the playground offers
SAMPLE_PROMPTS = (
    "Explain what a KV cache is, in one sentence.",
    "Write a haiku about memory bandwidth.",
    "List three reasons a long prompt makes the first token slower.",
    "Summarise: prefill processes the prompt in parallel; decode produces one token per step. " * 8,
)
#: what the in-process lessons measure with by default


@dataclass(frozen=True)
class Control:
    """One control of a lesson: ``kind`` slider | select | text | number; ``options`` for a select; ``min``,
    ``max``, ``step`` for a slider or number; ``log`` a slider whose steps double."""

    name: str
    label: str
    kind: str
    default: object
    min: float | None = None
    max: float | None = None
    step: float | None = None
    options: tuple = ()
    log: bool = False


@dataclass(frozen=True)
class Lesson:
    """One lesson: ``id``, ``title``, ``text`` (a few sentences), ``controls``, ``expect`` (what you should see),
    ``check`` (the small settings ``kit tour --check`` runs it with). The function is :data:`RUNNERS` [``id``]."""

    id: str
    title: str
    text: str
    controls: tuple[Control, ...]
    expect: str
    check: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The lesson as JSON for the page."""
        return asdict(self)


# ------------------------------------------------------------------------------------------------ the list
def _choices():
    from kit.catalog import load_catalog
    from kit.check.harness import OP_CHECKS
    from kit.models import PRESETS
    from kit.plan.spec import list_models

    return sorted(PRESETS), list_models(), [n for n in load_catalog().names if n != "CPU"], sorted(OP_CHECKS)


def lessons(model: str | None = None) -> list[Lesson]:
    """The lessons in order (the playground first); the context sliders end at what ``model`` (default: the tour's
    default model) can measure (:func:`kit.tour.measured.longest_context`).

    Raises:
        UserError: an unknown ``model``.
    """
    presets, ref_models, accels, ops = _choices()
    return measured_lessons(presets, longest_context(model or DEFAULT_MODEL)) + planning_lessons(
        ref_models, accels, ops
    )


def measured_lessons(presets, top: int = 16376) -> list[Lesson]:
    """The playground and the lessons that measure this machine (prefill vs decode, KV length, concurrency);
    ``presets``: the model presets the playground offers; ``top``: the longest context the model measures
    (the sliders' maximum; a log slider's last step is ``top`` itself)."""
    model_ctl = Control("model", "in-process model (a preset or a checkpoint directory)", "text", DEFAULT_MODEL,
                        options=tuple(presets))  # fmt: skip
    return [
        Lesson(
            "playground",
            "Playground",
            "Type a prompt and press Send. Tokens stream in as the model makes them. The first one waits for the "
            "prefill of the whole prompt: that wait is the TTFT (time to first token). Every later token is one "
            "decode step: the gap before it is its ITL (inter-token latency), drawn live in the strip chart. The "
            "source is the in-process model (a kit preset: random weights, so the text is noise but the timings "
            "are real; or a local checkpoint), any OpenAI-compatible endpoint URL, or a server the kit starts.",
            (
                Control("prompt", "prompt", "text", "Explain what a KV cache is, in one sentence."),
                Control("pick", "pick a prompt", "select", "", options=SAMPLE_PROMPTS),
                Control("source", "source", "select", "in-process", options=("in-process", "url", "sim", "launch")),
                model_ctl,
                Control("url", "endpoint URL (source url)", "text", ""),
                Control("max_tokens", "max tokens", "number", 48, 1, 4096, 1),
            ),
            "TTFT appears with the first token; the ITL strip is flat-ish; tok/s settles; at the end one summary "
            "line in the kit's terms (TTFT, TPOT, ITL p50/p90, E2E, tokens, tok/s). Stop ends it at once.",
            check={"max_tokens": 8},
        ),
        Lesson(
            "prefill",
            "Prefill vs decode",
            "The prompt is processed in one batch (prefill); each output token is one more step (decode). Move the "
            "prompt length: the kit measures one prefill and a few decode steps at this length and at 1/2, 1/4, "
            "1/8 of it.",
            (Control("prompt_len", "prompt length (tokens)", "slider", 512, 8, min(4096, top), 8, log=True),),
            "TTFT grows with the prompt (more tokens to prefill); ITL barely moves (one token per step, whatever "
            "the prompt). Each number is a median of repeats; on a busy machine (the noise line says so) a step "
            "the OS delays can still hide the trend at short prompts: press Run again.",
            check={"prompt_len": 64},
        ),
        Lesson(
            "kv",
            "KV-cache length",
            "Every decode step reads the whole KV cache: the keys and values of every earlier token. Move the "
            "context: the kit measures TPOT at that KV length (and shorter ones) and draws the planner's line "
            "for this machine beside it (from `kit calibrate`'s figures when this machine has them, else its "
            "catalog row: a gap between the lines is what calibration closes).",
            (Control("context", "context (tokens)", "slider", min(2048, top), 16, top, 16, log=True),),
            "TPOT rises with the context once the cache is a noticeable part of the bytes a step reads (on a "
            "small model at short contexts it is nearly flat: the weights dominate); the planner's dashed line "
            "follows the same trend. Medians of repeats; when the noise line shows, the machine is busy and "
            "differences smaller than that ratio mean nothing.",
            check={"context": 256},
        ),
        Lesson(
            "concurrency",
            "Concurrency",
            "More users decode in the same step: the weights are read once for all of them. Move the users: the "
            "kit measures one batch at 1, 2, 4, ... users.",
            (Control("users", "users", "slider", 16, 1, 64, 1, log=True),),
            "Per-user tok/s falls while total tok/s rises, until the step is no longer cheaper per user: the knee "
            "(marked) is where doubling the users stops buying throughput. A noisy machine (the noise line) can "
            "move the knee.",
            check={"users": 4},
        ),
    ]


def planning_lessons(ref_models, accels, ops) -> list[Lesson]:
    """Will it fit, what a million tokens cost (``ref_models`` and ``accels`` offered) and is the stack sane (``ops``
    offered)."""
    return [
        Lesson(
            "fit",
            "Will it fit",
            "Before any GPU: weights, runtime reserve and the KV cache of every user must fit in memory. Pick a "
            "model, an accelerator, GPUs, a context and users: the planner breaks the memory of one GPU down.",
            (
                Control("model", "model", "select", "llama-3.1-70b", options=tuple(ref_models)),
                Control("accelerator", "accelerator", "select", "MI355X", options=tuple(accels)),
                Control("n_gpus", "GPUs", "select", 1, options=(1, 2, 4, 8, 16)),
                Control("context", "context (tokens)", "slider", 8192, 512, 131072, 512, log=True),
                Control("users", "users", "slider", 32, 1, 1024, 1, log=True),
            ),
            "Weights are fixed; the KV part grows with users × context; past the usable memory it does not fit.",
            check={"model": "llama-3.1-8b", "accelerator": "H100", "context": 4096, "users": 8},
        ),
        Lesson(
            "cost",
            "What a million tokens cost",
            "Throughput per GPU buys cost; users want speed. Compare accelerators at the same interactivity "
            "(tok/s per user) along each one's Pareto front, at catalog prices or yours (NAME=$/GPU-hour).",
            (
                Control("model", "model", "select", "llama-3.1-70b", options=tuple(ref_models)),
                Control("interactivity", "tok/s per user", "slider", 50, 5, 400, 5),
                Control("n_gpus", "GPUs", "select", 8, options=(1, 2, 4, 8, 16)),
                Control("basis", "price basis", "select", "tco", options=("tco", "assumed-rental", "on-demand")),
                Control("prices", "your prices ($/GPU-hour)", "text", ""),
                Control("accelerators", "compare only (empty: all)", "text", ""),
            ),
            "$/Mtok per accelerator at that interactivity; asking for more tok/s per user costs more per token.",
            check={"model": "llama-3.1-8b", "accelerators": "MI355X,B300"},
        ),
        Lesson(
            "sanity",
            "Is the stack sane",
            "Before trusting any number: do this machine's sampling ops give the right answer, eager and under "
            "torch.compile, in each dtype? The kit checks one op against its float64 reference.",
            (
                Control("op", "op", "select", "top_k_renorm_prob", options=tuple(ops)),
                Control("dtypes", "dtypes", "text", "float32,bfloat16"),
            ),
            "PASS for every dtype and mode. A FAIL names the dtype, the mode and the first bad input.",
            check={"dtypes": "float32"},
        ),
    ]


#: lesson id → its function (the playground streams through :mod:`kit.tour.generate` instead)
RUNNERS = {
    "prefill": prefill_vs_decode,
    "kv": kv_length,
    "concurrency": concurrency,
    "fit": will_it_fit,
    "cost": cost,
    "sanity": sanity,
}


def run_lesson(ctx: TourContext, lesson_id: str, settings: dict) -> dict:
    """Run lesson ``lesson_id`` with ``settings`` (control values; unknown names refused).

    Raises:
        UserError: an unknown lesson or setting; what the lesson's function raises.
    """
    if lesson_id not in RUNNERS:
        raise UserError(f"unknown lesson {lesson_id!r}; lessons with a function: {', '.join(RUNNERS)}")
    import inspect

    fn = RUNNERS[lesson_id]
    allowed = [p for p in inspect.signature(fn).parameters if p != "ctx"]
    bad = [k for k in settings if k not in allowed]
    if bad:
        raise UserError(f"lesson {lesson_id!r}: unknown setting(s) {bad}; allowed: {allowed}")
    return fn(ctx, **settings)
