"""Aegis' JAX training engine: model families, LoRA, NF4, safetensors I/O, data, steps, loop, forensics.

Plain JAX (no flax): models are pure functions over a params pytree, the train state is a small
frozen pytree dataclass, and a :class:`Trainer` yields one typed :class:`StepInfo` per step.

    from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
    from aegis.train import Trainer, load_jsonl
    from aegis.schema import TrainConfig
    trainer = Trainer(tiny_llama_config(), TrainConfig(method="lora", micro_batch_size=8, seq_len=64,
                      precision="fp32"), load_jsonl(toy_dataset_path(), ByteTokenizer()))
    for info in trainer.train(20):
        print(info.step, info.loss, info.grad_norm, info.tokens_per_s)
    report = trainer.analyze()                 # per-sample losses and gradient norms of the last batch
    trainer.save("/tmp/ckpt")                  # orbax: train state + sampler state

Modules: ``models`` (families, ``build_model``), ``lora``, ``nf4``, ``weights`` (HF safetensors
and PEFT adapters), ``data`` (examples, batches, sampler), ``step`` (train/eval steps, optimizers,
precision modes, fp16 loss scaling), ``optim8bit`` (8-bit AdamW), ``loop`` (Trainer), ``forensics``
(per-sample gradients), ``benchmark`` (measured throughput and XLA memory). Names below are
imported on first use, so ``import aegis.train.data`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "build_model": "aegis.train.modeling",
    "Model": "aegis.train.modeling",
    "init_lora": "aegis.train.lora",
    "merge_lora": "aegis.train.lora",
    "LoRAWeights": "aegis.train.lora",
    "quantize_params": "aegis.train.nf4",
    "load_checkpoint": "aegis.train.weights",
    "save_checkpoint": "aegis.train.weights",
    "save_lora_adapter": "aegis.train.weights",
    "load_lora_adapter": "aegis.train.weights",
    "Example": "aegis.train.data",
    "Batch": "aegis.train.data",
    "BatchSampler": "aegis.train.data",
    "load_jsonl": "aegis.train.data",
    "tokenize_rows": "aegis.train.data",
    "split_examples": "aegis.train.data",
    "OptimizerSettings": "aegis.train.step",
    "LossScaleSettings": "aegis.train.step",
    "TrainState": "aegis.train.step",
    "make_optimizer": "aegis.train.step",
    "make_train_step": "aegis.train.step",
    "make_eval_step": "aegis.train.step",
    "init_state": "aegis.train.step",
    "adamw_8bit": "aegis.train.optim8bit",
    "Trainer": "aegis.train.loop",
    "StepInfo": "aegis.train.loop",
    "analyze_batch": "aegis.train.per_sample",
    "BatchForensics": "aegis.train.per_sample",
    "SampleReport": "aegis.train.per_sample",
    "run_benchmark": "aegis.train.benchmark",
    "MemoryCheck": "aegis.train.memory_check",
    "check_memory": "aegis.train.memory_check",
    "export_trained": "aegis.train.export",
    "BenchmarkResult": "aegis.train.benchmark",
    "jax_step_memory": "aegis.train.benchmark",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'aegis.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
