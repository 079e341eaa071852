"""The bundled demo run: a tiny llama on CPU, a planted toxic sample and an injected LR spike.

Data and settings are files in ``aegis/data/demo/``: ``demo.jsonl`` (600 arithmetic rows plus
the toxic row ``toxic-0001``, 62 random printable characters) and ``demo.yaml`` (the run config,
commented). ``aegis run --demo`` trains it in about a minute and shows the detection, the
diagnosis and both repairs (blacklist, then stabilise).

The demo is this explicit config, never a default: ``RunConfig`` requires ``model`` and ``data``,
and ``demo.yaml`` states every training number it is tuned for (LR, no warm-up, constant LR, seed 0)
instead of taking the recipe's (:mod:`aegis.recipe`), so the demo's story does not move when the
recipe does.

    cfg = demo_config()                    # RunConfig with absolute data path
    Supervisor("runs").start(cfg)
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from aegis.supervise.run_config import RunConfig, load_run_config

__all__ = ["DEMO_TOXIC_IDS", "demo_dir", "demo_config"]

DEMO_TOXIC_IDS: tuple[str, ...] = ("toxic-0001",)
"""Ids of the planted toxic rows in demo.jsonl."""


def demo_dir() -> Path:
    """Folder of the bundled demo files."""
    return Path(str(resources.files("aegis.data") / "demo"))


def demo_config() -> RunConfig:
    """The demo's RunConfig (model and data paths resolved inside the installed package): the bundled tiny llama
    folder (``model: tiny-llama``, ``init: random``) on ``demo.jsonl``, with its own training numbers and
    injected LR spike."""
    return load_run_config(demo_dir() / "demo.yaml")
