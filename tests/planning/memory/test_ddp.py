"""DDP: each GPU holds what one GPU would, plus DDP's all-reduce buckets, checked against PyTorch's own DDP."""

from __future__ import annotations

import pytest

from aegis.errors import InvalidConfigError
from aegis.planning.memory.estimate import estimate
from aegis.models.profiles import profile_from_config
from aegis.schema import LoRAConfig, TrainConfig

CONFIG = dict(model_type="llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=1024, max_position_embeddings=256)


def _ddp_bucket_bytes(model) -> int:
    """The bytes of the buckets torch's DistributedDataParallel allocates for ``model`` (a one-process gloo group)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(model)  # HF Trainer's kwargs leave gradient_as_bucket_view at its default
        data = ddp._get_ddp_logging_data()
        assert not data["gradient_as_bucket_view"]
        return sum(int(x) for x in str(data["bucket_sizes"]).split(",") if x)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("method", "precision"), [("full", "bf16"), ("full", "bf16_mixed"), ("lora", "bf16")])
def test_ddp_buckets_are_the_trainable_gradients_torch_allocates(method, precision):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_config = {k: v for k, v in CONFIG.items() if k != "model_type"}
    model = LlamaForCausalLM(LlamaConfig(**hf_config))  # untied head: the planner counts what the model trains
    model = model.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    lora = LoRAConfig(rank=8) if method == "lora" else None
    if lora is not None:
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=list(lora.target_modules)))
    profile = profile_from_config({**CONFIG, "tie_word_embeddings": False}, model_id="tiny", source="path")
    cfg = TrainConfig(method=method, precision=precision, micro_batch_size=1, seq_len=64, lora=lora)
    one = estimate(profile, cfg)
    ddp = estimate(profile, cfg, ddp=True)
    buckets = {c.key: c.bytes for c in ddp.components}["buckets"]
    assert buckets == _ddp_bucket_bytes(model)
    assert ddp.tensor_bytes == one.tensor_bytes + buckets  # resident from DDP's construction: in every moment


def test_ddp_and_fsdp_are_not_both_asked():
    profile = profile_from_config(CONFIG, model_id="tiny", source="path")
    with pytest.raises(InvalidConfigError, match="choose one"):
        estimate(profile, TrainConfig(method="full", micro_batch_size=1, seq_len=64), ddp=True, fsdp_shards=2)
