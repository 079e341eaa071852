"""Make transformers treat fake inputs the way it treats the real, unpadded batch.

With real tensors and an all-ones `attention_mask`, transformers' SDPA path skips the
(b, 1, s, s) causal mask and relies on `is_causal=True`. With `FakeTensor` inputs its
`is_tracing()` guard answers True (values are unknown), so it would build the mask, which
a real run never allocates. The harness only feeds unpadded, unpacked batches, so inside
`unpadded_inputs()` the two checks are answered as for such a batch:

- `_ignore_causal_mask_sdpa` is evaluated with `padding_mask=None` (no padding), which
  keeps every other rule (sliding windows longer than the sequence, q/kv lengths);
- `find_packed_sequence_indices` returns None (one sequence per row).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def unpadded_inputs() -> Iterator[None]:
    """Patch transformers' mask helpers to treat every input as unpadded and unpacked."""
    from transformers import masking_utils

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
