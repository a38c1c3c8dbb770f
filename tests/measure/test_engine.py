"""Engine numbers follow their definitions; the static-cache decode computes the same logits as a full forward."""

import numpy as np
import pytest
import torch

from kit.measure import engine


def test_metrics_consistent_with_definitions(tiny_model):
    p = engine.PointConfig(concurrency=4, context_len=64, decode_steps=6, warmup_steps=2, repeats=2, kv_fill="prefill")
    r = engine.run_point(tiny_model, p)
    steps = np.array(r["x_step_ms"])
    assert r["tpot_n"] == len(steps) == 12
    assert r["tpot_ms_p50"] == pytest.approx(np.percentile(steps, 50))
    assert r["tpot_ms_p99"] == pytest.approx(np.percentile(steps, 99, method="linear"))
    assert r["tpot_ms_min"] == pytest.approx(steps.min())
    assert r["decode_tok_s"] == pytest.approx(4 / (r["tpot_ms_p50"] / 1000))
    assert r["tok_s_per_stream"] == pytest.approx(1000 / r["tpot_ms_p50"])
    assert r["ttft_ms"] == r["prefill_ms"] == pytest.approx(np.median(r["x_prefill_ms"]))
    assert r["prefill_tok_s"] == pytest.approx(4 * 64 / (r["prefill_ms"] / 1000))
    cfg = tiny_model.config
    kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4 * 4 * p.cache_len
    assert r["kv_cache_gb"] == pytest.approx(kv_bytes / 1e9)
    assert r["peak_mem_gb"] > 0 and r["peak_mem_method"] == "cpu_rss_highwater"
    assert r["x_logits_finite"] is True and r["status"] == "ok"


def test_synthetic_fill_has_no_prefill_time(tiny_model):
    r = engine.run_point(tiny_model, engine.PointConfig(2, 256, decode_steps=3, repeats=1, kv_fill="synthetic"))
    assert r["prefill_ms"] is None and r["ttft_ms"] is None and r["tpot_n"] == 3 and r["kv_fill"] == "synthetic"


def test_static_cache_decode_matches_full_forward(tiny_model):
    """Prefill C tokens into the static cache, decode one token: logits equal a no-cache forward over C+1."""
    torch.manual_seed(0)
    B, C = 2, 10
    ids = torch.randint(0, tiny_model.config.vocab_size, (B, C + 1))
    fwd = engine.Forward(tiny_model)
    cache = engine.new_cache(tiny_model, C + 4)
    pos = torch.arange(C + 4).unsqueeze(0).expand(B, -1)
    with torch.inference_mode():
        fwd(ids[:, :C], pos[:, :C], cache)
        step = fwd(ids[:, C:], pos[:, C : C + 1], cache)[:, -1]
        full = tiny_model(input_ids=ids).logits[:, -1]
        # rewinding the cache and decoding again gives the same answer (repeat blocks reuse the cache)
        engine.set_cache_length(cache, C)
        again = fwd(ids[:, C:], pos[:, C : C + 1], cache)[:, -1]
    assert torch.allclose(step, full, atol=1e-4)
    assert torch.allclose(again, step, atol=1e-6)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(concurrency=0, context_len=8), "concurrency=0"),
        (dict(concurrency=1, context_len=-3), "context_len=-3"),
        (dict(concurrency=1, context_len=8, kv_fill="magic"), "kv_fill='magic'"),
    ],
)
def test_bad_points(tiny_model, kw, match):
    with pytest.raises(ValueError, match=match):
        engine.run_point(tiny_model, engine.PointConfig(**kw))


def test_context_beyond_max_positions(tiny_model):
    with pytest.raises(ValueError, match="at most 16384 positions"):
        engine.run_point(tiny_model, engine.PointConfig(1, 16384))


@pytest.mark.parametrize(
    "kw,named,fix",
    [
        (dict(context_len=20000), "context_len=20000", "use context_len <= 16368"),  # the context is too long
        (dict(context_len=16, decode_steps=10**10), "decode_steps=10000000000", "use decode_steps <= 16368"),
        (dict(context_len=16, warmup_steps=20000), "warmup_steps=20000", "use warmup_steps <= 16368"),
        (dict(context_len=20000, decode_steps=20000), "decode_steps=20000", "use context + steps <= 16384"),
    ],
)
def test_a_cache_past_the_positions_names_what_to_shrink(kw, named, fix):
    """Steps that alone fill the positions are named (not "use context_len <= -9999983616"); every bound said is
    one a value can meet."""
    with pytest.raises(ValueError) as e:
        engine.PointConfig(1, **kw).validate(16384)
    assert str(e.value).startswith(named) and str(e.value).endswith(fix) and "<= -" not in str(e.value), e.value


def test_repeats_are_bounded():
    engine.PointConfig(1, 8, repeats=engine.MAX_REPEATS).validate()
    with pytest.raises(ValueError, match=f"repeats=1000000000 must be an integer from 1 to {engine.MAX_REPEATS}"):
        engine.PointConfig(1, 8, repeats=10**9).validate()


def test_mla_moe_preset_runs():
    from kit.models import build_model

    m = build_model("tiny-deepseek")
    r = engine.run_point(m, engine.PointConfig(2, 32, decode_steps=3, repeats=1, kv_fill="prefill"))
    assert r["status"] == "ok" and r["tpot_n"] == 3 and r["kv_cache_gb"] > 0


def test_chunked_prefill_logits_equal_one_forward(tiny_model):
    """Issue 13 item 4: a prefill in chunks of N tokens gives the logits of one forward over the whole context,
    and the cache then decodes the same next token."""
    torch.manual_seed(1)
    B, C = 2, 50
    ids = torch.randint(0, tiny_model.config.vocab_size, (B, C + 1))
    pos = torch.arange(C + 4).unsqueeze(0).expand(B, -1)
    fwd = engine.Forward(tiny_model)
    out = {}
    with torch.inference_mode():
        for chunk in (None, 16, 7):
            cache = engine.new_cache(tiny_model, C + 4)
            last = engine.prefill(fwd, ids[:, :C], pos, cache, chunk)[:, -1]
            step = fwd(ids[:, C:], pos[:, C : C + 1], cache)[:, -1]
            out[chunk] = (last, step)
    for chunk in (16, 7):
        assert torch.allclose(out[chunk][0], out[None][0], atol=1e-4)
        assert torch.allclose(out[chunk][1], out[None][1], atol=1e-4)


def test_chunked_prefill_never_builds_a_context_by_context_tensor(tiny_model, monkeypatch):
    """Every attention call of a chunked prefill sees at most chunk queries, and its mask is chunk x cache_len."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        # a decode step packs grouped heads into the query's length axis: keep prefill calls (all heads, q > 1)
        if q.shape[1] == tiny_model.config.num_attention_heads and q.shape[-2] > 1:
            seen.append((q.shape[-2], k.shape[-2], None if attn_mask is None else tuple(attn_mask.shape[-2:])))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    p = engine.PointConfig(1, 1000, decode_steps=2, warmup_steps=0, repeats=1, prefill_chunk=128)
    r = engine.run_point(tiny_model, p)
    assert len(seen) == 8 * tiny_model.config.num_hidden_layers  # ceil(1000 / 128) chunks per layer
    assert max(q for q, _, _ in seen) == 128
    assert all(m is None or m[0] * m[1] <= 128 * p.cache_len for _, _, m in seen)
    assert r["x_prefill_chunk"] == 128 and r["prefill_tok_s"] > 0 and r["status"] == "ok"
    with pytest.raises(ValueError, match="prefill_chunk=0"):
        engine.PointConfig(1, 8, prefill_chunk=0).validate()


PEAK_SCRIPT = """
import os, sys, traceback, psutil, torch
from kit.models import build_model
from kit.measure import engine
torch.set_num_threads(1)
m = build_model("tiny-llama")


def peak(C):
    cache, fwd = engine.new_cache(m, C + 8), engine.Forward(m)
    pos = torch.arange(C + 8).unsqueeze(0)
    ids = torch.randint(0, 1000, (1, C))
    with torch.inference_mode():
        fwd(ids[:, :1], pos[:, :1], cache)  # allocates the whole static buffer before the baseline
        engine.set_cache_length(cache, 0)
        touched = [t.fill_(0) for layer in cache.layers for t in (layer.keys, layer.values)]  # its pages resident too
        assert touched
        open("/proc/self/clear_refs", "w").write("5")  # resets this process's RSS high-water mark (Linux)
        base = psutil.Process().memory_info().rss
        engine.prefill(fwd, ids, pos, cache, 256)
    hwm = next(ln for ln in open("/proc/self/status") if ln.startswith("VmHWM")).split()[1]
    return int(hwm) * 1024 - base


for C in sys.argv[1:]:  # each context in a child forked from this state (one import, one model; no thread started)
    r, w = os.pipe()
    if os.fork() == 0:
        code = 1
        try:
            os.write(w, str(peak(int(C))).encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        os._exit(code)
    os.close(w)
    got = os.read(r, 64).decode()
    print(C, got or "-", os.waitstatus_to_exitcode(os.wait()[1]))
"""


@pytest.mark.slow
def test_long_chunked_prefill_peak_memory_is_linear_in_the_context():
    """Peak RSS above the allocated (and resident) cache, for a chunked prefill at 2k and 8k tokens: grows
    ~linearly (4x the context: well under the 16x of a quadratic prefill; 8x is the midpoint on a log scale, as an
    RSS high-water mark of a few MB moves with the allocator) and stays far below one 8k x 8k float32 score matrix
    (268 MB). Each context is measured in its own process, forked after the imports and the model build."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, "2048", "8192"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert [r[0] for r in rows] == ["2048", "8192"] and all(r[2] == "0" for r in rows), out.stdout + out.stderr
    peak = {int(c): int(p) for c, p, _ in rows}
    assert peak[8192] < 8 * max(peak[2048], 4e6) and peak[8192] < 120e6, peak
