"""The memory truth harness: fake-tensor traces equal real CPU runs, and the table is sound.

The validation runs the same two training steps twice on tiny models: once under
`FakeTensorMode` (what the table uses at real sizes) and once for real on CPU, both tracked
by the same dispatch mode. Peaks, per-phase peaks and the breakdown must be identical.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from tools.truth.alloc import LiveBytes, rounded_bytes  # noqa: E402
from tools.truth.build import TABLE, config_path, row_key  # noqa: E402
from tools.truth.explain import peak_allocations  # noqa: E402
from tools.truth.model import load_config  # noqa: E402
from tools.truth.setup import DEFAULT_LORA_TARGETS, TraceSetup  # noqa: E402
from tools.truth.show import format_rows  # noqa: E402
from tools.truth.trace import trace_training, trace_with_tracker  # noqa: E402

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
TINY_QWEN2 = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
TINY_MIXTRAL = {
    "model_type": "mixtral",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
}
TINY_GEMMA3 = {
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 256,
    "sliding_window": 16,
    "max_position_embeddings": 512,
}

CASES = [
    ("llama-full-bf16", TINY_LLAMA, {"method": "full"}),
    ("llama-full-gc", TINY_LLAMA, {"method": "full", "gradient_checkpointing": True}),
    ("llama-full-bf16-mixed", TINY_LLAMA, {"method": "full", "precision": "bf16_mixed"}),
    ("llama-full-fused-adamw", TINY_LLAMA, {"method": "full", "optimizer": "adamw_fused"}),
    ("llama-lora-eager", TINY_LLAMA, {"method": "lora", "attention": "eager"}),
    ("qwen2-lora", TINY_QWEN2, {"method": "lora"}),
    ("qwen2-qlora", TINY_QWEN2, {"method": "qlora"}),
    ("qwen2-qlora-autocast", TINY_QWEN2, {"method": "qlora", "autocast": True}),
    ("llama-qlora-gc", TINY_LLAMA, {"method": "qlora", "gradient_checkpointing": True}),
    ("mixtral-lora", TINY_MIXTRAL, {"method": "lora"}),
    ("gemma3-lora-sliding", TINY_GEMMA3, {"method": "lora"}),
    # stack profiles: LoRA dropout, reentrant checkpointing, no k-bit prep, TRL's preparation
    ("llama-lora-dropout", TINY_LLAMA, {"method": "lora", "lora_dropout": 0.1}),
    (
        "llama-lora-dropout-reentrant",
        TINY_LLAMA,
        {"method": "lora", "lora_dropout": 0.1, "gradient_checkpointing": True, "checkpointing": "reentrant"},
    ),
    ("llama-full-reentrant", TINY_LLAMA, {"method": "full", "gradient_checkpointing": True, "checkpointing": "reentrant"}),
    ("qwen2-qlora-no-kbit-prep", TINY_QWEN2, {"method": "qlora", "kbit_prep": False, "trainer": "peft"}),
    (
        "llama-qlora-trl-reentrant",
        TINY_LLAMA,
        {"method": "qlora", "trainer": "trl", "autocast": True, "gradient_checkpointing": True, "checkpointing": "reentrant"},
    ),
]


def _trace(config, setup, fake):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trace_training(config, setup, fake=fake)


@pytest.mark.slow
@pytest.mark.parametrize(("config", "overrides"), [(c, o) for _, c, o in CASES], ids=[n for n, _, _ in CASES])
def test_fake_trace_equals_real_cpu_run(config, overrides):
    setup = TraceSetup(micro_batch_size=2, seq_len=32, **overrides)
    fake = _trace(config, setup, fake=True)
    real = _trace(config, setup, fake=False)
    assert fake.peak_bytes == real.peak_bytes
    assert fake.peak_phase == real.peak_phase
    assert fake.phase_peak_bytes == real.phase_peak_bytes
    assert fake.peak_breakdown_bytes == real.peak_breakdown_bytes
    assert fake.grad_bytes == real.grad_bytes
    assert fake.optimizer_state_bytes == real.optimizer_state_bytes
    assert fake.param_bytes_frozen == real.param_bytes_frozen
    assert fake.param_bytes_trainable == real.param_bytes_trainable
    assert fake.lora_param_count == real.lora_param_count
    # The breakdown partitions the peak, and the peak is the largest phase peak.
    assert sum(fake.peak_breakdown_bytes.values()) == fake.peak_bytes
    assert fake.peak_bytes == max(fake.phase_peak_bytes.values())
    assert fake.phase_peak_bytes[fake.peak_phase] == fake.peak_bytes


def _per_tensor_bytes(shapes, itemsize):
    return sum(rounded_bytes(math.prod(s) * itemsize) for s in shapes)


def test_full_bf16_parameters_grads_and_adamw_states_match_the_formula():
    cfg = TINY_LLAMA
    h, i, layers, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    layer = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]
    shapes = [(v, h), (v, h), (h,)] + layer * layers
    result = _trace(cfg, TraceSetup(method="full", micro_batch_size=1, seq_len=16), fake=True)
    weights = _per_tensor_bytes(shapes, 2)
    assert result.param_bytes_trainable == weights
    assert result.grad_bytes == weights
    # exp_avg + exp_avg_sq in the parameter dtype (bf16) + one fp32 `step` scalar per parameter.
    assert result.optimizer_state_bytes == 2 * weights + len(shapes) * rounded_bytes(4)
    assert result.param_count_total == sum(math.prod(s) for s in shapes)


def test_lora_parameter_count_matches_module_shapes_and_adapters_are_fp32():
    cfg = TINY_QWEN2
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    r = 8
    dims = {"q": (h, h), "k": (h, kv), "v": (h, kv), "o": (h, h), "gate": (h, i), "up": (h, i), "down": (i, h)}
    expected = layers * sum(r * (a + b) for a, b in dims.values())
    setup = TraceSetup(method="lora", lora_rank=r, lora_alpha=16, micro_batch_size=1, seq_len=16)
    result = _trace(cfg, setup, fake=True)
    assert result.lora_param_count == expected
    assert result.param_count_trainable == expected
    assert result.lora_module_count == layers * len(DEFAULT_LORA_TARGETS)
    adapter_shapes = [(r, a) for a, _ in dims.values()] + [(b, r) for _, b in dims.values()]
    assert result.param_bytes_trainable == layers * _per_tensor_bytes(adapter_shapes, 4)


def test_qlora_quantizes_every_linear_but_lm_head_and_upcasts_the_rest():
    cfg = TINY_LLAMA
    result = _trace(cfg, TraceSetup(method="qlora", micro_batch_size=1, seq_len=16), fake=True)
    assert result.quantized_modules == 7 * cfg["num_hidden_layers"]
    assert "lm_head.weight" in result.upcast_to_fp32
    assert "embed_tokens.weight" in result.upcast_to_fp32
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    numels = [h * h, kv * h, kv * h, h * h, i * h, i * h, h * i] * cfg["num_hidden_layers"]

    def nf4_bytes(n):
        blocks = math.ceil(n / 64)
        # packed 4-bit weight, uint8 absmax per 64-block, fp32 absmax per 256 of those,
        # 16-entry NF4 code, 256-entry dynamic code, fp32 offset.
        parts = [math.ceil(n / 2), blocks, math.ceil(blocks / 256) * 4, 16 * 4, 256 * 4, 4]
        return sum(rounded_bytes(p) for p in parts)

    unquantized_fp32 = _per_tensor_bytes([(v, h), (v, h), (h,)] + [(h,), (h,)] * cfg["num_hidden_layers"], 4)
    assert result.param_bytes_frozen == sum(nf4_bytes(n) for n in numels) + unquantized_fp32


def test_qlora_without_kbit_prep_keeps_the_unquantized_weights_bf16():
    """A plain PEFT loop: nothing is upcast, so the frozen bytes drop by exactly half of the fp32 bytes
    `prepare_model_for_kbit_training` gives the embeddings, lm_head and norms."""
    cfg = TINY_LLAMA
    h, v, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    shapes = [(v, h), (v, h), (h,)] + [(h,), (h,)] * layers
    prep = _trace(cfg, TraceSetup(method="qlora", micro_batch_size=1, seq_len=16), fake=True)
    plain = _trace(cfg, TraceSetup(method="qlora", kbit_prep=False, trainer="peft", micro_batch_size=1, seq_len=16), fake=True)
    assert plain.upcast_to_fp32 == []
    assert plain.quantized_modules == prep.quantized_modules
    assert prep.param_bytes_frozen - plain.param_bytes_frozen == _per_tensor_bytes(shapes, 4) - _per_tensor_bytes(shapes, 2)
    assert plain.param_bytes_trainable == prep.param_bytes_trainable


def test_trl_preparation_puts_embeddings_and_lm_head_back_in_bf16():
    """TRL's peft_module_casting_to_bf16 (bf16=True on a 4-bit model): norms stay fp32, embed_tokens
    and lm_head return to bf16 after prepare_model_for_kbit_training upcast them."""
    cfg = TINY_LLAMA
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    hf = _trace(cfg, TraceSetup(method="qlora", micro_batch_size=1, seq_len=16), fake=True)
    trl = _trace(cfg, TraceSetup(method="qlora", trainer="trl", autocast=True, micro_batch_size=1, seq_len=16), fake=True)
    assert {"embed_tokens.weight", "lm_head.weight"} <= set(hf.upcast_to_fp32)
    assert trl.upcast_to_fp32 == sorted(n for n in hf.upcast_to_fp32 if "norm" in n)
    assert hf.param_bytes_frozen - trl.param_bytes_frozen == 2 * (_per_tensor_bytes([(v, h)], 4) - _per_tensor_bytes([(v, h)], 2))


def test_lora_dropout_keeps_a_bool_mask_as_on_cuda_and_leaves_weights_alone():
    base = _trace(TINY_LLAMA, TraceSetup(method="lora", micro_batch_size=2, seq_len=32), fake=True)
    drop = _trace(TINY_LLAMA, TraceSetup(method="lora", lora_dropout=0.1, micro_batch_size=2, seq_len=32), fake=True)
    assert drop.param_bytes_trainable == base.param_bytes_trainable
    assert drop.optimizer_state_bytes == base.optimizer_state_bytes
    # As on CUDA (native_dropout): each wrapped module's dropout output replaces the input copy lora_A would
    # have saved, and adds a bool mask (1 B per element of its (b, s, in_features) input) — not the float
    # noise tensor of the CPU kernel, which would add 4 B per element.
    ins = [64] * 6 + [128]
    masks = TINY_LLAMA["num_hidden_layers"] * sum(rounded_bytes(2 * 32 * n) for n in ins)
    assert 0 < drop.phase_peak_bytes["forward"] - base.phase_peak_bytes["forward"] <= masks


def test_a_row_pinned_to_another_transformers_version_is_refused():
    setup = TraceSetup(method="lora", micro_batch_size=1, seq_len=16, transformers="4.0.0")
    with pytest.raises(RuntimeError, match="traced under transformers 4.0.0"):
        _trace(TINY_LLAMA, setup, fake=True)


def test_build_picks_the_interpreter_for_the_pinned_version(tmp_path, monkeypatch):
    import sys
    from importlib import metadata

    import tools.truth.build as build

    assert build.python_for(None) == sys.executable
    assert build.python_for(metadata.version("transformers")) == sys.executable
    assert build.python_for("4.48.1", {"4.48.1": "/opt/py"}) == "/opt/py"
    monkeypatch.setattr(build, "VENVS", tmp_path)
    with pytest.raises(SystemExit, match="tools/truth/__init__.py"):
        build.python_for("4.48.1")
    (tmp_path / "tf4" / "bin").mkdir(parents=True)
    (tmp_path / "tf4" / "bin" / "python").touch()
    assert build.python_for("4.48.1") == str(tmp_path / "tf4" / "bin" / "python")


def test_row_key_marks_only_non_default_stack_fields():
    plain = TraceSetup(method="lora", micro_batch_size=1, seq_len=16)
    assert row_key("m", plain) == row_key("m", TraceSetup(method="lora", micro_batch_size=1, seq_len=16, trainer="hf"))
    key = row_key(
        "m",
        TraceSetup(method="qlora", micro_batch_size=1, seq_len=16, lora_dropout=0.1, kbit_prep=False, trainer="peft",
                   gradient_checkpointing=True, checkpointing="reentrant", transformers="4.48.1"),
    )
    assert key.endswith("|drop0.1|nokbit|reentrant|peft|tf4.48.1")
    with pytest.raises(ValueError):
        TraceSetup(method="qlora", micro_batch_size=1, seq_len=16, trainer="peft")  # plain PEFT runs no k-bit prep
    with pytest.raises(ValueError):
        TraceSetup(method="full", micro_batch_size=1, seq_len=16, lora_dropout=0.1)


def test_balanced_routing_splits_top_k_times_tokens_over_the_experts():
    import types

    from tools.truth.patches import balanced_routing

    module = types.ModuleType("fake_moe_module")
    module.torch = torch
    import sys

    sys.modules["fake_moe_module"] = module
    try:
        with balanced_routing("fake_moe_module", 60):
            mask = torch.zeros(4, 37, dtype=torch.long)  # one expert's one-hot slice: top-4 of 60, 37 tokens
            counts = [module.torch.where(mask)[1].numel() for _ in range(60)]
            assert module.torch.where(mask > 0, 1, 0).shape == (4, 37)  # other forms are torch's
        assert module.torch is torch
    finally:
        del sys.modules["fake_moe_module"]
    assert sum(counts) == 4 * 37
    assert max(counts) - min(counts) <= 1


def test_live_bytes_counts_storages_once_rounds_to_512_and_frees():
    assert [rounded_bytes(n) for n in (0, 1, 512, 513, 4096)] == [0, 512, 512, 1024, 4096]
    tracker = LiveBytes()
    with tracker:
        a = torch.empty(1000, dtype=torch.float32)  # 4000 B -> 4096
        view = a[10:20]
        b = a.view(10, 100)
        assert tracker.total_bytes == 4096
        c = torch.empty(3, dtype=torch.bfloat16)  # 6 B -> 512
        assert tracker.total_bytes == 4608
        del a, view, b
        assert tracker.total_bytes == 512
        del c
    assert tracker.total_bytes == 0
    assert tracker.peak_bytes == 4608


def test_tracker_peak_breakdown_uses_groups_live_at_the_peak():
    keep = {}

    def groups():
        return {"kept": {t.untyped_storage()._cdata for t in keep.values()}}

    tracker = LiveBytes(groups_fn=groups)
    with tracker:
        keep["w"] = torch.empty(256, dtype=torch.float32)  # 1024
        tmp = torch.empty(1024, dtype=torch.float32)  # 4096, freed after the peak
        del tmp
        small = torch.empty(10)  # 512: below the earlier peak
        del small
    assert tracker.peak_bytes == 5120
    assert tracker.peak_breakdown() == {"kept": 1024, "other": 4096}


def test_eager_attention_stores_scores_that_sdpa_does_not():
    base = {"micro_batch_size": 1, "seq_len": 128, "method": "full"}
    sdpa = _trace(TINY_LLAMA, TraceSetup(**base), fake=True)
    eager = _trace(TINY_LLAMA, TraceSetup(attention="eager", **base), fake=True)
    scores = TINY_LLAMA["num_attention_heads"] * 128 * 128 * 2  # one layer's bf16 (h, s, s)
    assert eager.phase_peak_bytes["forward"] - sdpa.phase_peak_bytes["forward"] >= scores


def test_explain_accounts_for_the_other_bytes_and_finds_the_fp32_loss_buffers():
    setup = TraceSetup(method="lora", micro_batch_size=2, seq_len=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, tracker = trace_with_tracker(TINY_LLAMA, setup, record_origin=True)
    rows = peak_allocations(tracker)
    assert sum(r["bytes"] for r in rows) == result.peak_breakdown_bytes["other"]
    logits = [r for r in rows if r["op"] == "_log_softmax"]
    assert logits and logits[0]["dtype"] == "float32"
    assert logits[0]["shape"] == [2 * 32, TINY_LLAMA["vocab_size"]]


# --- the committed truth table -------------------------------------------------------------


@pytest.fixture(scope="module")
def table():
    return json.loads(TABLE.read_text(encoding="utf-8"))


def test_truth_table_covers_families_methods_sizes_and_checkpointing(table):
    rows = table["rows"]
    assert len(rows) >= 36
    families = {json.loads(config_path(r["model_id"]).read_text())["model_type"] for r in rows}
    assert len(families) >= 4
    for method in ("full", "lora", "qlora"):
        assert any(r["method"] == method for r in rows)
        assert {r["gradient_checkpointing"] for r in rows if r["method"] == method} == {False, True}
    assert len({(r["micro_batch_size"], r["seq_len"]) for r in rows}) >= 3
    assert any("MoE" in r["model_id"] or "Mixtral" in r["model_id"] or "A3B" in r["model_id"] for r in rows)


def test_truth_table_rows_are_consistent(table):
    keys = set()
    for r in table["rows"]:
        setup = TraceSetup(
            method=r["method"],
            precision=r["precision"],
            optimizer=r["optimizer"],
            micro_batch_size=r["micro_batch_size"],
            seq_len=r["seq_len"],
            gradient_checkpointing=r["gradient_checkpointing"],
            attention=r["attention"],
            autocast=r["autocast"] and r["precision"] != "bf16_mixed",
            kbit_prep=r.get("kbit_prep", True),
            checkpointing=r.get("checkpointing", "non_reentrant"),
            trainer=r.get("trainer", "hf"),
            transformers=r.get("transformers_pinned"),
            **(
                {
                    "lora_rank": r["lora_rank"],
                    "lora_alpha": r["lora_alpha"],
                    "lora_targets": tuple(r["lora_targets"]),
                    "lora_dropout": r.get("lora_dropout") or 0.0,
                }
                if r["method"] != "full"
                else {}
            ),
        )
        assert r["key"] == row_key(r["model_id"], setup)
        assert r["key"] not in keys
        keys.add(r["key"])
        assert config_path(r["model_id"]).name == r["config_file"]
        assert sum(r["peak_breakdown_bytes"].values()) == r["peak_bytes"]
        assert r["phase_peak_bytes"][r["peak_phase"]] == r["peak_bytes"]
        assert r["peak_bytes"] % 512 == 0
        assert r["peak_bytes"] >= r["after_setup_bytes"]
        assert r["how"] and r["date"] and r["versions"]["transformers"]
        assert r.get("transformers_version", "5.23.0") == r["versions"]["transformers"]
        if r.get("transformers_pinned"):
            assert r["transformers_version"] == r["transformers_pinned"]
        if r["method"] == "full":
            assert r["lora_param_count"] == 0
            assert r["grad_bytes"] == r["param_bytes_trainable"]
        else:
            assert r["lora_param_count"] == r["param_count_trainable"] > 0


def test_truth_table_parameter_counts_equal_transformers_meta_count(table):
    from transformers import AutoModelForCausalLM

    full_rows = {r["model_id"]: r for r in table["rows"] if r["method"] == "full"}
    for model_id in sorted(full_rows)[:3]:
        config = load_config(str(config_path(model_id)))
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(config)
        assert full_rows[model_id]["param_count_total"] == sum(p.numel() for p in model.parameters())


def test_show_formats_every_row(table):
    text = format_rows(table["rows"], phases=True)
    assert len(text.splitlines()) == len(table["rows"]) + 2


def test_static_rope_length_reads_the_table_length_from_the_input_shape():
    """transformers 4's Phi-MoE asks its rotary embedding for ``cache_position[-1] + 1`` rows (a value a fake tensor
    does not have); inside the patch a tensor length is the input's sequence length, as it is for an unpadded batch,
    and an int is left alone."""
    import sys
    import types

    import torch

    from tools.truth.patches import static_rope_length

    module = types.ModuleType("fake_modeling_rope")

    class Rotary(torch.nn.Module):
        def forward(self, x, seq_len=None):
            return torch.arange(seq_len)

    Rotary.__module__ = module.__name__
    module.Rotary = Rotary
    sys.modules[module.__name__] = module
    try:
        x = torch.zeros(2, 7, 4)
        with static_rope_length(module.__name__):
            assert Rotary()(x, seq_len=torch.tensor(99)).shape == (7,)
            assert Rotary()(x, seq_len=5).shape == (5,)
        assert Rotary()(x, seq_len=torch.tensor(3)).shape == (3,)  # restored
    finally:
        del sys.modules[module.__name__]


def test_sdpa_attention_dropout_allocates_what_cuda_kernels_do():
    """CUDA's flash / memory-efficient SDPA kernels apply attention dropout inside the kernel; the CPU dispatcher
    falls back to the math kernel, which materialises the scores. Inside `cuda_dropout` an SDPA call with
    dropout_p > 0 (positional or keyword) allocates what the dropout-free kernel does, and the patch is undone."""
    import torch
    import torch.nn.functional as F

    from tools.truth.patches import cuda_dropout

    original = F.scaled_dot_product_attention
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))

    def peak(call) -> int:
        tracker = LiveBytes()
        with tracker:
            call()
        return tracker.peak_bytes

    free = peak(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    math = peak(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True))
    assert math > free  # CPU: scores, their dropout mask and output
    with cuda_dropout():
        assert peak(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)) == free
        assert peak(lambda: F.scaled_dot_product_attention(q, k, v, None, 0.1, True)) == free
    assert F.scaled_dot_product_attention is original


def test_float32_grouped_query_attention_runs_the_math_kernel_unless_autocast_casts_it():
    """On CUDA, float32 grouped-query SDPA can only run the math kernel (flash and cuDNN take 16-bit inputs, the
    memory-efficient kernel no grouped heads), which keeps the [b, h, s, s] probabilities; under autocast the inputs
    are cast to bf16 first and the flash kernel runs (H100: Llama-3.2-1B QLoRA 14.52 GiB without autocast, 9.97 GiB
    with). Inside `cuda_dropout` the trace follows both, whatever the CPU dispatcher would pick."""
    import torch
    import torch.nn.functional as F

    from tools.truth.patches import cuda_dropout

    b, h, kv, s, d = 1, 8, 2, 256, 16
    q = torch.randn(b, h, s, d)
    k, v = torch.randn(b, kv, s, d), torch.randn(b, kv, s, d)
    scores = b * h * s * s * 4

    def peak(call) -> tuple[int, torch.dtype]:
        tracker = LiveBytes()
        with tracker:
            out = call()
        return tracker.peak_bytes, out.dtype

    attend = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    flash, _ = peak(attend)
    with cuda_dropout():
        math, dtype = peak(attend)
        assert math >= flash + scores and dtype == torch.float32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cast, dtype = peak(attend)
        assert dtype == torch.bfloat16 and cast < flash + scores // 2


def test_gpu_rows_record_the_sdpa_backend_each_call_gets():
    """tools.truth.cuda counts each SDPA call by the backend PyTorch's dispatcher picks for its own arguments (here the
    CPU's: its flash kernel without dropout, the math kernel with it), and the call itself runs unchanged."""
    import collections

    import torch
    import torch.nn.functional as F

    from tools.truth.cuda import sdpa_backends

    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    calls: collections.Counter = collections.Counter()
    with sdpa_backends(calls):
        plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.manual_seed(0)
        dropped = F.scaled_dot_product_attention(q, k, v, None, 0.1, True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(plain, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch.manual_seed(0)
    assert torch.equal(dropped, F.scaled_dot_product_attention(q, k, v, None, 0.1, True))
    assert F.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"  # restored
    keys = sorted(calls)
    assert calls == {key: 1 for key in keys} and len(keys) == 3
    assert any(key.startswith("FLASH_ATTENTION float32 q(2, 4, 16, 8)") and "dropout 0 " in key for key in keys), keys
    assert any(key.startswith("MATH float32") and "dropout 0.1 " in key for key in keys), keys
    assert any(key.startswith("FLASH_ATTENTION bfloat16") for key in keys), keys  # autocast's cast, then the choice
