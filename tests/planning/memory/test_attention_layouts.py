"""Multi-query / grouped attention under flash-attention 2: what the kernel saves for backward, per layer and token.

flash_attn's ``FlashAttnFunc.forward`` saves ``q, k, v, out, softmax_lse, rng_state``: q, k and v as the model hands
them over ([b, s, heads, d], fewer key/value heads than query heads taken as they are: no ``repeat_kv`` in any
transformers version), the output, and a float32 log-sum-exp of [b, heads, s]; dropout runs in the kernel. With a
fused projection and no rotary embedding (GPTBigCode's ``c_attn``) q, k and v are views of its output, which stays
alive whole."""

from __future__ import annotations

import pytest

from aegis.models.families import get_family, layer_shapes
from aegis.models.resolve import resolve_model
from aegis.planning.memory._dtypes import placement
from aegis.planning.memory.activations import layer_activation_terms
from aegis.planning.memory.estimate import estimate_memory, step_setting


def _attention_bytes(model: str, **kw) -> float:
    profile = resolve_model(model)
    cfg = estimate_memory(profile, seq_len=4096, **kw).config
    fam = get_family(profile.config)
    setting = step_setting(profile, cfg, fam, placement(cfg))
    layer = layer_shapes(fam, profile.config, profile.layout_major)[0]
    return layer_activation_terms(fam, profile.config, layer, setting)["attention (q, k, v, out)"]


@pytest.mark.parametrize("transformers_version", ["4.46", "5.0"])
@pytest.mark.parametrize("method", ["full", "qlora"])
def test_gpt_bigcode_flash_saves_fused_qkv_output_out_and_lse(method, transformers_version):
    """santacoder (1.1B, 16 heads of 128, one key/value head): c_attn's output (2048 + 2 x 128 wide, bf16), the
    output (2048, bf16) and the float32 lse per head; transformers 4.x's repeat_kv (an SDPA path) does not apply."""
    heads, d, kv = 16, 128, 1
    expected = 2 * (heads + 2 * kv) * d + 2 * heads * d + 4 * heads
    got = _attention_bytes("bigcode/gpt_bigcode-santacoder", method=method, attention="flash",
                           transformers_version=transformers_version)
    assert got == expected


def test_gqa_flash_keeps_key_value_heads_under_transformers_4():
    """Llama-3.2-1B (32 query heads, 8 key/value heads of 64): under transformers 4.48 SDPA is given repeated keys and
    values (query width), flash-attention 2 the 8 heads: q, rotated k, v and out in bf16 plus the float32 lse."""
    heads, kv, d = 32, 8, 64
    flash = _attention_bytes("meta-llama/Llama-3.2-1B", method="lora", attention="flash", transformers_version="4.48")
    sdpa = _attention_bytes("meta-llama/Llama-3.2-1B", method="lora", attention="sdpa", transformers_version="4.48")
    assert flash == 2 * (heads * d + 2 * kv * d + heads * d) + 4 * heads
    assert sdpa - flash == 2 * 2 * (heads - kv) * d


def test_flash_never_runs_sdpa_math_kernel():
    """Falcon-7B's broadcast multi-query keys send SDPA to its math kernel (float32 probabilities, s^2 per head);
    flash-attention 2 has no such fallback: nothing grows with the sequence length squared."""
    profile = resolve_model("tiiuae/falcon-7b")
    short = estimate_memory(profile, method="lora", seq_len=1024, attention="flash", transformers_version="4.48")
    long = estimate_memory(profile, method="lora", seq_len=2048, attention="flash", transformers_version="4.48")
    per_token = [e.component("activations").bytes / e.config.seq_len for e in (short, long)]
    assert per_token[0] == pytest.approx(per_token[1], rel=1e-6)
