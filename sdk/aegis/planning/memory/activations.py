"""Activation memory of one HF/PyTorch training step, derived op by op.

For each decoder layer this walks the ops transformers 5 runs (RMSNorm, q/k/v/o projections with
PEFT LoRA wrappers or bitsandbytes 4-bit bases, RoPE, SDPA or eager attention, gated MLP, MoE routing
and experts) and adds up the tensors autograd *saves for backward*, per token, in the dtype they really
have. Conventions followed (all checked against traced peaks in tests/data/memory_truth.json):

- RMSNorm saves its fp32 upcast input and the rsqrt; the normalised tensor only when its weight trains.
- A frozen linear saves nothing; a trainable one saves its input (shared by q/k/v, by gate/up).
- PEFT casts a LoRA module's input to the adapter dtype (fp32): one saved copy per wrapped module
  (none when the input is already fp32), plus lora_A's output.
- SDPA saves q, k, v, its output and the log-sum-exp; GQA keys are not repeated unless a mask is
  present (sliding-window layers), eager attention also keeps fp32 softmax scores (b*heads*s^2).
- GPT-OSS's eager attention (its sinks refuse SDPA) runs one softmax over ``[scores, sink]`` in the compute dtype,
  and its experts' clamped SwiGLU saves six expert widths per routed token (gate_up, the clamped gate, the sigmoid,
  ``up + 1``, the gated product), as traced for gpt-oss-20b. nn.LayerNorm (Phi-MoE) saves its input and an fp32
  mean and rstd per row (``native_layer_norm``'s saved tensors; no Phi-MoE row is traced yet).
- The loss upcasts logits to fp32: at the start of backward the log-softmax output, the NLL gradient
  and the log-softmax gradient ([tokens, vocab] fp32 each) are live at once.
- SDPA's 16-bit output is laid out like q: free to hand to o_proj after elementwise RoPE, a copy (which a trainable
  o_proj saves) where RoPE concatenates q (`CAT_ROPE_QUERY`: Phi-3, GPT-NeoX, Phi, StableLM).

Stack profiles (`aegis.schema.StackProfile`, knobs set by `aegis.planning.memory.stack_effects.stack_setting`):

- LoRA dropout > 0: PEFT's ``lora.Linear.forward`` runs ``lora_B(lora_A(dropout(x)))`` with ``lora_dropout`` an
  ``nn.Dropout`` (``nn.Identity`` at 0). On CUDA ``F.dropout`` is ``at::native_dropout`` (aten Dropout.cpp,
  ``is_fused_kernel_acceptable``), which saves a bool mask (1 B/element); lora_A then saves the dropout output, a
  new tensor per wrapped module, instead of the shared (or cast) input. Per wrapped module and token:
  ``(adapter compute bytes + 1) x in_features``.
- Liger kernels: ``LigerRMSNorm`` saves its input in its own dtype and one fp32 rstd per row (ops/rms_norm.py) and
  returns the input dtype; ``LigerSiLUMulFunction`` saves the gate and up outputs only (the SiLU is recomputed in
  backward, ops/swiglu.py); Liger RoPE saves cos/sin, which HF's RoPE keeps alive anyway (no change).
- transformers 4.x MoE (``moe_loop``, 4.48 ``MixtralSparseMoeBlock.forward``): per routed pair, besides what the fused
  experts save, the expert output weighted by its routing weight (``index_add_`` saves its source), the gathered
  routing weight (``routing_weights[top_x, idx, None]``) and ``torch.where``'s int64 (slot, token) indices (16 B).
- transformers < 4.54 SDPA (``integrations/sdpa_attention.py``) always runs ``repeat_kv``: GQA keys and values are
  materialised at the query width and saved (``sdpa_repeat_kv``); 4.54+ passes ``enable_gqa`` when there is no mask.

    from aegis.planning.memory.activations import layer_activation_terms
    terms = layer_activation_terms(family, config, layer_shape, setting)   # {label: bytes per token}
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

from aegis.models.architectures import config_keys as arch
from aegis.errors import InvalidConfigError
from aegis.models.families import Family, LayerShape

__all__ = ["Setting", "layer_activation_terms", "layer_activation_parts", "terms_by_layer", "parts_by_layer", "layer_fixed_saved_bytes", "fixed_saved_by_layer",
           "loss_bytes_per_token", "head_saved_bytes_per_token"]

MATH_KERNEL_LABEL = "attention (math kernel: fp32 q, k, v, probabilities)"
"""The math kernel's saved tensors; its last part is the probabilities, made from a float32 score tensor of the same
size that lives only until the softmax has run."""


class Setting(NamedTuple):
    """What the activation model needs to know about one configuration."""

    stream_bytes: int
    base_trainable: bool
    autocast: bool
    norm_weight_bytes: int
    lora_targets: frozenset[str]
    lora_rank: int
    adapter_bytes: int
    adapter_compute_bytes: int
    sdpa_autocast: bool
    """SDPA runs under autocast: it saves bf16 casts of q, k, v and returns bf16."""
    """Element size of a LoRA module's saved input copy and lora_A output: the adapter dtype, or bf16 under autocast."""
    eager: bool
    flash: bool
    seq_len: int
    expert_weight_bytes: int
    lm_head_bytes: int
    lora_dropout: bool = False
    """LoRA dropout > 0: each wrapped module saves its own dropout output and a bool mask."""
    dropout_mask_bytes: int = 1
    """Element size of the mask ``native_dropout`` saves (bool on CUDA)."""
    liger: bool = False
    """Liger's fused RMSNorm and SwiGLU (see the module docstring)."""
    moe_loop: bool = False
    """transformers 4.x loop-over-experts MoE forward (saved int64 routing indices)."""
    sdpa_repeat_kv: bool = False
    """transformers < 4.54: SDPA is given repeated (query-width) keys and values, which it saves."""
    loss_shift_copy: bool = False
    """transformers <= 4.48 ``ForCausalLMLoss``: ``logits[..., :-1, :].contiguous()`` after the fp32 upcast, a second
    fp32 [tokens, vocab] tensor live while cross-entropy runs (4.49 pads the labels instead)."""


class _Acc:
    """Accumulates saved bytes per token under labels, and the tensors they are made of (``parts``: one per
    `add`, or ``tensors`` equal ones), which the device-level stream allocates one by one as PyTorch does."""

    def __init__(self) -> None:
        self.terms: dict[str, float] = defaultdict(float)
        self.parts: dict[str, list[float]] = defaultdict(list)

    def add(self, label: str, nbytes: float, tensors: int = 1) -> None:
        if nbytes:
            self.terms[label] += nbytes
            self.parts[label].extend([nbytes / tensors] * tensors)


def _norm(acc: _Acc, s: Setting, x_bytes: int, width: int, *, gemma: bool, label: str, layer_norm: bool | str = False,
          input_saved: bool = False, rows: int = 1) -> int:
    """An RMSNorm (or, `layer_norm`, an nn.LayerNorm) on a tensor of `x_bytes` elements; returns the output element
    size. ``input_saved``: another LayerNorm already saved this input (GPT-NeoX's two norms of one block input).
    ``layer_norm="manual"``: Cohere's LayerNorm written out in float32 ops over ``rows`` rows per token (its q/k
    norms: one per head)."""
    if layer_norm == "float32":
        # OlmoLayerNorm: native_layer_norm of a float32 copy of x (the copy it saves; x itself when already float32)
        # and float32 mean and rstd per row; no weight; the output is cast back to x's dtype
        acc.add(label, 4 * width + 8 * rows)
        return x_bytes
    if layer_norm == "manual":
        # CohereLayerNorm computes the centred float32 input twice (for the variance's pow and for the product with
        # the rsqrt): both are saved, with the rsqrt per row; the float32 weight product keeps the normalised tensor
        # when the weight trains. Its output has the input's dtype, autocast or not (no op in it is autocast).
        acc.add(label, 8 * width, 2)
        acc.add(label, 4 * rows)
        if s.base_trainable:
            acc.add(label, 4 * width)
        return x_bytes
    if layer_norm:  # native_layer_norm saves its input (an fp32 copy under autocast) and fp32 mean and rstd per row
        x_in = 4 if s.autocast else x_bytes
        shared = input_saved and x_in == x_bytes  # autocast casting a bf16 input gives each norm its own fp32 copy
        acc.add(label, (0 if shared else x_in * width) + 8 * rows)  # per row: per head for Phi's q/k LayerNorms
        return x_in
    if s.liger:  # LigerRMSNorm: X in its dtype + fp32 rstd per row; dW from them in backward; output in X's dtype
        acc.add(label, x_bytes * width + 4)
        return x_bytes
    acc.add(label, 4 * width + 4)  # fp32 input (pow / mul) + rsqrt
    if s.base_trainable:
        acc.add(label, 4 * width if gemma else x_bytes * width)  # normalised tensor, for the weight's grad
    return x_bytes if gemma else max(x_bytes, s.norm_weight_bytes)


def _linears(acc: _Acc, s: Setting, x_bytes: int, in_w: int, modules: list[tuple[tuple[str, ...], int]], label: str,
             *, input_saved: bool = False) -> int:
    """Projections sharing one input; returns the output element size. `input_saved`: the input tensor
    itself is already saved by another op (counted once)."""
    own = 0 if input_saved else x_bytes * in_w
    if s.base_trainable:
        if s.autocast and x_bytes != 2:
            acc.add(label, 2 * in_w * len(modules), len(modules))  # each autocast cast is a new bf16 copy
        else:
            acc.add(label, own)
    wrapped = [out for names, out in modules if set(names) & s.lora_targets]
    if wrapped and s.lora_dropout:
        # each module: dropout output (saved by lora_A, a new tensor) + its bool mask; the cast copy is not saved
        a = s.adapter_compute_bytes
        acc.add(label + " (LoRA dropout)", a * in_w * len(wrapped), len(wrapped))
        acc.add(label + " (LoRA dropout)", s.dropout_mask_bytes * in_w * len(wrapped), len(wrapped))
        acc.add(label + " (LoRA)", a * s.lora_rank * len(wrapped), len(wrapped))
    elif wrapped:
        a = s.adapter_compute_bytes
        if x_bytes == a and a == s.adapter_bytes:
            if not s.base_trainable:
                acc.add(label + " (LoRA)", own)
        else:
            acc.add(label + " (LoRA)", a * in_w * len(wrapped), len(wrapped))
        acc.add(label + " (LoRA)", a * s.lora_rank * len(wrapped), len(wrapped))
    return 2 if s.autocast else x_bytes


def _mlp(acc: _Acc, s: Setting, fam: Family, x_bytes: int, hidden: int, width: int, label: str, lin_names,
         fused: bool = False, input_saved: bool = False) -> int:
    """``fused``: one ``gate_up_proj`` (Phi-3), one LoRA-wrapped module whose output ``chunk`` splits into views:
    the same saved bytes as separate gate and up outputs, one LoRA input cast instead of two. ``input_saved``: a
    parallel block's MLP reads the normed input attention saved (StableLM ``use_parallel_residual``)."""
    gate_up = ([(lin_names("gate_up_proj"), 2 * width)] if fused
               else [(lin_names("gate_proj"), width), (lin_names("up_proj"), width)])
    d = _linears(acc, s, x_bytes, hidden, gate_up, label, input_saved=input_saved)
    # act input (gate), act output and up, saved by act / mul; Liger's SiLUMul saves gate and up only
    acc.add(label, (2 if s.liger else 3) * d * width, 2 if s.liger else 3)
    return _linears(acc, s, d, width, [(lin_names("down_proj"), hidden)], label)


CAT_ROPE_QUERY = frozenset({"phi3", "gpt_neox", "phi", "stablelm"})
"""Model types whose attention (transformers 5) builds the rotated query with ``torch.cat`` of its rotated and
passed-through head dims, in [b, heads, s, d] order: Phi-3's and GPT-NeoX's ``apply_rotary_pos_emb``
(``torch.cat([q_rot * cos + rotate_half(q_rot) * sin, q_pass], dim=-1)``, also at a rotary factor of 1 with an empty
``q_pass``), Phi's and StableLM's attention forward (``torch.cat((query_rot, query_pass), dim=-1)``). The result is
contiguous in that order, unlike the strided projection view other families' elementwise RoPE follows (GPT-J
concatenates before its permute: not here). See the SDPA output note in `_layer_acc`; traced on the tiny Phi-3 and
GPT-NeoX of tests/data/sharded_configs.json (a ``clone`` of [b, s, heads, d] per layer, fake and real CPU alike)."""


ACT_SAVED_WIDTHS: dict[str, int] = {
    "gelu": 1, "gelu_pytorch_tanh": 1, "relu": 1, "silu": 1, "swish": 1, "gelu_new": 4, "gelu_fast": 7,
}
"""Tensors of the MLP's width that ``ACT2FN[name]`` saves for backward, its input included. One aten op (GELU,
ReLU, SiLU) saves its input (ReLU its output); ``NewGELUActivation`` is
``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`` in eager ops: ``pow`` saves x, ``tanh`` its output,
the last ``mul`` both of its operands (``0.5 * x`` and ``1 + tanh``); ``FastGELUActivation``
(``0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x))))``) saves x, ``0.044715 * x``, the tanh argument's
two factors, the tanh output and the final mul's two operands: seven (traced on GPT-NeoX-20B: three mul, two add and
one tanh output of the MLP's width per layer, beside the input)."""


ACT_SAVES_OUTPUT = frozenset({"relu"})
"""Activations whose backward reads their output (``threshold_backward``), not their input."""


def _plain_mlp(acc: _Acc, s: Setting, fam: Family, c: dict, x_bytes: int, hidden: int, width: int, lin_names, *,
               input_saved: bool) -> int:
    """The two-matrix MLP ``out(act(in(x)))`` (Phi's fc1/fc2, StarCoder2's c_fc/c_proj): the input projection shares
    the block's input with attention in a parallel block (``input_saved``); the activation saves `ACT_SAVED_WIDTHS`
    tensors of its width."""
    fc_in, fc_out = fam.entry.plain_mlp_names
    act = fam.hidden_act(c)
    if act not in ACT_SAVED_WIDTHS:
        raise InvalidConfigError(f"hidden_act {act!r}: the activation model knows {', '.join(sorted(ACT_SAVED_WIDTHS))}")
    d = _linears(acc, s, x_bytes, hidden, [(lin_names(fc_in), width)], "MLP", input_saved=input_saved)
    acc.add("MLP", ACT_SAVED_WIDTHS[act] * d * width, ACT_SAVED_WIDTHS[act])
    # ReLU saves its output, the very tensor the output projection saves as its input (OPT's fc1 -> relu -> fc2)
    return _linears(acc, s, d, width, [(lin_names(fc_out), hidden)], "MLP", input_saved=act in ACT_SAVES_OUTPUT)


def layer_activation_terms(fam: Family, c: dict, layer: LayerShape, s: Setting) -> dict[str, float]:
    """Bytes per token saved for backward by one decoder layer (no checkpointing)."""
    return dict(_layer_acc(fam, c, layer, s).terms)


def layer_activation_parts(fam: Family, c: dict, layer: LayerShape, s: Setting) -> dict[str, list[float]]:
    """`layer_activation_terms` as the tensors (bytes per token each) each label is made of."""
    return {label: list(parts) for label, parts in _layer_acc(fam, c, layer, s).parts.items()}


def _layer_acc(fam: Family, c: dict, layer: LayerShape, s: Setting) -> _Acc:
    acc = _Acc()
    h, hd = fam.hidden(c), fam.head_dim(c)
    heads, kv = fam.heads(c), fam.kv_heads(c)
    q_w, kv_w = heads * hd, kv * hd
    gemma = fam.norm_product_float32
    names = {lin.name: lin.matched_by or (lin.name,) for lin in layer.linears}

    def lin_names(name: str) -> tuple[str, ...]:
        return names.get(name, (name,))

    # attention block
    x = s.stream_bytes
    y = _norm(acc, s, x, h, gemma=gemma, label="norms", layer_norm=fam.layer_norm) if fam.pre_norms else x
    if "mla" in layer.extra:
        _mla_attention(acc, s, c, layer.extra["mla"], y, h, heads, lin_names)
        y = _norm(acc, s, x, h, gemma=gemma, label="norms")
        if layer.num_experts:
            _moe(acc, s, fam, c, layer, y, h, lin_names)
        else:
            _mlp(acc, s, fam, y, h, layer.mlp_intermediate, "MLP", lin_names)
        return acc
    fused_qkv = fam.entry.fused_qkv  # Phi-3, GPT-NeoX: q, k and v are slices (views) of one projection's output
    projections = ([(lin_names(fused_qkv), q_w + 2 * kv_w)] if fused_qkv else
                   [(lin_names("q_proj"), q_w), (lin_names("k_proj"), kv_w), (lin_names("v_proj"), kv_w)])
    d = _linears(acc, s, y, h, projections, "attention projections")
    if fam.clip_qkv(c) is not None:  # OLMo's in-place clamp_ of q, k and v saves a copy of each input (traced)
        acc.add("attention (clip_qkv)", d * (q_w + 2 * kv_w), 3)
    if fam.qk_norm(c):
        d_q = _norm(acc, s, d, q_w, gemma=gemma, label="q/k norms", layer_norm=fam.layer_norm, rows=heads)
        _norm(acc, s, d, kv_w, gemma=gemma, label="q/k norms", layer_norm=fam.layer_norm, rows=kv)
        d = d_q
    # autocast gives SDPA bf16 copies of q, k and v; flash-attention 2 takes fp16/bf16 only, so transformers casts
    # float32 q, k and v (a k-bit-prepared float32 stream without autocast) to the target dtype before it
    # (``_flash_attention_forward``'s callers: "the input hidden states get silently casted in float32")
    half = (s.sdpa_autocast or s.flash) and not s.eager
    cast = half and d != 2
    if half:
        d = 2
    masked = bool(layer.sliding_window and layer.sliding_window < s.seq_len and not s.flash) or s.eager
    # repeat_kv materialises GQA keys/values (mask or 4.x SDPA); flash_attn_func / flash_attn_varlen_func take fewer
    # key/value heads than query heads (multi-query, grouped) as they are, in every transformers version
    repeated = (masked or s.sdpa_repeat_kv) and not s.flash
    k_w = q_w if repeated else kv_w
    # the values attention saves: a new tensor when repeat_kv copies them (GQA) or autocast casts them; else the v
    # projection's output, which for a fused qkv_proj is a view that keeps the whole q/k/v output alive
    copied = kv_w != q_w and (repeated or s.eager)
    v_w = q_w if copied else (q_w + 2 * kv_w if fused_qkv and not cast else kv_w)
    # SDPA on CUDA runs its math kernel where no fused kernel takes the call: Falcon-7B gives it one key/value head
    # broadcast to every query head, and float32 grouped-query attention (enable_gqa; a k-bit-prepared model without
    # autocast, or full fp32) fits neither flash/cuDNN (bf16/fp16 only) nor the memory-efficient kernel (no grouped
    # heads). Measured on an H100: Llama-3.2-1B QLoRA b2 s1024 allocates 4.4 GiB more than the flash-style layout.
    # Flash-attention 2 is no SDPA backend: it never falls back to the math kernel.
    fp32_gqa = d == 4 and kv_w != q_w and not repeated
    math_kernel = not s.eager and not s.flash and (fam.entry.runs_sdpa_math(c) or fp32_gqa)
    if math_kernel:
        # float32 q, expanded k and v (upcast where they were not), and the float32 probabilities
        acc.add(MATH_KERNEL_LABEL, 4 * 3 * q_w, 3)
        acc.add(MATH_KERNEL_LABEL, 4 * heads * s.seq_len)  # last: `aegis.planning.memory.device` frees the scores
    elif s.eager:
        # matmuls keep q and the repeated k, v; softmax keeps its fp32 output, the second matmul its cast
        acc.add("attention (q, k, v, out)", d * 2 * q_w, 2)
        acc.add("attention (q, k, v, out)", d * v_w)
        if fam.attention_sinks:
            # GPT-OSS: one softmax over [scores, sink] in the compute dtype (s + 1 columns, kept by the value
            # matmul through a view), and the int64 index of the row max it subtracts first
            acc.add("attention scores (eager)", d * heads * (s.seq_len + 1) + 8 * heads)
        else:
            # float32 softmax output and its cast; Falcon takes the softmax in the compute dtype
            scores = d if fam.entry.eager_softmax_in_compute_dtype else 4 + (0 if d == 4 else d)
            if fam.attention_softcap(c):
                scores += d  # tanh output of the score soft-capping
            if fam.attention_dropout(c) > 0:  # eager_attention_forward's dropout keeps a bool mask; its output
                scores += s.dropout_mask_bytes  # replaces the cast as the tensor the value matmul saves
            acc.add("attention scores (eager)", scores * heads * s.seq_len)
    else:
        # q, k, v and the output; without RoPE (GPT-2's learned positions) a fused projection's q and k stay views of
        # its output, which the values (v_w) already keep alive. Flash-attention 2 (flash_attn's FlashAttnFunc) saves
        # the same: q, k, v as given ([b, s, heads, d], views where they are views), out, softmax_lse (float32
        # [b, heads, s]) and its rng state (two int64); attention dropout runs in the kernel (no mask is kept)
        views = fused_qkv and not cast and not copied and fam.entry.position_embedding is not None
        for width_ in (v_w, q_w) if views else (q_w, k_w, v_w, q_w):
            acc.add("attention (q, k, v, out)", d * width_)
        acc.add("attention (q, k, v, out)", 4 * heads)  # log-sum-exp
    # SDPA's 16-bit kernels allocate their output like q (CUDA flash ``mha_fwd``: ``out = at::empty_like(q)`` of q
    # transposed to [b, s, heads, d]; the CPU flash kernel and its fake-tensor meta alike; flash-attention 2 the
    # same). A q made of the projection's view by elementwise RoPE keeps the projection's [b, s, heads, d] memory
    # order, so the ``transpose(1, 2).contiguous()`` before o_proj is free and o_proj's input is the very tensor SDPA
    # saved. Where RoPE builds q with ``torch.cat`` (`CAT_ROPE_QUERY`) q is a new [b, heads, s, d]-contiguous tensor,
    # the output has that order and the contiguous() copies it: a trainable o_proj saves the copy beside SDPA's output.
    # Eager attention (and the math kernel) always makes a copy.
    out_copy = d == 2 and not (s.eager or math_kernel) and fam.entry.model_type in CAT_ROPE_QUERY
    o_proj = lin_names(fam.entry.output_projection)
    d_o = _linears(acc, s, d, q_w, [(o_proj, h)], "attention projections",
                   input_saved=not (s.eager or math_kernel or out_copy))
    if fam.post_norms:
        _norm(acc, s, d_o, h, gemma=gemma, label="norms")
    if fam.residual_dropout(c) > 0:  # Seed-OSS: dropout on the attention and MLP outputs, a bool mask each
        acc.add("residual dropout", len(fam.entry.residual_dropout_on) * s.dropout_mask_bytes * h)
    # MLP block (a parallel block's MLP reads the attention's normed input, saved once for both; GPT-NeoX's reads a
    # second LayerNorm of the block's input)
    parallel = fam.entry.is_parallel(c)
    shared_input = parallel and not fam.entry.has_parallel_mlp_norm(c)
    if not shared_input:
        y = _norm(acc, s, x, h, gemma=gemma, label="norms", layer_norm=fam.layer_norm,
                  input_saved=parallel) if fam.pre_norms else x
    if layer.num_experts:
        _moe(acc, s, fam, c, layer, y, h, lin_names)
        d_m = 2 if s.autocast else max(y, s.expert_weight_bytes)
    elif fam.plain_mlp:
        d_m = _plain_mlp(acc, s, fam, c, y, h, layer.mlp_intermediate, lin_names, input_saved=shared_input)
    else:
        d_m = _mlp(acc, s, fam, y, h, layer.mlp_intermediate, "MLP", lin_names, fused="gate_up_proj" in names,
                   input_saved=shared_input)
    if fam.post_norms:
        _norm(acc, s, d_m, h, gemma=gemma, label="norms")
    return acc


def _moe(acc: _Acc, s: Setting, fam: Family, c: dict, layer: LayerShape, y: int, h: int, lin_names) -> None:
    k, e, w = layer.experts_per_tok, layer.num_experts, layer.mlp_intermediate
    if s.base_trainable:
        acc.add("MoE router", y * h)
    acc.add("MoE router", 4 * e + 16 * k)  # fp32 softmax output, top-k values and indices
    d_e = 2 if s.autocast else max(y, s.expert_weight_bytes)
    # gate_up output (kept by the act's view) and what the activation saves (`Family.expert_act_saved_widths`
    # widths in all: 3 for SwiGLU, 6 for GPT-OSS's clamped SwiGLU), and the down output
    per_pair = fam.expert_act_saved_widths * w * d_e + h * d_e
    if s.base_trainable:
        per_pair += h * y + w * d_e  # gathered tokens and act*up, for the expert weights' grads
    acc.add("MoE experts (top-k)", k * per_pair)
    lora_experts = [lin for lin in layer.linears if lin.name.startswith("experts.") and lin.lora_targetable
                    and set(lin.matched_by) & s.lora_targets]
    # 4.x expert nn.Linear are lora.Linear: under autocast lora_A saves a bf16 cast of its input, as in `_linears`
    a_e = s.adapter_compute_bytes if s.moe_loop else s.adapter_bytes
    for lin in lora_experts:  # PEFT ParamWrapper: the routed rows cast to the adapter dtype, and lora_A's output
        acc.add("MoE experts (LoRA)", k * a_e * (lin.in_features + s.lora_rank * lin.lora_rank_factor))
        if s.lora_dropout:  # 4.x expert nn.Linear: lora.Linear's dropout mask (ParamWrapper refuses dropout)
            acc.add("MoE experts (LoRA dropout)", k * s.dropout_mask_bytes * lin.in_features)
    if s.moe_loop:
        # per routed pair: index_add_'s source (its backward saves it), the gathered routing weight, and the
        # int64 (slot, token) pair torch.where returns (one [n, 2] storage)
        acc.add("MoE experts (4.x loop)", k * (h * d_e + d_e + 16))
    if layer.shared_expert_intermediate:
        shared = lambda n: lin_names(f"shared_expert.{n}")  # noqa: E731
        d_s = _mlp(acc, s, fam, y, h, layer.shared_expert_intermediate, "MoE shared expert", shared)
        if fam.shared_expert_gate:
            acc.add("MoE shared expert", d_s * h + d_s)  # gated output and sigmoid


def _mla_attention(acc: _Acc, s: Setting, c: dict, m: dict, y: int, h: int, heads: int, lin_names) -> None:
    """DeepSeek's multi-head latent attention (``modeling_deepseek_v2.py`` / ``_v3.py``), saved for backward:
    the down-projections (q_a or q, and kv_a) share the normed input; q_a_layernorm and kv_a_layernorm are
    RMSNorms on the latents; the up-projections' inputs are those norms' outputs. Rope: V2 rotates fp32
    complex copies of the rotated parts; V3 multiplies strided views, which keeps the q and compressed-kv
    projection outputs alive. ``query_states`` (cat) and ``key_states`` (new_empty + copy_) are new tensors
    that SDPA saves; the values are a view of kv_b_proj's output, which SDPA keeps whole."""
    qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
    rope, kvr, qr, v = m["qk_rope_head_dim"], m["kv_lora_rank"], m["q_lora_rank"], m["v_head_dim"]
    kv_a = (lin_names("kv_a_proj_with_mqa"), kvr + rope)
    label = "attention projections"
    if qr is None:
        d = _linears(acc, s, y, h, [(lin_names("q_proj"), heads * qk), kv_a], label)
    else:
        d_a = _linears(acc, s, y, h, [(lin_names("q_a_proj"), qr), kv_a], label)
        y_q = _norm(acc, s, d_a, qr, gemma=False, label="norms")
        d = _linears(acc, s, y_q, qr, [(lin_names("q_b_proj"), heads * qk)], label)
    y_kv = _norm(acc, s, d, kvr, gemma=False, label="norms")
    d_kv = _linears(acc, s, y_kv, kvr, [(lin_names("kv_b_proj"), heads * (m["qk_nope_head_dim"] + v))], label)
    if c.get("model_type") == "deepseek_v2":
        acc.add("rope", 4 * rope * (heads + 1))  # fp32 complex copies of q_pe and k_pe
    else:
        acc.add("rope", d * (heads * qk + kvr + rope))  # q and compressed kv, kept by the strided views
        if not arch.value(c, "rope_interleave"):
            acc.add("rope", d * rope * (heads + 1))  # rotate_half outputs
    if s.sdpa_autocast and not s.eager:
        d = d_kv = 2
    if s.eager:
        scores = 4 + (0 if d == 4 else d)
        acc.add("attention (q, k, v, out)", d * 2 * heads * qk + d_kv * heads * (m["qk_nope_head_dim"] + v))
        acc.add("attention scores (eager)", scores * heads * s.seq_len)
    else:  # q, k, the kv_b output (values are its view), the output and the log-sum-exp
        acc.add("attention (q, k, v, out)", d * 2 * heads * qk + d_kv * heads * (m["qk_nope_head_dim"] + v)
                + d * heads * v + 4 * heads)
    _linears(acc, s, d, heads * v, [(lin_names("o_proj"), h)], label, input_saved=not s.eager)


def layer_fixed_saved_bytes(layer: LayerShape, s: Setting) -> int:
    """Bytes one layer saves for backward whatever the token count: PEFT's ParamWrapper on a fused expert tensor
    merges ``W + B @ A`` for all experts (one baddbmm, in the weight's dtype) and the grouped matmul keeps that
    merged tensor, beside the casts of lora_A / lora_B to the weight dtype (none when they already match)."""
    total = 0
    for lin in layer.linears:
        if not (lin.name.startswith("experts.") and lin.lora_targetable and set(lin.matched_by) & s.lora_targets):
            continue
        w = s.expert_weight_bytes
        total += lin.count * lin.out_features * lin.in_features * w
        if w != s.adapter_bytes:
            total += lin.count * s.lora_rank * lin.lora_rank_factor * (lin.in_features + lin.out_features) * w
    return total


def fixed_saved_by_layer(layers, s: Setting) -> list[int]:
    """`layer_fixed_saved_bytes` for each layer, computed once per distinct layer object (as `terms_by_layer`)."""
    seen: dict[int, int] = {}
    out = []
    for layer in layers:
        fixed = seen.get(id(layer))
        if fixed is None:
            fixed = seen[id(layer)] = layer_fixed_saved_bytes(layer, s)
        out.append(fixed)
    return out


def head_saved_bytes_per_token(fam: Family, c: dict, s: Setting) -> float:
    """Final norm (+ lm_head input when the head trains), saved for backward."""
    acc = _Acc()
    y = _norm(acc, s, s.stream_bytes, fam.hidden(c), gemma=fam.norm_product_float32, label="head", layer_norm=fam.layer_norm)
    if s.base_trainable:
        acc.add("head", (2 if s.autocast and y != 2 else y) * fam.hidden(c))
    if fam.embedding_dropout(c) > 0:  # Phi's embd_pdrop: the bool mask of the embeddings' dropout
        acc.add("head", s.dropout_mask_bytes * fam.hidden(c))
    return sum(acc.terms.values())


def loss_bytes_per_token(fam: Family, c: dict, s: Setting) -> tuple[float, str]:
    """Peak bytes per token of the logits and cross-entropy buffers, and the formula."""
    v = fam.vocab(c)
    d_l = 2 if s.autocast else s.lm_head_bytes
    cap = fam.logit_softcap(c)
    tanh = d_l if cap else 0
    scaled = d_l if fam.logits_scaling(c) else 0  # Granite, Cohere: the scaled logits are a second tensor
    shift = 4 if s.loss_shift_copy else 0
    forward = d_l + scaled + (4 if d_l != 4 else 0) + shift + 4 + tanh
    backward = 12 + tanh
    if backward >= forward:
        formula = "3 x fp32 [tokens, vocab] at the start of backward (log-softmax out, NLL grad, its grad)"
    else:
        formula = (f"logits ({d_l} B) + fp32 upcast" + (" + its shifted fp32 copy (transformers <= 4.48)" if shift else "")
                   + " + log-softmax out, per [token, vocab]")
    if cap:
        formula += " + soft-capping tanh output"
    if scaled and forward > backward:
        formula += " + the scaled logits (logits_scaling / logit_scale)"
    return max(forward, backward) * v, formula


def terms_by_layer(fam: Family, c: dict, layers, s: Setting) -> list[dict[str, float]]:
    """`layer_activation_terms` for each layer, computed once per distinct layer object
    (`aegis.models.families.layer_shapes` makes equal layers the same object)."""
    return _per_layer(layer_activation_terms, fam, c, layers, s)


def parts_by_layer(fam: Family, c: dict, layers, s: Setting) -> list[dict[str, list[float]]]:
    """`layer_activation_parts` for each layer (computed once per distinct layer object)."""
    return _per_layer(layer_activation_parts, fam, c, layers, s)


def _per_layer(fn, fam: Family, c: dict, layers, s: Setting) -> list:
    seen: dict[int, Any] = {}
    out = []
    for layer in layers:
        value = seen.get(id(layer))
        if value is None:
            value = seen[id(layer)] = fn(fam, c, layer, s)
        out.append(value)
    return out
