"""kit.track: the DuckDB history (real file), the compare's statistics on simulated runs with known slowdowns,
the CLI's exit codes, and ``kit sweep --runs N`` with the slowdown test hook."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pandas as pd
import pytest
from simulated_runs import simulated_history, write_simulated_run

from kit.cli import main
from kit.errors import UnknownNameError, UserError
from kit.track.compare import compare, compare_frames, interval
from kit.track.db import Provenance, add_run, git_provenance, list_runs, load_rows
from kit.track.rows import frames_of
from kit.track.simulate import Noise, simulated_records


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """12 simulated commits (5 % step noise, 3 runs each); a 10 % slowdown of the B=4 points from commit 7."""
    root = tmp_path_factory.mktemp("hist")
    db = root / "h.duckdb"
    runs = simulated_history(root / "runs", commits=12, slow_at=7, slowdown=0.10, noise=Noise(step_noise=0.05))
    for commit, run in runs:
        add_run(db, run, Provenance(commit, "main", False))
    return db, runs


def test_same_run_twice_is_stored_once_with_raw_samples(history, tmp_path):
    db, runs = history
    again = add_run(db, runs[0][1], Provenance("c01"))
    assert again["rows_added"] == 0 and again["rows_known"] == 12
    with pytest.raises(UserError, match="already in .* under commit c01, not c99"):  # not silently "under c99"
        add_run(db, runs[0][1], Provenance("c99"))
    assert "c99" not in set(list_runs(db).commit)
    con = duckdb.connect(str(db), read_only=True)
    try:
        n_rows = con.execute("SELECT count(*) FROM rows").fetchone()[0]
        steps = con.execute(
            "SELECT count(*), count(DISTINCT block) FROM samples s JOIN rows r USING (row_key) "
            "WHERE r.run_key = ? AND s.metric = 'tpot_ms' AND r.point_key = 'sim-kv128-b1'",
            [again["runs"][0]],
        ).fetchone()
        row = json.loads(con.execute("SELECT row_json FROM rows LIMIT 1").fetchone()[0])
    finally:
        con.close()
    assert n_rows == 12 * 12
    assert steps == (3 * 3 * 16, 3)  # 3 replicates x 3 repeats x 16 steps, blocks = repeats
    assert len(row["x_step_ms"]) == 48 and row["backend"] == "engine"  # the whole row is kept
    runs_df = list_runs(db)
    assert list(runs_df.commit) == [f"c{i:02d}" for i in range(1, 13)]
    assert set(runs_df.replicates) == {3} and (runs_df.branch == "main").all()
    assert json.loads(runs_df.versions[0])["transformers"]


def test_twelve_commits_flag_the_slowdown_at_commit_7_only(history):
    db, runs = history
    names = [c for c, _ in runs]
    for prev, cur in zip(names, names[1:]):
        cmp = compare(db, prev, cur)
        if cur == "c07":
            assert cmp.exit_code == 1
            assert cmp.regressed_points == ["simulated float32 kv=128 B=4", "simulated float32 kv=512 B=4"]
            t = cmp.table.set_index(["point_key", "metric"])
            assert t.loc[("sim-kv128-b4", "tpot_ms"), "ci_low"] > 0.03
            assert 0.05 < t.loc[("sim-kv128-b4", "tpot_ms"), "change"] < 0.15
        else:
            assert cmp.exit_code == 0, (prev, cur, cmp.regressed_points)
    md = compare(db, "c06", "c07").to_markdown()
    assert "2 point(s) regressed" in md and md.count("🔴") >= 4


def test_cli_compare_exit_codes_json_and_markdown(history, tmp_path, capsys):
    db, _ = history
    md = tmp_path / "summary.md"
    assert main(["history", "compare", "c06", "c07", "--db", str(db), "--json", "--markdown", str(md)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 1 and len(doc["regressed_points"]) == 2 and len(doc["rows"]) == 16
    assert md.read_text().startswith("### kit history compare `c06` → `c07`")
    assert main(["history", "compare", "c07", "c08", "--db", str(db)]) == 0
    assert "no regression" in capsys.readouterr().out
    assert main(["history", "compare", "c07", "nope", "--db", str(db)]) == 2
    assert "'nope' is no commit, tag or run id" in capsys.readouterr().err
    assert main(["history", "compare", "c07", "c07", "--db", str(db)]) == 2
    assert main(["history", "compare", "c06", "c07", "--db", str(tmp_path / "none.duckdb")]) == 2
    assert main(["history", "list", "--db", str(db)]) == 0
    assert "c12" in capsys.readouterr().out


def test_refs_resolve_commit_prefix_tag_and_run_key(tmp_path):
    db = tmp_path / "h.duckdb"
    rng = np.random.default_rng(1)
    for i, (sha, tag) in enumerate((("abcdef1234", "v1"), ("abcd99ffff", None), ("1234abcd00", "v2"))):
        recs = simulated_records(rng, run_id=f"2025-01-0{i + 1}T00:00:00+00:00", runs=2)
        add_run(db, write_simulated_run(tmp_path / sha, recs), Provenance(sha, tag=tag))
    runs = list_runs(db)
    assert compare(db, "v1", "1234ab").head == "1234ab"
    assert compare(db, runs.run_key[0], "v2").exit_code == 0
    with pytest.raises(UnknownNameError, match="several commits"):
        compare(db, "abcd", "v2")
    with pytest.raises(UserError, match="tolerance"):
        compare(db, "v1", "v2", tolerance=-0.1)


def test_interval_is_honest_about_independent_units():
    rng = np.random.default_rng(0)
    # 1000 pairs of 3 unchanged runs each with 5 % run-to-run noise: the 95 % interval covers 0 at least ~95 % of times
    cover = 0
    for _ in range(1000):
        b, h = np.exp(rng.normal(0, 0.05, 3)), np.exp(rng.normal(0, 0.05, 3))
        _, lo, hi, _ = interval(b, h)
        cover += lo <= 0 <= hi
    assert 0.94 <= cover / 1000 <= 0.985  # Welch with n=3 a side is slightly conservative (~97.5 %)
    chg, lo, hi, p = interval(np.array([10.0, 10.0]), np.array([11.0, 11.0]))  # no spread: exact
    assert chg == pytest.approx(0.1) and lo == hi == pytest.approx(0.1) and p == 0.0
    assert np.isnan(interval(np.array([10.0]), np.array([11.0, 12.0]))[1])  # one unit: no interval


def test_blocks_not_steps_when_one_run_per_side():
    """With one replicate per side the units are the repeats (3), not the 48 correlated steps: strongly
    correlated steps (AR 0.9) with a block effect must not produce false alarms."""
    rng = np.random.default_rng(3)
    noise = Noise(step_noise=0.05, step_ar=0.9, block_noise=0.01)
    alarms = 0
    for i in range(40):
        rb, sb = frames_of(simulated_records(rng, noise=noise, runs=1, run_id=f"b{i}"), "b")
        rh, sh = frames_of(simulated_records(rng, noise=noise, runs=1, run_id=f"h{i}"), "h")
        rows = pd.concat([rb.assign(side="base"), rh.assign(side="head")], ignore_index=True)
        cmp = compare_frames(rows, pd.concat([sb, sh], ignore_index=True))
        assert set(cmp.table.unit) == {"repeat"} and set(cmp.table.n_base) == {3}
        alarms += cmp.exit_code
    assert alarms <= 2


def test_a_point_that_fails_on_head_is_a_regression(tmp_path):
    rng = np.random.default_rng(2)
    db = tmp_path / "h.duckdb"
    add_run(db, write_simulated_run(tmp_path / "a", simulated_records(rng, run_id="2025-01-01")), Provenance("a"))
    recs = simulated_records(rng, run_id="2025-01-02")
    for r in recs:
        if r["x_point_key"] == "sim-kv512-b4":
            r.update(status="oom", error="OutOfMemoryError", decode_tok_s=None, tpot_ms_p50=None, x_step_ms=None)
    add_run(db, write_simulated_run(tmp_path / "b", recs), Provenance("b"))
    cmp = compare(db, "a", "b")
    assert cmp.exit_code == 1 and cmp.regressed_points == ["simulated float32 kv=512 B=4"]
    assert load_rows(db).query("commit == 'b' and not ok").shape[0] == 3


def test_provenance_from_a_git_checkout(tmp_path):
    import subprocess

    repo = tmp_path / "stack"
    repo.mkdir()
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "feature"], cwd=repo, check=True)
    (repo / "f.txt").write_text("1")
    subprocess.run([*git, "add", "f.txt"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], cwd=repo, check=True)
    subprocess.run([*git, "tag", "v0.1"], cwd=repo, check=True)
    p = git_provenance(repo)
    assert len(p.commit) == 40 and p.branch == "feature" and p.dirty is False and p.tag == "v0.1"
    (repo / "f.txt").write_text("2")
    assert git_provenance(repo).dirty is True
    with pytest.raises(Exception, match="not a git checkout"):
        git_provenance(tmp_path)


def test_runs_started_in_the_same_second_keep_their_order(tmp_path):
    # the run ids' random tails sort against time (ffff first, 0000 second): the history orders by the sidecars'
    # microsecond created_utc, and a run without one by its run id's time, in the same ISO format
    from kit.results import to_frame
    from kit.store import save_results

    db = tmp_path / "h.duckdb"
    rng = np.random.default_rng(2)
    starts = [("first", "20261201T120000-ffffffff", "2026-12-01T12:00:00.100000+00:00")]
    starts += [("second", "20261201T120000-00000000", "2026-12-01T12:00:00.900000+00:00")]
    starts += [("third", "20261201T120001-77777777", None)]
    for sha, run_id, created in starts:
        recs = [{**r, "run_id": run_id} for r in simulated_records(rng, run_id=run_id, runs=1)]
        meta = {"run_id": run_id, "host": "h", "created_utc": created}
        save_results(to_frame(recs), tmp_path / sha, metadata=meta, runs=[meta])
        add_run(db, tmp_path / sha, Provenance(sha))
    runs = list_runs(db)
    assert list(runs.commit) == ["first", "second", "third"]
    assert list(runs.created_utc)[2] == "2026-12-01T12:00:01.000000+00:00"


def test_package_versions_finds_the_kit_under_its_distribution_name():
    # the kit is installed as llm-perf-kit (`kit` on PyPI is another project): without a kit_version in the run's
    # metadata the installed version is read under that name; with one, the run's own version wins
    from importlib import metadata

    from kit.track.db import package_versions

    assert package_versions({})["kit"] == metadata.version("llm-perf-kit")
    assert package_versions({"kit_version": "9.9.9"})["kit"] == "9.9.9"


def test_a_flagged_row_is_stored_flagged_never_ok(tmp_path):
    """Issue 22 item 7: one status vocabulary in every file the kit writes: the history's typed ``status`` and the
    stored row itself say ``flagged`` for an ok row with a problem flag (overflowing float16 logits)."""
    rng = np.random.default_rng(5)
    recs = simulated_records(rng, run_id="2025-01-01", runs=1)
    for r in recs:
        if r["x_point_key"] == "sim-kv512-b4":
            r["x_logits_finite"] = False
    db = tmp_path / "h.duckdb"
    add_run(db, write_simulated_run(tmp_path / "a", recs), Provenance("a"))
    rows = load_rows(db).set_index("point_key")
    assert rows.loc["sim-kv512-b4", "status"] == "flagged" and not rows.loc["sim-kv512-b4", "ok"]
    assert json.loads(rows.loc["sim-kv512-b4", "row_json"])["status"] == "flagged"
    assert set(rows.drop(index="sim-kv512-b4").status) == {"ok"} and rows.drop(index="sim-kv512-b4").ok.all()
    again = add_run(db, tmp_path / "a", Provenance("a"))  # the same run is still recognised as stored
    assert again["rows_added"] == 0 and again["rows_known"] == 4


def _corrupt_copies(db, tmp_path) -> dict:
    """Damaged copies of a real history file: a flipped data block, a block overwritten, a truncated file."""
    good = db.read_bytes()
    out = {}
    flipped = bytearray(good)
    for i in range(4096, len(flipped), 997):
        flipped[i] ^= 0xFF
    overwritten = bytearray(good)
    overwritten[8192:12288] = b"\xff" * 4096
    for name, data in (("flipped", flipped), ("overwritten", overwritten), ("truncated", good[: len(good) // 2])):
        out[name] = tmp_path / f"{name}.duckdb"
        out[name].write_bytes(bytes(data))
    return out


def test_a_damaged_or_impossible_history_path_is_a_one_line_user_error(history, tmp_path, capsys):
    """Issue 28 item 8: a corrupt DuckDB history and ``--db /etc/passwd/x`` gave tracebacks (exit 1)."""
    db, runs = history
    run_dir = str(runs[0][1])
    for name, bad in _corrupt_copies(db, tmp_path).items():
        for args in (
            ["list"],
            ["compare", "c01", "c02"],
            ["add", run_dir, "--commit", "c01"],
            ["report", "--out", str(tmp_path / "r")],
        ):
            assert main(["history", *args, "--db", str(bad)]) == 2, (name, args)
            err = capsys.readouterr().err
            assert err.startswith("kit history: error: ") and err.count("\n") == 1, (name, args, err)
            assert str(bad) in err and "Traceback" not in err, (name, args, err)
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0::/root:/bin/sh\n")  # a file where --db needs a directory (as /etc/passwd/x)
    for args in (["add", run_dir, "--commit", "c01"], ["list"], ["compare", "c01", "c02"]):
        assert main(["history", *args, "--db", str(passwd / "x")]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("kit history: error: ") and err.count("\n") == 1 and str(passwd) in err, (args, err)
    assert passwd.read_text() == "root:x:0:0::/root:/bin/sh\n"
