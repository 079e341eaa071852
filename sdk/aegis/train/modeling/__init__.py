"""JAX transformer families that compute what transformers' PyTorch models compute.

Plain JAX, pure functions over a params pytree named like transformers' ``state_dict`` (decoder
layers stacked on axis 0 and run with ``jax.lax.scan``). One registry, :data:`ENGINE_FAMILIES`, keyed by
config.json ``model_type``: llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3_text, olmo2, granite, mixtral,
qwen2_moe, qwen3_moe, gpt_oss, phimoe, deepseek_v2, deepseek_v3 (DeepSeek: its leading dense layers are a
second stack, ``model.dense_layers``, before ``model.layers``; see ``aegis.models.shapes.layer_stacks``).

    from aegis.train.modeling import build_model
    model = build_model(json.load(open("config.json")), dtype=jnp.bfloat16)
    params = model.init(jax.random.key(0))            # or aegis.train.weights.load_checkpoint(model, path)
    logits = model.apply(params, input_ids)           # [b, s] int32 -> [b, s, vocab] float32
    h = model.hidden(params, input_ids, segment_ids=seg)   # packed sequences: 0 = padding
    logits = model.project(h, model.head_weight(params))   # same as apply (soft-capped where needed)
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from aegis.errors import InvalidConfigError
from aegis.train.modeling.decoder import Model, attention_mask, segment_positions, standard_layer
from aegis.train.modeling.layers import ATTENTION_IMPLS
from aegis.train.modeling.families import ENGINE_FAMILIES, EngineFamily, Recipe, engine_family, engine_model_types
from aegis.models.shapes import ArchSpec, MoESpec, param_shapes

__all__ = [
    "build_model",
    "resolve_attention",
    "engine_attention",
    "Model",
    "ATTENTION_IMPLS",
    "ArchSpec",
    "MoESpec",
    "EngineFamily",
    "Recipe",
    "ENGINE_FAMILIES",
    "engine_family",
    "engine_model_types",
    "param_shapes",
    "standard_layer",
    "segment_positions",
    "attention_mask",
]


def resolve_attention(attention: str, spec: ArchSpec, dtype: Any, device: Any = None) -> str:
    """The kernel ``attention="auto"`` runs on ``device`` (default: the first local device).

    cuDNN flash attention where it applies (`aegis.planning.hardware.cudnn_flash_attention`: an NVIDIA GPU
    from Ampere on, bf16/fp16 compute, no attention soft-capping, a head dim cuDNN takes); everywhere
    else ``xla``, the eager maths with the hand-written backward (the fast path on CPU). Any other
    value is returned unchanged.
    """
    from aegis.planning.hardware import cudnn_flash_attention

    if attention != "auto":
        return attention
    if device is None:
        import jax

        device = jax.devices()[0]
    # a CUDA device has a numeric compute capability ("9.0"); ROCm reports a gfx name
    nvidia = getattr(device, "platform", "") in ("gpu", "cuda")
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    ok = nvidia and cudnn_flash_attention(
        getattr(device, "compute_capability", None),
        head_dim=spec.head_dim,
        soft_capped=spec.attn_softcap is not None or spec.attn_sinks,  # neither fits the fused kernels
        half_precision=half,
    )
    return "cudnn" if ok else "xla"


def engine_attention(planned: str) -> str:
    """The engine's ``attention`` for a plan's ``TrainConfig.attention``: eager stays eager (``xla``);
    sdpa and flash become ``auto`` (flash attention where the GPU has it)."""
    return "xla" if planned == "eager" else "auto"


def build_model(
    config: dict[str, Any],
    *,
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    remat: bool = False,
    attention: str = "xla",
    scan_layers: bool | None = None,
    remat_layers: int | None = None,
) -> Model:
    """Build the JAX model for a Hugging Face config.json dict.

    ``dtype`` is the compute dtype (activations, matmuls), ``param_dtype`` the storage dtype that
    :meth:`Model.init` produces; ``remat`` wraps each decoder layer in ``jax.checkpoint`` (with
    ``remat_layers``, only the first that many: the others keep their activations);
    ``attention`` picks the kernel (:data:`ATTENTION_IMPLS`: ``xla`` = transformers' eager maths,
    the default; ``cudnn`` = flash attention on NVIDIA GPUs; ``dot_product`` = the same call on XLA;
    ``auto`` = cuDNN where it applies on the local device, else ``xla``, see :func:`resolve_attention`).
    ``scan_layers``: True runs the layers under ``lax.scan`` (compile time independent of depth),
    False unrolls them (faster steps), None (default) unrolls shallow models and scans deep, NF4 or
    rematerialised ones. Gradient checkpointing needs the scan (unrolled, XLA keeps every layer's
    recomputed activations alive at once), so ``remat=True, scan_layers=False`` is refused.
    Raises :class:`~aegis.errors.UnsupportedArchitectureError` (listing supported model types) for
    an unknown ``model_type``.
    """
    if not isinstance(config, dict):
        raise InvalidConfigError("build_model expects the config.json contents as a dict (json.load the file first).")
    family = engine_family(config.get("model_type"))
    spec = family.build_spec(config)
    if attention not in (*ATTENTION_IMPLS, "auto"):
        raise InvalidConfigError(f"attention={attention!r} is not one of {', '.join(ATTENTION_IMPLS)} or auto.")
    attention = resolve_attention(attention, spec, dtype)
    if attention == "cudnn" and jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise InvalidConfigError(
            f"cuDNN flash attention needs bf16 or fp16 compute, got dtype={jnp.dtype(dtype).name}; "
            "pass dtype=jnp.bfloat16 or attention='xla'."
        )
    if attention != "xla" and spec.attn_softcap is not None:
        raise InvalidConfigError(
            f"{family.name} soft-caps attention logits, which fused attention kernels do not do; use attention='xla'."
        )
    if attention != "xla" and spec.attn_sinks:
        raise InvalidConfigError(
            f"{family.name} has attention sinks, which fused attention kernels do not take; use attention='xla'."
        )
    if remat and scan_layers is False:
        raise InvalidConfigError(
            "gradient checkpointing (remat=True) needs the scanned layer loop: pass scan_layers=None or True."
        )
    if remat_layers is not None and not 0 <= remat_layers <= spec.num_layers:
        raise InvalidConfigError(
            f"remat_layers={remat_layers} is outside 0..{spec.num_layers} ({family.name} has {spec.num_layers} layers)."
        )
    return Model(
        config=dict(config),
        family=family.name,
        spec=spec,
        layer_fn=family.layer_fn,
        dtype=jnp.dtype(dtype),
        param_dtype=jnp.dtype(param_dtype),
        remat=remat,
        remat_layers=remat_layers if remat else None,
        attention=attention,
        scan_layers=scan_layers,
    )
