"""``kit tour --check``: every lesson of the tour, headless, in order, with small settings: the kit's smoke test.

The playground generates a few tokens (in-process, or from ``url``); every other lesson runs its function
(:func:`kit.tour.lessons.run_lesson`) with the lesson's ``check`` settings. A lesson fails when its live result
does: an error event or no token (the playground), a non-finite number, a failing op, an exception. The first
failed lesson is named; the run goes on so every lesson's outcome is reported.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from dataclasses import dataclass

from kit.errors import UserError
from kit.tour.context import TourContext, finite
from kit.tour.generate import endpoint_tokens, in_process_tokens
from kit.tour.lessons import lessons, run_lesson


@dataclass
class LessonOutcome:
    """One lesson's outcome: ``lesson`` (id), ``title``, ``ok``, ``seconds``, ``line`` and ``problems``."""

    lesson: str
    title: str
    ok: bool
    seconds: float
    line: str
    problems: list

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def playground_events(
    ctx: TourContext,
    max_tokens: int,
    url: str | None = None,
    prompt: str | None = None,
    served_model=None,
    stall_s: float = 15.0,
) -> list:
    """The playground's events for one prompt (:mod:`kit.tour.generate`): from ``url`` when given (asking for
    ``served_model``, default the first model it lists), else in-process with ``ctx``'s model. A
    :class:`~kit.errors.UserError` becomes an ``error`` event; a stream silent for ``stall_s`` s is a stall (its
    message names ``--stall-timeout``)."""
    prompt = prompt or "The tour's smoke test: say something."
    events: list = []
    try:
        if url:

            async def collect():
                stop = asyncio.Event()
                async for ev in endpoint_tokens(
                    url, served_model, prompt, max_tokens, stop, stall_s=stall_s, stall_hint="raise --stall-timeout"
                ):
                    events.append(ev)

            asyncio.run(collect())
        else:
            loaded = ctx.models.get(ctx.model, ctx.dtype, ctx.device)
            in_process_tokens(loaded, prompt, max_tokens, threading.Event(), events.append)
    except UserError as e:
        events.append({"type": "error", "message": str(e)})
    return events


def judge_playground(events: list) -> tuple[str, list[str]]:
    """(line, problems) of a playground run: an error event, no token or a non-finite TTFT/TPOT is a problem."""
    problems = [ev["message"] for ev in events if ev.get("type") == "error"]
    toks = [ev for ev in events if ev.get("type") == "token"]
    summ = next((ev["summary"] for ev in events if ev.get("type") == "summary"), None)
    if not toks and not problems:
        problems.append("no tokens arrived")
    if summ is not None:
        bad = [k for k in ("ttft_ms", "e2el_ms") if not finite(summ.get(k))]
        if summ.get("output_tokens", 0) > 1 and not finite(summ.get("tpot_ms")):
            bad.append("tpot_ms")
        if bad:
            problems.append(f"non-finite {', '.join(bad)}")
    elif not problems:
        problems.append("the stream ended without a summary")
    line = summ["line"] if summ else (problems[0] if problems else "")
    return line, problems


def run_check(
    ctx: TourContext | None = None,
    url: str | None = None,
    on_lesson=None,
    served_model: str | None = None,
    stall_s: float = 15.0,
) -> list[LessonOutcome]:
    """Run every lesson headless with its ``check`` settings, in order; returns one :class:`LessonOutcome` each.
    ``url``: the playground's endpoint (``served_model``: the model id to ask it for; ``stall_s``: its stall timeout,
    s) instead of the in-process model.
    ``on_lesson(outcome)`` is called as each finishes. Bugs in a lesson are outcomes too (their traceback in the
    problem text), so one broken lesson does not hide the others."""
    ctx = ctx or TourContext()
    out = []
    for lesson in lessons(ctx.model):
        t0 = time.perf_counter()
        try:
            if lesson.id == "playground":
                line, problems = judge_playground(
                    playground_events(ctx, lesson.check["max_tokens"], url, served_model=served_model, stall_s=stall_s)
                )
            else:
                res = run_lesson(ctx, lesson.id, lesson.check)
                line, problems = res["line"], list(res["problems"])
                if res.get("noise"):  # the kit's noise verdict beside numbers a busy machine may have bent
                    line += f" [{res['noise']}]"
        except UserError as e:
            line, problems = str(e), [str(e)]
        except Exception as e:  # noqa: BLE001 - a bug in a lesson: reported with its traceback, the rest go on
            line, problems = f"{type(e).__name__}: {e}", [traceback.format_exc()]
        o = LessonOutcome(lesson.id, lesson.title, not problems, time.perf_counter() - t0, line, problems)
        out.append(o)
        if on_lesson is not None:
            on_lesson(o)
    return out
