"""Run by ``test_jax_fsdp_memory.py`` in a subprocess with 4 forced host devices (XLA reads the flag when JAX starts).

``argv[1]``: JSON ``{"config": config.json dict, "train": TrainConfig fields}``. Builds the trainer on one device and
on ``{fsdp: 4}`` (the same micro batch per rank) and prints, per mesh, one JSON line with `check_memory`'s figures
(the ``memory_check`` event's: XLA's compiled per-device peak and the planner's estimate for that mesh).
"""

from __future__ import annotations

import json
import sys

import jax

from aegis.data import ByteTokenizer, toy_dataset_path
from aegis.schema import TrainConfig
from aegis.train.data import load_jsonl
from aegis.train.loop import Trainer
from aegis.train.memory_check import check_memory
from aegis.train.parallel import ParallelConfig

assert len(jax.devices()) == 4, jax.devices()
spec = json.loads(sys.argv[1])
train = TrainConfig(**spec["train"])
examples = load_jsonl(toy_dataset_path(), ByteTokenizer())
for name, parallel, devices in (("one", None, jax.devices()[:1]), ("fsdp4", ParallelConfig(fsdp=4), jax.devices())):
    check = check_memory(Trainer(spec["config"], train, examples, seed=0, devices=devices, parallel=parallel))
    print(json.dumps({"mesh": name, **check.model_dump(mode="json")}), flush=True)
