"""Meshes and sharding rules: every parameter of every registry family gets a valid PartitionSpec, and LoRA /
QLoRA / full fine-tuning on 4 forced host devices ({fsdp: 4}, {data: 2, fsdp: 2}, {fsdp: 2, tensor: 2}) follow the
one-device run (``mesh_check.py``, in a subprocess: XLA reads the device count when JAX starts)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax.sharding import PartitionSpec as P

from aegis.errors import InvalidConfigError
from aegis.train.modeling import build_model
from aegis.train.parallel import ParallelConfig, global_batch_size, resolve_parallel
from aegis.train.sharding import ShardingRules, logical_axes, make_mesh, partition_spec

from conftest import TINY_CONFIGS

SIZES = {"data": 2, "fsdp": 4, "tensor": 2}


def _leaf_shapes(tree: dict, path: tuple = ()) -> list[tuple[tuple, tuple]]:
    if isinstance(tree, dict):
        return [x for k, v in tree.items() for x in _leaf_shapes(v, path + (k,))]
    return [(path, tuple(tree))]


def _named(spec: P) -> list[str]:
    return [a for axes in spec if axes is not None for a in ((axes,) if isinstance(axes, str) else axes)]


def _check_spec(shape: tuple[int, ...], logical: tuple, spec: P, sizes: dict[str, int]) -> None:
    assert len(spec) <= len(shape)
    named = [a for axes in spec if axes is not None for a in ((axes,) if isinstance(axes, str) else axes)]
    assert len(named) == len(set(named)), spec  # a mesh axis shards one dimension at most
    for dim, axes in zip(shape, spec):
        if axes is not None:
            axes = (axes,) if isinstance(axes, str) else axes
            assert all(a in sizes for a in axes) and dim % math.prod(sizes[a] for a in axes) == 0, (shape, spec)
    for i, name in enumerate(logical):
        if name == "layers" and i < len(spec):
            assert spec[i] is None, (logical, spec)


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_every_parameter_of_every_family_gets_a_valid_spec(name: str) -> None:
    model = build_model(TINY_CONFIGS[name])
    axes = logical_axes(model)
    shapes = {p: s for p, s in _leaf_shapes(model.param_shapes())}
    assert set(axes) == set(shapes)
    sharded = 0
    for path, shape in shapes.items():
        logical = axes[path]
        assert len(logical) == len(shape), (path, logical, shape)
        spec = partition_spec(shape, logical, SIZES)
        _check_spec(shape, logical, spec, SIZES)
        # fsdp alone shards every parameter that has an axis (not the layer axis) it divides
        if any(d % 4 == 0 for d, n in zip(shape, logical) if n != "layers"):
            assert "fsdp" in _named(partition_spec(shape, logical, {"fsdp": 4})), (path, shape)
        sharded += "tensor" in _named(spec)
    assert sharded, "tensor parallelism split nothing"
    # the embedding's vocab goes over tensor, its width over fsdp
    assert axes[("model", "embed_tokens", "weight")] == ("vocab", "embed")


def test_logical_axes_come_from_the_registry_expressions() -> None:
    axes = logical_axes(build_model(TINY_CONFIGS["llama"]))
    layer = lambda *p: axes[("model", "layers", *p)]  # noqa: E731
    assert layer("self_attn", "q_proj", "weight") == ("layers", "heads", "embed")  # linear [hidden, heads*head_dim]
    assert layer("self_attn", "k_proj", "weight") == ("layers", "kv_heads", "embed")
    assert layer("mlp", "down_proj", "weight") == ("layers", "embed", "mlp")
    assert layer("input_layernorm", "weight") == ("layers", "embed")
    moe = logical_axes(build_model(TINY_CONFIGS["mixtral"]))
    assert moe[("model", "layers", "mlp", "experts", "gate_up_proj")] == ("layers", "experts", "mlp", "embed")
    gpt2 = logical_axes(build_model(TINY_CONFIGS["gpt2"]))  # Conv1D names, the engine's layout
    assert gpt2[("model", "layers", "self_attn", "c_attn", "weight")] == ("layers", "embed", "embed")
    assert all(set(a) - {None, "layers"} for p, a in gpt2.items() if "layers" in p), gpt2


def test_one_device_and_data_only_meshes_replicate_everything() -> None:
    import jax

    model = build_model(TINY_CONFIGS["qwen2"])
    for devices in (jax.devices()[:1],):
        mesh, parallel = make_mesh(None, devices)
        assert parallel == ParallelConfig(data=len(devices))
        shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
        specs = jax.tree.leaves(ShardingRules.for_model(model, mesh).shardings(shapes))
        assert specs and all(s.spec == P() for s in specs)


def test_indivisible_axes_are_replicated_never_an_error() -> None:
    assert partition_spec((3, 5), ("vocab", "embed"), SIZES) == P()
    assert partition_spec((2, 6, 8), ("layers", None, "embed"), {"fsdp": 4}) == P(None, None, "fsdp")
    assert partition_spec((4, 6), ("layers", None), {"fsdp": 4}) == P()  # the layer axis stays whole
    assert partition_spec((12, 64), ("heads", None), {"fsdp": 4, "tensor": 8}) == P(None, "fsdp")  # 12 % 8
    assert partition_spec((), (), SIZES) == P()


def test_parallel_config() -> None:
    assert resolve_parallel(None, 4) == ParallelConfig(data=4)
    assert resolve_parallel(ParallelConfig(fsdp=4), 4).shape == (1, 4, 1)
    with pytest.raises(InvalidConfigError, match="needs 6 devices but this run has 4"):
        resolve_parallel(ParallelConfig(data=2, fsdp=3), 4)
    with pytest.raises(ValueError):
        ParallelConfig(fsdp=2, pipeline=2)
    assert global_batch_size(2, ParallelConfig(data=2, fsdp=2, tensor=2), accumulation=3) == 24


def test_run_config_takes_a_parallel_section() -> None:
    from aegis.supervise.run_config import RunConfig

    cfg = RunConfig(model="tiny-llama", data="toy", parallel={"data": 2, "fsdp": 2})
    assert cfg.parallel == ParallelConfig(data=2, fsdp=2, tensor=1)
    assert RunConfig(model="tiny-llama", data="toy").parallel is None
    with pytest.raises(ValueError):
        RunConfig(model="tiny-llama", data="toy", parallel={"fdsp": 2})


def test_a_run_whose_mesh_is_not_the_device_count_is_refused_before_it_starts() -> None:
    import jax

    from aegis.data import tiny_llama_config
    from aegis.supervise.run_config import RunConfig
    from aegis.supervise.engine_handle import check_feasible

    n = len(jax.devices())
    with pytest.raises(InvalidConfigError, match=f"needs {n + 1} devices but this run has {n}"):
        check_feasible(RunConfig(model="tiny-llama", data="toy", parallel={"fsdp": n + 1}), tiny_llama_config())
    check_feasible(RunConfig(model="tiny-llama", data="toy", parallel={"data": n}), tiny_llama_config())


@pytest.mark.slow
def test_sharded_runs_follow_the_one_device_run() -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=4"]).strip()
    script = Path(__file__).with_name("mesh_check.py")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("OK"), out.stdout
