"""Forge phase 4: BitNet b1.58 compression of a Hugging Face llama-family folder, and inference from it.

    result = compress_model("merged/", "ternary/")       # CompressionResult: ratios, sparsity, category
    packed = load_packed("ternary/")                      # PackedModel: JAX model + params with packed leaves
    logits = packed.apply(ids)                            # unpacks inside the jitted forward
    params = packed.dense_params()                        # or the dequantised tree, for model.apply

Every linear weight of the decoder layers becomes ternary by the paper's absmean rule
(:mod:`aegis.forge._bitnet_pack`: ``W_q = RoundClip(W / (gamma + eps), -1, 1)``, ``gamma = mean|W|`` per
tensor, or per output channel with ``per_channel=True``) and is stored packed, 4 weights per byte, beside its
float32 (or bfloat16) ``gamma``. What stays in its original dtype, whatever the model's size: the embeddings,
the LM head, every norm, biases and MoE routers, and any decoder layer listed in ``keep_layers`` (the seed's
conservative fallback keeps the last one: ``keep_layers=(-1,)``).

The size category (:data:`SIZE_CATEGORIES`, from the Agent Forge phase-4 plan) is read at run time from the
parameter count that :func:`aegis.models.profiles.profile_from_config` computes from config.json; it sets the target
compression the result is compared against (reported, never enforced).

The output folder holds the model's ``config.json`` renamed :data:`MODEL_CONFIG`, in its place a ``config.json``
whose ``model_type`` is the format's name (``aegis-bitnet-b1.58``), the tokenizer files unchanged, a ``README.md``
saying how to load it, ``model.safetensors`` (sharded with
an index above ``max_shard_bytes``) with the preserved tensors under their own names and, for each
ternary tensor ``NAME``, ``NAME.ternary`` (uint8, last axis packed) and ``NAME.scale`` (``gamma``, with the
weight's leading dims: all ones per tensor, ``shape[:-1]`` per channel), and ``bitnet_config.json`` saying
what is packed and how. transformers cannot run that format (its own BitNet format packs another axis, keeps
one scale per tensor and needs its quantizer), so ``AutoModelForCausalLM.from_pretrained`` refuses the folder
("model type `aegis-bitnet-b1.58` ... does not recognize this architecture") instead of loading a model whose
decoder weights are missing and randomly initialised, while ``AutoTokenizer`` still reads the tokenizer;
:func:`load_packed` loads it (and folders of the earlier layout, with the model's own ``config.json``).

Activations: each ternary linear of the packed model quantises its input per token to int8
(:func:`~aegis.forge._bitnet_pack.absmax_int8`, the paper's W1.58 A8) and multiplies int8 by ternary codes in
integers; ``load_packed(..., activations="none")`` runs W1.58 A16. Where the quantiser sits and why, the
straight-through fine-tuning, calibration and layer-wise revert: :mod:`aegis.forge.bitnet_train` and
:mod:`aegis.forge.bitnet_pipeline`.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from aegis.errors import InvalidConfigError
from aegis.schema import Frozen

__all__ = [
    "BITNET_CONFIG",
    "MODEL_CONFIG",
    "SIZE_CATEGORIES",
    "SizeCategory",
    "CompressionResult",
    "PackedTernary",
    "PackedModel",
    "size_category",
    "is_ternary_target",
    "compress_model",
    "load_packed",
    "unpack_params",
]

BITNET_CONFIG = "bitnet_config.json"
MODEL_CONFIG = "model_config.json"
"""The source model's config.json, renamed so that no loader takes the packed folder for a plain model."""
FORMAT = "aegis-bitnet-b1.58"
PACKED_SUFFIX = ".ternary"
SCALE_SUFFIX = ".scale"


class SizeCategory(Frozen):
    """One row of the phase-4 plan's size table."""

    name: Literal["tiny", "small", "medium", "large"] = Field(description="The plan's name for the category.")
    max_params: int | None = Field(description="Exclusive upper bound on total parameters; None: no bound.")
    target_compression: float = Field(description="Whole-model size ratio (original / packed) the plan aims at.")
    preserve: tuple[str, ...] = Field(description="Parameter groups kept in their original dtype.")


_ALWAYS = ("embeddings", "lm_head", "norms", "biases", "routers")
SIZE_CATEGORIES: dict[str, SizeCategory] = {
    c.name: c
    for c in [
        SizeCategory(name="tiny", max_params=50_000_000, target_compression=6.0, preserve=_ALWAYS),
        SizeCategory(name="small", max_params=500_000_000, target_compression=8.0, preserve=_ALWAYS),
        SizeCategory(name="medium", max_params=2_000_000_000, target_compression=10.0, preserve=_ALWAYS),
        # the seed would ternarise a large model's LM head too; the head stays in full precision here
        SizeCategory(name="large", max_params=None, target_compression=12.0, preserve=_ALWAYS),
    ]
}
"""The Agent Forge phase-4 size table (tiny < 50M, small < 500M, medium < 2B, large). The seed's sparsity
thresholds belong to its sign-with-threshold quantiser, not to the paper's absmean rule used here; its
calibration sample counts, expected sparsities and accuracy bars are in :mod:`aegis.forge.bitnet_pipeline`."""


def size_category(total_params: int) -> SizeCategory:
    """The category a model of ``total_params`` parameters falls in."""
    for c in SIZE_CATEGORIES.values():
        if c.max_params is None or total_params < c.max_params:
            return c
    raise AssertionError("the last size category has no bound")


class CompressionResult(Frozen):
    """What :func:`compress_model` wrote and measured."""

    out: Path = Field(description="The packed model folder.")
    size_category: str = Field(description="Size category from the parameter count.")
    total_params: int = Field(description="Parameters of the model (aegis.models.profiles.profile_from_config).")
    ternary_params: int = Field(description="Weights made ternary.")
    preserved_params: int = Field(description="Parameters kept in their original dtype.")
    zero_weights: int = Field(description="Ternary weights equal to 0.")
    sparsity: float = Field(description="Share of ternary weights equal to 0.")
    per_channel: bool = Field(description="gamma per output channel (else per tensor).")
    linear_bytes_original: int = Field(description="Bytes of the ternarised weights in the input folder.")
    linear_bytes_packed: int = Field(description="Bytes of their packed codes plus scales.")
    total_bytes_original: int = Field(description="Bytes of all tensors in the input folder.")
    total_bytes_packed: int = Field(description="Bytes of all tensors in the output folder.")
    target_compression: float = Field(description="The category's whole-model target (reported, not enforced).")
    packed: tuple[str, ...] = Field(description="Tensors stored ternary.")
    preserved: tuple[str, ...] = Field(description="Tensors stored as they were.")

    @property
    def linear_compression(self) -> float:
        """Original / packed bytes of the ternarised weights."""
        return self.linear_bytes_original / max(self.linear_bytes_packed, 1)

    @property
    def total_compression(self) -> float:
        """Original / packed bytes of the whole model's tensors."""
        return self.total_bytes_original / max(self.total_bytes_packed, 1)


# ----- which tensors become ternary ----------------------------------------------------------------------

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_ROUTERS = frozenset({"gate", "shared_expert_gate", "router"})
_LINEAR_LEAVES = ("weight", "gate_up_proj", "down_proj", "w1", "w2", "w3")


def is_ternary_target(name: str, shape: tuple[int, ...], num_layers: int, keep_layers: tuple[int, ...] = ()) -> bool:
    """Whether on-disk tensor ``name`` is a decoder-layer linear weight to ternarise: inside ``layers.N.``
    (N not in ``keep_layers``, negative indices from the end), at least 2-D, not a norm, bias or router."""
    m = _LAYER.search(name)
    if m is None or len(shape) < 2:
        return False
    layer = int(m.group(1))
    if layer in {k % num_layers for k in keep_layers}:
        return False
    parts = name.split(".")
    if parts[-1] not in _LINEAR_LEAVES or any("norm" in p or p in _ROUTERS for p in parts[:-1]):
        return False
    return True


# ----- compress --------------------------------------------------------------------------------------------


def compress_model(
    src: str | Path,
    out: str | Path,
    *,
    per_channel: bool = False,
    scale_dtype: Literal["float32", "bfloat16"] = "float32",
    keep_layers: tuple[int, ...] = (),
    max_shard_bytes: int | None = None,
    on_tensor: Callable[[str], None] | None = None,
    overwrite: bool = False,
) -> CompressionResult:
    """Write the BitNet b1.58 form of model folder ``src`` to ``out`` (layout: module doc).

    Tensors stream one at a time (memory: about one tensor). ``scale_dtype``: how ``gamma`` is stored (the
    loader uses the stored value, so the packed model is exactly ``W_q * gamma``). Raises
    :class:`~aegis.errors.InvalidConfigError` for a folder that is not a model or an ``out`` that is ``src``,
    :class:`~aegis.errors.OutputPathError` for an ``out`` holding files Aegis did not write (unless
    ``overwrite``: files of the same name are replaced, the others kept); ``out`` appears whole or not at all.
    """
    from aegis._outdir import output_dir

    out = _check_compress_output(src, out, overwrite=overwrite)
    with output_dir(out, overwrite=overwrite, writer="aegis compress") as tmp:
        result = _pack_model(src, tmp, per_channel=per_channel, scale_dtype=scale_dtype, keep_layers=keep_layers,
                            max_shard_bytes=max_shard_bytes, on_tensor=on_tensor)
    return result.model_copy(update={"out": out})


def _check_compress_output(src: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """``out`` as a path, once it is known to be writable and not the input folder (before any work)."""
    from aegis._outdir import check_output_dir

    out = Path(out).expanduser()
    if out.resolve() == Path(src).resolve():
        raise InvalidConfigError(f"output folder {out} is the input folder; pick a new folder for the packed model.")
    check_output_dir(out, overwrite=overwrite)
    return out


def _pack_model(
    src: str | Path,
    out: Path,
    *,
    per_channel: bool = False,
    scale_dtype: Literal["float32", "bfloat16"] = "float32",
    keep_layers: tuple[int, ...] = (),
    max_shard_bytes: int | None = None,
    on_tensor: Callable[[str], None] | None = None,
) -> CompressionResult:
    """:func:`compress_model`'s writing, into folder ``out`` as it is (a fresh folder the caller publishes)."""
    from aegis.forge._bitnet_pack import absmean_ternary, pack_ternary
    from aegis.models.source import TOKENIZER_FILES, locate_model
    from aegis.models.profiles import profile_from_config
    from aegis.train.safetensors_io import DTYPES, FLOATING, MAX_SHARD_BYTES, ModelWeights, ShardWriter, code_of

    from aegis.forge.cognate.engine import cognate_profile, is_cognate

    source = locate_model(str(src))
    weights = ModelWeights(str(src), source)
    config = weights.config
    if is_cognate(config):  # not a planner family: its layers and parameters from its own shapes
        profile = cognate_profile(config)
    else:
        profile = profile_from_config(config, model_id=str(src), source="path")
    outside = [k for k in keep_layers if not -profile.num_layers <= k < profile.num_layers]
    if outside:
        raise InvalidConfigError(f"--keep-layer {outside[0]}: {src} has {profile.num_layers} decoder layers "
                                 f"(0 to {profile.num_layers - 1}, or -1 for the last)")
    category = size_category(profile.total_params)
    scale_code = code_of(scale_dtype)
    scale_np = DTYPES[scale_code]

    entries: list[tuple[str, str, tuple[int, ...]]] = []
    packed_info: dict[str, dict[str, Any]] = {}
    preserved: list[str] = []
    for name in weights.names:
        code, shape = weights.dtype(name), weights.shape(name)
        if code in FLOATING and is_ternary_target(name, shape, profile.num_layers, keep_layers):
            scale_shape = shape[:-1] if per_channel else (1,) * (len(shape) - 1)
            entries.append((name + PACKED_SUFFIX, "U8", (*shape[:-1], -(-shape[-1] // 4))))
            entries.append((name + SCALE_SUFFIX, scale_code, scale_shape))
            packed_info[name] = {"shape": list(shape), "dtype": code}
        else:
            entries.append((name, code, shape))
            preserved.append(name)
    if not packed_info:
        raise InvalidConfigError(
            f"{src} has no decoder-layer linear weights to ternarise (tensors named 'layers.N....weight'); "
            "point at a llama-family model folder."
        )

    ternary = zeros = preserved_params = 0
    linear_orig = linear_packed = total_orig = total_packed = 0
    with ShardWriter(out, entries, max_shard_bytes or MAX_SHARD_BYTES) as writer:
        for name in weights.names:
            arr = weights.read(name)
            total_orig += arr.nbytes
            if name in packed_info:
                codes, gamma = absmean_ternary(arr, per_channel=per_channel)
                packed, scale = pack_ternary(codes), gamma.astype(scale_np)
                writer.write(name + PACKED_SUFFIX, packed)
                writer.write(name + SCALE_SUFFIX, scale)
                ternary += codes.size
                zeros += int(np.count_nonzero(codes == 0))
                linear_orig += arr.nbytes
                linear_packed += packed.nbytes + scale.nbytes
                total_packed += packed.nbytes + scale.nbytes
            else:
                writer.write(name, arr)
                preserved_params += arr.size
                total_packed += arr.nbytes
            if on_tensor is not None:
                on_tensor(name)
        shards = writer.finish()
    weights.close()

    shutil.copy2(source.folder / "config.json", out / MODEL_CONFIG)
    stub = {
        "model_type": FORMAT,
        "architectures": ["AegisBitNetForCausalLM"],
        "aegis": {"model_config": MODEL_CONFIG, "format": BITNET_CONFIG, "load_with": "aegis.forge.bitnet.load_packed"},
    }
    (out / "config.json").write_text(json.dumps(stub, indent=2) + "\n", encoding="utf-8")
    for f in ("generation_config.json", *TOKENIZER_FILES):
        if (source.folder / f).exists():
            shutil.copy2(source.folder / f, out / f)
    (out / "README.md").write_text(_README.format(src=Path(str(src)).name, model_config=MODEL_CONFIG), encoding="utf-8")
    result = CompressionResult(
        out=out,
        size_category=category.name,
        total_params=profile.total_params,
        ternary_params=ternary,
        preserved_params=preserved_params,
        zero_weights=zeros,
        sparsity=zeros / max(ternary, 1),
        per_channel=per_channel,
        linear_bytes_original=linear_orig,
        linear_bytes_packed=linear_packed,
        total_bytes_original=total_orig,
        total_bytes_packed=total_packed,
        target_compression=category.target_compression,
        packed=tuple(packed_info),
        preserved=tuple(preserved),
    )
    meta = {
        "format": FORMAT,
        "version": 1,
        "model_config": MODEL_CONFIG,
        "weights": {
            "method": "absmean",
            "formula": "W_q = RoundClip(W / (gamma + eps), -1, 1), gamma = mean(|W|); W ~ W_q * gamma",
            "granularity": "channel" if per_channel else "tensor",
            "eps": 1e-5,
            "rounding": "half to even",
        },
        "packing": {
            "bits_per_weight": 2,
            "weights_per_byte": 4,
            "axis": -1,
            "code_map": {"-1": 0, "0": 1, "1": 2},
            "bit_order": "weight 4k+j of a row in bits 2j..2j+1 of byte k (LSB first); rows padded with code 1",
            "packed_suffix": PACKED_SUFFIX,
            "scale_suffix": SCALE_SUFFIX,
            "scale_dtype": scale_dtype,
        },
        "activations": {"method": "absmax per token, int8", "applied_by_loader": True},
        "size_category": category.name,
        "total_params": profile.total_params,
        "target_compression": category.target_compression,
        "keep_layers": list(keep_layers),
        "packed": packed_info,
        "preserved": preserved,
        "shards": shards,
        "stats": {
            "sparsity": result.sparsity,
            "linear_compression": result.linear_compression,
            "total_compression": result.total_compression,
        },
    }
    (out / BITNET_CONFIG).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return result


_README = """# {src}, BitNet b1.58 ternary (aegis compress)

The decoder's linear weights are stored packed, 2 bits per weight (`*.ternary`) with their scales (`*.scale`);
`bitnet_config.json` describes the format. This is not a plain Hugging Face model folder: the model's config is
`{model_config}`, and `config.json` names the format as its model type, so that transformers refuses the folder
rather than load it with randomly initialised decoder weights. The tokenizer files are the model's own.

Load it with Aegis:

```python
from aegis.forge.bitnet import load_packed

packed = load_packed("this-folder")      # JAX model, packed ternary leaves
logits = packed.apply(input_ids)
params = packed.dense_params()           # dequantised weights (W_q * gamma)
```
"""


# ----- load and run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackedTernary:
    """A ternary weight kept packed in a params tree: uint8 ``codes [..., ceil(n / 4)]``, ``scale`` with one
    fewer dim than the weight, ``n`` the length of the last axis. A JAX pytree (``n`` and ``activations`` are
    static); in :func:`~aegis.train.modeling.layers.linear` it computes ``Q_a(x) @ (W_q * gamma).T``: with
    ``activations`` the input is quantised per token to int8 (:func:`~aegis.forge._bitnet_pack.absmax_int8`)
    and multiplied by the ternary codes in integers (int8 x int8 -> int32), then scaled by ``s_x * gamma``."""

    codes: Any
    scale: Any
    n: int
    activations: bool = True

    def dequantize(self, dtype: Any) -> Any:
        from aegis.forge._bitnet_pack import unpack_ternary_jax

        w = unpack_ternary_jax(self.codes, self.n).astype("float32") * self.scale.astype("float32")[..., None]
        return w.astype(dtype)

    def matmul(self, x: Any, dtype: Any) -> Any:
        import jax
        import jax.numpy as jnp

        from aegis.forge._bitnet_pack import absmax_int8, unpack_ternary_jax

        if not self.activations:
            w = self.dequantize(dtype)
            return jnp.einsum("...i,oi->...o", x, w)
        lead = x.shape[:-1]
        q, s = absmax_int8(x.reshape(-1, x.shape[-1]))
        codes = unpack_ternary_jax(self.codes, self.n)
        acc = jax.lax.dot_general(q, codes, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)
        y = acc.astype(jnp.float32) * s * self.scale.astype(jnp.float32)
        return y.astype(dtype).reshape(*lead, y.shape[-1])


@dataclass(frozen=True)
class MixedLinear:
    """A stacked linear weight whose layers are partly ternary (dequantised, ``W_q * gamma``) and partly kept in
    full precision: ``int8 [L]`` (bool) says which layers quantise their input per token to int8."""

    w: Any
    int8: Any

    def matmul(self, x: Any, dtype: Any) -> Any:
        import jax.numpy as jnp

        from aegis.forge._bitnet_pack import absmax_int8

        q, s = absmax_int8(x)
        x = jnp.where(self.int8, (q.astype(jnp.float32) * s).astype(x.dtype), x)
        return jnp.einsum("...i,oi->...o", x, self.w.astype(dtype))


def _register() -> None:
    import jax

    from aegis.train.modeling.layers import LinearWeight

    LinearWeight.register(PackedTernary)
    LinearWeight.register(MixedLinear)
    jax.tree_util.register_pytree_node(MixedLinear, lambda m: ((m.w, m.int8), None), lambda _, ch: MixedLinear(*ch))
    jax.tree_util.register_pytree_node(
        PackedTernary,
        lambda p: ((p.codes, p.scale), (p.n, p.activations)),
        lambda aux, ch: PackedTernary(ch[0], ch[1], *aux),
    )


def unpack_params(params: dict[str, Any], dtype: Any, *, experts_only: bool = False) -> dict[str, Any]:
    """``params`` with every :class:`PackedTernary` leaf dequantised to ``dtype`` (jit-friendly); with
    ``experts_only`` only the MoE expert stacks (grouped matmuls take plain arrays), the rest stay packed."""
    import jax

    def one(path: Any, x: Any) -> Any:
        if isinstance(x, MixedLinear):
            return x if experts_only else x.w.astype(dtype)
        if not isinstance(x, PackedTernary):
            return x
        if experts_only and not any(getattr(k, "key", None) == "experts" for k in path):
            return x
        return x.dequantize(dtype)

    return jax.tree_util.tree_map_with_path(one, params, is_leaf=lambda x: isinstance(x, (PackedTernary, MixedLinear)))


@dataclass
class PackedModel:
    """A packed folder loaded for the JAX engine: ``model`` (:func:`aegis.train.modeling.build_model`) and
    ``params`` whose ternary leaves are :class:`PackedTernary` (uint8 codes + scale on the device)."""

    model: Any
    params: dict[str, Any]
    meta: dict[str, Any]
    _forward: Any = None

    def dense_params(self) -> dict[str, Any]:
        """The params tree with ternary leaves dequantised (``W_q * gamma``) in the model's param dtype
        (``model.apply`` on it runs W1.58 A16: no activation quantisation)."""
        return unpack_params(self.params, self.model.param_dtype)

    def served_params(self) -> dict[str, Any]:
        """The params tree the packed model is served with (`apply`, ``aegis generate``): ternary linears stay
        packed and quantise their inputs to int8 per token (unless loaded with ``activations="none"``), as the
        straight-through fine-tuning trained them; only MoE expert stacks are dequantised."""
        return unpack_params(self.params, self.model.param_dtype, experts_only=True)

    def apply(self, input_ids: Any) -> Any:
        """Logits ``[b, s, vocab]`` from the packed params in one jitted forward: each ternary linear unpacks
        its codes inside the forward (int8 activations unless loaded with ``activations="none"``)."""
        if self._forward is None:
            import jax

            model = self.model
            self._forward = jax.jit(
                lambda p, ids: model.apply(unpack_params(p, model.param_dtype, experts_only=True), ids)
            )  # the served tree (`served_params`), its expert stacks dequantised inside the forward
        return self._forward(self.params, input_ids)


def load_packed(
    folder: str | Path, *, dtype: Any = None, activations: Literal["int8", "none"] = "int8"
) -> PackedModel:
    """Read a folder written by :func:`compress_model` for the JAX engine (compute and param dtype ``dtype``,
    default float32; ``activations``: per-token int8 inputs to the ternary linears, the paper's W1.58 A8, or
    ``"none"`` for W1.58 A16). A params leaf whose every layer is packed stays packed; one that mixes packed and kept
    layers (``keep_layers``) or that the family stores split on disk is dequantised."""
    import jax.numpy as jnp
    from safetensors import safe_open

    from aegis.forge._bitnet_pack import unpack_ternary
    from aegis.train.modeling import build_model, engine_family
    from aegis.train.weights import _memory_names, _set

    _register_once()
    folder = Path(folder)
    meta_file = folder / BITNET_CONFIG
    if not meta_file.exists():
        raise InvalidConfigError(f"{folder} has no {BITNET_CONFIG}; write it with compress_model (aegis compress).")
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise InvalidConfigError(f"{meta_file} is not an {FORMAT} description (format {meta.get('format')!r}).")
    config_file = folder / MODEL_CONFIG if (folder / MODEL_CONFIG).is_file() else folder / "config.json"  # earlier layout
    config = json.loads(config_file.read_text(encoding="utf-8"))
    dtype = jnp.dtype(dtype or jnp.float32)
    handles = [safe_open(str(folder / f), framework="numpy") for f in meta["shards"]]
    where = {k: h for h in handles for k in h.keys()}
    packed_meta = meta["packed"]
    if config.get("model_type") == "cognate":
        return _load_packed_cognate(config, meta, where)
    model = build_model(config, dtype=dtype, param_dtype=dtype)

    def packed(name: str) -> tuple[np.ndarray, np.ndarray]:
        return where[name + PACKED_SUFFIX].get_tensor(name + PACKED_SUFFIX), np.asarray(
            where[name + SCALE_SUFFIX].get_tensor(name + SCALE_SUFFIX), np.float32
        )

    def dense(name: str) -> np.ndarray:
        if name in packed_meta:
            codes, scale = packed(name)
            w = unpack_ternary(codes, packed_meta[name]["shape"][-1]).astype(np.float32) * scale[..., None]
            return w
        if name not in where:
            raise InvalidConfigError(f"{folder} lacks tensor {name!r}; the packed folder is incomplete, compress again.")
        return where[name].get_tensor(name)

    recipe = engine_family(config.get("model_type")).recipe
    params: dict[str, Any] = {}
    for path_, template, shape in _memory_names(model):
        stacked = "{i}" in template
        names = [template.format(i=i) for i in range(model.spec.num_layers)] if stacked else [template]
        recipes = [recipe(n, model.spec) for n in names]
        for r in recipes:
            if r.stored_as_kept and r.keys[0] in packed_meta and tuple(packed_meta[r.keys[0]]["shape"]) != shape:
                raise InvalidConfigError(
                    f"packed tensor {r.keys[0]!r} has shape {packed_meta[r.keys[0]]['shape']}, expected {list(shape)} "
                    "from config.json; the folder's config.json and weights belong to different models."
                )
        if all(r.stored_as_kept and r.keys[0] in packed_meta for r in recipes):
            parts = [packed(r.keys[0]) for r in recipes]
            codes = np.stack([c for c, _ in parts]) if stacked else parts[0][0]
            scale = np.stack([s for _, s in parts]) if stacked else parts[0][1]
            leaf: Any = PackedTernary(jnp.asarray(codes), jnp.asarray(scale), int(shape[-1]), activations == "int8")
        else:
            arrs = [np.asarray(r.join([dense(k) for k in r.keys]), np.float32) for r in recipes]
            leaf = jnp.asarray(np.stack(arrs) if stacked else arrs[0], dtype)
            ternary = [all(k in packed_meta for k in r.keys) for r in recipes]
            if activations == "int8" and any(ternary) and path_[-1] == "weight":
                # some layers ternary, some kept (keep_layers): dequantised, int8 inputs on the ternary layers only
                leaf = MixedLinear(leaf, jnp.asarray(ternary if stacked else ternary[0]))
        _set(params, path_, leaf)
    return PackedModel(model=model, params=params, meta=meta)


def _load_packed_cognate(config: dict[str, Any], meta: dict[str, Any], where: dict[str, Any]) -> PackedModel:
    """A packed Cognate folder: its ternary weights dequantised (``W_q * gamma``, W1.58 A16: the Cognate forward
    has no quantised-activation linears), the rest as stored, behind :class:`aegis.forge.cognate.engine.CognateModel`."""
    from aegis.forge._bitnet_pack import unpack_ternary
    from aegis.forge.cognate.engine import build_cognate
    from aegis.forge.cognate.hyperparams import param_shapes
    from aegis.forge.cognate.model import from_flat

    model = build_cognate(config)
    flat = {}
    for name in param_shapes(model.cfg):
        if name in meta["packed"]:
            codes = where[name + PACKED_SUFFIX].get_tensor(name + PACKED_SUFFIX)
            scale = np.asarray(where[name + SCALE_SUFFIX].get_tensor(name + SCALE_SUFFIX), np.float32)
            flat[name] = unpack_ternary(codes, meta["packed"][name]["shape"][-1]).astype(np.float32) * scale[..., None]
        elif name in where:
            flat[name] = np.asarray(where[name].get_tensor(name), np.float32)
        else:
            raise InvalidConfigError(f"the packed folder lacks tensor {name!r}; it is incomplete, compress again.")
    return PackedModel(model=model, params=from_flat(flat, model.cfg), meta=meta)


_REGISTERED: list[bool] = []


def _register_once() -> None:
    if not _REGISTERED:
        _register()
        _REGISTERED.append(True)
