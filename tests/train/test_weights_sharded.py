"""Weights stream from safetensors straight into their shards: each device's slice is read from the file alone, and
the params equal today's whole-parameter load bit for bit (one device here; 4 forced devices in a subprocess,
``weights_sharded_check.py``, since XLA reads the device count when JAX starts)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from aegis.train import safetensors_io
from aegis.train.modeling import build_model
from aegis.train.safetensors_io import CheckpointReader
from aegis.train.weights import Placement, load_checkpoint, save_checkpoint
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file


@pytest.mark.parametrize(("page", "chunk"), [(4096, 8 << 20), (0, 8 << 20), (4096, 8)])
def test_read_slice_reads_what_numpy_slicing_gives(page: int, chunk: int, tmp_path: Path, monkeypatch) -> None:
    # short runs as whole rows (in one chunk, or one row at a time), and every run read on its own
    monkeypatch.setattr(safetensors_io, "_PAGE_BYTES", page)
    monkeypatch.setattr(safetensors_io, "_CHUNK_BYTES", chunk)
    rng = np.random.default_rng(0)
    tensors = {
        "a": rng.standard_normal((4, 6, 5)).astype(np.float32),
        "b": rng.standard_normal((7, 3)).astype(ml_dtypes.bfloat16),
        "c": rng.standard_normal((9,)).astype(np.float16),
        "d": rng.standard_normal((3, 4, 2, 5)).astype(np.float32),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))  # safetensors' own writer
    reader = CheckpointReader(tmp_path)
    for name, x in tensors.items():
        cuts = [[slice(None), slice(0, 1), slice(1, n), slice(n // 2, n)] for n in x.shape]
        for index in itertools.product(*cuts):
            for dtype in (x.dtype, np.float32):  # straight into place, and cast through a buffer
                out = np.empty(x[index].shape, dtype)
                reader.read_slice(name, index, out)
                np.testing.assert_array_equal(out, x[index].astype(dtype))
    with pytest.raises(ValueError, match="does not fit"):
        reader.read_slice("a", (slice(0, 2), slice(None), slice(None)), np.empty((3, 6, 5), np.float32))


def test_one_device_placement_equals_the_whole_load(tmp_path: Path) -> None:
    from conftest import tiny_config

    model = build_model(tiny_config("llama"))
    folder = save_checkpoint(model, model.init(jax.random.PRNGKey(0)), tmp_path / "ckpt")
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    streamed = load_checkpoint(model, folder, place=Placement(lambda path, shape: NamedSharding(mesh, P())))
    reference = load_checkpoint(model, folder)
    for x, y in zip(jax.tree.leaves(streamed), jax.tree.leaves(reference), strict=True):
        assert x.dtype == y.dtype
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@pytest.mark.slow
def test_sharded_loads_on_four_devices_equal_the_one_device_load(hf_checkpoint, tmp_path: Path) -> None:
    # llama; phi3's fused qkv_proj; Mixtral's experts (joined from per-expert tensors); GPT-2's Conv1D (transposed)
    folders = [str(hf_checkpoint(name)[1]) for name in ("llama", "phi3", "mixtral", "gpt2")]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=4"]).strip()
    script = Path(__file__).with_name("weights_sharded_check.py")
    for extra in ([], ["--cast"], ["--nf4"]):
        args = folders if not extra else folders[:1] + folders[2:3]  # cast and NF4: llama and the MoE family
        out = subprocess.run([sys.executable, str(script), *args, *extra], capture_output=True, text=True, env=env,
                             timeout=600, check=False)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.startswith("OK"), out.stdout
        if not extra:
            assert "joined per layer: ['model.layers.mlp.experts.gate_up_proj'" in out.stdout, out.stdout  # the debug log
