"""Compiled decode (torch.compile over the static cache): the same logits as eager, a compile outside the timed
steps, no recompilation inside them, and a recompilation there flags the row."""

import pytest
import torch

from kit import results
from kit.measure import compiled, engine, sweep
from kit.models import get_config


@pytest.mark.compile
def test_compiled_decode_logits_equal_eager():
    """One inductor compile (the costly part on CPU: seconds per graph), of a 1-layer tiny-llama: the compiled
    decode step's logits equal eager's within float32 tolerance."""
    from transformers import AutoModelForCausalLM

    cfg = get_config("tiny-llama")
    cfg.num_hidden_layers = 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    B, C = 2, 8
    ids = torch.randint(0, cfg.vocab_size, (B, C + 1), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(C + 4).unsqueeze(0).expand(B, -1)
    fwd, cache = engine.Forward(model), engine.new_cache(model, C + 4)
    step = compiled.CompiledDecode(fwd, B, "cpu")
    with torch.inference_mode():
        engine.prefill(fwd, ids[:, :C], pos, cache)
        eager = fwd(ids[:, C:], pos[:, C : C + 1], cache)[:, -1]
        engine.set_cache_length(cache, C)
        comp = step(ids[:, C:], pos[:, C : C + 1], cache)[:, -1]
        engine.set_cache_length(cache, C)
        again = step(ids[:, C:], pos[:, C : C + 1], cache)[:, -1]  # a replay of the compiled step
    assert step.engine_mode == "compiled" and step.mode == "default"
    assert torch.allclose(comp, eager, atol=1e-4), (comp - eager).abs().max()
    assert torch.allclose(again, eager, atol=1e-4)


def test_a_compiled_sweep_compiles_outside_the_timed_steps_and_never_recompiles_in_them(tmp_path):
    """The sweep's compiled path end to end, with dynamo's tracing and guards but no inductor codegen
    (backend "eager": the same recompilation counting, without seconds of C++ compilation per point)."""

    def runner(model, point, device, seed, **kw):
        return engine.run_point(model, point, device, seed, compile_backend="eager", **kw)

    cfg = sweep.SweepConfig(compile=True, kv_lens=[16, 32], concurrencies=[2], decode_steps=3, warmup_steps=1,
                            repeats=2)  # fmt: skip
    df = sweep.run_sweep(cfg, tmp_path, progress=False, runner=runner)
    assert list(df.status) == ["ok", "ok"] and results.ok_mask(df).all()
    assert set(df.x_engine_mode) == {"compiled"} and set(df.x_prefill_mode) == {"eager"}
    assert (df.x_compile_s > 0).all() and list(df.x_recompiles_timed) == [0, 0] and list(df.tpot_n) == [6, 6]
    eager = sweep.SweepConfig(kv_lens=[16, 32], concurrencies=[2], decode_steps=3, warmup_steps=1, repeats=2)
    assert not set(df.point_id) & {sweep.sweep_point_id(eager, "float32", "cpu", p) for _, p in eager.points()}


def test_a_recompilation_is_counted_and_flags_the_row():
    f = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    f(torch.ones(2))
    before = compiled.dynamo_compiles()
    f(torch.ones(2))  # same shape: no compile
    assert compiled.dynamo_compiles() == before
    f(torch.ones(3))  # a new shape: dynamo compiles again
    assert compiled.dynamo_compiles() > before
    rows = results.to_frame(
        [{"backend": "engine", "status": "ok", "x_recompiles_timed": n} for n in (0, 2)]
        + [{"backend": "engine", "status": "ok", "x_engine_mode": "eager"}]
    )
    assert list(results.verdict(rows)) == ["ok", "flagged", "ok"]
    assert "recompiled" in results.row_problems(rows.iloc[1])[0]


def test_eager_rows_say_so_and_compile_modes_per_device(tiny_model):
    r = engine.run_point(tiny_model, engine.PointConfig(1, 8, decode_steps=2, warmup_steps=0, repeats=1))
    assert r["x_engine_mode"] == "eager" and "x_compile_s" not in r
    assert compiled.compile_mode("cpu") == ("default", "compiled")
    assert compiled.compile_mode("cuda") == ("reduce-overhead", "compiled+graphs")
