"""kit comm: collective probes on real torchrun gloo ranks — every collective and size stored with busbw = algbw ×
the nccl-tests factor, the decode-step messages marked, the plots written, a dead rank and an unreachable
rendezvous ending inside their timeouts; case C1 (bus bandwidth of every collective, incl. all-to-all)."""

import json
import time

import pytest

from kit import metrics
from kit.errors import UserError
from kit.measure.comm import CommConfig, decode_summary, fit_links, parse_bytes, run_comm, save_comm_calibration
from kit.measure.ranks import RankError
from kit.plan.comm import apply_comm_calibration, step_collectives
from kit.plan.device import get_device_model
from kit.plan.spec import get_spec
from kit.store import load_results


def test_case_c1_bus_bandwidth_of_every_collective():
    # C1: S = 8 GB moved in 1 s over 8 ranks (S = the whole buffer)
    alg, bus = metrics.bus_bandwidth_gb_s("all_gather", 8e9, 1.0, 8)
    assert alg == 8 and bus == pytest.approx(7)
    assert metrics.bus_bandwidth_gb_s("reduce_scatter", 8e9, 1.0, 8)[1] == pytest.approx(7)
    assert metrics.bus_bandwidth_gb_s("all_reduce", 8e9, 1.0, 8) == pytest.approx((8, 14))
    assert metrics.bus_bandwidth_gb_s("all_to_all", 8e9, 1.0, 8)[1] == pytest.approx(7)
    assert metrics.bus_bandwidth_gb_s("broadcast", 8e9, 1.0, 8) == (8, 8)
    assert metrics.busbw_factor("send_recv", 2) == 1.0


def test_settings_are_checked_before_any_rank_starts(tmp_path):
    assert parse_bytes("64K") == 65536 and parse_bytes("1G") == 1 << 30 and parse_bytes("8") == 8
    with pytest.raises(UserError, match="number of bytes"):
        parse_bytes("lots")
    with pytest.raises(UserError, match=r"'all_reduce,gather' has unknown collective\(s\) \['gather'\]; allowed: all_"):
        CommConfig(ops="all_reduce,gather", out=str(tmp_path)).validate()  # the value given, the bad item, the choices
    with pytest.raises(UserError, match="at least 2 ranks"):
        CommConfig(nproc=1, out=str(tmp_path)).validate()
    with pytest.raises(UserError, match="max_bytes=4 must be >= min_bytes=8"):
        CommConfig(max_bytes=4, out=str(tmp_path)).validate()
    assert CommConfig(min_bytes=8, max_bytes=64).sizes() == [8, 16, 32, 64]


def test_decode_step_messages_are_the_planners():
    spec = get_spec("kimi-k3")
    got = {t: (op, size, count) for t, op, size, count, _ in step_collectives(spec, 4, 8, 8, 1)}
    assert got["tp_allreduce"] == ("all_reduce", 4 * 7168 * 2, spec.num_layers + spec.n_dense_layers)
    assert got["ep_alltoall"] == ("all_to_all", 4 * 16 * 7168 * 2 / 8, 2 * spec.n_moe_layers)


@pytest.mark.slow
def test_two_gloo_ranks_probe_every_collective_and_size(tmp_path):
    out = tmp_path / "comm"
    df = run_comm(max_bytes=256, iters=3, warmup=1, out=str(out), model="llama-3.1-8b", batch=2)
    probe = df[df["x_decode_term"].isna()]
    assert set(probe["x_op"]) == set(CommConfig().ops)
    assert sorted(probe.groupby("x_op").size().unique()) == [6]  # 8 .. 256 B doubling, every op
    assert (df["backend"] == "comm").all() and (df["x_n_ranks"] == 2).all() and (df["x_dist_backend"] == "gloo").all()
    assert (df["x_lat_us_p99"] >= df["x_lat_us_p50"]).all() and (df["x_n"] == 3).all()
    for _, r in df.iterrows():  # algbw = S / t(p50); busbw = algbw × the nccl-tests factor
        alg = r["x_size_bytes"] / (r["x_lat_us_p50"] / 1e6) / 1e9
        assert r["x_algbw_gb_s"] == pytest.approx(alg)
        assert r["x_busbw_gb_s"] == pytest.approx(alg * metrics.busbw_factor(r["x_op"], 2))
    dec = df[df["x_decode_term"].notna()]
    assert list(dec["x_decode_term"]) == ["tp_allreduce"] and dec["x_size_bytes"].iloc[0] == 2 * 4096 * 2
    lines = decode_summary(df)
    assert lines[0].startswith("per decode step this model pays 64 × ") and "in collectives" in lines[-1]
    stored = load_results(out)
    assert len(stored) == len(df) and (out / "results.parquet").exists()
    cal = save_comm_calibration(df, tmp_path / "links.json")
    links = json.loads(cal.read_text())["links"]["scale-up"]
    assert links["alpha_size_bytes"] == 8 and links["busbw_gb_s"] == pytest.approx(
        probe[probe.x_op == "all_reduce"]["x_busbw_gb_s"].max()
    )
    dev = apply_comm_calibration(get_device_model("B300"), cal)
    assert (
        dev.scaleup_alpha_us == pytest.approx(fit_links(df)["scale-up"]["alpha_us"]) and "kit comm" in dev.link_source
    )
    from kit.view.comm_plots import save_comm_plots

    for png in save_comm_plots(df, out):
        assert png.stat().st_size > 10_000
    # a re-run with the same settings measures nothing (no rank starts) and returns the stored rows; one more size
    # measures only that size; --no-resume moves the earlier files to previous/ and measures all again
    again = run_comm(max_bytes=256, iters=3, warmup=1, out=str(out), model="llama-3.1-8b", batch=2)
    assert sorted(again.point_id) == sorted(df.point_id) and len(list((out / "runs").iterdir())) == 1
    more = run_comm(max_bytes=512, iters=3, warmup=1, out=str(out), ops=["all_reduce"])
    assert len(more) == 7 and (more.x_size_bytes == 512).sum() == 1 and len(list((out / "runs").iterdir())) == 2
    run_id = more.loc[more.x_size_bytes == 512, "run_id"].iloc[0]
    assert (more.loc[more.x_size_bytes < 512, "run_id"] != run_id).all()
    fresh = run_comm(max_bytes=8, iters=2, warmup=0, out=str(out), ops=["all_reduce"], resume=False)
    assert len(fresh) == 1 and len(load_results(out)) == 1 and any((out / "previous").iterdir())


@pytest.mark.slow
def test_a_dead_rank_ends_the_probe_with_a_clear_error_and_keeps_nothing_half_written(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankError, match=r"rank 1 failed: .*rank 1 exits early"):
        run_comm(CommConfig(max_bytes=8, iters=2, warmup=0, out=str(tmp_path / "c"), fail_rank=1, timeout_s=60))
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_an_unreachable_rendezvous_ends_inside_the_timeout(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankError, match="rendezvous|did not finish within"):
        run_comm(max_bytes=8, iters=2, out=str(tmp_path / "c"), nproc=1, nnodes=2, node_rank=1,
                 rdzv_endpoint="127.0.0.1:9", timeout_s=25, join_timeout_s=5)  # fmt: skip
    assert time.monotonic() - t0 < 40
    assert not (tmp_path / "c" / "results.parquet").exists()
