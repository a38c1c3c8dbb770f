"""`kit kv-stress` end to end in-process (table, figures, refused probes, exit codes), the stress figures, and the
memory guard's pieces: cgroup limits, allocator settings, fragmentation columns (issue 13)."""

from __future__ import annotations

import os

import matplotlib
import pytest

from kit.cli import main
from kit.measure import memguard
from kit.plan.spec import get_spec
from kit.results import to_frame
from kit.store import load_results
from kit.view.stress_plots import fit_tpot_per_token, memory_vs_context, tpot_vs_context_fit

matplotlib.use("Agg")
SMALL = ["--start", "64", "--max-context", "128", "--decode-steps", "2", "--warmup-steps", "1", "--repeats", "1"]


def test_cli_prints_the_table_and_writes_the_figures(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["kv-stress", *SMALL, "--check-context", "64", "--threads", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "largest context that decodes: 128 tokens" in text and "pred_peak_GB" in text and "n/a" in text
    assert "within float32 tolerance" in text and "ns per token of context" in text
    for png in ("memory_vs_context.png", "tpot_vs_context.png"):
        assert (out / png).stat().st_size > 10_000
    assert len(load_results(out)) == 2


def test_cli_far_beyond_memory_refuses_and_lives_on(tmp_path, capsys):
    args = ["kv-stress", "--batch", "64", "--start", "1048576", "--max-probes", "2", "--check-context", "0"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.count(" refused ") == 2 and "stopped after 2 probes" in text
    assert "no context decoded: the smallest probe, 524,288 tokens, did not (refused)" in text
    df = load_results(tmp_path)
    assert list(df.status) == ["refused", "refused"] and (df.x_pred_total_gb > df.x_avail_gb).all()


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["kv-stress", "--start", "0", "--out", str(tmp_path)]) == 2
    assert "start=0" in capsys.readouterr().err
    assert main(["kv-stress", "--expandable-segments", "--out", str(tmp_path)]) == 2
    assert "GPUs" in capsys.readouterr().err


def rows():
    """Four probes of a stress: three ok, then one refused."""
    base = dict(backend="engine", model="m", dtype="float32", concurrency=1, device="cpu", x_limit_gb=10.0)
    recs = [
        dict(base, status="ok", context_len=c, peak_mem_gb=0.5 + c * 2e-6, x_pred_peak_gb=0.5 + c * 2.05e-6,
             tpot_ms_p50=1.0 + c * 1e-3, tpot_ms_p90=1.2 + c * 1e-3)
        for c in (1024, 4096, 16384)
    ]  # fmt: skip
    recs.append(dict(base, status="refused", context_len=65536, x_pred_peak_gb=12.0))
    return to_frame(recs)


def test_tpot_fit_recovers_the_per_token_slope():
    fit = fit_tpot_per_token(rows())
    assert (
        fit["n"] == 3 and fit["slope_ns_per_token"] == pytest.approx(1000) and fit["intercept_ms"] == pytest.approx(1)
    )
    assert fit_tpot_per_token(rows().iloc[:1]) is None


def test_stress_figures_draw_prediction_limit_refused_region_and_fit(tmp_path):
    fig = memory_vs_context(rows())
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["predicted peak (guard)", "measured peak (ok)", "limit 10.0 GB", "refused (no fit)"]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and len(ax.patches) == 1  # the refused span
    fig.savefig(tmp_path / "m.png")
    fig = tpot_vs_context_fit(rows())
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[0].startswith("fit: 1 ms + 1e+03 ns/token") and fig.axes[0].get_yscale() == "log"
    fig.savefig(tmp_path / "t.png")
    assert (tmp_path / "m.png").stat().st_size > 10_000 and (tmp_path / "t.png").stat().st_size > 10_000


def _cgroup_tree(tmp_path, proc_lines: str, mounts: list[tuple[str, str, str]], files: dict[str, str]):
    """A fake /proc/self/cgroup, /proc/self/mountinfo (``(root, mount point under tmp_path, fstype + options)``)
    and cgroup files (path under tmp_path → content); returns the two /proc paths."""
    proc, info = tmp_path / "proc-cgroup", tmp_path / "mountinfo"
    proc.write_text(proc_lines)
    esc = lambda path: str(path).replace(" ", "\\040")  # mountinfo's escape of a space
    info.write_text("".join(f"3{i} 23 0:4{i} {root} {esc(tmp_path / point)} rw - {kind}\n" for i, (root, point, kind)
                            in enumerate(mounts)))  # fmt: skip
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return proc, info


NO_LIMIT_V1 = str(2**63 - 4096)
V1_MOUNTS = [("/", "cg/cpu", "cgroup cgroup rw,cpu"), ("/", "cg/memory", "cgroup cgroup rw,memory"),
             ("/", "cg/unified", "cgroup2 cgroup2 rw")]  # fmt: skip


def test_cgroup_v1_reads_the_process_s_own_group_not_the_hierarchy_root(tmp_path):
    """Issue 28: a 5 GiB v1 group on a host whose hierarchy root has no limit read as "no limit" (20 GB free).
    The process's group comes from /proc/self/cgroup + the memory mount: 5 GiB, working set 1.5 - 0.5 GB."""
    proc, info = _cgroup_tree(
        tmp_path,
        "9:cpu:/\n4:memory:/process_api/e77e\n0::/\n",
        V1_MOUNTS,
        {
            "cg/memory/memory.limit_in_bytes": NO_LIMIT_V1,  # the hierarchy root: no limit
            "cg/memory/memory.usage_in_bytes": "9000000000",
            "cg/memory/process_api/memory.limit_in_bytes": NO_LIMIT_V1,
            "cg/memory/process_api/e77e/memory.limit_in_bytes": str(5 * 2**30),
            "cg/memory/process_api/e77e/memory.usage_in_bytes": "1500000000",
            "cg/memory/process_api/e77e/memory.stat": "cache 1\ntotal_inactive_file 500000000\n",
        },
    )
    assert memguard.cgroup_memory(proc, info) == (5 * 2**30, 1_000_000_000)
    # a tighter ancestor wins (its room, 3 GB - 2 GB, is less than the group's own)
    (tmp_path / "cg/memory/process_api/memory.limit_in_bytes").write_text("3000000000")
    (tmp_path / "cg/memory/process_api/memory.usage_in_bytes").write_text("2000000000")
    assert memguard.cgroup_memory(proc, info) == (3_000_000_000, 2_000_000_000)


def test_cgroup_v1_container_mount_and_hierarchical_limit(tmp_path):
    """A container without a cgroup namespace: the mount's root is the container's own path, so its group is the
    mount point; a limit set above the mount shows as memory.stat's hierarchical_memory_limit."""
    proc, info = _cgroup_tree(
        tmp_path,
        "4:memory:/docker/abc\n",
        [("/docker/abc", "cg space/memory", "cgroup cgroup rw,memory")],  # a space in the path: \040 in mountinfo
        {
            "cg space/memory/memory.limit_in_bytes": NO_LIMIT_V1,
            "cg space/memory/memory.usage_in_bytes": "1000000000",
            "cg space/memory/memory.stat": "hierarchical_memory_limit 4000000000\ntotal_inactive_file 0\n",
        },
    )
    assert memguard.cgroup_memory(proc, info) == (4_000_000_000, 1_000_000_000)
    (tmp_path / "cg space/memory/memory.stat").write_text(f"hierarchical_memory_limit {NO_LIMIT_V1}\n")
    assert memguard.cgroup_memory(proc, info) is None  # v1's "no limit" at every level


def test_cgroup_v2_own_group_and_parents(tmp_path):
    proc, info = _cgroup_tree(
        tmp_path,
        "0::/user.slice/job\n",
        [("/", "cg2", "cgroup2 cgroup2 rw,nsdelegate")],
        {
            "cg2/user.slice/job/memory.max": "8000000000\n",
            "cg2/user.slice/job/memory.current": "3000000000\n",
            "cg2/user.slice/job/memory.stat": "anon 1\ninactive_file 1000000000\n",
            "cg2/user.slice/memory.max": "max\n",
        },
    )
    assert memguard.cgroup_memory(proc, info) == (8_000_000_000, 2_000_000_000)
    (tmp_path / "cg2/user.slice/job/memory.max").write_text("max\n")
    assert memguard.cgroup_memory(proc, info) is None
    (tmp_path / "cg2/user.slice/memory.max").write_text("6000000000\n")  # the parent's limit applies
    (tmp_path / "cg2/user.slice/memory.current").write_text("5000000000\n")
    assert memguard.cgroup_memory(proc, info) == (6_000_000_000, 5_000_000_000)
    assert memguard.cgroup_memory(tmp_path / "missing", info) is None  # not Linux, or /proc unreadable


def test_free_memory_on_this_cpu_and_the_refusal_text():
    free = memguard.available_memory("cpu")
    assert 0 < free.free_gb <= free.total_gb and free.source
    pred = memguard.predict_memory(get_spec("tiny-llama"), "float32", 64, 1_048_576)
    assert pred.kv_bytes_per_token == 2048 and pred.kv_gb == pytest.approx(64 * 2**20 * 2048 / 1e9)
    why = memguard.refusal(pred, memguard.FreeMemory(20.0, 24.0, "MemAvailable"), 1.2)
    assert why.startswith("refused by the memory guard: predicted 141.") and "KV 137.44" in why
    assert "available 20.00 GB (MemAvailable) minus a 1.20 GB margin" in why
    small = memguard.predict_memory(get_spec("tiny-llama"), "float32", 1, 1024, weights_resident=True)
    assert small.weights_gb == 0 and memguard.refusal(small, free, 1.0) is None
    assert memguard.default_margin_gb(24.0) == pytest.approx(1.2) and memguard.default_margin_gb(4.0) == 1.0


def test_expandable_segments_setting_and_fragmentation_columns():
    env = {"PYTORCH_HIP_ALLOC_CONF": "garbage_collection_threshold:0.8,expandable_segments:False"}
    assert memguard.expandable_segments("rocm", env) is False and memguard.expandable_segments("cpu", env) is None
    value = memguard.set_expandable_segments("rocm", True, env)
    assert value == "garbage_collection_threshold:0.8,expandable_segments:True" and memguard.expandable_segments(
        "rocm", env
    )
    assert memguard.set_expandable_segments("cuda", True, env) == "expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ or env is not os.environ
    stats = {"reserved_bytes.all.peak": 4e9, "allocated_bytes.all.peak": 3e9, "inactive_split_bytes.all.peak": 5e8,
             "num_alloc_retries": 7}  # fmt: skip
    cols = memguard.fragmentation_columns(stats, retries_before=5, expandable=True)
    assert cols["x_frag_ratio"] == pytest.approx(0.25) and cols["x_alloc_retries"] == 2
    assert cols["x_inactive_split_gb"] == 0.5 and cols["x_mem_reserved_gb"] == 4.0 and cols["x_expandable_segments"]
    cpu = memguard.fragmentation_columns(None)
    assert cpu["x_frag_ratio"] is None and cpu["x_alloc_stats"].startswith("not available")


def test_fit_line_says_when_the_slope_is_noise():
    """Issue 22: kv-stress printed "-710 ns per token of context" as if it were the cost of context. A negative
    slope is noise, a slope within two standard errors of 0 is indistinguishable from 0; a clear one stays plain."""
    from kit.measure.stress_cli import fit_line

    def probes(tpots):
        base = dict(backend="engine", model="m", dtype="float32", concurrency=1, device="cpu", status="ok")
        return to_frame([dict(base, context_len=c, tpot_ms_p50=t) for c, t in zip((1024, 4096, 16384, 65536), tpots)])

    falling = fit_line(probes([2.6, 2.4, 2.5, 2.2]))  # the scatter of a busy 2-core machine
    assert "ns per token of context (2 standard errors)" in falling and " + -" in falling
    assert "a negative slope is noise" in falling and "a longer context never makes a decode step cheaper" in falling
    assert "read the figure, not the fit" in falling
    flat = fit_line(probes([2.0, 2.3, 1.9, 2.1]))
    assert "not distinguishable from 0 given the probes' scatter" in flat and "negative slope" not in flat
    clear = fit_line(rows())  # 1 ms + 1,000 ns per token exactly: resolved, nothing to add
    assert clear.startswith("TPOT fit over 3 ok probes: 1 ms + 1e+03 ± ") and clear.endswith("(2 standard errors)")
    two = fit_line(rows().iloc[:2])
    assert "two probes leave no scatter to judge the slope by" in two
    assert fit_line(rows().iloc[:1]) is None


def test_a_full_disk_while_writing_the_figures_is_one_line(tmp_path, capsys, monkeypatch):
    """Issue 28: kv-stress on a full disk ended in an OSError traceback from matplotlib (ENOSPC while writing a
    PNG). Now one line naming the file, exit 2; the probes are already stored."""
    from matplotlib.figure import Figure

    def full(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    out = tmp_path / "run"
    assert main(["kv-stress", *SMALL, "--check-context", "0", "--threads", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"kit kv-stress: error: cannot write {out / 'memory_vs_context.png'}: No space left on device"
    assert len(load_results(out)) == 2 and not list(out.glob(".*.tmp"))
