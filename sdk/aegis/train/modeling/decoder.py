"""The decoder-only model: embeddings, the stacked layers (under ``jax.lax.scan``, or unrolled for
shallow models), final norm, head.

:class:`Model` is a thin, hashable handle (config + :class:`ArchSpec` + the family's layer
function); parameters are a plain nested dict passed in. The parameter tree mirrors
transformers' in-memory ``state_dict`` names, with the per-layer tensors stacked on axis 0::

    params["model"]["embed_tokens"]["weight"]                      # [vocab, d]
    params["model"]["layers"]["self_attn"]["q_proj"]["weight"]     # [L, heads*head_dim, d]
    params["model"]["layers"]["mlp"]["experts"]["gate_up_proj"]    # [L, E, 2*I, d]   (MoE)
    params["model"]["norm"]["weight"]                              # [d]
    params["lm_head"]["weight"]                                    # [vocab, d]  (absent when tied)

Packed sequences: ``segment_ids`` ``[b, s]`` (0 = padding) restrict attention to the token's own
segment (causal, plus each layer's sliding window); positions restart at 0 per segment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aegis.errors import InvalidConfigError
from aegis.train.modeling.layers import Ctx, attention_block, dropout, layer_norm, mlp_block, moe_block, rms_norm
from aegis.train.modeling.rope import cos_sin
from aegis.models.shapes import FULL_WINDOW, ArchSpec, layer_stacks, param_shapes, stack_spec
from aegis.train.nf4 import NF4Tensor

__all__ = ["Model", "standard_layer", "parallel_layer", "segment_positions", "attention_mask", "LayerFn"]

_EMBEDDING_DROPOUT_STREAM = 2**31 - 1
"""``fold_in`` data of the embedding dropout's key: the layers fold in their index (0 .. L - 1)."""

UNROLL_MAX_LAYERS = 8
"""``scan_layers=None`` unrolls models this shallow; deeper ones scan (see ``tools/bench/bench_engine.py``)."""

LayerFn = Callable[..., jax.Array]
"""``layer(spec, p, x, *, cos, sin, mask, ctx, lora) -> x``: one decoder layer (per-layer slices)."""


def standard_layer(
    spec: ArchSpec,
    p: dict[str, Any],
    x: jax.Array,
    *,
    cos: jax.Array,
    sin: jax.Array,
    mask: jax.Array,
    ctx: Ctx,
    lora: dict[str, Any] | None = None,
) -> jax.Array:
    """Pre-norm residual layer; with ``spec.sandwich_norms`` the Gemma 2/3 four-norm variant; LayerNorms with biases
    where ``spec.layer_norm`` (StarCoder2); `parallel_layer` where ``spec.parallel_block`` (StableLM's
    ``use_parallel_residual`` switches it per config)."""
    if spec.parallel_block:
        return parallel_layer(spec, p, x, cos=cos, sin=sin, mask=mask, ctx=ctx, lora=lora)
    lora = lora or {}
    eps, gemma = spec.rms_norm_eps, spec.gemma_norm
    h = _norm(spec, p.get("input_layernorm", {}), x)
    h = attention_block(spec, p["self_attn"], h, cos=cos, sin=sin, mask=mask, ctx=ctx, lora=lora.get("self_attn"))
    h = _residual_dropout(spec, h, ctx, "attention")
    block = moe_block if spec.moe is not None else mlp_block

    def ff(spec: ArchSpec, p: Any, h: jax.Array, ctx: Ctx, lora: Any) -> jax.Array:
        return _residual_dropout(spec, block(spec, p, h, ctx, lora), ctx, "mlp")

    if spec.sandwich_norms:
        h = rms_norm(h, p["post_attention_layernorm"]["weight"], eps, gemma=gemma)
        x = x + h
        h = rms_norm(x, p["pre_feedforward_layernorm"]["weight"], eps, gemma=gemma)
        h = ff(spec, p["mlp"], h, ctx, lora.get("mlp"))
        h = rms_norm(h, p["post_feedforward_layernorm"]["weight"], eps, gemma=gemma)
        return x + h
    x = x + h
    h = _norm(spec, p.get("post_attention_layernorm", {}), x)
    return x + ff(spec, p["mlp"], h, ctx, lora.get("mlp"))


def _norm(spec: ArchSpec, p: dict[str, Any], x: jax.Array) -> jax.Array:
    """A layer's pre-norm: LayerNorm with its bias where ``spec.layer_norm`` (Phi, StarCoder2), else RMSNorm."""
    if spec.layer_norm:
        return layer_norm(x, p, spec.rms_norm_eps)
    return rms_norm(x, p["weight"], spec.rms_norm_eps, gemma=spec.gemma_norm)


def parallel_layer(
    spec: ArchSpec,
    p: dict[str, Any],
    x: jax.Array,
    *,
    cos: jax.Array,
    sin: jax.Array,
    mask: jax.Array,
    ctx: Ctx,
    lora: dict[str, Any] | None = None,
) -> jax.Array:
    """Phi's layer: one LayerNorm feeds attention and the MLP side by side, ``x + drop(attn(h)) + drop(mlp(h))``;
    GPT-NeoX (``spec.parallel_mlp_norm``) gives the MLP its own, ``mlp(post_attention_layernorm(x))``."""
    lora = lora or {}
    h = _norm(spec, p.get("input_layernorm", {}), x)
    a = attention_block(spec, p["self_attn"], h, cos=cos, sin=sin, mask=mask, ctx=ctx, lora=lora.get("self_attn"))
    a = _residual_dropout(spec, a, ctx, "attention")
    if spec.parallel_mlp_norm:
        h = _norm(spec, p.get("post_attention_layernorm", {}), x)
    m = _residual_dropout(spec, mlp_block(spec, p["mlp"], h, ctx, lora.get("mlp")), ctx, "mlp")
    return a + m + x


def _residual_dropout(spec: ArchSpec, h: jax.Array, ctx: Ctx, where: str) -> jax.Array:
    """Seed-OSS, Phi: a sublayer's output dropped (training) before its residual add (StableLM: the MLP's only)."""
    if spec.residual_dropout <= 0.0 or where not in spec.residual_dropout_on:
        return h
    return dropout(h, spec.residual_dropout, ctx.train_rng(f"residual_dropout.{where}"))


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Positions that restart at 0 at every segment boundary: ``[[1,1,2,2,2]] -> [[0,1,0,1,2]]``."""
    s = segment_ids.shape[-1]
    idx = jnp.arange(s, dtype=jnp.int32)
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], dtype=bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    start_idx = jax.lax.cummax(jnp.where(starts, idx[None, :], 0), axis=1)
    return idx[None, :] - start_idx


def attention_mask(segment_ids: jax.Array) -> jax.Array:
    """``[b, s, s]`` bool: causal and within the same segment (the sliding window is added per layer)."""
    s = segment_ids.shape[-1]
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return causal[None] & same


@jax.custom_vjp
def _head_logits(h: jax.Array, w: jax.Array) -> jax.Array:
    """``h [..., d] @ w.T`` (float32, ``w [vocab, d]``) with autodiff's own two gradient matmuls, ``dh = g @ w`` and
    ``dw = g^T @ h``, written out: left to autodiff, XLA:CPU lays the ``[tokens, vocab]`` logits gradient out
    transposed (to feed ``dw`` as a plain GEMM), a transposing write of the step's largest tensor that costs
    more than the GEMM gains (measured on the 25M bench: the head's forward + backward 220 -> 180 ms)."""
    return _head_fwd(h, w)[0]


def _head_fwd(h: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    h2 = h.reshape(-1, h.shape[-1])
    logits = jax.lax.dot_general(h2, w, (((1,), (1,)), ((), ())))
    return logits.reshape(*h.shape[:-1], w.shape[0]), (h, w)


def _head_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    h, w = res
    h2, g2 = h.reshape(-1, h.shape[-1]), g.reshape(-1, w.shape[0])
    dh = jax.lax.dot_general(g2, w, (((1,), (0,)), ((), ())))
    dw = jax.lax.dot_general(g2, h2, (((0,), (0,)), ((), ())))
    return dh.reshape(h.shape), dw


_head_logits.defvjp(_head_fwd, _head_bwd)


def _computed_once(tables: Any, positions: jax.Array) -> Any:
    """The rope tables as buffers of their own, computed once per step: returned through a conditional on the data,
    which XLA cannot fold away. Left as plain elementwise results, XLA fuses cos and sin into every consumer (each
    layer's q and k rotation, forward and backward: 60 evaluations on the 25M bench, each once per head; an
    optimisation barrier does not stop it, XLA:CPU removes barriers before fusion). Measured on the 25M bench
    (fp32, full FT, in-process A/B): step CPU time 1.571 -> 1.537 s. CPU only: on a GPU a conditional reads its
    predicate on the host (a sync per step), and recomputing sin/cos inside fused kernels costs next to nothing."""
    if jax.default_backend() != "cpu":
        return tables
    keep = positions.reshape(-1)[0] >= 0  # always true; XLA cannot tell
    return jax.lax.cond(keep, lambda t: jax.tree.map(lambda a: a + 0, t), lambda t: t, tables)


def _is_nf4(x: Any) -> bool:
    return isinstance(x, NF4Tensor)


@dataclass(frozen=True, eq=False)
class Model:
    """A built model: ``init``/``apply``/``hidden``/``head_weight`` over a params pytree."""

    config: dict[str, Any]
    family: str
    spec: ArchSpec
    layer_fn: LayerFn = field(default=standard_layer)
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: bool = False
    # with ``remat``: how many layers (the first ones) are recomputed in the backward pass; None: every layer.
    # The others keep their activations (save what fits, recompute the rest).
    remat_layers: int | None = None
    attention: str = "xla"  # one of layers.ATTENTION_IMPLS
    # True: layers under ``lax.scan`` (compile time independent of depth); False: unrolled (no stacked
    # residual buffers, static per-layer windows); None: see ``scans_layers``.
    scan_layers: bool | None = None

    # ----- parameters -------------------------------------------------------------------------
    def param_shapes(self) -> dict[str, Any]:
        """Nested dict of shapes (tuples), the structure ``init`` returns."""
        return param_shapes(self.spec)

    def init(self, rng: jax.Array) -> dict[str, Any]:
        """Random parameters as transformers initialises them: normal(0, initializer_range) weights,
        zero biases, RMSNorm weights 1 (0 for Gemma's (1 + w) norm). Compiled as one XLA program."""
        return jax.jit(self._init)(rng)

    def _init(self, rng: jax.Array) -> dict[str, Any]:
        shapes = self.param_shapes()
        is_shape = lambda x: isinstance(x, tuple)  # noqa: E731
        flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_shape)
        kinds = []
        for path, _ in flat:
            names = [getattr(k, "key", k) for k in path]
            module = names[-2] if names[-1] in ("weight", "bias") else names[-1]
            is_bias = names[-1] == "bias" or names[-1].endswith("_bias")  # GPT-OSS experts' gate_up_proj_bias
            kinds.append("bias" if is_bias else "norm" if module.endswith("norm") else "weight")
        # One RNG draw for all weights (sliced per leaf): many small draws make XLA compile for seconds.
        total = sum(int(np.prod(shape)) for (_, shape), kind in zip(flat, kinds, strict=True) if kind == "weight")
        noise = jax.random.normal(rng, (total,), jnp.float32) * self.spec.initializer_range
        out, offset = [], 0
        for (_, shape), kind in zip(flat, kinds, strict=True):
            if kind == "bias":
                arr = jnp.zeros(shape, self.param_dtype)
            elif kind == "norm":
                arr = jnp.full(shape, 0.0 if self.spec.gemma_norm else 1.0, self.param_dtype)
            else:
                size = int(np.prod(shape))
                arr = noise[offset : offset + size].reshape(shape).astype(self.param_dtype)
                offset += size
            out.append(arr)
        return jax.tree_util.tree_unflatten(treedef, out)

    # ----- forward ----------------------------------------------------------------------------
    def scans_layers(self, layer_params: Any = None) -> bool:
        """Whether the layers run under ``lax.scan`` (one compiled body) or unrolled (one per layer).

        Auto (``scan_layers=None``): unrolled up to :data:`UNROLL_MAX_LAYERS` layers, except with
        gradient checkpointing or over an NF4 base. Unrolled, XLA schedules every layer's recomputed
        forward (or dense weight) at the start of the backward pass, which keeps them all alive at once
        (measured: remat saves 6% of the temporaries unrolled, 75% scanned); the scan recomputes one
        layer at a time.
        """
        if self.scan_layers is not None:
            return self.scan_layers
        quantized = any(_is_nf4(x) for x in jax.tree.leaves(layer_params, is_leaf=_is_nf4))
        return self.remat or quantized or self.spec.num_layers > UNROLL_MAX_LAYERS

    def _layers(
        self,
        params: dict[str, Any],
        x: jax.Array,
        positions: jax.Array,
        segment_ids: jax.Array | None,
        lora: Any,
        rng: jax.Array | None,
    ) -> jax.Array:
        spec = self.spec
        b, s = x.shape[:2]
        tables = _computed_once([cos_sin(r, positions, seq_len=s) for r in spec.ropes], positions)
        # Fused attention kernels take "causal + one static window" without a mask tensor; packed
        # segments or per-layer windows need the explicit mask.
        static_window = len(set(spec.layer_window)) == 1 and self.attention != "xla" and segment_ids is None
        window0 = spec.layer_window[0]
        idx = jnp.arange(s)
        dist = idx[:, None] - idx[None, :]
        # [b, s, s] with packed segments; plain causal attention needs one [1, s, s] mask for the batch
        base_mask = (dist >= 0)[None] if segment_ids is None else attention_mask(segment_ids)
        lora_model = {} if lora is None else lora.tree.get("model", {})
        scale = 0.0 if lora is None else lora.scale
        dropout = 0.0 if lora is None else lora.dropout
        layer_fn = self.layer_fn
        scan = self.scans_layers({key: params["model"][key] for key, _, _ in layer_stacks(spec)})
        cos_all = jnp.stack([c for c, _ in tables])  # the scan indexes the rope table per layer
        sin_all = jnp.stack([t for _, t in tables])
        for key, first, count in layer_stacks(spec):  # one stack, or DeepSeek's dense layers, then MoE
            x = self._stack(
                stack_spec(spec, key), params["model"][key], lora_model.get(key, {}), x, first, count, scan=scan,
                tables=tables, cos_all=cos_all, sin_all=sin_all, base_mask=base_mask, dist=dist, s=s,
                static_window=static_window, window0=window0, scale=scale, dropout=dropout, rng=rng,
                layer_fn=layer_fn,
            )
        return x

    def _stack(
        self, spec: ArchSpec, layer_params: Any, lora_layers: Any, x: jax.Array, first: int, count: int, *,
        scan: bool, tables: Any, cos_all: Any, sin_all: Any, base_mask: Any, dist: Any, s: int, static_window: bool,
        window0: int, scale: float, dropout: float, rng: Any, layer_fn: LayerFn,
    ) -> jax.Array:
        """Run layers ``first .. first + count - 1`` (one stacked group of parameters)."""

        def body(h: jax.Array, p: Any, lp: Any, window: Any, rope_i: Any, layer_i: Any) -> jax.Array:
            layer_rng = None if rng is None else jax.random.fold_in(rng, layer_i)
            ctx = Ctx(
                dtype=self.dtype,
                lora_scale=scale,
                lora_dropout=dropout,
                rng=layer_rng,
                attention=self.attention,
                window=None if window0 >= FULL_WINDOW else window0,
            )
            if static_window:
                mask = None
            elif isinstance(window, int) and window >= s:  # unrolled full-attention layer: no window term
                mask = base_mask
            else:
                mask = base_mask & (dist < window)[None]
            cos, sin = tables[rope_i] if isinstance(rope_i, int) else (cos_all[rope_i], sin_all[rope_i])
            return layer_fn(spec, p, h, cos=cos, sin=sin, mask=mask, ctx=ctx, lora=lp)

        recomputed = self.remat_count(first, count)
        saved_body = body
        remat_body = jax.checkpoint(body, prevent_cse=not scan, static_argnums=() if scan else (3, 4, 5))
        if not scan:
            for j in range(count):
                take = lambda a, j=j: a[j]  # noqa: E731
                p = jax.tree.map(take, layer_params)
                lp = jax.tree.map(take, lora_layers)
                i = first + j
                fn = remat_body if j < recomputed else saved_body
                x = fn(x, p, lp, spec.layer_window[i], spec.layer_rope[i], i)
            return x
        windows = jnp.asarray(np.asarray(spec.layer_window[first : first + count], dtype=np.int32))
        ropes = jnp.asarray(np.asarray(spec.layer_rope[first : first + count], dtype=np.int32))
        layer_ids = jnp.arange(first, first + count, dtype=jnp.int32)
        if recomputed in (0, count):
            xs = (layer_params, lora_layers, windows, ropes, layer_ids)
            fn = remat_body if recomputed else saved_body
            x, _ = jax.lax.scan(lambda h, xs: (fn(h, *xs), None), x, xs)
            return x
        # The first ``recomputed`` layers under jax.checkpoint, the rest keeping their residuals: one scan each.
        # The base weights stay one stack both scans index into (a slice of the stack would be a copy of the
        # weights); the adapters, small, are sliced. A recomputed layer indexes its weights inside the checkpoint:
        # a checkpointed function's inputs are its residuals, so weights indexed outside it were saved per layer
        # (the scan stacked a [recomputed, ...] copy of the frozen matrices); indexed inside, the residual is the
        # whole stack, loop-invariant, which the scan keeps once. Full fine-tuning recomputes all layers or none
        # (`TrainConfig` refuses a split): its trained weights would be copied, and so would their gradients.
        def take_layer(stack: Any, j: jax.Array) -> Any:
            return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, j, keepdims=False), stack)

        remat_indexed = jax.checkpoint(
            lambda h, stack, j, lp, window, rope_i, layer_i: body(h, take_layer(stack, j), lp, window, rope_i, layer_i),
            prevent_cse=False,
        )
        saved_indexed = lambda h, stack, j, *rest: saved_body(h, take_layer(stack, j), *rest)  # noqa: E731
        for lo, hi, fn in ((0, recomputed, remat_indexed), (recomputed, count, saved_indexed)):
            part = lambda a, lo=lo, hi=hi: a[lo:hi]  # noqa: E731

            def indexed(h, xs, fn=fn):
                j, lp, window, rope_i, layer_i = xs
                return fn(h, layer_params, j, lp, window, rope_i, layer_i), None

            xs = (jnp.arange(lo, hi, dtype=jnp.int32), jax.tree.map(part, lora_layers), windows[lo:hi], ropes[lo:hi],
                  layer_ids[lo:hi])
            x, _ = jax.lax.scan(indexed, x, xs)
        return x

    def remat_count(self, first: int, count: int) -> int:
        """How many of layers ``first .. first + count - 1`` run under ``jax.checkpoint``: all of them with
        ``remat`` and no ``remat_layers``; the ones among the first ``remat_layers`` of the model otherwise."""
        if not self.remat:
            return 0
        if self.remat_layers is None:
            return count
        return max(0, min(count, self.remat_layers - first))

    def hidden(
        self,
        params: dict[str, Any],
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        lora: Any = None,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """Final-norm hidden states ``[b, s, d]`` in the compute dtype."""
        input_ids = jnp.asarray(input_ids, jnp.int32)
        b, s = input_ids.shape
        if segment_ids is None:
            if positions is None:
                positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
        elif positions is None:
            positions = segment_positions(segment_ids)
        x = jnp.take(params["model"]["embed_tokens"]["weight"], input_ids, axis=0)
        if self.spec.position_embeddings:  # GPT-2, OPT: wte(ids) + wpe(positions), added in the weights' dtype
            limit = self.spec.position_embeddings - self.spec.position_offset
            if s > limit:
                raise InvalidConfigError(
                    f"{self.family} has learned positions for {limit:,} tokens, the sequence has {s:,}: lower seq_len "
                    f"to {limit:,} or less."
                )
            rows = positions + self.spec.position_offset if self.spec.position_offset else positions
            x = x + jnp.take(params["model"]["embed_positions"]["weight"], rows, axis=0)
        x = x.astype(self.dtype)
        if self.spec.embed_scale is not None:
            x = x * jnp.asarray(self.spec.embed_scale, self.dtype)
        if self.spec.embedding_dropout > 0.0 and rng is not None:  # Phi's embd_pdrop, training only
            x = dropout(x, self.spec.embedding_dropout, jax.random.fold_in(rng, _EMBEDDING_DROPOUT_STREAM))
        x = self._layers(params, x, positions, segment_ids, lora, rng)
        spec = self.spec
        if spec.layer_norm:
            return layer_norm(x, params["model"].get("norm", {}), spec.rms_norm_eps)
        return rms_norm(
            x, params["model"]["norm"]["weight"], spec.rms_norm_eps, gemma=spec.gemma_norm,
            weight_fp32=spec.norm_weight_fp32,
        )

    def head_weight(self, params: dict[str, Any]) -> Any:
        """The output projection ``[vocab, d]`` in HF layout (the embedding matrix when tied); with an
        ``lm_head`` bias (Phi-MoE) the pair ``(weight, bias)``, which :meth:`project` takes as well."""
        w = params["model"]["embed_tokens"]["weight"] if self.spec.tie_embeddings else params["lm_head"]["weight"]
        return (w, params["lm_head"]["bias"]) if self.spec.lm_head_bias else w

    def project(self, h: jax.Array, w: jax.Array) -> jax.Array:
        """Logits (float32) from hidden states ``[..., d]`` and ``head_weight`` ``[vocab, d]`` (contracted
        in HF layout, no transpose), soft-capped where the family does."""
        bias = None
        if isinstance(w, tuple):  # (weight, bias): Phi-MoE's lm_head bias
            w, bias = w
        if h.dtype == jnp.float32:
            logits = _head_logits(h, w.astype(h.dtype))
        else:
            dims = (((h.ndim - 1,), (1,)), ((), ()))
            logits = jax.lax.dot_general(h, w.astype(h.dtype), dims, preferred_element_type=jnp.float32)
        if bias is not None:  # nn.Linear adds its bias in the compute dtype
            logits = (logits.astype(h.dtype) + bias.astype(h.dtype)).astype(jnp.float32)
        if self.spec.logits_divisor != 1.0:  # Granite's logits_scaling
            logits = logits / self.spec.logits_divisor
        if self.spec.logits_scale != 1.0:  # Cohere's logit_scale
            logits = logits * self.spec.logits_scale
        if self.spec.final_softcap is not None:
            cap = self.spec.final_softcap
            logits = jnp.tanh(logits / cap) * cap
        return logits

    def apply(
        self,
        params: dict[str, Any],
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        lora: Any = None,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """Logits ``[b, s, vocab]`` float32 for token ids ``[b, s]``."""
        h = self.hidden(params, input_ids, positions=positions, segment_ids=segment_ids, lora=lora, rng=rng)
        return self.project(h, self.head_weight(params))
