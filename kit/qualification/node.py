"""Qualify one node: run (or resume) the items, record them in the history database, write the report."""

from __future__ import annotations

import dataclasses

from kit.qualification.config import QualifyConfig
from kit.qualification.report import summary, write_report
from kit.qualification.run import run_items, verdict_line
from kit.qualification.verdicts import nothing_checked


def qualify(config: QualifyConfig | None = None, echo=print, **fields) -> dict:
    """Qualify this node: every item of ``config`` in order under its share of the budget, then the history row
    per item (``config.db``) and the report (``OUT/index.html``, ``OUT/qualify.json``).

    ``kit.qualify(out="results/q", budget_s=300)`` is the same as passing a :class:`QualifyConfig` with those
    fields. ``echo`` prints each choice and each item's verdict as it comes, then every item's verdict (those kept
    from an earlier run marked) and the overall one (``None``: silent).

    Returns:
        ``qualify.json``'s content: ``overall`` (pass | warn | fail; warn when nothing was checked), ``exit_code``
        (0 nothing failed, 1 something failed or nothing was checked), ``items`` (verdict, reason, threshold,
        figures, plots, raw_dir, headline, kept per item), ``plan``, ``machine``, ``comparison`` (with the
        previous qualification in ``db``, or None), ``report`` (the page).

    Raises:
        UserError / OutputPathError: bad settings, before any item runs. KeyboardInterrupt: after the finished
            items are saved (the same command again resumes them).
    """
    config = dataclasses.replace(config or QualifyConfig(), **fields)
    say = echo or (lambda *_: None)
    p, items, items_dir = run_items(config, say)
    comparison = None
    if config.db:
        from kit.qualification.history import record

        comparison = record(config.db, items_dir, p.device_name, [i["run_id"] for i in items])["comparison"]
        if comparison:
            say(f"kit qualify: {comparison['text']}")
    s = summary(p, items, items_dir.parent, config.budget_s, comparison)
    js, page = write_report(s, items_dir.parent)
    s["report"] = str(page)
    for i in items:  # every verdict, the kept ones too, and why each failed
        say(verdict_line(i["item"], i["verdict"], i["reason"], i.get("kept", False)))
    if nothing_checked(i["verdict"] for i in items):
        say("kit qualify: nothing was checked: every item was skipped (raise --budget, or see each item's reason)")
    say(f"kit qualify: {s['overall'].upper()} — report {page}, verdicts {js}")
    return s
