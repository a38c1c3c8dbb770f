"""A servable checkpoint that needs no download: a tiny random-weight Llama and a byte-level BPE tokenizer trained
locally, for ``transformers serve`` on CPU (the how-to notebook, the real-server tests, the README's example).
Its numbers say how a server and the client behave, never how a real model performs.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_checkpoint(
    path: str | Path, vocab_size: int = 512, hidden_size: int = 64, layers: int = 2, seed: int = 0
) -> Path:
    """Write a tiny random-weight Llama and a byte-level BPE tokenizer trained locally (no downloads) to
    ``path``, ready for ``transformers serve`` on CPU. Reuses an existing checkpoint at ``path``.

    Shapes: hidden ``hidden_size``, ``layers`` decoder layers, 4 heads / 2 KV heads, vocab ``vocab_size``.

    Returns: the directory.
    """
    path = Path(path)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists() and any(path.glob("*.safetensors")):
        return path  # before the imports below: reusing a checkpoint costs no torch import
    import random

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    words = (
        "time person year way day thing man world life hand part child eye woman place work week case point "
        "number group problem fact be have do say get make go know take see come think look want give use "
        "find tell ask seem feel try leave call good new first last long great little own other old right "
        "big high different small large next early young important few public bad same able to of in for "
        "on with at by from up about into over after the a and that it not he as you this but his they"
    ).split()
    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # alphabet = the corpus' ASCII symbols only: with all 256 byte symbols a random model often repeats a lone
    # byte (invalid UTF-8) that a server's streaming detokeniser withholds, so the stream carries no text
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(path)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path
