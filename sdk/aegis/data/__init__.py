"""Bundled toy data for demos and tests: a small mixed-domain JSONL, a tiny llama model folder, a byte tokenizer.

Nothing here downloads anything. The JSONL has three domains (``arithmetic``, ``chat``,
``prose``); chat rows use the ``messages`` format, the others plain ``text``. The model folder
(``demo/tiny-llama/``) is an ordinary Hugging Face folder without weights: its config.json and a
tokenizer_config.json naming :class:`ByteTokenizer`; a run names it with ``init: random``, like any
folder, and ``data:`` the JSONL's path.

    from aegis.data import ByteTokenizer, toy_dataset_path, tiny_llama_config, tiny_llama_path
    from aegis.train.data import load_jsonl
    examples = load_jsonl(toy_dataset_path(), ByteTokenizer())
    config = tiny_llama_config()          # a config.json dict: 2 layers, hidden 64, vocab 264
    run = {"model": str(tiny_llama_path()), "init": "random", "data": str(toy_dataset_path())}
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from aegis.data.byte_tokenizer import SPECIAL_TOKENS, ByteTokenizer

__all__ = ["ByteTokenizer", "SPECIAL_TOKENS", "toy_dataset_path", "tiny_llama_config", "tiny_llama_path"]


def toy_dataset_path() -> Path:
    """Path of the bundled toy JSONL (252 rows, domains arithmetic / chat / prose)."""
    return Path(str(resources.files("aegis.data") / "toy.jsonl"))


def tiny_llama_path() -> Path:
    """The bundled tiny llama's model folder (config.json, tokenizer_config.json naming :class:`ByteTokenizer`;
    no weights: runs name it with ``init: random``)."""
    return Path(str(resources.files("aegis.data") / "demo" / "tiny-llama"))


def tiny_llama_config() -> dict[str, Any]:
    """A tiny LlamaForCausalLM config.json dict whose vocabulary covers :class:`ByteTokenizer`."""
    return json.loads((tiny_llama_path() / "config.json").read_text())
