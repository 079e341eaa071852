"""BitNet b1.58 in the JAX engine's forward: the BitLinear weight, the straight-through model wrapper used for
quantisation-aware fine-tuning, calibration and layer-wise revert, and the supervised STE run.

    model = BitNetModel(build_model(config))                     # W1.58 A8 forward over the usual params tree
    logits = model.apply(params, ids)                            # ternary weights, int8 activations
    model.with_keep((2,)).apply(params, ids)                     # layer 2 in full precision
    trainer = Trainer(config, train_config, examples, wrap_model=bitnet_wrapper(QuantizeSection()))

What a quantised linear computes (*BitNet*, Wang et al. 2023, and *The Era of 1-bit LLMs*, Ma et al. 2024):
``y = Q_a(x) @ Q_w(W).T`` with ``Q_w(W) = RoundClip(W / (gamma + eps), -1, 1) * gamma``, ``gamma = mean|W|``
(per tensor, or per output channel), and ``Q_a(x) = Clip(round(x * 127 / max|x|), -128, 127) * max|x| / 127``
per token (:mod:`aegis.forge._bitnet_pack`). The gradient goes straight through both quantisers
(``x + stop_gradient(Q(x) - x)``, as the reference training code and HF's *Fine-tuning LLMs to 1.58bit* do).
With a warm-up of ``lambda_warmup_steps`` the forward is ``x + lambda * stop_gradient(Q(x) - x)`` (weights and
activations alike), ``lambda = min(step / warmup, 1)``: full precision at step 0, fully quantised after (the HF
blog's warm-up quantisation). Evaluation always runs at ``lambda = 1``.

Where the activations are quantised: at each linear's input. In a llama-style layer the inputs of
q/k/v/gate/up are the output of the layer's RMSNorm, so quantisation comes after the norm as in the paper's
BitLinear; o_proj and down_proj take the attention output and the gated product, which have no norm in this
architecture. BitNet b1.58 models insert an extra (sub-)norm there; a converted checkpoint has none, and
adding one changes the function a pretrained model computes (the per-token absmax quantiser is scale-invariant,
so a weightless norm before it only rescales each token's output), so none is added.

Which weights: the decoder layers' linear weights (:func:`aegis.forge.bitnet.is_ternary_target`); embeddings,
LM head, norms, biases and routers stay in full precision, and so does every layer in ``keep_layers``. Dense
(non-MoE) families only: grouped expert matmuls take plain arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from aegis.errors import UnsupportedArchitectureError
from aegis.forge._bitnet_pack import EPS, absmax_int8, round_clip
from aegis.train.modeling.layers import LinearWeight

__all__ = [
    "BitLinear",
    "BitNetModel",
    "activation_quant",
    "weight_quant",
    "bitnet_wrapper",
    "layer_targets",
    "warmup_lambda",
]


def weight_quant(w: jax.Array, per_channel: bool = False, eps: float = EPS) -> jax.Array:
    """``RoundClip(w / (gamma + eps), -1, 1) * gamma`` in float32 (``w`` ``[out, in]``)."""
    w = w.astype(jnp.float32)
    a = jnp.abs(w)
    gamma = jnp.mean(a, axis=-1, keepdims=True) if per_channel else jnp.mean(a)
    return round_clip(w / (gamma + eps), -1, 1) * gamma


def activation_quant(x: jax.Array, eps: float = EPS) -> jax.Array:
    """The per-token absmax int8 value ``q * max|x| / 127`` (float32) of :func:`absmax_int8`."""
    q, scale = absmax_int8(x, eps=eps)
    return q.astype(jnp.float32) * scale


def warmup_lambda(step: jax.Array, warmup_steps: int) -> jax.Array:
    """The warm-up's quantisation strength ``min(step / warmup_steps, 1)`` (1 without a warm-up)."""
    if warmup_steps <= 0:
        return jnp.float32(1.0)
    return jnp.clip(jnp.asarray(step, jnp.float32) / warmup_steps, 0.0, 1.0)


def _ste(x: jax.Array, q: jax.Array, f: jax.Array) -> jax.Array:
    """Forward ``x + f * (q - x)``, gradient 1 with respect to ``x``."""
    return x + jax.lax.stop_gradient((f * (q - x.astype(jnp.float32))).astype(x.dtype))


@dataclass(frozen=True)
class BitLinear(LinearWeight):
    """A latent full-precision weight ``w [..., out, in]`` run as a BitNet b1.58 linear with strength ``f``
    (``[...]``: 1 quantised, 0 full precision, between: the warm-up's mix). Static: ``per_channel`` (gamma per
    output row) and ``activations`` (quantise the input to int8 per token)."""

    w: Any
    f: Any
    per_channel: bool = False
    activations: bool = True

    def matmul(self, x: jax.Array, dtype: Any) -> jax.Array:
        f = self.f.astype(jnp.float32)
        w = _ste(self.w, weight_quant(self.w, self.per_channel), f).astype(dtype)
        if self.activations:
            x = _ste(x, activation_quant(x), f).astype(dtype)
        lead = x.shape[:-1]
        y = jax.lax.dot_general(x.reshape(-1, x.shape[-1]), w, (((1,), (1,)), ((), ())))
        return y.reshape(*lead, y.shape[-1])


jax.tree_util.register_pytree_node(
    BitLinear,
    lambda b: ((b.w, b.f), (b.per_channel, b.activations)),
    lambda aux, ch: BitLinear(ch[0], ch[1], *aux),
)


def layer_targets(layers: dict[str, Any], num_layers: int) -> list[tuple[str, ...]]:
    """Paths (inside ``params["model"]["layers"]``) of the stacked linear weights to quantise."""
    from aegis.forge.bitnet import is_ternary_target

    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(layers)[0]:
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        name = "model.layers.0." + ".".join(keys)
        if is_ternary_target(name, tuple(leaf.shape[1:]), num_layers):
            if keys[-1] != "weight":
                raise UnsupportedArchitectureError(
                    f"BitNet fine-tuning runs dense linear weights; {'.'.join(keys)} is an expert stack (MoE). "
                    "Compress MoE models without --finetune (aegis compress packs them; inference dequantises experts)."
                )
            out.append(keys)
    return out


def _get(tree: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        tree = tree[k]
    return tree


def _set(tree: dict[str, Any], keys: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of nested dict ``tree`` with ``keys`` set (only the dicts on the path are copied)."""
    if not keys:
        return value
    return {**tree, keys[0]: _set(tree[keys[0]], keys[1:], value)}


@dataclass(frozen=True, eq=False)
class BitNetModel:
    """The engine's :class:`~aegis.train.modeling.decoder.Model` with every target linear run as a
    :class:`BitLinear` (everything else delegates to ``inner``). ``keep_layers``: decoder layers left in full
    precision (negative: from the end); ``lam``: the quantisation strength (the warm-up's lambda)."""

    inner: Any
    per_channel: bool = False
    activations: bool = True
    keep_layers: tuple[int, ...] = ()
    lam: Any = 1.0
    lambda_warmup_steps: int = 0
    layer_strength: Any = None  # an explicit [L] strength (overrides keep_layers and lam): one jit for all

    def __getattr__(self, name: str) -> Any:  # the inner model's spec, config, dtypes, project, head_weight ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def with_keep(self, keep_layers: tuple[int, ...]) -> "BitNetModel":
        return dataclasses.replace(self, keep_layers=tuple(keep_layers))

    def at_step(self, step: jax.Array) -> "BitNetModel":
        """The model a train step at ``step`` runs: lambda ramps from 0 to 1 over the warm-up."""
        if self.lambda_warmup_steps <= 0:
            return self
        return dataclasses.replace(self, lam=warmup_lambda(step, self.lambda_warmup_steps))

    def strengths(self) -> jax.Array:
        """Per-layer quantisation strength ``[L]``: ``lam``, 0 for kept layers."""
        if self.layer_strength is not None:
            return jnp.asarray(self.layer_strength, jnp.float32)
        n = self.inner.spec.num_layers
        kept = {k % n for k in self.keep_layers}
        on = jnp.asarray([0.0 if i in kept else 1.0 for i in range(n)], jnp.float32)
        return on * jnp.asarray(self.lam, jnp.float32)

    def view(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with the target weights wrapped as :class:`BitLinear` (no copy of any array)."""
        layers = params["model"]["layers"]
        f = self.strengths()
        for keys in layer_targets(layers, self.inner.spec.num_layers):
            layers = _set(layers, keys, BitLinear(_get(layers, keys), f, self.per_channel, self.activations))
        return {**params, "model": {**params["model"], "layers": layers}}

    def hidden(self, params: dict[str, Any], input_ids: jax.Array, **kwargs: Any) -> jax.Array:
        return self.inner.hidden(self.view(params), input_ids, **kwargs)

    def apply(self, params: dict[str, Any], input_ids: jax.Array, **kwargs: Any) -> jax.Array:
        h = self.hidden(params, input_ids, **kwargs)
        return self.inner.project(h, self.inner.head_weight(params))


def bitnet_wrapper(section: Any) -> Callable[[Any], BitNetModel]:
    """The ``Trainer(wrap_model=...)`` of a run config's ``quantize`` section
    (:class:`aegis.supervise.run_config.QuantizeSection`)."""

    def wrap(model: Any) -> BitNetModel:
        if model.spec.moe is not None:
            raise UnsupportedArchitectureError(
                "BitNet fine-tuning runs dense linear weights; this model has MoE expert stacks. "
                "Compress it without fine-tuning (aegis compress)."
            )
        return BitNetModel(
            model,
            per_channel=section.per_channel,
            activations=section.activations == "int8",
            keep_layers=tuple(section.keep_layers),
            lambda_warmup_steps=section.lambda_warmup_steps,
        )

    return wrap
