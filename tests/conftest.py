"""Shared test set-up: offline Hugging Face settings, a small shared tiny model."""

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# test helpers beside this file (nbexec, sse_server) import by name from any test folder (--import-mode=importlib)
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model():
    """The default preset built once per session on CPU in float32."""
    from kit.models import build_model

    return build_model("tiny-llama", "float32", "cpu")
