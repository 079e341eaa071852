"""Make transformers treat fake inputs the way it treats the real, unpadded batch.

With real tensors and an all-ones `attention_mask`, transformers' SDPA path skips the
(b, 1, s, s) causal mask and relies on `is_causal=True`. With `FakeTensor` inputs its
`is_tracing()` guard answers True (values are unknown), so it would build the mask, which
a real run never allocates. The harness only feeds unpadded, unpacked batches, so inside
`unpadded_inputs()` the two checks are answered as for such a batch:

- `_ignore_causal_mask_sdpa` is evaluated with `padding_mask=None` (no padding), which
  keeps every other rule (sliding windows longer than the sequence, q/kv lengths);
- `find_packed_sequence_indices` returns None (one sequence per row).

transformers 4.x has neither helper: `AttentionMaskConverter._ignore_causal_mask_sdpa` is
answered with `attention_mask=None` instead. `balanced_routing` answers the data-dependent
expert selection of transformers 4 MoE blocks, and `static_rope_length` the RoPE table length
transformers 4's Phi-MoE reads from `cache_position`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def unpadded_inputs() -> Iterator[None]:
    """Patch transformers' mask helpers to treat every input as unpadded and unpacked."""
    try:
        from transformers import masking_utils
    except ImportError:  # transformers 4.x before masking_utils
        with _unpadded_inputs_v4():
            yield
        return

    original_ignore = masking_utils._ignore_causal_mask_sdpa
    original_packed = masking_utils.find_packed_sequence_indices

    def ignore_causal_mask_sdpa(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
        return original_ignore(None, q_length, kv_length, q_offset, kv_offset, local_attention_size)

    def find_packed_sequence_indices(position_ids):
        return None

    masking_utils._ignore_causal_mask_sdpa = ignore_causal_mask_sdpa
    masking_utils.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield
    finally:
        masking_utils._ignore_causal_mask_sdpa = original_ignore
        masking_utils.find_packed_sequence_indices = original_packed


@contextlib.contextmanager
def _unpadded_inputs_v4() -> Iterator[None]:
    """transformers 4.x: `AttentionMaskConverter._ignore_causal_mask_sdpa` asks `torch.all(mask == 1)`,
    which a fake mask cannot answer; answer it with ``attention_mask=None`` (an unpadded batch), which
    keeps its other rules (sliding window, query/key lengths, training)."""
    from transformers.modeling_attn_mask_utils import AttentionMaskConverter

    original = AttentionMaskConverter.__dict__["_ignore_causal_mask_sdpa"]
    fn = original.__func__

    def ignore_causal_mask_sdpa(attention_mask, inputs_embeds, past_key_values_length, sliding_window=None,
                                is_training=False):
        return fn(None, inputs_embeds, past_key_values_length, sliding_window, is_training)

    AttentionMaskConverter._ignore_causal_mask_sdpa = staticmethod(ignore_causal_mask_sdpa)
    try:
        yield
    finally:
        AttentionMaskConverter._ignore_causal_mask_sdpa = original


class _BalancedTorch:
    """Stands in for `torch` inside one modeling module: `torch.where(mask)` (the one-argument form the
    transformers 4 MoE blocks use to pick each expert's tokens) returns index tensors of a balanced
    routing; everything else is torch's."""

    def __init__(self, num_experts: int) -> None:
        import torch

        self._torch = torch
        self._num_experts = num_experts
        self._calls = 0

    def __getattr__(self, name: str):
        return getattr(self._torch, name)

    def where(self, *args, **kwargs):
        torch = self._torch
        if len(args) != 1 or kwargs or args[0].dim() != 2:
            return torch.where(*args, **kwargs)
        mask = args[0]  # (top_k, tokens) one-hot slice for one expert
        e, n = self._calls % self._num_experts, mask.numel()
        self._calls += 1
        count = n * (e + 1) // self._num_experts - n * e // self._num_experts
        idx = torch.zeros(count, dtype=torch.long, device=mask.device)
        return idx, idx.clone()


@contextlib.contextmanager
def balanced_routing(model_module: str, num_experts: int | None) -> Iterator[None]:
    """Route tokens evenly over the experts of a transformers 4 MoE block.

    transformers 4 loops over experts and gathers each one's tokens with `torch.where(expert_mask[e])`:
    an output whose size depends on values, which a fake tensor does not have. Inside this context
    that call in ``model_module`` returns, for expert e of E, the e-th share of top_k x tokens
    (shares differ by at most one and sum to top_k x tokens, so every routed token is computed once).
    The bytes the block allocates depend on these counts only through their sum, apart from the one
    expert's temporaries live at a time; a balanced router is the typical case the bar is about.
    """
    import sys

    module = sys.modules.get(model_module)
    if not num_experts or module is None or not hasattr(module, "torch"):
        yield
        return
    original = module.torch
    module.torch = _BalancedTorch(num_experts)
    try:
        yield
    finally:
        module.torch = original


@contextlib.contextmanager
def static_rope_length(model_module: str) -> Iterator[None]:
    """Give a transformers 4 rotary embedding that sizes its table from a tensor its length as an int.

    transformers 4's Phi-MoE calls ``rotary_emb(hidden_states, seq_len=cache_position[-1] + 1)`` and builds
    ``torch.arange(seq_len)``: a size read from a value, which a fake tensor does not have. In an unpadded
    training forward without a cache ``cache_position`` is ``arange(s)``, so that value is the sequence length
    ``hidden_states.shape[1]``: inside this context a tensor ``seq_len`` is replaced by it (same table, same
    mscale choice)."""
    import inspect
    import sys

    import torch

    module = sys.modules.get(model_module)
    classes = [c for c in vars(module).values() if module and isinstance(c, type) and c.__module__ == model_module
               and issubclass(c, torch.nn.Module) and "seq_len" in inspect.signature(c.forward).parameters]
    originals = {c: c.forward for c in classes}

    def wrap(forward):
        def static(self, x, seq_len=None, *args, **kwargs):
            if isinstance(seq_len, torch.Tensor):
                seq_len = x.shape[1]
            return forward(self, x, seq_len, *args, **kwargs)
        return static

    for c, forward in originals.items():
        c.forward = wrap(forward)
    try:
        yield
    finally:
        for c, forward in originals.items():
            c.forward = forward


SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
"""`F.scaled_dot_product_attention`'s positional parameters (``scale`` and ``enable_gqa`` are keyword-only)."""


def sdpa_arguments(args: tuple, kwargs: dict) -> dict:
    """An SDPA call's arguments by name."""
    return {**dict(zip(SDPA_ARGS, args, strict=False)), **kwargs}


def autocast_sdpa_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """An SDPA call's arguments with query, key and value cast as CUDA's autocast casts them before a kernel is chosen
    (SDPA is on its lower-precision list, so float32 hidden states under autocast still get the bf16 flash kernel);
    unchanged outside autocast."""
    import torch

    device = (args[0] if args else kwargs["query"]).device.type
    if not torch.is_autocast_enabled(device):
        return args, kwargs
    dtype = torch.get_autocast_dtype(device)
    args = tuple(a.to(dtype) if i < 3 and a.is_floating_point() else a for i, a in enumerate(args))
    kwargs = {k: (v.to(dtype) if k in SDPA_ARGS[:3] and v.is_floating_point() else v) for k, v in kwargs.items()}
    return args, kwargs


@contextlib.contextmanager
def cuda_dropout() -> Iterator[None]:
    """Dropout as it runs on CUDA, on the (fake) CPU device.

    `aten::dropout` is composite: on CUDA (`is_fused_kernel_acceptable`: a CUDA/XPU tensor, 0 < p < 1)
    it calls `native_dropout`, which returns the output and a bool mask (1 B/element) that its backward
    keeps; on CPU it builds a float noise tensor of the input's dtype and multiplies, keeping that noise.
    The table models CUDA, so inside this context `F.dropout` in training with 0 < p < 1 calls
    `torch.native_dropout` as the CUDA path does (PEFT's `lora_dropout` is an `nn.Dropout`).

    Attention dropout inside `F.scaled_dot_product_attention` (``dropout_p > 0``, e.g. Seed-OSS's 0.1 in
    training): CUDA's flash and memory-efficient kernels apply it in the kernel and keep only the RNG seed and
    offset, while the CPU dispatcher falls back to the math kernel and materialises fp32 scores, their dropout
    mask and output. The SDPA call runs with ``dropout_p=0`` here, which allocates what the CUDA kernels do.

    Float32 grouped-query attention (``enable_gqa=True``, fewer key/value heads; e.g. a k-bit-prepared model without
    autocast, whose hidden states are float32) runs CUDA's math kernel, as measured on an H100 (tools/truth/cuda.py:
    Llama-3.2-1B QLoRA, 4.4 GiB above the flash-style trace); here it runs that kernel too. Under autocast the inputs
    are cast to its dtype first, as CUDA's autocast does (same H100: that QLoRA step under autocast, 9.97 GiB).
    """
    import torch
    import torch.nn.functional as F

    original = F.dropout
    original_sdpa = F.scaled_dot_product_attention

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0 < p < 1 and not inplace and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    def sdpa(*args, **kwargs):
        if len(args) > 4:  # (query, key, value, attn_mask, dropout_p, ...)
            args = (*args[:4], 0.0, *args[5:])
        else:
            kwargs["dropout_p"] = 0.0
        args, kwargs = autocast_sdpa_inputs(args, kwargs)
        bound = sdpa_arguments(args, kwargs)
        query, key = bound["query"], bound["key"]
        if query.dtype == torch.float32 and kwargs.get("enable_gqa") and key.shape[-3] != query.shape[-3]:
            # CUDA: flash and cuDNN take only bf16/fp16 and the memory-efficient kernel no grouped heads, so float32
            # grouped-query attention runs the math kernel (the CPU dispatcher would pick its flash kernel)
            return torch.ops.aten._scaled_dot_product_attention_math(
                bound["query"], bound["key"], bound["value"], bound.get("attn_mask"), 0.0,
                bound.get("is_causal", False), scale=bound.get("scale"), enable_gqa=True)[0]
        return original_sdpa(*args, **kwargs)

    F.dropout = dropout
    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.dropout = original
        F.scaled_dot_product_attention = original_sdpa


@contextlib.contextmanager
def settable_fake_params() -> Iterator[None]:
    """Let `Module.to()` convert fake parameters.

    `Module._apply` always converts a `FakeTensor` parameter with `torch.utils.swap_tensors`,
    which refuses tensors that have weak references — and `FakeTensorMode` keeps one to
    every fake tensor it creates. Where the swap is refused this falls back to
    `param.data = new.data`, which frees the old storage and keeps the parameter object,
    the same effect as the swap.
    """
    import torch

    original = torch.utils.swap_tensors

    def swap_tensors(t1, t2):
        try:
            return original(t1, t2)
        except RuntimeError:
            t1.data = t2.data
            return None

    torch.utils.swap_tensors = swap_tensors
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


@contextlib.contextmanager
def fp32_grouped_mm() -> Iterator[None]:
    """Let the fake (meta) `_grouped_mm` accept fp32 operands and return fp32.

    transformers 5 runs MoE experts (fused 3-D parameters) through `grouped_mm`. QLoRA's
    `prepare_model_for_kbit_training` upcasts those unquantized expert tensors to fp32, but
    the meta kernel mirrors the CUDA kernel's bf16-only check. For the trace an fp32
    grouped matmul is shaped as the bf16 one with an fp32 result; nothing else changes.
    """
    import torch
    from torch import _meta_registrations as meta

    original = meta._meta_grouped_mm_common

    def common(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None, out_dtype=None, **kwargs):
        if scale_a is None and mat_a.dtype == torch.float32 and mat_b.dtype == torch.float32:
            bf16 = original(mat_a.to(torch.bfloat16), mat_b.to(torch.bfloat16), None, None, offs, bias, None, None)
            return bf16.to(torch.float32)
        return original(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_dtype, **kwargs)

    meta._meta_grouped_mm_common = common
    try:
        yield
    finally:
        meta._meta_grouped_mm_common = original
