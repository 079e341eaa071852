"""Run by ``test_mesh.py`` in a subprocess with 4 forced host devices (XLA reads the flag when JAX starts).

One device at micro batch 8 against ``{fsdp: 4}`` and ``{data: 2, fsdp: 2}`` at micro batch 2 (the same global
batch): LoRA and QLoRA losses, gradient norms and adapters agree, every array is really sharded, and a checkpoint
saved on one mesh restores onto another. Prints ``OK`` and the losses.
"""

from __future__ import annotations

import sys
import tempfile

import jax
import numpy as np
from safetensors.numpy import load_file

from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
from aegis.schema import LoRAConfig, TrainConfig
from aegis.train.data import load_jsonl
from aegis.train.loop import Trainer
from aegis.train.nf4 import NF4Tensor
from aegis.train.parallel import ParallelConfig
from aegis.train.step import OptimizerSettings
from aegis.train.modeling import build_model
from aegis.train.weights import load_checkpoint, save_checkpoint, save_lora_adapter

assert len(jax.devices()) == 4, jax.devices()
STEPS = 2
ex = load_jsonl(toy_dataset_path(), ByteTokenizer())
settings = OptimizerSettings(learning_rate=3e-3, warmup_steps=1, total_steps=10)


BASE = tempfile.mkdtemp()
_model = build_model(tiny_llama_config())
save_checkpoint(_model, _model.init(jax.random.PRNGKey(1)), BASE)


def load(model: object, dtype: object, place: object = None) -> object:
    """Pretrained weights; a sharded run passes ``place`` (each parameter straight to its shards)."""
    if len(jax.devices()) == 4 and place is not None:
        load.placed = True  # type: ignore[attr-defined]
    return load_checkpoint(model, BASE, dtype=dtype, nf4=True, place=place)


def trainer(method: str, micro: int, parallel: ParallelConfig | None, devices: list, accum: int = 1) -> Trainer:
    lora = LoRAConfig(rank=4, target_modules=("q_proj", "v_proj", "down_proj")) if method != "full" else None
    tc = TrainConfig(
        method=method, micro_batch_size=micro, seq_len=48, precision="fp32", lora=lora, gradient_accumulation_steps=accum
    )
    loader = load if method == "qlora" else None  # QLoRA: a pretrained base, NF4 while loading
    return Trainer(
        tiny_llama_config(), tc, ex, optimizer=settings, seed=0, devices=devices, parallel=parallel, load_params=loader
    )


def leaves(tree: object) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def same(a: object, b: object, atol: float) -> float:
    diff = max(float(np.max(np.abs(x - y))) for x, y in zip(leaves(a), leaves(b), strict=True))
    assert diff <= atol, diff
    return diff


def check(method: str, meshes: tuple[ParallelConfig, ...]) -> tuple[list[float], list[Trainer]]:
    one = trainer(method, 8, None, jax.devices()[:1])
    ref = list(one.train(STEPS))
    runs = [one]
    for parallel in meshes:
        t = trainer(method, 2, parallel, jax.devices())
        assert t.global_batch_size == one.global_batch_size == 8
        infos = list(t.train(STEPS))
        assert [i.sample_ids for i in infos] == [i.sample_ids for i in ref]
        np.testing.assert_allclose([i.loss for i in infos], [i.loss for i in ref], rtol=1e-5)
        np.testing.assert_allclose([i.grad_norm for i in infos], [i.grad_norm for i in ref], rtol=1e-4)
        same(t.state.trainable, one.state.trainable, 1e-5)
        # really sharded: the batch over data x fsdp, adapters, moments and the base over fsdp
        batch = t._device_batch(t.last_batch)["input_ids"]
        assert batch.addressable_shards[0].data.shape == (1, 2, 48), batch.sharding
        lora_a = t.state.trainable.tree["model"]["layers"]["self_attn"]["q_proj"]["lora_A"]["weight"]  # [L, r, in]
        f = parallel.fsdp
        assert lora_a.addressable_shards[0].data.shape == (2, 4, 64 // f), lora_a.sharding
        mu = t.state.opt_state.inner_state[0].mu.tree["model"]["layers"]["self_attn"]["q_proj"]["lora_A"]["weight"]
        assert mu.sharding == lora_a.sharding
        base = t.frozen["model"]["layers"]["self_attn"]["q_proj"]["weight"]
        if isinstance(base, NF4Tensor):
            assert base.packed.addressable_shards[0].data.shape == (2, base.packed.shape[1] // f)
            assert base.absmax.addressable_shards[0].data.shape == (2, base.absmax.shape[1] // f)
        else:  # [L, heads * head_dim, embed]: embed over fsdp
            assert base.addressable_shards[0].data.shape == (2, 64, 64 // f), base.sharding
        assert t.frozen["model"]["embed_tokens"]["weight"].addressable_shards[0].data.shape == (264, 64 // f)
        if parallel.data == 1:
            np.testing.assert_allclose(t.eval(max_batches=2), one.eval(max_batches=2), rtol=1e-5)
        runs.append(t)
    return [i.loss for i in ref], runs


lora_losses, (one, src, other) = check("lora", (ParallelConfig(fsdp=4), ParallelConfig(data=2, fsdp=2)))
qlora_losses, _ = check("qlora", (ParallelConfig(data=2, fsdp=2),))
assert load.placed  # type: ignore[attr-defined]

# a checkpoint saved on {fsdp: 4} restores on one device and on {data: 2, fsdp: 2}, and training goes on alike;
# the sharded adapter exports (gathered to the host) to the one-device run's PEFT files
with tempfile.TemporaryDirectory() as tmp:
    for name, t in (("one", one), ("fsdp", src)):
        save_lora_adapter(t.model, jax.device_get(t.state.trainable), f"{tmp}/{name}")
    a, b = load_file(f"{tmp}/one/adapter_model.safetensors"), load_file(f"{tmp}/fsdp/adapter_model.safetensors")
    assert a.keys() == b.keys() and max(float(np.max(np.abs(a[k] - b[k]))) for k in a) <= 1e-5
    src.save(f"{tmp}/ckpt")
    nxt = next(iter(src.train(1)))
    for dst in (one, other):
        list(dst.train(2))  # moved on, then back to the checkpoint
        dst.restore(f"{tmp}/ckpt")
        assert dst.step == STEPS
        leaf = jax.tree.leaves(dst.state.trainable)[0]
        assert leaf.sharding.mesh.shape == dst.mesh.shape
        info = next(iter(dst.train(1)))
        assert info.sample_ids == nxt.sample_ids
        np.testing.assert_allclose(info.loss, nxt.loss, rtol=1e-5)
        same(dst.state.trainable, src.state.trainable, 1e-5)

# full fine-tuning with tensor parallelism and accumulation: heads and MLP widths over tensor, the rest over fsdp
one = trainer("full", 4, None, jax.devices()[:1], accum=2)
tp = trainer("full", 2, ParallelConfig(fsdp=2, tensor=2), jax.devices(), accum=2)
ref, got = list(one.train(2)), list(tp.train(2))
np.testing.assert_allclose([i.loss for i in got], [i.loss for i in ref], rtol=1e-5)
same(tp.state.trainable, one.state.trainable, 1e-5)
q = tp.state.trainable["model"]["layers"]["self_attn"]["q_proj"]["weight"]  # [L, heads*hd, embed]
assert q.addressable_shards[0].data.shape == (2, 32, 32), q.sharding
nu = tp.state.opt_state.inner_state[0].nu["model"]["layers"]["self_attn"]["q_proj"]["weight"]
assert nu.sharding == q.sharding
print("OK", [round(x, 4) for x in lora_losses], [round(x, 4) for x in qlora_losses])
sys.exit(0)
