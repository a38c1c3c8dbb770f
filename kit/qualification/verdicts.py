"""Verdicts of the qualification's items: pure functions from an item's figures (plain dicts, what the
``kit.qualification.items_*`` modules measured) and the :class:`kit.qualification.config.Thresholds` to a
:class:`Verdict` naming the measured value and the threshold that decided it. Testable without measuring anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kit.qualification.config import Thresholds

VERDICTS = ("pass", "warn", "fail", "skip")


@dataclass(frozen=True)
class Verdict:
    """One item's verdict: ``verdict`` (pass | warn | fail | skip), ``reason`` (what was measured, or why skipped)
    and ``threshold`` (the rule that decided it, with its value; empty for a skip)."""

    verdict: str
    reason: str
    threshold: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def nothing_checked(verdicts) -> bool:
    """True when no item passed, warned or failed (every one skipped, or none at all): nothing was checked."""
    return not set(verdicts) & {"pass", "warn", "fail"}


def overall(verdicts) -> str:
    """The qualification's verdict: ``fail`` when any item failed, else ``warn`` when any warned or nothing was
    checked (:func:`nothing_checked`: a run of skips never reads pass), else ``pass`` (skips do not count)."""
    vs = set(verdicts)
    return "fail" if "fail" in vs else "warn" if "warn" in vs or nothing_checked(vs) else "pass"


def exit_code(verdicts) -> int:
    """0 when something was checked and nothing failed; 1 when something failed or nothing was checked (a CI gate
    must not pass on nothing); a user error is 2, raised before any item runs."""
    vs = list(verdicts)
    return 1 if overall(vs) == "fail" or nothing_checked(vs) else 0


def doctor_verdict(fig: dict, th: Thresholds) -> Verdict:
    """Fail on any problem ``kit doctor --strict`` fails on; warn on its warnings."""
    rule = "no problem of kit doctor --strict (missing kernel symbol, dtype or native fp8 that does not run, ...)"
    if fig["problems"]:
        return Verdict("fail", "; ".join(fig["problems"]), rule)
    if fig["warnings"]:
        return Verdict("warn", "; ".join(fig["warnings"]), rule + "; warnings warn")
    notes = fig.get("notes") or []
    note = f" (noted, expected of the format: {'; '.join(notes)})" if notes else ""
    return Verdict("pass", f"ready: {fig['summary']}{note}", rule + "; documented format behaviour is a note")


def ops_verdict(fig: dict, th: Thresholds) -> Verdict:
    """Fail when an op differs from the reference beyond tolerance in eager mode, or its compiled path differs
    from eager (eager matches the reference, compiled does not); warn when some compiled checks did not fit the
    budget or a library's sampler could not be called as the harness calls it. ``fig``: ``cells``,
    ``eager_failed`` and ``compile_failed`` (lists of cell dicts: op, dtype, mode, input, mismatches, detail),
    ``not_compiled`` (ops the budget did not reach), ``compile_capped`` (ops past ``--compile-ops``),
    ``eager_only``, ``library_not_checked`` (op → why)."""
    tol = f"mismatches <= {th.ops_max_mismatches:g} per op and dtype, atol/rtol of torch.testing per dtype"
    eager = [c for c in fig["eager_failed"] if c["mismatches"] > th.ops_max_mismatches]
    comp = [c for c in fig["compile_failed"] if c["mismatches"] > th.ops_max_mismatches]
    if eager:
        return Verdict("fail", "differs from the reference: " + "; ".join(map(_cell, eager[:4])), tol)
    if comp:
        why = "compiled differs from eager (eager matches the reference): " + "; ".join(map(_cell, comp[:4]))
        return Verdict("fail", why, tol + "; compiled == eager")
    if fig.get("library_not_checked"):
        why = "; ".join(f"{op}: {w}" for op, w in fig["library_not_checked"].items())
        return Verdict("warn", f"all other cells match; not checked: {why}", tol)
    if fig["not_compiled"]:
        why = f"compiled path not checked for {', '.join(fig['not_compiled'])}: the budget share was spent"
        return Verdict("warn", why, tol)
    capped = fig.get("compile_capped") or []
    modes = (
        "eager only (compiled checks off: --compile-ops 0)"
        if fig.get("eager_only")
        else f"eager, and compiled for all but {', '.join(capped)} (--compile-ops)"
        if capped
        else "eager and compiled"
    )
    return Verdict("pass", f"all {fig['cells']} cells match the reference, {modes}", tol)


def _cell(c: dict) -> str:
    return f"{c['op']} {c['dtype']} {c['mode']} input={c['input']}: {c['mismatches']} bad ({c['detail']})"


def points_verdict(fig: dict, limit: float, what: str) -> Verdict:
    """Fail when more than ``limit`` points are not ok (each named with its verdict and why); warn when the budget
    stopped the grid before every point ran; skip when no point ran. ``fig``: ``planned``, ``ran``, ``bad`` (list
    of ``{label, verdict, reason}``), ``headline`` text."""
    rule = f"points not ok (oom, error, failed requests, flagged invalid) <= {limit:g}"
    if fig["ran"] == 0:
        return Verdict("skip", f"no {what} point ran within the budget share")
    bad = fig["bad"]
    if len(bad) > limit:
        return Verdict("fail", "; ".join(f"{b['label']}: {b['verdict']} ({b['reason']})" for b in bad[:4]), rule)
    if fig["ran"] < fig["planned"]:
        return Verdict(
            "warn", f"{fig['ran']} of {fig['planned']} points ran within the budget; {fig['headline']}", rule
        )
    return Verdict("pass", fig["headline"], rule)


def kv_verdict(fig: dict, th: Thresholds) -> Verdict:
    """Fail when the largest context that decodes is below the target (the planner's capacity on this device, or
    the search's cap) by more than ``kv_shortfall``, or the cached decode step differs from an uncached forward;
    warn when the budget ended the search first. ``fig``: ``largest_ok``, ``target``, ``target_source``,
    ``smallest_failed``, ``failed_status``, ``done`` (the search ended), ``check`` (the correctness check)."""
    need = fig["target"] * (1 - th.kv_shortfall)
    rule = f"largest context >= (1 - kv_shortfall={th.kv_shortfall:g}) x target ({fig['target_source']})"
    got, check = fig["largest_ok"], fig.get("check")
    if check and not check.get("ok"):
        why = f"cached decode differs from an uncached forward at {check['context_len']:,} tokens"
        return Verdict("fail", f"{why} (max |diff| {check['max_abs_err']:.3g})", rule + "; cached == uncached")
    stop = f"; {fig['smallest_failed']:,} tokens did not ({fig['failed_status']})" if fig.get("smallest_failed") else ""
    if (got is None or got < need) and not fig.get("done", True):
        shown = "no context decoded yet" if got is None else f"largest context so far {got:,} tokens"
        return Verdict("warn", f"{shown}: the budget share ended the search before the target {fig['target']:,}", rule)
    if got is None or got < need:
        shown = "no context decoded" if got is None else f"largest context {got:,} tokens"
        return Verdict("fail", f"{shown} < {need:,.0f} (target {fig['target']:,}){stop}", rule)
    return Verdict("pass", f"largest context {got:,} tokens >= {need:,.0f} (target {fig['target']:,}){stop}", rule)


def comm_verdict(fig: dict, th: Thresholds) -> Verdict:
    """Fail when the best all_reduce busbw is below ``comm_min_busbw_fraction`` of the catalog's link figure; pass
    without a bandwidth judgement when the catalog has none (e.g. gloo on a CPU). ``fig``: ``busbw_gb_s``,
    ``catalog_busbw_gb_s``, ``ranks``, ``backend``."""
    got, ref = fig["busbw_gb_s"], fig.get("catalog_busbw_gb_s")
    rule = f"all_reduce busbw >= comm_min_busbw_fraction={th.comm_min_busbw_fraction:g} x catalog scale-up busbw"
    what = f"all_reduce busbw {got:.3g} GB/s over {fig['ranks']} {fig['backend']} ranks"
    if not ref:
        return Verdict("pass", f"{what}; no catalog link figure for this device: bandwidth not judged", rule)
    if got < th.comm_min_busbw_fraction * ref:
        return Verdict("fail", f"{what} < {th.comm_min_busbw_fraction:g} x {ref:g} GB/s (catalog)", rule)
    return Verdict("pass", f"{what} = {got / ref:.0%} of the catalog's {ref:g} GB/s", rule)


def power_verdict(fig: dict, th: Thresholds) -> Verdict:
    """Skip when no power reader works (the reason is the reader's); warn when a point was throttled or drew more
    than ``power_max_pct_tdp`` percent of TDP. ``fig``: ``status``, ``j_per_output_token``, ``avg_power_w``,
    ``pct_tdp_max``, ``throttled``."""
    if not str(fig["status"]).startswith("ok"):
        return Verdict("skip", f"no power reader: {fig['status']}")
    rule = f"not throttled; average power <= power_max_pct_tdp={th.power_max_pct_tdp:g} % of TDP"
    j = fig["j_per_output_token"]
    what = f"{j:.4g} J per output token at {fig['avg_power_w']:.4g} W" if j is not None else "no energy figure"
    if fig.get("throttled"):
        return Verdict("warn", f"{what}; throttled (clock below 85 % of max at the power limit)", rule)
    pct = fig.get("pct_tdp_max")
    if pct is not None and pct > th.power_max_pct_tdp:
        return Verdict("warn", f"{what}; {pct:.0f} % of TDP", rule)
    return Verdict("pass", what, rule)


def calibrate_verdict(fig: dict, th: Thresholds) -> Verdict:
    """Fail when measured copy bandwidth or matmul TFLOPS is below its fraction of the catalog figure for this
    device; pass without judgement when the device has no catalog row. ``fig``: ``copy_gb_s``, ``catalog_gb_s``,
    ``tflops``, ``catalog_tflops``, ``dtype``."""
    rule = (
        f"copy GB/s >= calib_min_bw_fraction={th.calib_min_bw_fraction:g} x catalog; matmul TFLOPS >= "
        f"calib_min_tflops_fraction={th.calib_min_tflops_fraction:g} x catalog dense peak"
    )
    what = f"copy {fig['copy_gb_s']:.4g} GB/s, {fig['dtype']} matmul {fig['tflops'] or 0:.4g} TFLOPS"
    if not fig.get("catalog_gb_s"):
        return Verdict("pass", f"{what}; no catalog figures for this device: not judged", rule)
    bad = []
    if fig["copy_gb_s"] < th.calib_min_bw_fraction * fig["catalog_gb_s"]:
        bad.append(f"copy {fig['copy_gb_s']:.4g} GB/s < {th.calib_min_bw_fraction:g} x {fig['catalog_gb_s']:g}")
    ref = fig.get("catalog_tflops")
    if ref and (fig["tflops"] or 0) < th.calib_min_tflops_fraction * ref:
        bad.append(f"matmul {fig['tflops'] or 0:.4g} TFLOPS < {th.calib_min_tflops_fraction:g} x {ref:g}")
    if bad:
        return Verdict("fail", "; ".join(bad), rule)
    return Verdict("pass", f"{what} (catalog {fig['catalog_gb_s']:g} GB/s, {ref or '-'} TFLOPS)", rule)


def planner_verdict(fig: dict, th: Thresholds) -> Verdict:
    """Measured / predicted decode tok/s, two-sided: fail when the worst point is below ``planner_fail_fraction``
    of the planner's prediction, warn below ``planner_warn_fraction`` or when a point is above
    ``planner_high_ratio`` times it (faster than the calibration allows: one of them is wrong). At most a warn when
    the seed workload ran on a noisy or busy machine (``noisy``: why), and only a warn, not judged, when the
    measurement and the calibration come from different runs (``mixed``: why; after a resume). ``fig``:
    ``worst_ratio``, ``worst_label``, ``best_ratio``, ``best_label``, ``points``, ``noisy``, ``mixed``."""
    r, hi = fig["worst_ratio"], fig.get("best_ratio", fig["worst_ratio"])
    rule = (
        f"planner_fail_fraction={th.planner_fail_fraction:g} <= measured / predicted decode tok/s (warn below "
        f"planner_warn_fraction={th.planner_warn_fraction:g} or above planner_high_ratio={th.planner_high_ratio:g}); "
        "seed and calibration of one run; at most warn on a noisy machine"
    )
    what = f"measured {r:.0%} of predicted at {fig['worst_label']}"
    if fig.get("best_label") and fig["best_label"] != fig["worst_label"]:
        what += f", {hi:.0%} at {fig['best_label']}"
    what += f" ({fig['points']} points)"
    if fig.get("mixed"):
        return Verdict("warn", f"not judged: {fig['mixed']} ({what}); re-run with --no-resume to compare", rule)
    if r < th.planner_fail_fraction:
        v = Verdict("fail", what, rule)
    elif r < th.planner_warn_fraction:
        v = Verdict("warn", what, rule)
    elif hi > th.planner_high_ratio:
        v = Verdict("warn", f"{what}: above the prediction, so the calibration or the measurement is wrong", rule)
    else:
        v = Verdict("pass", what, rule)
    if fig.get("noisy") and v.verdict != "pass":
        return Verdict("warn", f"{v.reason}; at most a warn: {fig['noisy']}", rule)
    return v


def with_overrun(v: Verdict, elapsed_s: float, share_s: float, th: Thresholds) -> Verdict:
    """A pass becomes a warn when the item took more than ``overrun_warn`` times its budget share."""
    if v.verdict == "pass" and share_s > 0 and elapsed_s > th.overrun_warn * share_s:
        return Verdict(
            "warn",
            f"{v.reason}; took {elapsed_s:.0f} s of a {share_s:.0f} s share",
            f"{v.threshold}; elapsed <= overrun_warn={th.overrun_warn:g} x share",
        )
    return v
