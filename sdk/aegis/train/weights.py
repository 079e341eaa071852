"""Hugging Face safetensors checkpoints <-> the JAX params pytree, and LoRA adapters in PEFT's format.

Checkpoints are read lazily (memory-mapped, one tensor at a time) from a folder holding
``model.safetensors`` or ``model.safetensors.index.json`` + shards, or from a single file.
Tensor names are transformers' on-disk names (per-expert MoE weights, Mixtral's
``block_sparse_moe``); each family's :class:`~aegis.train.modeling.Recipe` maps them to the
in-memory tree. Saving writes the same on-disk names, so ``from_pretrained`` reads the result.

    params = load_checkpoint(model, "ckpt/")                 # dtype: model.param_dtype
    params = load_checkpoint(model, "ckpt/", place=Placement(lambda path, shape: NamedSharding(mesh, spec)))
                                                             # each device's slices streamed into its shards
    save_checkpoint(model, params, "out/", max_shard_bytes=2**30)
    save_lora_adapter(model, lora, "adapter/")              # PeftModel.from_pretrained(hf_model, "adapter/")
    lora = load_lora_adapter(model, "adapter/")

Bad input raises :class:`~aegis.errors.CheckpointError` with a one-line message naming the
tensor and the expected shape, the missing shard, or the unsupported dtype.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aegis.errors import CheckpointError
from aegis.train.lora import LoRAWeights, peft_parameter_name
from aegis.train.modeling import Model, engine_family
from aegis.train.modeling.families import Recipe
from aegis.train.nf4 import NF4Tensor, dequantize
from aegis.train.safetensors_io import (
    ADAPTER_FILE,
    CheckpointReader,
    numpy_dtype,
    read_header,
    write_file,
    write_shards,
)
from aegis.models.shapes import layer_stacks

__all__ = [
    "read_header",
    "CheckpointReader",
    "load_checkpoint",
    "Placement",
    "save_checkpoint",
    "to_hf_state_dict",
    "save_lora_adapter",
    "load_lora_adapter",
]

_log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."


# ----- params <-> names -----------------------------------------------------------------------------------


def _memory_names(model: Model) -> list[tuple[tuple[str, ...], str | None, tuple[int, ...]]]:
    """(tree path, in-memory name template with ``{i}`` for stacked layers, per-layer shape)."""
    out = []
    stacks = {key for key, _, _ in layer_stacks(model.spec)}

    def visit(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                visit(v, path + (k,))
            return
        if path[0] == "model" and path[1] in stacks:  # every stack holds model.layers.{i} (DeepSeek: two)
            out.append((path, "model.layers.{i}." + ".".join(path[2:]), tuple(node[1:])))
        else:
            out.append((path, ".".join(path), tuple(node)))

    visit(model.param_shapes(), ())
    return out


def _stack_layers(model: Model, path: tuple[str, ...]) -> range:
    """The decoder layer indices a stacked leaf at ``path`` holds, in order."""
    for key, first, count in layer_stacks(model.spec):
        if path[1] == key:
            return range(first, first + count)
    raise KeyError(path)


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value


def _get(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        tree = tree[part]
    return tree


@dataclasses.dataclass(frozen=True)
class Placement:
    """``place=`` for :func:`load_checkpoint` that streams each parameter into its shards.

    ``sharding(tree path, global shape)``: the parameter's sharding (a run's ``NamedSharding`` from its rules). A
    parameter the sharding splits is built one device at a time from only the checkpoint slices that device holds;
    a replicated one is read whole and put on the devices (as a plain ``place`` does)."""

    sharding: Callable[[tuple[str, ...], tuple[int, ...]], Any]

    def __call__(self, path: tuple[str, ...], array: np.ndarray) -> Any:
        return jax.device_put(array, self.sharding(path, tuple(array.shape)))


def load_checkpoint(
    model: Model,
    path: str | Path,
    *,
    dtype: Any = None,
    nf4: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    place: Callable[[tuple[str, ...], np.ndarray], Any] | None = None,
) -> dict[str, Any]:
    """Read a safetensors checkpoint into the params tree (cast to ``dtype``, default ``model.param_dtype``).

    ``place(tree path, host array)``: puts each parameter on the devices; default ``jnp.asarray`` (the default
    device). A :class:`Placement` (a sharded run's) streams each parameter the sharding splits straight into its
    shards: each device's slice is read from the files alone (each process reads only what its devices hold), so
    the host holds about one shard, never the stacked parameter. Other ``place`` callables get the whole
    parameter, stacked over layers.

    Tensors stream one parameter (all layers) at a time, so the host holds at most one stacked parameter beside
    the growing tree. ``nf4``: linear weights are quantised to NF4 as they arrive (QLoRA), by the rule of
    :func:`aegis.train.nf4.quantize_params`, on the devices holding them. ``on_progress(bytes read, total bytes)``
    after each parameter.
    """
    from aegis.train.nf4 import quantize_leaf

    reader = CheckpointReader(path)
    total_bytes = reader.total_bytes()
    done_bytes = 0
    recipe = engine_family(model.config.get("model_type")).recipe
    prefix = _base_model_prefix(model)
    target = jnp.dtype(dtype or model.param_dtype)
    np_target = numpy_dtype(target)
    params: dict[str, Any] = {}
    consumed: set[str] = set()
    for path_, template, shape in _memory_names(model):
        layer_ids = _stack_layers(model, path_) if "{i}" in template else [None]
        stacked = layer_ids != [None]
        parts: list[tuple[str, Recipe]] = []
        for i in layer_ids:
            name = template.format(i=i) if i is not None else template
            r = recipe(name, model.spec)
            if prefix and not all(key in reader for key in r.keys):  # GPT-2's Hub files: h.0.*, not transformer.h.0.*
                r = dataclasses.replace(r, keys=tuple(reader.unprefixed(key, prefix) for key in r.keys))
            consumed.update(r.keys)
            for key in r.keys:
                if key not in reader:
                    raise CheckpointError(
                        f"checkpoint lacks tensor {key!r} (expected for {model.family} with this config.json); "
                        "check that the checkpoint and config.json belong to the same model."
                    )
                done_bytes += reader.nbytes(key)
            parts.append((name, r))
        full = (len(layer_ids), *shape) if stacked else shape
        sharding = place.sharding(path_, full) if isinstance(place, Placement) else None
        if sharding is not None and not sharding.is_fully_replicated:
            leaf = _load_sharded(reader, parts, shape, stacked, np_target, full, sharding, path_)
        else:
            arr = np.empty(full, np_target)  # one copy: cast while filling
            for j, (name, r) in enumerate(parts):
                _fill(reader, name, r, shape, arr[j] if stacked else arr, None)
            leaf = jnp.asarray(arr) if place is None else place(path_, arr)
            del arr
        _set(params, path_, quantize_leaf(path_, leaf) if nf4 else leaf)
        if on_progress is not None:
            on_progress(min(done_bytes, total_bytes), total_bytes)
    _check_nothing_left_out(reader, consumed)
    return params


def _fill(
    reader: CheckpointReader, name: str, r: Recipe, shape: tuple[int, ...], out: np.ndarray,
    index: tuple[slice, ...] | None,
) -> None:
    """Write ``index`` (None: all) of one layer's tensor ``name`` (per-layer ``shape``) into ``out``, cast to its
    dtype: a tensor stored as kept is read slice by slice from the file; a recipe that joins or transforms
    tensors (fused experts, Conv1D, MXFP4) is joined whole for this layer, then sliced."""
    if r.stored_as_kept and reader.shape(r.keys[0]) == shape:
        if index is None:
            reader.read_into(r.keys[0], out)
        else:
            reader.read_slice(r.keys[0], index, out)
        return
    joined = r.join([reader.get(key, packed=r.packed) for key in r.keys])
    if tuple(joined.shape) != shape:
        bad = r.keys[0] if len(r.keys) == 1 else name
        raise CheckpointError(
            f"tensor {bad!r} has shape {tuple(joined.shape)}, expected {shape} from config.json; "
            "the checkpoint and config.json belong to different models."
        )
    out[...] = joined if index is None else joined[index]


def _load_sharded(
    reader: CheckpointReader, parts: list[tuple[str, Recipe]], shape: tuple[int, ...], stacked: bool,
    np_target: np.dtype, full: tuple[int, ...], sharding: Any, path: tuple[str, ...],
) -> jax.Array:
    """One parameter built shard by shard: for each distinct slice this process's devices hold, read it from the
    files, put it on those devices and drop it; the global array is assembled from the per-device arrays.

    ``jax.make_array_from_callback`` would do the same with a callback per device, but it computes every local
    shard (replicas included) on the host before one transfer, which holds the whole parameter on a host with
    all its devices; here the host holds one slice at a time."""
    if not all(r.stored_as_kept and reader.shape(r.keys[0]) == shape for _, r in parts):
        _log.debug(
            "%s: its recipe joins or transforms checkpoint tensors (not sliceable in the file), so each layer is "
            "joined whole and then sliced for each shard", ".".join(path),
        )
    groups: dict[tuple[tuple[int, int], ...], tuple[tuple[slice, ...], list[Any]]] = {}
    for device, index in sharding.addressable_devices_indices_map(full).items():
        bounds = tuple(s.indices(n)[:2] for s, n in zip(index, full, strict=True))
        groups.setdefault(bounds, (tuple(slice(a, b) for a, b in bounds), []))[1].append(device)
    arrays = []
    for bounds, (index, devices) in groups.items():
        host = np.empty(tuple(b - a for a, b in bounds), np_target)
        if stacked:
            for j, layer in enumerate(range(*index[0].indices(full[0]))):
                name, r = parts[layer]
                _fill(reader, name, r, shape, host[j], index[1:])
        else:
            name, r = parts[0]
            _fill(reader, name, r, shape, host, index)
        arrays += [jax.device_put(host, device) for device in devices]
        del host
    return jax.make_array_from_single_device_arrays(full, sharding, arrays)


def _base_model_prefix(model: Model) -> str | None:
    from aegis.models.architectures import registry

    entry = registry.find(model.config.get("model_type"))
    return entry.base_model_prefix if entry is not None else None


def _check_nothing_left_out(reader: CheckpointReader, consumed: set[str]) -> None:
    """A checkpoint tensor of a module the model reads, which the model does not read (a bias or norm the config
    switches off): the config.json and the weights disagree, and training would silently drop it. Tensors of
    modules the model does not build (DeepSeek-V3's multi-token-prediction layer, a tied head stored anyway,
    rotary buffers) are not read by transformers either."""
    modules = {key.rsplit(".", 1)[0] for key in consumed}
    for key in reader.names():
        if key not in consumed and key.rsplit(".", 1)[0] in modules:
            raise CheckpointError(
                f"checkpoint tensor {key!r} is not part of the model config.json describes (a bias or norm it switches "
                "off, e.g. use_bias, attention_bias, mlp_bias); check that config.json belongs to these weights."
            )


def to_hf_state_dict(model: Model, params: dict[str, Any], *, dtype: Any = None) -> dict[str, np.ndarray]:
    """The on-disk tensors (transformers' checkpoint names) for ``params``; NF4 weights are dequantised."""
    recipe = engine_family(model.config.get("model_type")).recipe
    out: dict[str, np.ndarray] = {}
    for path_, template, _ in _memory_names(model):
        leaf = _get(params, path_)
        if isinstance(leaf, NF4Tensor):
            leaf = dequantize(leaf)
        arr = np.asarray(jax.device_get(leaf))
        if dtype is not None:
            arr = arr.astype(numpy_dtype(dtype))
        stacked = "{i}" in template
        for j, i in enumerate(_stack_layers(model, path_) if stacked else [None]):
            name = template.format(i=i) if stacked else template
            r = recipe(name, model.spec)
            for key, part in zip(r.written_keys, r.split(arr[j] if stacked else arr), strict=True):
                out[key] = np.ascontiguousarray(part)
    return out


def saved_config(model: Model, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config.json of a folder the engine writes: ``model.config`` (or ``config``) without a quantisation
    the engine read and undid (an MXFP4 GPT-OSS checkpoint is written in the training dtype)."""
    out = dict(model.config if config is None else config)
    if model.spec.extra.get("mxfp4"):
        out.pop("quantization_config", None)
    return out


def save_checkpoint(
    model: Model,
    params: dict[str, Any],
    path: str | Path,
    *,
    dtype: Any = None,
    max_shard_bytes: int | None = None,
    write_config: bool = True,
) -> Path:
    """Write ``params`` as a Hugging Face checkpoint folder (sharded, with an index, above ``max_shard_bytes``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = to_hf_state_dict(model, params, dtype=dtype)
    if write_config:
        (path / "config.json").write_text(json.dumps(saved_config(model), indent=2, default=str))
    write_shards(path, tensors, max_shard_bytes)
    return path


# ----- LoRA adapters (PEFT format) ------------------------------------------------------------------------


def _lora_modules(tree: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    if "lora_A" in tree:
        return [(path, tree)]
    out = []
    for k, v in tree.items():
        out += _lora_modules(v, path + (k,))
    return out


_EXPERT_PARAMS = ("gate_up_proj", "down_proj")
"""transformers' registration order of the fused expert parameters. PEFT wraps targeted parameters in that
order, each ParamWrapper around the previous one, so with both adapted ``gate_up_proj``'s adapter sits under
``experts.base_layer`` and ``down_proj``'s under ``experts``; with one, it sits under ``experts``."""


def _expert_key_paths(expert_names: set[str]) -> dict[str, tuple[str, ...]]:
    """Fused expert parameter -> the module path suffix PEFT saves its adapter under (after ``experts``)."""
    ordered = [n for n in _EXPERT_PARAMS if n in expert_names]
    return {n: ("base_layer",) * (len(ordered) - 1 - k) for k, n in enumerate(ordered)}


def _cast(arr: np.ndarray, dtype: Any) -> np.ndarray:
    if dtype is None:
        return arr
    return arr.astype(numpy_dtype(dtype))


def save_lora_adapter(
    model: Model,
    lora: LoRAWeights,
    path: str | Path,
    *,
    base_model_name_or_path: str | None = None,
    dtype: Any = None,
) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` as PEFT's ``save_pretrained`` does.

    Router and fused-expert adapters are written as PEFT writes its ParamWrapper adapters: listed in
    ``target_parameters`` (with ``rank_pattern``/``alpha_pattern`` for the doubled rank on ``gate_up_proj``),
    tensors under ``mlp.gate`` and ``mlp.experts[.base_layer]``.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    stack_layers = {key: range(first, first + count) for key, first, count in layer_stacks(model.spec)}
    names_on_disk = engine_family(model.config.get("model_type")).names
    modules = [(path, mod, stack) for stack, tree in lora.tree["model"].items() for path, mod in _lora_modules(tree)]
    expert_paths = _expert_key_paths({p[-1] for p, _, _ in modules if peft_parameter_name(p) in _EXPERT_PARAMS})
    tensors: dict[str, np.ndarray] = {}
    names: set[str] = set()
    parameters: set[str] = set()
    rank_pattern: dict[str, int] = {}
    alpha_pattern: dict[str, float] = {}
    for mod_path, mod, stack in modules:
        key_path = mod_path
        param = peft_parameter_name(mod_path)
        if param is None:
            names.add(mod_path[-1])
        else:
            parameters.add(param)
            if param in expert_paths:
                key_path = mod_path[:-1] + expert_paths[param]
                rank = mod["lora_A"]["weight"].shape[1] // model.spec.moe.num_experts
                if rank != lora.rank:  # PEFT's conversion: rank and alpha times the fused count, same scale
                    pattern = rf".*\.{param}"
                    rank_pattern[pattern] = int(rank)
                    alpha_pattern[pattern] = lora.alpha * rank / lora.rank
        for part in ("lora_A", "lora_B"):
            arr = _cast(np.asarray(jax.device_get(mod[part]["weight"])), dtype)
            for j, i in enumerate(stack_layers[stack]):
                module = names_on_disk.checkpoint(f"model.layers.{i}.{'.'.join(key_path)}")
                key = f"{PEFT_PREFIX}{module}.{part}.weight"
                tensors[key] = np.ascontiguousarray(arr[j])
    targets = sorted(names)  # explicit module names: PEFT targets exactly the modules that have weights here
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": targets,
        "target_parameters": sorted(parameters) or None,
        "bias": "none",
        "fan_in_fan_out": model.spec.conv1d,  # GPT-2's Conv1D stores [in, out]
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
    }
    (path / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    # the dtype the adapters were kept in (fp32 under a 16-bit base, as PEFT keeps them), said where loaders look
    stored = ",".join(sorted({np.dtype(t.dtype).name for t in tensors.values()}))
    write_file(path / ADAPTER_FILE, tensors, {"format": "pt", "dtype": stored})
    return path


def load_lora_adapter(model: Model, path: str | Path, *, dtype: Any = jnp.float32) -> LoRAWeights:
    """Read a PEFT LoRA adapter folder (as written by PEFT or :func:`save_lora_adapter`), including
    ParamWrapper adapters on the MoE router and fused experts (``target_parameters``)."""
    path = Path(path)
    cfg_file = path / ADAPTER_CONFIG
    if not cfg_file.exists():
        raise CheckpointError(f"{path} has no {ADAPTER_CONFIG}; point at a PEFT adapter folder.")
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("use_dora") or cfg.get("use_rslora"):
        raise CheckpointError(
            f"{path} is not a plain LoRA adapter (peft_type/use_dora/use_rslora); only LoRA is supported."
        )
    parameters = set(cfg.get("target_parameters") or ())
    if parameters and float(cfg.get("lora_dropout") or 0.0) > 0.0:
        raise CheckpointError(
            f"{path} adapts parameters {sorted(parameters)} with lora_dropout={cfg['lora_dropout']}, which PEFT's "
            "ParamWrapper refuses; set lora_dropout to 0 in its adapter_config.json."
        )
    scale = float(cfg["lora_alpha"]) / int(cfg["r"])
    ranks, alphas = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    for pattern in set(ranks) | set(alphas):
        r_, a_ = ranks.get(pattern, cfg["r"]), alphas.get(pattern, cfg["lora_alpha"])
        if abs(float(a_) / int(r_) - scale) > 1e-9 * scale:
            raise CheckpointError(
                f"{path} gives {pattern!r} LoRA scale {a_}/{r_}, not lora_alpha/r = {scale}; only one scale per "
                "adapter is supported (PEFT's fused-expert rank doubling keeps it)."
            )
    expert_paths = {v: k for k, v in _expert_key_paths(parameters & set(_EXPERT_PARAMS)).items()}
    reader = CheckpointReader(path / ADAPTER_FILE)
    grouped: dict[tuple[str, ...], dict[str, dict[int, np.ndarray]]] = {}
    names_on_disk = engine_family(model.config.get("model_type")).names
    for key in reader.names():
        ours = names_on_disk.engine(key[len(PEFT_PREFIX):]) if key.startswith(PEFT_PREFIX) else None
        if ours is None or not ours.startswith("model.layers."):
            raise CheckpointError(
                f"adapter tensor {key!r} is outside the decoder layers; only layer adapters are supported."
            )
        parts = ours[len("model.layers.") :].split(".")
        if len(parts) < 4 or parts[-2] not in ("lora_A", "lora_B"):
            raise CheckpointError(f"adapter tensor {key!r} is not a lora_A/lora_B weight.")
        layer, mod_path, which = int(parts[0]), tuple(parts[1:-2]), parts[-2]
        if "experts" in mod_path:
            at = mod_path.index("experts")
            suffix = mod_path[at + 1 :]
            if suffix not in expert_paths:
                raise CheckpointError(
                    f"adapter tensor {key!r} matches none of the fused expert parameters in target_parameters "
                    f"{sorted(parameters)}; expected PEFT's ParamWrapper names (experts[.base_layer].lora_A)."
                )
            mod_path = mod_path[: at + 1] + (expert_paths[suffix],)
        grouped.setdefault(mod_path, {}).setdefault(which, {})[layer] = reader.get(key)
    n = model.spec.num_layers
    stacks = layer_stacks(model.spec)
    tree: dict[str, Any] = {}
    for mod_path, parts in grouped.items():
        for which, by_layer in parts.items():
            # a module of every layer, or (DeepSeek) one of the dense or of the MoE layers only
            spans = [(key, range(first, first + count)) for key, first, count in stacks]
            covered = [(key, ids) for key, ids in spans if sorted(by_layer) == list(ids)]
            if sorted(by_layer) == list(range(n)):
                covered = spans
            if not covered:
                raise CheckpointError(
                    f"adapter for {'.'.join(mod_path)}.{which} covers layers {sorted(by_layer)}, expected 0..{n - 1}."
                )
            for key, ids in covered:
                arr = np.stack([by_layer[i].astype(np.float32) for i in ids])
                _set(tree, (key,) + mod_path + (which, "weight"), jnp.asarray(arr, dtype))
    if "layers" not in tree:
        tree["layers"] = {}
    rank = int(cfg["r"])
    targets = cfg.get("target_modules") or sorted({p[-1] for p in grouped})
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    targets += tuple(sorted(parameters - set(targets)))
    return LoRAWeights(
        {"model": tree}, rank, float(cfg["lora_alpha"]), float(cfg.get("lora_dropout", 0.0)), targets
    )
