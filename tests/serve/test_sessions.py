"""kit.serve.sessions: multi-turn conversations against the simulated server: each turn's prompt is the history
plus a new message (text and chat endpoints), think time between turns, per-turn TTFT and session totals, stored
as resumable points."""

import pytest

from kit.errors import UserError
from kit.grid import run_grid
from kit.serve.load import LoadConfig
from kit.serve.loop import run_coro, run_schedule
from kit.serve.point import read_detail
from kit.serve.sessions import SessionBackend, SessionSchedule, per_turn, session_messages, session_totals
from kit.serve.simserver import SimModel, SimServer
from kit.view.workload_plots import per_turn_plot

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim():
    # prefill 1 ms per uncached token, cache blocks of 4 tokens: later turns find their history cached
    with SimServer(SimModel(ttft_base_ms=5, prefill_ms_per_token=1.0, tpot_base_ms=2, block_tokens=4)) as s:
        yield s


def test_each_turn_sends_the_history_plus_a_new_message(sim):
    sim.log.clear()
    cfg = LoadConfig(url=sim.url, model="sim", isl=8, osl=3, max_concurrency=2)
    msgs = session_messages(cfg, 2, 3, seed=5)
    recs, info = run_coro(run_schedule(cfg, SessionSchedule(msgs, users=2, osl=3, think_time_s=0.1)))
    assert len(recs) == 6 and all(r["ok"] for r in recs) and info["model"] == "sim"
    for s in (0, 1):
        rs = sorted((r for r in recs if r["session_id"] == s), key=lambda r: r["turn"])
        assert [r["turn"] for r in rs] == [1, 2, 3]
        for a, b in zip(rs, rs[1:]):
            assert b["sent_s"] - a["end_s"] >= 0.1 - 1e-3  # the think time passed between reply and next turn
    prompts = {x["prompt"] for x in sim.log}
    for m in msgs:  # turn 3's prompt: message 1, reply 1 (3 words), message 2, reply 2, message 3
        p3 = next(p for p in prompts if p.endswith(m[2]))
        assert p3.startswith(m[0]) and m[1] in p3 and len(p3.split()) == 3 * 8 + 2 * 3
    hits = {x["tokens"]: x["cached"] for x in sim.log}
    assert hits[8] == 0 and hits[19] >= 8 and hits[30] >= 16  # the history's blocks were cached


def test_chat_history_is_a_message_list(sim):
    sim.log.clear()
    cfg = LoadConfig(url=sim.url, model="sim", endpoint="chat", isl=4, osl=2, max_concurrency=1)
    recs, _ = run_coro(run_schedule(cfg, SessionSchedule(session_messages(cfg, 1, 2, seed=1), users=1, osl=2)))
    assert [r["turn"] for r in recs] == [1, 2] and all(r["ok"] for r in recs)
    last = sim.log[-1]["prompt"]
    assert [m["role"] for m in last] == ["user", "assistant", "user"] and last[1]["content"] == " w0 w1"


def test_session_backend_rows_per_turn_and_totals(sim, tmp_path):
    cfg = LoadConfig(url=sim.url, model="sim", num_requests=6, isl=16, osl=4)
    df = run_grid(SessionBackend(cfg, [1, 2], tmp_path, turns=3, think_time_s=0.0), tmp_path, progress=False)
    assert list(df["status"]) == ["ok", "ok"] and list(df["completed"]) == [6, 6]
    assert list(df["x_sessions"]) == [2, 2] and list(df["x_sessions_completed"]) == [2, 2]
    assert (df["x_turn1_n"] == 2).all() and (df["x_turn3_n"] == 2).all() and "x_turn4_n" not in df
    assert (df["x_prefix_sharing"] == "history").all() and df["point_id"].str.contains("turns3").all()
    recs = read_detail(df.iloc[1].to_dict())
    turns, totals = per_turn(recs), session_totals(recs)
    assert list(turns["turn"]) == [1, 2, 3] and list(turns["n"]) == [2, 2, 2]
    assert list(totals["turns"]) == [3, 3] and totals["completed"].all() and (totals["output_tokens"] == 12).all()
    # the first turn pays for 16 uncached tokens at 1 ms each; later turns find most of the history cached
    assert turns["ttft_ms_p50"].iloc[0] >= 21
    fig = per_turn_plot(turns)
    fig.savefig(tmp_path / "turns.png")
    assert (tmp_path / "turns.png").stat().st_size > 0
    with pytest.raises(UserError, match="turns=0"):
        SessionBackend(cfg, [1], tmp_path, turns=0)
    with pytest.raises(UserError, match="users=0"):
        SessionSchedule([["hi"]], users=0, osl=2)


def test_users_bound_the_conversations_in_flight_and_a_failed_turn_ends_its_conversation(sim):
    """Three conversations, two users: the third starts only when one ends; its turns follow its own replies."""
    sim.log.clear()
    cfg = LoadConfig(url=sim.url, model="sim", isl=4, osl=2)
    msgs = session_messages(cfg, 3, 2, seed=2)
    recs, _ = run_coro(run_schedule(cfg, SessionSchedule(msgs, users=2, osl=2)))
    assert sorted((r["session_id"], r["turn"]) for r in recs) == [(s, k) for s in range(3) for k in (1, 2)]
    first = {s: min(r["sent_s"] for r in recs if r["session_id"] == s) for s in range(3)}
    ends = {s: max(r["end_s"] for r in recs if r["session_id"] == s) for s in range(3)}
    assert first[2] >= min(ends[0], ends[1]) - 1e-3  # the third conversation waited for a user to be free
    assert max(r["inflight_at_send"] for r in recs) <= 2


def test_a_failed_turn_ends_its_conversation(scripted):
    """'flaky' fails every other request: each conversation stops at its first failed turn; its later turns are
    never sent but recorded as failed (not sent), so the row's failures count every turn that did not complete."""
    n0 = len(scripted.requests)
    cfg = LoadConfig(url=scripted.url, model="flaky", isl=4, osl=2, num_requests=6)
    msgs = session_messages(cfg, 2, 3, seed=4)
    recs, _ = run_coro(run_schedule(cfg, SessionSchedule(msgs, users=1, osl=2)))
    assert len(recs) == 6
    for s in (0, 1):
        rs = sorted((r for r in recs if r["session_id"] == s), key=lambda r: r["turn"])
        assert [r["turn"] for r in rs] == [1, 2, 3]
        sent = [r for r in rs if not r.get("not_sent")]
        assert all(r["ok"] for r in sent[:-1]) and not sent[-1]["ok"] and len(sent) <= 2
        assert all(not r["ok"] and "earlier turn of its conversation failed" in r["error"] for r in rs[len(sent) :])
    assert len(scripted.requests) - n0 == sum(not r.get("not_sent") for r in recs)
