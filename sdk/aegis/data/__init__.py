"""Bundled toy data for demos and tests: a small mixed-domain JSONL, a tiny llama config, a byte tokenizer.

Nothing here downloads anything. The JSONL has three domains (``arithmetic``, ``chat``,
``prose``); chat rows use the ``messages`` format, the others plain ``text``.

    from aegis.data import ByteTokenizer, toy_dataset_path, tiny_llama_config
    from aegis.train.data import load_jsonl
    examples = load_jsonl(toy_dataset_path(), ByteTokenizer())
    config = tiny_llama_config()          # a config.json dict: 2 layers, hidden 64, vocab 264
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from aegis.data.tokenizer import SPECIAL_TOKENS, ByteTokenizer

__all__ = ["ByteTokenizer", "SPECIAL_TOKENS", "toy_dataset_path", "tiny_llama_config"]


def toy_dataset_path() -> Path:
    """Path of the bundled toy JSONL (252 rows, domains arithmetic / chat / prose)."""
    return Path(str(resources.files("aegis.data") / "toy.jsonl"))


def tiny_llama_config() -> dict[str, Any]:
    """A tiny LlamaForCausalLM config.json dict whose vocabulary covers :class:`ByteTokenizer`."""
    return json.loads((resources.files("aegis.data") / "tiny_llama.json").read_text())
