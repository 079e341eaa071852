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
- The loss upcasts logits to fp32: at the start of backward the log-softmax output, the NLL gradient
  and the log-softmax gradient ([tokens, vocab] fp32 each) are live at once.

    from aegis.memory.activations import layer_activation_terms
    terms = layer_activation_terms(family, config, layer_shape, setting)   # {label: bytes per token}
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from aegis.families import Family, LayerShape

__all__ = ["Setting", "layer_activation_terms", "loss_bytes_per_token", "head_saved_bytes_per_token"]


@dataclass(frozen=True)
class Setting:
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


class _Acc:
    """Accumulates saved bytes per token under labels."""

    def __init__(self) -> None:
        self.terms: dict[str, float] = defaultdict(float)

    def add(self, label: str, nbytes: float) -> None:
        if nbytes:
            self.terms[label] += nbytes


def _norm(acc: _Acc, s: Setting, x_bytes: int, width: int, *, gemma: bool, label: str) -> int:
    """An RMSNorm on a tensor of `x_bytes` elements; returns the output element size."""
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
            acc.add(label, 2 * in_w * len(modules))  # each autocast cast is a new bf16 copy
        else:
            acc.add(label, own)
    wrapped = [out for names, out in modules if set(names) & s.lora_targets]
    if wrapped:
        a = s.adapter_compute_bytes
        if x_bytes == a and a == s.adapter_bytes:
            if not s.base_trainable:
                acc.add(label + " (LoRA)", own)
        else:
            acc.add(label + " (LoRA)", a * in_w * len(wrapped))
        acc.add(label + " (LoRA)", a * s.lora_rank * len(wrapped))
    return 2 if s.autocast else x_bytes


def _mlp(acc: _Acc, s: Setting, fam: Family, x_bytes: int, hidden: int, width: int, label: str, lin_names) -> int:
    gate_up = [(lin_names("gate_proj"), width), (lin_names("up_proj"), width)]
    d = _linears(acc, s, x_bytes, hidden, gate_up, label)
    acc.add(label, 3 * d * width)  # act input (gate), act output and up, saved by act / mul
    return _linears(acc, s, d, width, [(lin_names("down_proj"), hidden)], label)


def layer_activation_terms(fam: Family, c: dict, layer: LayerShape, s: Setting) -> dict[str, float]:
    """Bytes per token saved for backward by one decoder layer (no checkpointing)."""
    acc = _Acc()
    h, hd = fam.hidden(c), fam.head_dim(c)
    heads, kv = fam.heads(c), fam.kv_heads(c)
    q_w, kv_w = heads * hd, kv * hd
    gemma = fam.gemma_norm
    names = {lin.name: lin.matched_by or (lin.name,) for lin in layer.linears}

    def lin_names(name: str) -> tuple[str, ...]:
        return names.get(name, (name,))

    # attention block
    x = s.stream_bytes
    y = _norm(acc, s, x, h, gemma=gemma, label="norms") if fam.pre_norms else x
    d = _linears(acc, s, y, h, [(lin_names("q_proj"), q_w), (lin_names("k_proj"), kv_w), (lin_names("v_proj"), kv_w)],
                 "attention projections")
    if fam.qk_norm:
        d_q = _norm(acc, s, d, q_w, gemma=gemma, label="q/k norms")
        _norm(acc, s, d, kv_w, gemma=gemma, label="q/k norms")
        d = d_q
    if s.sdpa_autocast and not s.eager:
        d = 2
    masked = bool(layer.sliding_window and layer.sliding_window < s.seq_len and not s.flash) or s.eager
    k_w = q_w if masked else kv_w  # repeat_kv materialises GQA keys/values when a mask is present
    if s.eager:
        # matmuls keep q and the repeated k, v; softmax keeps its fp32 output, the second matmul its cast
        acc.add("attention (q, k, v, out)", d * 3 * q_w)
        scores = 4 + (0 if d == 4 else d)
        if fam.attention_softcap(c):
            scores += d  # tanh output of the score soft-capping
        acc.add("attention scores (eager)", scores * heads * s.seq_len)
    else:
        acc.add("attention (q, k, v, out)", d * (q_w + 2 * k_w) + d * q_w + 4 * heads)  # + log-sum-exp
    # SDPA kernels write their output in [b, s, heads, d] layout: the transpose + contiguous before o_proj
    # is free, so o_proj's input is the very tensor SDPA saved. Eager attention makes a copy.
    d_o = _linears(acc, s, d, q_w, [(lin_names("o_proj"), h)], "attention projections", input_saved=not s.eager)
    if fam.post_norms:
        _norm(acc, s, d_o, h, gemma=gemma, label="norms")
    # MLP block
    y = _norm(acc, s, x, h, gemma=gemma, label="norms") if fam.pre_norms else x
    if layer.num_experts:
        _moe(acc, s, fam, c, layer, y, h, lin_names)
        d_m = 2 if s.autocast else max(y, s.expert_weight_bytes)
    else:
        d_m = _mlp(acc, s, fam, y, h, layer.mlp_intermediate, "MLP", lin_names)
    if fam.post_norms:
        _norm(acc, s, d_m, h, gemma=gemma, label="norms")
    return dict(acc.terms)


def _moe(acc: _Acc, s: Setting, fam: Family, c: dict, layer: LayerShape, y: int, h: int, lin_names) -> None:
    k, e, w = layer.experts_per_tok, layer.num_experts, layer.mlp_intermediate
    if s.base_trainable:
        acc.add("MoE router", y * h)
    acc.add("MoE router", 4 * e + 16 * k)  # fp32 softmax output, top-k values and indices
    d_e = 2 if s.autocast else max(y, s.expert_weight_bytes)
    per_pair = 2 * w * d_e + w * d_e + h * d_e  # gate_up output (kept by the act's view), act output, down output
    if s.base_trainable:
        per_pair += h * y + w * d_e  # gathered tokens and act*up, for the expert weights' grads
    acc.add("MoE experts (top-k)", k * per_pair)
    lora_experts = [lin for lin in layer.linears if lin.name.startswith("experts.") and lin.lora_targetable
                    and set(lin.matched_by) & s.lora_targets]
    for lin in lora_experts:  # PEFT ParamWrapper: the routed rows cast to the adapter dtype, and lora_A's output
        acc.add("MoE experts (LoRA)", k * s.adapter_bytes * (lin.in_features + s.lora_rank * lin.lora_rank_factor))
    if layer.shared_expert_intermediate:
        shared = lambda n: lin_names(f"shared_expert.{n}")  # noqa: E731
        d_s = _mlp(acc, s, fam, y, h, layer.shared_expert_intermediate, "MoE shared expert", shared)
        acc.add("MoE shared expert", d_s * h + d_s)  # gated output and sigmoid


def head_saved_bytes_per_token(fam: Family, c: dict, s: Setting) -> float:
    """Final norm (+ lm_head input when the head trains), saved for backward."""
    acc = _Acc()
    y = _norm(acc, s, s.stream_bytes, fam.hidden(c), gemma=fam.gemma_norm, label="head")
    if s.base_trainable:
        acc.add("head", (2 if s.autocast and y != 2 else y) * fam.hidden(c))
    return sum(acc.terms.values())


def loss_bytes_per_token(fam: Family, c: dict, s: Setting) -> tuple[float, str]:
    """Peak bytes per token of the logits and cross-entropy buffers, and the formula."""
    v = fam.vocab(c)
    d_l = 2 if s.autocast else s.lm_head_bytes
    cap = fam.logit_softcap(c)
    tanh = d_l if cap else 0
    scaled = d_l if fam.logits_scaling(c) else 0  # Granite: the divided logits are a second tensor
    forward = d_l + scaled + (4 if d_l != 4 else 0) + 4 + tanh
    backward = 12 + tanh
    if backward >= forward:
        formula = "3 x fp32 [tokens, vocab] at the start of backward (log-softmax out, NLL grad, its grad)"
    else:
        formula = f"logits ({d_l} B) + fp32 upcast + log-softmax out, per [token, vocab]"
    if cap:
        formula += " + soft-capping tanh output"
    if scaled and forward > backward:
        formula += " + the logits divided by logits_scaling"
    return max(forward, backward) * v, formula
