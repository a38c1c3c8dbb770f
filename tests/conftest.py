"""Shared test set-up: offline Hugging Face settings, a small shared tiny model."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model():
    """The default preset built once per session on CPU in float32."""
    from kit.models import build_model

    return build_model("tiny-llama", "float32", "cpu")
