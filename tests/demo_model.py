"""The bundled demo model and data as a run names them: paths, resolved like any user's (no special names)."""

from __future__ import annotations

from aegis.data import tiny_llama_path, toy_dataset_path

TINY_LLAMA = str(tiny_llama_path())
"""The bundled tiny llama's folder (config.json, byte tokenizer, no weights)."""

TOY_DATA = str(toy_dataset_path())
"""The bundled toy JSONL (252 rows: arithmetic text, chat messages, prose)."""

TINY_RUN = {"model": TINY_LLAMA, "init": "random"}
"""A run's model section for the tiny llama: its folder, random weights."""
