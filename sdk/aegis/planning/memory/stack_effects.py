"""What a stack profile (`aegis.schema.StackProfile`) changes in the memory engine, mechanism by mechanism.

The engine's default is HF Trainer on transformers 5 with ``prepare_model_for_kbit_training`` for QLoRA and
non-reentrant checkpointing. A profile changes:

- **transformers 4.x module layout** (`profile_for_stack`): MoE experts are separate ``nn.Linear`` modules that
  bitsandbytes quantises under QLoRA and PEFT wraps by their own names; the forward loops over experts
  (`aegis.models.families.moe`).
- **k-bit preparation** (`aegis.planning.memory._dtypes.placement`): with it, every unquantised weight is upcast to fp32
  (stream, norms, head and logits fp32); without it (plain PEFT loop, Unsloth) they stay bf16.
- **LoRA dropout** (`aegis.planning.memory.activations`): a dropout output and a bool mask per wrapped module.
  PEFT's ``lora.ParamWrapper`` (transformers 5 fused experts) refuses ``lora_dropout != 0``: `check_stack` says so.
- **Checkpointing**: ``torch.utils.checkpoint`` keeps each layer's input both ways (reentrant:
  ``ctx.save_for_backward(*tensor_inputs)``; non-reentrant: the inputs held by the recompute closure), and both
  recompute one layer in its backward, so they size alike. Unsloth's offloaded checkpointing
  (``Unsloth_Offloaded_Gradient_Checkpointer``) copies each layer input to the host (``.to("cpu", non_blocking=True)``)
  and back in backward: no layer inputs stay on the device.
- **Fused loss**: Liger's fused linear cross-entropy and Unsloth's chunked loss never hold [tokens, vocab] fp32
  logits (sized as chunked cross-entropy); Liger's RMSNorm/SwiGLU save less (`aegis.planning.memory.activations`).
- **transformers <= 4.48 loss** (``loss/loss_utils.py`` ``ForCausalLMLoss``): after ``logits.float()`` it takes
  ``logits[..., :-1, :].contiguous()``, a second fp32 [tokens, vocab] copy live during cross-entropy; 4.49 pads the
  labels instead. A bare "4" means the newest 4.x (no copy).
- **transformers < 4.54 SDPA**: ``repeat_kv`` before SDPA, so GQA keys/values are saved at the query width.
- **TRL's QLoRA casting** (TRL 0.14 ``SFTTrainer``: with ``bf16=True`` on a 4-bit model it calls
  ``peft_module_casting_to_bf16`` after the k-bit preparation): embeddings and ``lm_head`` back in bf16, norms fp32,
  so the logits are bf16 (`aegis.planning.memory._dtypes.placement`, ``embedding_bytes``). TRL 1.x no longer prepares.
- **Unsloth's LoRA kernels** (``fast_lora.py``: ``LoRA_MLP``/``LoRA_QKV`` compute ``X @ A.t()`` with A cast to X's
  dtype): no fp32 copy of the input per wrapped module.

    from aegis.planning.memory.stack_effects import profile_for_stack, stack_notes
    profile = profile_for_stack(profile, cfg.stack)
"""

from __future__ import annotations

from aegis.errors import InvalidConfigError
from aegis.schema import ModelProfile, StackProfile, TrainConfig, lora_selects, lora_target_names

__all__ = ["profile_for_stack", "check_stack", "stack_setting", "transformers_minor", "backward_width", "fused_loss", "checkpoint_keeps_inputs", "stack_notes"]

_V4: dict[tuple[str, str, int], ModelProfile] = {}


def profile_for_stack(profile: ModelProfile, stack: StackProfile) -> ModelProfile:
    """``profile`` with the module layout ``stack``'s transformers major builds (same object when it already has it)."""
    major = 4 if stack.transformers_major < 5 else 5
    if profile.layout_major == major or (not profile.is_moe and major == 5):
        return profile
    if not profile.is_moe:  # dense decoders: the same modules in 4.x and 5.x
        return profile.model_copy(update={"layout_major": major})
    key = (profile.model_id, profile.source, major)
    cached = _V4.get(key)
    if cached is None or cached.config != profile.config:
        from aegis.models.profiles import profile_from_config

        cached = profile_from_config(profile.config, model_id=profile.model_id, source=profile.source, transformers_major=major)
        _V4[key] = cached
    return cached


def check_stack(profile: ModelProfile, cfg: TrainConfig) -> None:
    """InvalidConfigError for a profile + configuration the stack itself refuses."""
    if cfg.method == "qlora" and cfg.stack.transformers_major >= 5:
        from aegis.models.architectures import registry

        entry = registry.find(profile.config.get("model_type"))
        if entry is not None and entry.linear_class:
            raise InvalidConfigError(
                f"QLoRA on {profile.model_id} with transformers {cfg.stack.transformers_version} quantises nothing: "
                f"its layers are {entry.linear_class}, which transformers 5's bitsandbytes integration does not replace "
                "(it takes exact nn.Linear modules only), and k-bit preparation then upcasts the weights to fp32 "
                "(traced: Falcon-40B holds 154 GiB); plan LoRA, or plan for transformers 4 (--transformers 4.48)"
            )
    if cfg.method == "full" or cfg.lora_config.dropout == 0 or profile.layout_major < 5:
        return
    lora = cfg.lora_config
    targets = lora_target_names(lora.target_modules, profile.linear_modules)
    fused = [m.name for m in profile.linear_modules if m.name.startswith("experts.") and m.count > 1 and lora_selects(m, targets)]
    if fused:
        raise InvalidConfigError(
            f"PEFT's ParamWrapper, which adapts the fused expert tensors of transformers 5 ({', '.join(fused)}), "
            f"refuses lora_dropout != 0 (got {lora.dropout}): set LoRA dropout 0, leave the experts out of "
            "target_modules, or plan for transformers 4 (--transformers 4.48)"
        )


def stack_setting(setting, cfg: TrainConfig):
    """The activation model's `Setting` with what ``cfg.stack`` and the LoRA dropout change."""
    stack = cfg.stack
    update: dict = {}
    if cfg.method != "full" and cfg.lora_config.dropout > 0:
        update["lora_dropout"] = True
    if stack.liger:
        update["liger"] = True
    if stack.transformers_major < 5:
        update["moe_loop"] = True
    if transformers_minor(stack) < (4, 49):
        update["loss_shift_copy"] = True
    if transformers_minor(stack) < (4, 54):
        update["sdpa_repeat_kv"] = True
    if stack.trainer == "unsloth" and cfg.method != "full":
        update["adapter_compute_bytes"] = setting.stream_bytes
    if cfg.method == "qlora":
        from aegis.planning.memory._dtypes import placement

        head = placement(cfg).embedding_bytes
        if head:  # TRL's bf16 lm_head: the logits are bf16 (the loss upcasts them)
            update["lm_head_bytes"] = head
    return setting._replace(**update) if update else setting


def transformers_minor(stack: StackProfile) -> tuple[int, int]:
    """(major, minor) of the profile's transformers; a bare major means its newest minor (99)."""
    parts = stack.transformers_version.split(".")
    minor = parts[1] if len(parts) > 1 else ""
    digits = "".join(ch for ch in minor if ch.isdigit()) if minor[:1].isdigit() else ""
    return int(parts[0]), int(digits) if digits else 99


def backward_width(layers, cfg: TrainConfig) -> int:
    """Widest per-token intermediate whose gradients a layer's backward holds at once: the MLP width, times top-k
    for transformers 5's fused experts (all routed rows in one grouped matmul); the 4.x loop runs one expert at a
    time, about ``top-k / experts`` of the tokens each (balanced routing)."""
    loop = cfg.stack.transformers_major < 5
    widths = []
    for layer in layers:
        k, e = max(1, layer.experts_per_tok), layer.num_experts
        widths.append(-(-layer.mlp_intermediate * k // e) if loop and e else layer.mlp_intermediate * k)
    return max(widths)


def fused_loss(cfg: TrainConfig) -> bool:
    """Whether the loss never materialises [tokens, vocab] logits (chunked CE, Liger FLCE, Unsloth)."""
    return cfg.chunked_cross_entropy or cfg.stack.liger or cfg.stack.trainer == "unsloth"


def checkpoint_keeps_inputs(cfg: TrainConfig) -> bool:
    """Whether checkpointing keeps every layer's input on the device (not with Unsloth's offloading)."""
    return cfg.stack.checkpointing != "offload"


def stack_notes(profile: ModelProfile, cfg: TrainConfig) -> list[str]:
    """One line per thing the stack profile changed in this estimate (for ``--explain``)."""
    stack = cfg.stack
    out: list[str] = []
    if stack.transformers_major < 5 and profile.is_moe:
        quant = " and quantised to NF4 by bitsandbytes" if cfg.method == "qlora" else ""
        out.append(f"transformers {stack.transformers_version}: experts are separate nn.Linear modules{quant}; "
                   "LoRA targets them by their 4.x names at rank r each; the forward loops over experts")
    if transformers_minor(stack) < (4, 49) and not fused_loss(cfg):
        out.append(f"transformers {stack.transformers_version} loss: a shifted fp32 copy of the logits lives while "
                   "cross-entropy runs (4.49+ pads the labels instead)")
    if cfg.method == "qlora":
        from aegis.planning.memory._dtypes import placement

        if placement(cfg).embedding_bytes == 2:
            out.append("TRL with bf16=True: after prepare_model_for_kbit_training, peft_module_casting_to_bf16 puts "
                       "embeddings and lm_head back in bf16 (norms stay fp32): bf16 logits")
        elif stack.kbit_prep_effective:
            out.append("prepare_model_for_kbit_training: unquantised weights (embeddings, head, norms) upcast to fp32, "
                       "so the residual stream and logits are fp32")
        else:
            out.append("no prepare_model_for_kbit_training: unquantised weights stay bf16 (stream and logits bf16)")
    if cfg.method != "full" and cfg.lora_config.dropout > 0:
        out.append(f"LoRA dropout {cfg.lora_config.dropout}: each wrapped module saves its dropout output and a 1-byte "
                   "mask per input element" + (" (only in the recomputed layer with checkpointing)"
                                               if cfg.gradient_checkpointing else ""))
    if cfg.gradient_checkpointing and stack.checkpointing == "offload":
        from aegis.planning.memory._dtypes import placement

        host = profile.num_layers * cfg.micro_batch_size * cfg.seq_len * profile.hidden_size * placement(cfg).stream_bytes
        out.append(f"offloaded checkpointing: layer inputs ({host / 2**30:.2f} GiB) are kept in host memory, not on "
                   "the GPU")
    elif cfg.gradient_checkpointing and stack.checkpointing == "reentrant":
        out.append("reentrant checkpointing: keeps each layer input and recomputes one layer, sized as non-reentrant")
    if stack.liger:
        out.append("Liger kernels: fused linear cross-entropy (no full logits), RMSNorm saves its input dtype, "
                   "SwiGLU saves gate and up only")
    if stack.trainer == "unsloth":
        out.append("Unsloth: chunked cross-entropy, LoRA kernels without fp32 input copies")
    return out
