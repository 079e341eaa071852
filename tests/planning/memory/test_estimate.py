"""Memory engine: invariants (hypothesis), component formulas against references, bad input."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aegis
from aegis.planning.memory.components import nf4_bytes
from aegis.schema import LoRAConfig

MODELS = ["llama-3.1-8b", "qwen2.5-0.5b", "gemma-2-2b", "gemma-3-1b", "mixtral-8x7b", "qwen3-30b-a3b", "phi-3-mini"]


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    method=st.sampled_from(["full", "lora", "qlora"]),
    ckpt=st.booleans(),
    attention=st.sampled_from(["sdpa", "eager"]),
    batch=st.integers(1, 16),
    seq=st.integers(16, 8192),
)
def test_monotonic_in_batch_and_seq(model, method, ckpt, attention, batch, seq):
    kw = dict(method=method, gradient_checkpointing=ckpt, attention=attention)
    est = aegis.estimate_memory(model, micro_batch_size=batch, seq_len=seq, **kw)
    more_batch = aegis.estimate_memory(model, micro_batch_size=batch + 1, seq_len=seq, **kw)
    more_seq = aegis.estimate_memory(model, micro_batch_size=batch, seq_len=seq + 64, **kw)
    assert more_batch.tensor_bytes >= est.tensor_bytes and more_seq.tensor_bytes >= est.tensor_bytes
    assert more_batch.eval_peak_bytes > est.eval_peak_bytes and more_seq.eval_peak_bytes > est.eval_peak_bytes
    # the optimizer step's peak, and a tied embedding's gradients summed after the last layer, do not depend on batch
    # or length
    if est.peak_phase not in ("optimizer step", "embedding backward (tied head)"):
        assert more_batch.tensor_bytes > est.tensor_bytes and more_seq.tensor_bytes > est.tensor_bytes


def test_components_sum_to_tensor_peak_and_range_is_ordered():
    est = aegis.estimate_memory("llama-3.1-8b", method="qlora", micro_batch_size=4, seq_len=1024, gpu="3090")
    assert sum(c.bytes for c in est.components) == est.tensor_bytes
    assert est.low_bytes < est.total_bytes < est.high_bytes
    assert est.total_bytes == est.tensor_bytes + aegis.find_gpu("3090").overhead_bytes
    assert all(c.formula for c in est.components)


def test_full_bf16_static_components_follow_their_formulas():
    profile = aegis.resolve_model("qwen2.5-0.5b")
    est = aegis.estimate_memory(profile, method="full", micro_batch_size=1, seq_len=64)
    assert est.component("weights").bytes == profile.total_params * 2
    assert est.component("optimizer").bytes == 2 * profile.total_params * 2  # AdamW states in the param dtype


def test_lora_adapter_bytes_from_real_module_shapes():
    profile = aegis.resolve_model("llama-3.1-8b")
    est = aegis.estimate_memory(profile, method="lora", lora=LoRAConfig(rank=16))
    # q: 16*(4096+4096), k and v: 16*(4096+1024) (GQA), o like q, gate/up/down: 16*(4096+14336); x 32 layers; fp32
    per_layer = 16 * (2 * 8192 + 2 * 5120 + 3 * 18432)
    assert est.component("adapters").bytes == 32 * per_layer * 4


def test_nf4_bytes_match_bitsandbytes_quantize_4bit():
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    w = torch.randn(1024, 4096, dtype=torch.bfloat16)
    packed, state = bnb.functional.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    tensors = [packed, state.absmax, state.state2.absmax, state.state2.code, state.offset]

    def rounded(t):
        return -(-t.numel() * t.element_size() // 512) * 512

    assert nf4_bytes(w.numel()) == sum(rounded(t) for t in tensors)


def test_moe_qlora_keeps_experts_unquantized():
    est = aegis.estimate_memory("mixtral-8x7b", method="qlora")
    profile = aegis.resolve_model("mixtral-8x7b")
    quantized = sum(m.count * m.in_features * m.out_features for m in profile.linear_modules if m.quantizable)
    assert quantized < 0.05 * profile.total_params  # attention only: experts are fused 3-D parameters
    assert est.component("weights").bytes > 3 * profile.total_params  # experts upcast to fp32


def test_checkpointing_and_chunked_ce_reduce_memory():
    kw = dict(method="lora", micro_batch_size=4, seq_len=2048)
    plain = aegis.estimate_memory("llama-3.1-8b", **kw).tensor_bytes
    assert aegis.estimate_memory("llama-3.1-8b", gradient_checkpointing=True, **kw).tensor_bytes < plain / 2
    assert aegis.estimate_memory("llama-3.1-8b", chunked_cross_entropy=True, **kw).tensor_bytes < plain


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(micro_batch_size=0), aegis.InvalidConfigError, "micro_batch_size must be a positive integer"),
        (dict(seq_len=-5), aegis.InvalidConfigError, "seq_len must be a positive integer"),
        (dict(gpu="3900"), aegis.UnknownGPUError, "did you mean"),
        (dict(model="llama-3.1-9b"), aegis.UnknownModelError, "aegis models"),
    ],
)
def test_bad_input_is_a_one_line_error(kwargs, error, match):
    model = kwargs.pop("model", "llama-3.1-8b")
    with pytest.raises(error, match=match) as info:
        aegis.estimate_memory(model, **kwargs)
    assert "\n" not in str(info.value)


def test_the_eval_peak_counts_the_cache_and_logits_in_the_dtypes_transformers_leaves():
    """transformers' own forward with float32 weights (QLoRA's k-bit preparation keeps the stream in float32): under
    bf16 autocast the cached values and the logits are bf16 but the keys float32 (RoPE's tables follow the stream);
    without autocast all are float32. The eval peak grows per token by exactly those bytes."""
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config).eval()
    size = {}
    for autocast in (True, False):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(torch.arange(8)[None], use_cache=True)
        layer = out.past_key_values.layers[0]
        size[autocast] = tuple(t.element_size() for t in (layer.keys, layer.values, out.logits))
    assert size == {True: (4, 2, 2), False: (4, 4, 4)}

    profile = aegis.resolve_model("llama-3.1-8b")
    kv = profile.num_layers * profile.num_key_value_heads * profile.head_dim
    for autocast, (key, value, logit) in size.items():
        short, long = (aegis.estimate_memory("llama-3.1-8b", method="qlora", micro_batch_size=1, seq_len=512,
                                             autocast=autocast, eval_seq_len=n).eval_peak_bytes for n in (1024, 2048))
        loss = (4 if logit != 4 else 0) + 4  # logits.float() copies 16-bit logits; log-softmax writes float32
        layer = 3 * value * profile.intermediate_size + 4 * profile.hidden_size
        assert (long - short) / 1024 == pytest.approx(kv * (key + value) + (logit + loss) * profile.vocab_size + layer,
                                                      rel=1e-6)
