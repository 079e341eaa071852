"""The memory engine: predicted peak memory of one training configuration, component by component.

The peak is the largest of the moments a step goes through, each summed from what is live then:
the start of backward (every saved activation plus the fp32 loss buffers), each layer's backward
(activations not yet freed, gradients already produced, recomputation under checkpointing, backward
temporaries) and the optimizer step (weights, gradients, states and foreach temporaries). The
components reported are those live at the peak; each carries its formula with the numbers filled in.

    import aegis
    est = aegis.estimate_memory("llama-3.1-8b", method="qlora", micro_batch_size=4, seq_len=1024, gpu="3090")
    est.tensor_bytes, est.total_bytes, [c.name for c in est.components]
"""

from __future__ import annotations

from typing import NamedTuple

from aegis.errors import InvalidConfigError
from aegis.models.families import get_family, layer_shapes
from aegis.planning.hardware import find_gpu
from aegis.models.resolve import resolve_model
from aegis.planning.memory._dtypes import dtype_name, placement
from aegis.planning.memory.activations import (
    Setting, fixed_saved_by_layer, head_saved_bytes_per_token, loss_bytes_per_token, terms_by_layer,
)
from aegis.planning.memory.components import (
    check_lora_targets, layer_storage_bytes, optimizer_state_bytes, optimizer_temp_bytes, root_storage_bytes,
    selects_any, sizes,
)
from aegis.planning.memory.stack_effects import (
    backward_width, check_stack, checkpoint_keeps_inputs, fused_loss, profile_for_stack, stack_notes, stack_setting,
)
from aegis.planning.memory.zero_stages import ZERO_STAGES, ZeroBuckets, ZeroPlan, zero_plan
from aegis.units import gib
from aegis.schema import (
    GPU, Attention, Framework, LoRAConfig, MemoryComponent, MemoryEstimate, Method, ModelProfile, Optimizer, Precision, StackProfile,
    Trainer, TrainConfig,
    default_lora_targets,
    lora_selects,
    lora_target_names,
)

__all__ = ["estimate_memory", "estimate", "DEFAULT_OVERHEAD_BYTES"]

GIB = 1 << 30
DEFAULT_OVERHEAD_BYTES = 1 * GIB
"""CUDA context + framework reservation assumed when no GPU is given."""
FSDP_QLORA_NOTE = (
    "FSDP QLoRA: NF4 weights in bf16 storage (bnb_4bit_quant_storage=bfloat16) and no "
    "prepare_model_for_kbit_training (TRL and axolotl skip it when sharding: FSDP1's flat parameters need one "
    "dtype): embeddings, head and norms stay bf16")
"""Why a sharded QLoRA plan is sized without k-bit preparation, whatever the trainer's single-GPU default."""
ZERO_QLORA_NOTE = (
    "DeepSpeed QLoRA: NF4 weights in bf16 storage (bnb_4bit_quant_storage=bfloat16), which ZeRO-3 partitions like any "
    "bf16 parameter, and no prepare_model_for_kbit_training: the engine casts every float parameter to bf16 anyway")
_DYNAMIC_FRACTION = 0.04
_DYNAMIC_FLOOR = 256 << 20


class _Moment(NamedTuple):
    name: str
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def estimate_memory(
    model: str | ModelProfile,
    *,
    method: Method = "lora",
    micro_batch_size: int = 1,
    seq_len: int = 1024,
    gradient_checkpointing: bool = False,
    attention: Attention = "sdpa",
    chunked_cross_entropy: bool = False,
    precision: Precision = "bf16",
    optimizer: Optimizer = "adamw",
    lora: LoRAConfig | None = None,
    lora_rank: int | None = None,
    gpu: str | GPU | None = None,
    eval_seq_len: int | None = None,
    eval_batch_size: int | None = None,
    fsdp_shards: int = 1,
    tensor_shards: int = 1,
    ddp: bool = False,
    fsdp_reshard: bool = True,
    zero_stage: int = 0,
    zero_buckets: ZeroBuckets | None = None,
    gradient_accumulation_steps: int = 1,
    framework: Framework = "hf",
    stack: StackProfile | None = None,
    trainer: Trainer | None = None,
    transformers_version: str | None = None,
    lora_dropout: float | None = None,
    autocast: bool | None = None,
) -> MemoryEstimate:
    """Predict the peak memory of a training step. Raises `InvalidConfigError` on impossible settings.

    ``fsdp_shards`` > 1 sizes rank 0 of a FULL_SHARD FSDP run as the Trainer wraps it (decoder layers and, for PEFT,
    each LoRA Linear their own units; BACKWARD_PRE prefetch; bf16 MixedPrecision for LoRA/QLoRA): parameters,
    gradients and states sharded, the root unit (embeddings, final norm, head) gathered from forward to the end of
    backward, one layer gathered at the loss and two in a layer's backward (checked against FSDP1 and FSDP2 steps
    traced by tools/truth/sharded.py). ``fsdp_reshard=False`` is SHARD_GRAD_OP (FSDP2: ``reshard_after_forward=False``):
    a layer stays gathered from its forward to the end of its backward. ``ddp`` one GPU of a DDP run (the same as
    one GPU, plus DDP's gradient buckets). ``zero_stage`` 2 or 3 sizes rank 0 of a DeepSpeed ZeRO-2/ZeRO-3 run under
    the HF Trainer (bf16, HF's ZeRO configs with their "auto" buckets) on ``fsdp_shards`` GPUs: the fp32 master and
    optimizer states partitioned, the gradient partition and reduce buckets, and under ZeRO-3 the partitioned
    parameters with those kept gathered between a layer's forward and backward and the prefetch bucket
    (`aegis.planning.memory.zero_stages`; checked against steps traced by tools/truth/zero.py); QLoRA as TRL shards it
    (bf16 quant_storage, no k-bit preparation); with ``gradient_checkpointing`` (non-reentrant, as TRL sets it) each
    layer's input is kept and one layer recomputed, as on one GPU, and under ZeRO-3 the recompute and the embedding's
    backward (``enable_input_require_grads``) gather their parameters again; ``zero_buckets`` the ZeRO config's sizes
    when not HF's "auto" ones. With ``framework="jax"``, ``fsdp_shards`` and ``tensor_shards`` are the run's mesh
    (`aegis.train.parallel.ParallelConfig`): the estimate is one device's share of the sharded step.

    ``stack`` (or its fields ``trainer``/``transformers_version``) names the software the run uses
    (`aegis.schema.StackProfile`; default HF Trainer on transformers 5); ``lora_dropout`` the LoRA dropout;
    ``autocast`` whether the step runs under torch.autocast (None: the trainer's default, `TrainConfig.autocast`).

    ``framework="hf"`` sizes HF Trainer on PyTorch; ``"jax"`` Aegis' JAX engine as XLA compiles it
    (`aegis.planning.memory.jax_profile`; XLA:CPU's layout when no GPU is named)."""
    profile = model if isinstance(model, ModelProfile) else resolve_model(model)
    if method != "full" and lora is None:
        lora = LoRAConfig(rank=lora_rank) if lora_rank else LoRAConfig()
        if not selects_any(profile, lora):  # no q/k/v/o/gate/up/down (GPT-2's c_attn): the plan's own defaults
            lora = lora.model_copy(update={"target_modules": default_lora_targets(profile.linear_modules)})
    try:
        if lora is not None and lora_dropout is not None:
            lora = lora.model_copy(update={"dropout": LoRAConfig(dropout=lora_dropout).dropout})
        stack = stack or StackProfile()
        given = {k: v for k, v in (("trainer", trainer), ("transformers_version", transformers_version)) if v is not None}
        if given:
            fields = {**stack.model_dump(exclude_defaults=True), **given}
            if fields.get("trainer") == "unsloth":  # its documented default, as `aegis.planning.stack.resolve_stack` has it
                fields.setdefault("checkpointing", "offload")
            stack = StackProfile(**fields)
        cfg = TrainConfig(
            method=method, micro_batch_size=micro_batch_size, seq_len=seq_len,
            gradient_checkpointing=gradient_checkpointing, attention=attention,
            gradient_accumulation_steps=gradient_accumulation_steps, chunked_cross_entropy=chunked_cross_entropy, precision=precision, optimizer=optimizer,
            lora=lora if method != "full" else None, stack=stack, autocast=autocast,
        )
    except ValueError as err:
        raise InvalidConfigError(_first_error(err)) from err
    return estimate(profile, cfg, gpu=gpu, eval_seq_len=eval_seq_len, eval_batch_size=eval_batch_size, fsdp_shards=fsdp_shards,
                    tensor_shards=tensor_shards, ddp=ddp, framework=framework, fsdp_reshard=fsdp_reshard,
                    zero_stage=zero_stage, zero_buckets=zero_buckets)


def _first_error(err: ValueError) -> str:
    errors = getattr(err, "errors", None)
    if callable(errors):
        first = errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ())) or "value"
        return f"{loc}: {first['msg']}"
    return str(err)


def estimate(
    profile: ModelProfile,
    cfg: TrainConfig,
    *,
    gpu: str | GPU | None = None,
    eval_seq_len: int | None = None,
    eval_batch_size: int | None = None,
    fsdp_shards: int = 1,
    tensor_shards: int = 1,
    ddp: bool = False,
    framework: Framework = "hf",
    fsdp_reshard: bool = True,
    zero_stage: int = 0,
    zero_buckets: ZeroBuckets | None = None,
) -> MemoryEstimate:
    """`estimate_memory` for a resolved profile and a full `TrainConfig`."""
    if zero_buckets is not None and not zero_stage:
        raise InvalidConfigError("zero_buckets sizes a DeepSpeed ZeRO run: give zero_stage 2 or 3 with it")
    if zero_stage:
        _check_zero(cfg, zero_stage, ddp=ddp, framework=framework, fsdp_reshard=fsdp_reshard)
        cfg = cfg.model_copy(update={"autocast": False})  # accelerate leaves mixed precision to the engine
    if ddp and fsdp_shards > 1:
        raise InvalidConfigError("ddp and fsdp_shards > 1 are two ways to use several GPUs: choose one")
    if framework == "jax":
        if ddp:
            raise InvalidConfigError("the JAX engine's data-parallel ranks hold what one device holds: drop ddp "
                                     "(fsdp_shards / tensor_shards size a sharded mesh)")
        from aegis.planning.memory.jax_profile import estimate_jax

        return estimate_jax(profile, cfg, gpu=gpu, eval_seq_len=eval_seq_len, eval_batch_size=eval_batch_size,
                            fsdp_shards=fsdp_shards, tensor_shards=tensor_shards)
    if tensor_shards != 1:
        raise InvalidConfigError("tensor_shards sizes the JAX engine's mesh: use framework='jax' (HF plans shard with fsdp_shards)")
    if framework != "hf":
        raise InvalidConfigError(f"framework must be 'hf' or 'jax', got {framework!r}")
    profile = profile_for_stack(profile, cfg.stack)  # transformers 4.x: separate expert Linears
    if cfg.method != "full":
        check_lora_targets(profile, cfg.lora_config)
    check_stack(profile, cfg)
    gpu_obj = find_gpu(gpu) if isinstance(gpu, str) else gpu
    if fsdp_shards < 1:
        raise InvalidConfigError(f"fsdp_shards must be >= 1, got {fsdp_shards}")
    fam = get_family(profile.config)
    c = profile.config
    asked = cfg
    n = 1 if zero_stage else fsdp_shards  # ZeRO's partitions are `zero_plan`'s, not FSDP's
    if (n > 1 or zero_stage) and cfg.method == "qlora" and cfg.stack.kbit_prep_effective:
        cfg = cfg.model_copy(update={"stack": cfg.stack.model_copy(update={"kbit_prep": False})})
    place = placement(cfg)
    if zero_stage and cfg.method != "full":  # the engine casts the module to bf16, adapters included
        place = place._replace(adapter_bytes=2)
    sz = sizes(profile, cfg, place)
    lora = cfg.lora_config
    b, s = cfg.micro_batch_size, cfg.seq_len
    tokens = b * s

    eager = cfg.attention == "eager" or not fam.sdpa_supported
    setting = step_setting(profile, cfg, fam, place)
    layers = layer_shapes(fam, c, profile.layout_major)
    layer_terms = terms_by_layer(fam, c, layers, setting)
    per_layer = [sum(t.values()) for t in layer_terms]
    # PEFT ParamWrapper's merged expert tensors: per layer, whatever the tokens (kept unless checkpointed)
    fixed = fixed_saved_by_layer(layers, setting) if cfg.method != "full" else [0] * len(layers)
    head_saved = head_saved_bytes_per_token(fam, c, setting)
    if fused_loss(cfg):
        # Liger-style fused linear cross-entropy: chunks of tokens/ceil(vocab/hidden), grads computed in-chunk
        chunk = max(1, -(-tokens // -(-fam.vocab(c) // fam.hidden(c))))
        loss_total = int(chunk * fam.vocab(c) * 12 + tokens * fam.hidden(c) * 4)
        loss_formula = f"chunked: {chunk:,}-token chunks x {fam.vocab(c):,} vocab x 12 B + fp32 hidden grads"
    else:
        loss_per_token, loss_formula = loss_bytes_per_token(fam, c, setting)
        loss_total = int(tokens * loss_per_token)
        loss_formula = f"{tokens:,} tokens x {int(loss_per_token):,} B: " + loss_formula

    masks = 0
    if eager:
        masks += b * s * s * place.stream_bytes
    elif cfg.attention == "sdpa" and any(layer.sliding_window and layer.sliding_window < s for layer in layers):
        masks += b * s * s  # bool sliding-window mask shared by the sliding layers

    hidden = fam.hidden(c)
    # torch.utils.checkpoint (reentrant or not) keeps each layer's input; Unsloth's offloading keeps it on the host
    ckpt_saved = place.stream_bytes * hidden if checkpoint_keeps_inputs(cfg) else 0
    saved = [ckpt_saved if cfg.gradient_checkpointing else a for a in per_layer]
    act_total = int(tokens * sum(saved))

    trainable_per_layer = _trainable_per_layer(profile, cfg, lora, layers, fam)
    gb = sz.trainable_bytes_per_param
    grads_total = sz.trainable_params * gb
    head_grad = 0
    if cfg.method == "full":
        head_grad = (profile.lm_head_params or profile.embedding_params) * gb
    states, states_formula = optimizer_state_bytes(cfg, sz.trainable_params, place.state_bytes)
    # DDP (gradient_as_bucket_view off, its default and the HF Trainer's) keeps flat all-reduce buckets the size of
    # every trainable gradient beside the gradients themselves, from its construction on
    buckets = sz.trainable_params * gb if ddp else 0
    temp, temp_formula = optimizer_temp_bytes(cfg, sz.decay_params, place.state_bytes)

    # FSDP shards parameters; an NF4 weight's quantisation state (absmax, code book) is not one and stays whole
    weights = (sz.base_bytes - sz.quant_state_bytes) // n + sz.quant_state_bytes
    adapters = sz.adapter_bytes // n
    states //= n
    grads_total //= n
    temp //= n
    gathered = gathered_layer = root_gathered = layer_grad = 0
    if n > 1:
        # FSDP1 FULL_SHARD, BACKWARD_PRE (traced, tools/truth/sharded.py): the root unit (embeddings, final norm,
        # head) is gathered at the start of forward and kept unsharded until its post-backward (the end of
        # backward); each layer is gathered for its forward and again, with the next one prefetched, for its
        # backward. At the loss the root's pre-backward has prefetched the last layer: root + one layer.
        gathered_layer = max(layer_storage_bytes(layer, cfg, place) for layer in {id(x): x for x in layers}.values())
        root_gathered = root_storage_bytes(profile, cfg, place)
        gathered = root_gathered + gathered_layer
        if not fsdp_reshard:  # SHARD_GRAD_OP: every layer still gathered at the loss, freed by its own backward,
            # and with it its LoRA units (their own FSDP units, gathered in the bf16 compute dtype)
            adapters_gathered = [0] * len(layers) if cfg.method == "full" else [2 * t for t in trainable_per_layer]
            kept = [layer_storage_bytes(layer, cfg, place) + a for layer, a in zip(layers, adapters_gathered)]
            gathered = root_gathered + sum(kept)
        if cfg.method == "full":
            # the layer's flat gradient, unsharded until its reduce-scatter; the head's, unsharded in the root's
            # flat gradient until the embedding's (last) is made
            layer_grad = gathered_layer
    casts = head_cast = 0  # bf16 copies autocast keeps through forward and backward
    layer_casts = [0] * len(layers)
    if n > 1 and cfg.method == "lora":
        pass  # FSDP's bf16 MixedPrecision gathers the adapters in bf16 and frees them: nothing to cast or keep
    elif cfg.autocast_effective and cfg.method == "lora":
        casts = sz.adapter_params * 2 // n
    elif cfg.autocast_effective and cfg.method == "qlora" and (place.embedding_bytes or place.unquantized_bytes) != 2:
        # the frozen fp32 head's bf16 copy: autocast caches only leaf weights that require grad, so this one is the
        # head matmul's saved operand, freed by the head's backward (the layers' backward runs without it)
        head_cast = (profile.lm_head_params or profile.embedding_params) * 2
    elif n == 1 and gb == 4 and cfg.autocast_effective and cfg.method == "full":
        layer_casts = [sum(c) for c in full_autocast_casts(layers)]
        head_cast = (profile.lm_head_params or profile.embedding_params) * 2

    moments: list[_Moment] = []
    moments.append(_Moment("start of backward (loss)", {
        "weights": weights, "adapters": adapters, "optimizer": states, "gathered": gathered,
        # checkpointed layers' copies leave with the forward's autocast cache, before the loss's backward
        "casts": casts + head_cast + (0 if cfg.gradient_checkpointing else sum(layer_casts)), "buckets": buckets, "activations": act_total + int(tokens * head_saved) + (0 if cfg.gradient_checkpointing else sum(fixed)),
        "masks": masks, "logits": loss_total,
    }))
    d = 2 if place.autocast else place.stream_bytes
    width = backward_width(layers, cfg)  # 4.x MoE: one expert's rows at a time
    transient_per_token = 2 * d * width + 2 * place.stream_bytes * hidden
    grads_so_far = head_grad
    for i in range(len(layers) - 1, -1, -1):
        below = tokens * sum(saved[:i]) + (0 if cfg.gradient_checkpointing else sum(fixed[:i]))
        recompute = tokens * per_layer[i] + fixed[i]
        moments.append(_Moment(f"backward of layer {i}", {
            "weights": weights, "adapters": adapters, "optimizer": states,
            "gathered": (root_gathered + sum(kept[:i + 1]) + layer_grad if n > 1 and not fsdp_reshard
                         else gathered + (gathered_layer + layer_grad if i else layer_grad)),
            "casts": casts + (layer_casts[i] if cfg.gradient_checkpointing else sum(layer_casts[:i + 1])),
            "buckets": buckets, "activations": int(below + recompute + tokens * (ckpt_saved if cfg.gradient_checkpointing else 0)),
            "masks": masks,
            "gradients": grads_so_far,
            "backward temporaries": int(tokens * transient_per_token),
        }))
        grads_so_far += trainable_per_layer[i] * gb // n
    if n > 1 and cfg.method == "full" and not profile.tie_word_embeddings:
        # FSDP1's root post-backward, the end of backward (traced at real size: Llama-3.1-8B and Qwen2.5-7B full on
        # 2 GPUs with checkpointing hold their backward peak here): the root still gathered, its unsharded gradients
        # (embedding, final norm, head) copied into its flat gradient for the reduce-scatter, every layer's gradient
        # shard made, the gradient flowing out of the first layer still live
        root_grads = (profile.total_params - sum(profile.layer_params)) * gb
        moments.append(_Moment("root's post-backward (FSDP)", {
            "weights": weights, "optimizer": states, "gathered": root_gathered, "buckets": buckets, "masks": masks,
            "activations": tokens * hidden * place.stream_bytes,
            "gradients": grads_total - root_grads // n + 2 * root_grads,
        }))
    if cfg.method == "full" and profile.tie_word_embeddings:
        # a tied embedding's two gradients, the head dot's (made first, kept) and the lookup's (its backward, last),
        # are summed out of place: all three live at once, beside every other gradient (traced, aya-23-8B full)
        moments.append(_Moment("embedding backward (tied head)", {
            "weights": weights, "adapters": adapters, "optimizer": states, "gathered": gathered, "buckets": buckets,
            "masks": masks, "gradients": grads_total + 2 * head_grad,
        }))
    moments.append(_Moment("optimizer step", {
        "weights": weights, "adapters": adapters, "optimizer": states, "gradients": grads_total, "buckets": buckets,
        "optimizer temporaries": temp,
    }))
    zp = None
    if zero_stage:  # the same step, with what each rank holds under ZeRO in place of the one-GPU tensors
        zp = zero_plan(profile, cfg, layers, world_size=fsdp_shards, stage=zero_stage,
                       trainable_params=sz.trainable_params, decay_params=sz.decay_params,
                       state_bytes_per_param=optimizer_state_bytes(cfg, 1, 4)[0], quant_state_bytes=sz.quant_state_bytes,
                       buckets=zero_buckets, head_input_bytes=tokens * hidden * 2)
        one_gpu = ("weights", "adapters", "optimizer", "gradients", "gathered", "buckets", "optimizer temporaries")
        zero_moments = [_Moment(moments[0].name, {**{k: v for k, v in moments[0].parts.items() if k not in one_gpu},
                                                  **zp.terms_at_loss()})]
        for i, moment in zip(range(len(layers) - 1, -1, -1), moments[1:1 + len(layers)]):
            zero_moments.append(_Moment(moment.name, {**{k: v for k, v in moment.parts.items() if k not in one_gpu},
                                                      **zp.terms_in_backward(i)}))
        zero_moments.append(_Moment("optimizer step", zp.terms_at_step()))
        moments = zero_moments
    peak = max(moments, key=lambda m: m.total)

    layer_breakdown: dict[str, float] = {}
    for terms in layer_terms:
        for k, v in terms.items():
            layer_breakdown[k] = layer_breakdown.get(k, 0.0) + v
    per_token_layers = sum(per_layer)
    if cfg.gradient_checkpointing:
        act_formula = (
            f"checkpointing: {len(layers)} layer inputs x {tokens:,} tokens x {ckpt_saved:,} B "
            f"+ one layer recomputed in backward ({gib(per_layer[-1] * tokens, 2)})"
        )
    else:
        detail = ", ".join(f"{k} {v / len(layers):,.0f}" for k, v in sorted(layer_breakdown.items(), key=lambda kv: -kv[1]))
        act_formula = f"{tokens:,} tokens x {len(layers)} layers x {per_token_layers / len(layers):,.0f} B/token/layer ({detail})"

    labels = {
        "weights": (f"Base model ({_weights_label(cfg, place)})", sz.base_formula + (
                        "" if n == 1 else f" / {n} shards" if not sz.quant_state_bytes else
                        f"; the packed weights and the rest / {n} shards, the {sz.quant_state_bytes:,} B of "
                        f"quantisation state whole on every GPU"),
                    "frozen" if cfg.method != "full" else "trained in place"),
        "adapters": (f"LoRA adapters ({'fp32' if place.adapter_bytes == 4 else 'bf16'})",
                     f"{sz.adapter_params:,} params (rank {lora.rank}) x {place.adapter_bytes} B",
                     "PEFT keeps adapters in fp32"),
        "optimizer": (f"Optimizer states ({_opt_label(cfg)})", states_formula + (f" / {n}" if n > 1 else ""),
                      "only trainable parameters have optimizer state"),
        "gradients": ("Gradients", f"{sz.trainable_params:,} trainable x {gb} B; live at this moment",
                      "freed after every optimizer step (zero_grad set_to_none)"),
        "activations": ("Activations" + (" (grad ckpt)" if cfg.gradient_checkpointing else ""), act_formula,
                        f"micro batch {b} x seq {s:,}; grows linearly with both"),
        "logits": ("Logits + loss buffers" + (" (chunked CE)" if fused_loss(cfg) else ""), loss_formula,
                   f"{fam.vocab(c):,}-token vocabulary; chunked cross-entropy removes most of it"),
        "masks": ("Attention mask", f"{b} x {s:,}^2 x {place.stream_bytes if eager else 1} B",
                  "materialised for eager attention or sliding-window layers"),
        "backward temporaries": ("Backward temporaries", f"{tokens:,} tokens x {transient_per_token:,} B",
                                 "gradients of the widest intermediate while a layer runs backward"),
        "optimizer temporaries": ("Optimizer-step temporaries", temp_formula, "foreach AdamW allocates a state-sized buffer"),
        "casts": ("Autocast weight copies", "bf16 copies of fp32 weights used in autocast matmuls, kept for backward",
                  "torch.autocast casts fp32 weights per forward"),
        "buckets": ("DDP gradient buckets", f"{sz.trainable_params:,} trainable x {gb} B",
                    "DDP's all-reduce buffers, as large as the gradients (gradient_as_bucket_view off)"),
        **_zero_labels(zp, cfg),
        "gathered": ("FSDP gathered parameters", f"root unit {root_gathered:,} B (embeddings, final norm, head) + "
                     f"{gathered_layer:,} B per gathered layer: the largest layer's parameters as stored"
                     + (" (NF4 packed 2 per byte in bf16 storage; norms and biases bf16)" if cfg.method == "qlora" else "")
                     + (f"; in a layer's backward also its unsharded gradient ({layer_grad:,} B)" if layer_grad else ""),
                     ("FSDP FULL_SHARD, BACKWARD_PRE: the root stays gathered from forward to the end of backward; a "
                      "layer's backward holds it and the prefetched next one; at the loss the last layer is prefetched"
                      if fsdp_reshard else "SHARD_GRAD_OP: every layer stays gathered from its forward to its backward")),
    }
    components = tuple(
        MemoryComponent(name=labels[key][0], key=key, bytes=int(value), formula=labels[key][1], note=labels[key][2])
        for key, value in peak.parts.items()
        if value or key in ("weights", "optimizer")
    )
    tensor = peak.total
    overhead = gpu_obj.overhead_bytes if gpu_obj else DEFAULT_OVERHEAD_BYTES
    dynamic = int(_DYNAMIC_FRACTION * tensor + _DYNAMIC_FLOOR)
    total = tensor + overhead  # the low end (below) keeps the fixed overhead: the margin is the tensors'
    static = weights + adapters + states + buckets
    if zp is not None:  # what a rank keeps between steps (ZeRO-3 gathers again for the eval forward)
        static = sum(v for k, v in zp.terms_at_loss().items() if k != "zero gathered")
    eval_peak = _eval_peak(profile, fam, cfg, place, static=static,
                           seq=eval_seq_len or s, batch=eval_batch_size or b, width=width) + overhead
    notes = (f"peak at the {peak.name}",)
    if cfg is not asked:
        notes += (ZERO_QLORA_NOTE if zero_stage else FSDP_QLORA_NOTE,)
    if eager and cfg.attention != "eager":
        notes += (f"{profile.architecture} runs eager attention in transformers (no SDPA): scores are materialised",)
    return MemoryEstimate(
        model_id=profile.model_id, config=asked, components=components, tensor_bytes=tensor,
        overhead_bytes=overhead, dynamic_margin_bytes=dynamic, total_bytes=total,
        low_bytes=total - min(dynamic, tensor), high_bytes=total + dynamic, eval_peak_bytes=eval_peak,
        peak_phase=peak.name, notes=notes, stack_notes=tuple(stack_notes(profile, cfg)),
    )


def _check_zero(cfg: TrainConfig, stage: int, *, ddp: bool, framework: str, fsdp_reshard: bool) -> None:
    """One-line refusals of what the ZeRO model does not size."""
    if stage not in ZERO_STAGES:
        raise InvalidConfigError(f"zero_stage must be 2 or 3 (DeepSpeed ZeRO-2 / ZeRO-3; 0 without DeepSpeed), got {stage}")
    if framework != "hf":
        raise InvalidConfigError("zero_stage sizes DeepSpeed under the HF Trainer: use framework='hf' "
                                 "(the JAX engine shards with fsdp_shards)")
    if ddp:
        raise InvalidConfigError("ddp and zero_stage are two ways to use several GPUs: choose one "
                                 "(fsdp_shards is the number of GPUs under ZeRO)")
    if not fsdp_reshard:
        raise InvalidConfigError("fsdp_reshard=False is FSDP's SHARD_GRAD_OP: leave it True with zero_stage")
    if cfg.precision != "bf16":
        raise InvalidConfigError("zero_stage is modelled for DeepSpeed's bf16 (bf16.enabled: bf16 weights, fp32 "
                                 "master): use precision='bf16'")
    if cfg.gradient_checkpointing and cfg.stack.checkpointing != "non_reentrant":
        raise InvalidConfigError("zero_stage is modelled with non-reentrant gradient checkpointing (use_reentrant="
                                 "False, as TRL sets): leave the stack's checkpointing at 'non_reentrant'")
    if cfg.autocast:
        raise InvalidConfigError("DeepSpeed's bf16 runs without torch.autocast (accelerate leaves mixed precision to "
                                 "the engine): leave autocast unset with zero_stage")


def _zero_labels(zp: ZeroPlan | None, cfg: TrainConfig) -> dict[str, tuple[str, str, str]]:
    """Breakdown labels of the ZeRO terms (`aegis.planning.memory.zero_stages`)."""
    if zp is None:
        return {}
    n, b = zp.world_size, zp.buckets
    f = zp.formulas
    return {
        "weights": ("Model parameters (bf16)", f["weights"],
                    "the engine casts the module to bf16, LoRA adapters included"),
        "optimizer": (f"Optimizer states ({_opt_label(cfg)}{', fp32' if cfg.optimizer in ('adamw', 'adafactor') else ''})",
                      f["optimizer"], "of this rank's master partition only"
                      + ("" if cfg.optimizer == "adamw" else "; traced under ZeRO for AdamW only")),
        "zero master": ("ZeRO fp32 master partition", f["zero master"],
                        "the optimizer's fp32 copy of this rank's 1/n of the trainable parameters"),
        "zero gradient partition": ("ZeRO gradient partition", f["zero gradient partition"],
                                    "this rank's reduced bf16 gradients (contiguous_gradients)"
                                    + ("; from the first reduction to the step" if zp.stage == 2 else "; allocated once")),
        "zero reduce buckets": ("ZeRO reduce buckets", f["zero reduce buckets"],
                                f"reduce_bucket_size {b.reduce_bucket_size:,} (HF 'auto': hidden²)"),
        "zero linear inputs": ("ZeRO-3 saved head input", f"the frozen head's bf16 input: {zp.head_input:,} B",
                               "DeepSpeed's memory-efficient linear saves every Linear's input, frozen or not"),
        "zero fp32 gradients": ("ZeRO fp32 gradient copy", f["zero fp32 gradients"],
                                "the optimizer steps the fp32 master with an fp32 copy of the gradient partition"),
        "zero gathered": ("ZeRO-3 gathered parameters",
                          (f"the parameters the backward uses, {sum(zp.gathered_layers):,} B of layers + "
                           f"{zp.gathered_root:,} B embeddings/head, gathered ahead by the prefetcher up to "
                           f"stage3_max_live_parameters {b.max_live_parameters:,}, or kept from forward within "
                           f"stage3_max_reuse_distance {b.max_reuse_distance:,}; a layer's freed by its backward"),
                          (f"parameters under stage3_param_persistence_threshold {b.persistence_threshold:,} stay "
                           f"gathered (counted with the weights); the rest is 1/{n} per rank")),
    }


def full_autocast_casts(layers) -> list[list[int]]:
    """Per layer, the bytes of each 16-bit copy autocast makes of an fp32 weight or bias a matmul uses, when full
    fine-tuning keeps fp32 weights under autocast (HF Trainer's ``bf16=True`` on an fp32 model).

    Autocast caches the copy of every leaf tensor that requires grad until the forward's autocast exits; the matmul
    saves it for backward, so without checkpointing a layer's copies live to its backward, with checkpointing only
    the recomputed layer's do (its recomputation casts again). The head's copy lives to the head's backward."""
    return [[2 * (lin.in_features * lin.out_features + (lin.out_features if lin.bias else 0))
             for lin in layer.linears for _ in range(lin.count)] for layer in layers]


def step_setting(profile: ModelProfile, cfg: TrainConfig, fam, place) -> Setting:
    """What the activation model needs to know about ``cfg`` (shared by the peak estimate and the
    device-level allocation stream, `aegis.planning.memory.device`)."""
    lora = cfg.lora_config
    s = cfg.seq_len
    eager = cfg.attention == "eager" or not fam.sdpa_supported
    return stack_setting(Setting(
        stream_bytes=place.stream_bytes,
        base_trainable=place.base_trainable,
        autocast=place.autocast,
        norm_weight_bytes=place.unquantized_bytes if cfg.method != "full" else place.base_bytes,
        lora_targets=lora_target_names(lora.target_modules, profile.linear_modules) if cfg.method != "full" else frozenset(),
        lora_rank=lora.rank,
        adapter_bytes=place.adapter_bytes or 4,
        adapter_compute_bytes=2 if cfg.autocast_effective and cfg.method != "full" else (place.adapter_bytes or 4),
        sdpa_autocast=cfg.autocast_effective,
        eager=eager,
        flash=cfg.attention == "flash",
        seq_len=s,
        expert_weight_bytes=place.unquantized_bytes if cfg.method == "qlora" else place.base_bytes,
        lm_head_bytes=place.unquantized_bytes if cfg.method == "qlora" else place.base_bytes,
    ), cfg)


def _trainable_per_layer(profile, cfg, lora, layers, fam) -> list[int]:
    if cfg.method == "full":
        return list(profile.layer_params)
    out = []
    targets = lora_target_names(lora.target_modules, profile.linear_modules)
    seen: dict[int, int] = {}  # equal layers are one object (`aegis.models.families.layer_shapes`): sum each once
    for layer in layers:
        n = seen.get(id(layer))
        if n is None:
            n = seen[id(layer)] = sum(
                lin.count * lora.rank * lin.lora_rank_factor * (lin.in_features + lin.out_features)
                for lin in layer.linears
                if lora_selects(lin, targets)
            )
        out.append(n)
    return out


def _eval_peak(profile, fam, cfg, place, *, static: int, seq: int, batch: int, width: int) -> int:
    """Eval step at `seq`: weights and states stay, plus the KV cache HF builds (use_cache), the logits
    and fp32 loss buffers, and one layer's forward temporaries.

    Dtypes as transformers' forward leaves them (checked in tests/planning/memory/test_estimate.py): under autocast (mixed
    precision, or the bf16/fp16 autocast a LoRA/QLoRA Trainer runs) the matmuls write 16-bit values and logits, but
    RoPE's tables follow the stream's dtype, so over a float32 stream (QLoRA's k-bit preparation) the cached keys are
    float32; 16-bit logits get a float32 copy for the loss (``logits.float()``), float32 ones do not."""
    tokens = batch * seq
    out = 2 if place.autocast or cfg.autocast_effective else place.stream_bytes
    rotated = fam.entry.position_embedding is None  # keys rotated by RoPE (GPT-2 / OPT: learned positions)
    key = max(out, place.stream_bytes) if rotated else out
    kv = profile.num_layers * fam.kv_cache_elements(profile.config) * (key + out) / 2
    logits = (out + (4 if out != 4 else 0) + 4) * fam.vocab(profile.config)
    layer = 3 * out * width + 4 * profile.hidden_size
    return int(static + tokens * (kv + logits + layer))


def _weights_label(cfg: TrainConfig, place) -> str:
    if cfg.method == "qlora":
        return "NF4"
    return dtype_name(place.base_bytes, cfg)


def _opt_label(cfg: TrainConfig) -> str:
    return {"adamw": "AdamW", "adamw_8bit": "AdamW 8-bit", "paged_adamw_8bit": "paged AdamW 8-bit",
            "sgd": "SGD", "adafactor": "Adafactor"}[cfg.optimizer]
