"""Data parallel over 4 forced host devices: the same losses and params as one device."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
    from aegis.schema import TrainConfig
    from aegis.train.data import load_jsonl
    from aegis.train.loop import Trainer
    from aegis.train.step import OptimizerSettings

    assert len(jax.devices()) == 4, jax.devices()
    ex = load_jsonl(toy_dataset_path(), ByteTokenizer())
    settings = OptimizerSettings(learning_rate=3e-3, warmup_steps=1, total_steps=10)

    def run(devices, per_device):
        tc = TrainConfig(method="full", micro_batch_size=per_device, seq_len=48, precision="fp32",
                         gradient_accumulation_steps=2)
        tr = Trainer(tiny_llama_config(), tc, ex, optimizer=settings, seed=0, devices=devices)
        infos = list(tr.train(3))
        arrays = tr._device_batch(tr.last_batch)
        return tr, infos, arrays

    multi, m_infos, m_arrays = run(jax.devices(), 2)       # 4 devices x 2 rows
    single, s_infos, _ = run(jax.devices()[:1], 8)         # 1 device x 8 rows: the same global batch
    assert len(m_arrays["input_ids"].sharding.device_set) == 4
    assert m_arrays["input_ids"].addressable_shards[0].data.shape == (2, 2, 48)
    leaf = jax.tree.leaves(multi.state.trainable)[0]
    assert len(leaf.sharding.device_set) == 4 and leaf.sharding.is_fully_replicated
    assert [i.sample_ids for i in m_infos] == [i.sample_ids for i in s_infos]
    np.testing.assert_allclose([i.loss for i in m_infos], [i.loss for i in s_infos], rtol=1e-5)
    np.testing.assert_allclose([i.grad_norm for i in m_infos], [i.grad_norm for i in s_infos], rtol=1e-4)
    for a, b in zip(jax.tree.leaves(multi.state.trainable), jax.tree.leaves(single.state.trainable)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(multi.eval(max_batches=2), single.eval(max_batches=2), rtol=1e-5)
    print("OK", [round(i.loss, 4) for i in m_infos])
    """
)


def test_data_parallel_loss_equals_single_device_loss():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("OK")
