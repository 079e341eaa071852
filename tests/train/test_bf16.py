"""Pure-bf16 full fine-tuning stays finite: Adam's arithmetic runs in fp32 (b2 = 0.999 is 1.0 in bf16)."""

import math

from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
from aegis.schema import TrainConfig
from aegis.train.data import load_jsonl
from aegis.train.loop import Trainer


def test_bf16_full_finetune_stays_finite_and_learns():
    examples = load_jsonl(toy_dataset_path(), ByteTokenizer())
    trainer = Trainer(tiny_llama_config(), TrainConfig(method="full", micro_batch_size=4, seq_len=128, precision="bf16"), examples)
    infos = list(trainer.train(5))
    assert not any(i.nan_or_inf for i in infos)
    assert all(math.isfinite(i.loss) for i in infos)
    assert infos[-1].loss < infos[0].loss
