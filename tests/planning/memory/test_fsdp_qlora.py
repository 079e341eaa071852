"""FSDP QLoRA: what each GPU holds and gathers, checked against a model transformers and bitsandbytes load.

FSDP shards and all-gathers a layer's parameters as stored. With ``bnb_4bit_quant_storage=bfloat16`` (the
documented FSDP-QLoRA setting) a quantised weight is its packed 4-bit data viewed as bf16, and without
``prepare_model_for_kbit_training`` (TRL and axolotl skip it when sharding) every parameter shares that dtype.
"""

from __future__ import annotations

import ast

import pytest

from aegis.planning.memory.estimate import FSDP_QLORA_NOTE, estimate
from aegis.planning.planner import plan
from aegis.models.profiles import profile_from_config
from aegis.planning.report import emit
from aegis.schema import LoRAConfig, StackProfile, TrainConfig

# every tensor a multiple of 1,024 elements, so no 512-byte rounding hides a difference
CONFIG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=1024, max_position_embeddings=256)


def _llama_folder(folder):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16).save_pretrained(folder)
    return folder


def _load_4bit(folder):
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    return AutoModelForCausalLM.from_pretrained(folder, quantization_config=q, dtype=torch.bfloat16, device_map="cpu")


def _storage(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _cfg(**stack) -> TrainConfig:
    return TrainConfig(method="qlora", micro_batch_size=1, seq_len=128, lora=LoRAConfig(),
                       stack=StackProfile(**stack))


def _parts(profile, cfg, shards):
    est = estimate(profile, cfg, fsdp_shards=shards)
    return {c.key: c.bytes for c in est.components}, est


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    import json

    folder = _llama_folder(tmp_path_factory.mktemp("llama"))
    config = json.loads((folder / "config.json").read_text())
    return _load_4bit(folder), profile_from_config(config, model_id="tiny-llama", source="path"), folder


def test_gathered_layers_are_the_layer_parameters_bitsandbytes_stores(loaded):
    model, profile, _ = loaded
    layer = model.model.layers[0]
    assert {p.dtype for p in layer.parameters()} == {__import__("torch").bfloat16}  # one dtype: FSDP1 can flatten it
    parts, est = _parts(profile, _cfg(), 2)
    root = [p for n, p in model.named_parameters() if ".layers." not in n]  # embeddings, final norm, head
    # at the loss: the root unit (kept gathered through backward) and the last layer, prefetched
    assert parts["gathered"] == _storage(root) + _storage(layer.parameters())
    assert FSDP_QLORA_NOTE in est.notes


def test_only_parameters_are_sharded(loaded):
    """Going from 2 to 4 GPUs frees a quarter of the parameter storage per GPU; the quantisation state (absmax,
    code books: not parameters) stays whole on each GPU."""
    model, profile, _ = loaded
    two, _ = _parts(profile, _cfg(), 2)
    four, _ = _parts(profile, _cfg(), 4)
    assert two["weights"] - four["weights"] == _storage(model.parameters()) // 4


def test_sharded_qlora_is_sized_without_kbit_preparation(loaded):
    """PEFT's k-bit preparation upcasts what is not quantised to fp32 (mixing dtypes in a layer, which FSDP1's flat
    parameters refuse); a sharded plan is sized as TRL and axolotl run it, without it, whatever the trainer."""
    import torch
    from peft import prepare_model_for_kbit_training

    _, profile, folder = loaded
    hf, est = _parts(profile, _cfg(trainer="hf"), 2)
    assert hf == _parts(profile, _cfg(trainer="hf", kbit_prep=False), 2)[0]
    assert est.config.stack.kbit_prep_effective  # the plan's stack is reported as asked; the note says why
    one_gpu = _parts(profile, _cfg(trainer="hf"), 1)[0]
    assert one_gpu["weights"] > _parts(profile, _cfg(trainer="hf", kbit_prep=False), 1)[0]["weights"]
    prepared = prepare_model_for_kbit_training(_load_4bit(folder), use_gradient_checkpointing=False)
    assert {p.dtype for p in prepared.model.layers[0].parameters()} == {torch.bfloat16, torch.float32}


@pytest.mark.slow
def test_the_emitted_fsdp_qlora_script_loads_one_dtype_per_layer(tmp_path):
    """The HF script of a plan that shards QLoRA over two GPUs stores NF4 in bf16, skips k-bit preparation and asks
    the Trainer for FSDP; what it loads is what the plan sized."""
    import runpy

    import torch
    import transformers

    report = plan("qlora llama-2-70b on 2x rtx 3090")
    assert report.multi_gpu is not None and report.multi_gpu.assumed == "fsdp" and report.recommended is not None
    source = emit(report, "hf")
    tree = ast.parse(source)
    calls = {n.func.id: n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "prepare_model_for_kbit_training" not in calls
    args = {k.arg: ast.literal_eval(k.value) for k in calls["TrainingArguments"].keywords
            if k.arg in ("fsdp", "fsdp_config")}
    assert args["fsdp"] is True  # transformers 5 (the stack planned here); 4.x takes "full_shard auto_wrap"
    assert args["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    assert args["fsdp_config"]["version"] == 1  # PEFT's documented FSDP-QLoRA path (FSDP2 needs patches for NF4)
    assert set(args) <= set(transformers.TrainingArguments.__dataclass_fields__)
    assert "torchrun --nproc_per_node 2 train_hf.py" in source
    script = tmp_path / "train_hf.py"
    script.write_text(source)
    model = runpy.run_path(str(script), run_name="aegis_emitted")["load_model"](str(_llama_folder(tmp_path / "m")))
    frozen = {p.dtype for n, p in model.named_parameters() if "lora_" not in n}
    assert frozen == {torch.bfloat16}


@pytest.mark.parametrize("precision", ["bf16_mixed", "fp16_mixed"])
def test_mixed_precision_fsdp_gathers_layers_in_the_compute_dtype(loaded, precision):
    """Under mixed precision the Trainer's FSDP gathers the fp32 master weights in the dtype accelerate's plugin sets
    as its ``param_dtype``: a gathered layer is the layer's parameters at that element size, not at fp32's."""
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import LlamaConfig, LlamaForCausalLM

    from aegis.models.families import get_family, layer_shapes
    from aegis.planning.memory._dtypes import placement
    from aegis.planning.memory.components import layer_storage_bytes

    _, profile, _ = loaded
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision(precision.split("_")[0])
    gathered_dtype = plugin.mixed_precision_policy.param_dtype
    cfg = TrainConfig(method="full", precision=precision, micro_batch_size=1, seq_len=128)
    assert placement(cfg).base_bytes == torch.float32.itemsize  # fp32 master weights
    layer = layer_shapes(get_family(profile.config), profile.config)[0]
    hf_layer = LlamaForCausalLM(LlamaConfig(**CONFIG)).model.layers[0].to(gathered_dtype)
    assert layer_storage_bytes(layer, cfg, placement(cfg)) == _storage(hf_layer.parameters())
