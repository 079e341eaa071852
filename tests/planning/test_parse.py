"""Free-text requests → PlanRequest: a corpus of phrasings, catalog-wide alias properties, arbitrary text."""

import random
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aegis.models import catalog
from aegis.errors import RequestParseError
from aegis.planning.hardware import find_gpu
from aegis.models.resolve import canonical_model_id, match_model, resolve_model
from aegis.planning.parse import MAX_REQUEST_CHARS, ParsedRequest, parse_request, parse_request_lenient
from aegis.schema import PlanRequest as R

LLAMA8, LLAMA70 = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"
QWEN7, MIXTRAL, MISTRAL = "Qwen/Qwen2.5-7B", "mistralai/Mixtral-8x7B-v0.1", "mistralai/Mistral-7B-v0.3"


def _bundled(hub_id: str, else_id: str) -> str:
    """The catalog entry serving ``hub_id`` (an instruct checkpoint may have its own), else its sibling's."""
    entry = catalog.model_entry(hub_id)
    return entry.id if entry is not None else else_id


QWEN7_INSTRUCT = _bundled("Qwen/Qwen2.5-7B-Instruct", QWEN7)
LLAMA8_INSTRUCT = _bundled("meta-llama/Llama-3.1-8B-Instruct", LLAMA8)

CORPUS = [
    ("qlora llama-3.1-8b on 3090 with ./data/support.jsonl",
     R(model=LLAMA8, method="qlora", gpu="rtx-3090", dataset="./data/support.jsonl")),
    ("full finetune qwen2.5-7b on 2x a100 80gb, seq 4096, 3 epochs",
     R(model=QWEN7, method="full", gpu="a100-80gb", gpu_count=2, seq_len=4096, epochs=3)),
    ("lora r=32 mixtral 8x7b on h100 bs 2",
     R(model=MIXTRAL, method="lora", gpu="h100-sxm", lora_rank=32, micro_batch_size=2)),
    ("fine-tune Llama 3.1 8B with LoRA rank 64 on an RTX 4090 using tatsu-lab/alpaca",
     R(model=LLAMA8, method="lora", gpu="rtx-4090", lora_rank=64, dataset="tatsu-lab/alpaca")),
    ("qlora mistral 7b 4x h100 seq_len=8192 8-bit adam grad ckpt",
     R(model=MISTRAL, method="qlora", gpu="h100-sxm", gpu_count=4, seq_len=8192, optimizer="adamw_8bit",
       gradient_checkpointing=True)),
    ("gemma-2-9b lora on a10g, no gradient checkpointing, batch size 4, effective batch 32",
     R(model="google/gemma-2-9b", method="lora", gpu="a10g", gradient_checkpointing=False, micro_batch_size=4,
       effective_batch_size=32)),
    ("8 x H100 full fine-tune llama 3.1 70b", R(model=LLAMA70, method="full", gpu="h100-sxm", gpu_count=8)),
    ("phi-3 mini qlora 3060 2 epochs",
     R(model="microsoft/Phi-3-mini-4k-instruct", method="qlora", gpu="rtx-3060-12gb", epochs=2)),
    ("Can I fine-tune qwen2.5 7b with lora on a single 4090?",
     R(model=QWEN7, method="lora", gpu="rtx-4090", gpu_count=1)),
    ("qlora Llama-3.1-8B on a T4, micro batch 1, global batch 64, max length 2048",
     R(model=LLAMA8, method="qlora", gpu="t4", micro_batch_size=1, effective_batch_size=64, seq_len=2048)),
    ("train mistralai/Mistral-7B-v0.3 with lora on l4 using data/train.csv, mbs=2, gradient accumulation 8",
     R(model=MISTRAL, method="lora", gpu="l4", dataset="data/train.csv", micro_batch_size=2, effective_batch_size=16)),
    ("lora_r=16 lora_alpha=32 gemma2 2b on rtx 3060 12gb, adamw_8bit, 4k context",
     R(model="google/gemma-2-2b", method="lora", lora_rank=16, gpu="rtx-3060-12gb", optimizer="adamw_8bit", seq_len=4096)),
    ("full fine-tuning of llama 3.2 1b on 8 gpus, fp16, adafactor",
     R(model="meta-llama/Llama-3.2-1B", method="full", gpu_count=8, precision="fp16_mixed", optimizer="adafactor")),
    ("full-parameter sft Qwen/Qwen3-8B on b200, per_device_train_batch_size=8, num_train_epochs=2",
     R(model="Qwen/Qwen3-8B", method="full", gpu="b200", micro_batch_size=8, epochs=2)),
    ("4-bit lora llama3.1:70b on h100 80gb x 2, without checkpointing, sgd",
     R(model=LLAMA70, method="qlora", gpu="h100-sxm", gpu_count=2, gradient_checkpointing=False, optimizer="sgd")),
    ("qlora qwen2.5 14b on a100, r64, bs 1, seq 2048, one epoch, paged adamw 8bit",
     R(model="Qwen/Qwen2.5-14B", method="qlora", gpu="a100-80gb", lora_rank=64, micro_batch_size=1, seq_len=2048,
       epochs=1, optimizer="paged_adamw_8bit")),
    ("lora gemma 3 4b on mi300x with ~/datasets/chat.parquet, 2048 tokens",
     R(model="google/gemma-3-4b-pt", method="lora", gpu="mi300x", dataset="~/datasets/chat.parquet", seq_len=2048)),
    ("qlora ./models/my-llama/config.json on 3090 with /data/x.jsonl",
     R(model="./models/my-llama/config.json", method="qlora", gpu="rtx-3090", dataset="/data/x.jsonl")),
    ("lora qwen3-30b-a3b on two 4090s, paged adamw, bf16 mixed",
     R(model="Qwen/Qwen3-30B-A3B", method="lora", gpu="rtx-4090", gpu_count=2, optimizer="paged_adamw_8bit",
       precision="bf16_mixed")),
    ("lora meta-llama/Llama-3.1-8B on 4 h100s with yahma/alpaca-cleaned ctx 8k",
     R(model=LLAMA8, method="lora", gpu="h100-sxm", gpu_count=4, dataset="yahma/alpaca-cleaned", seq_len=8192)),
    ("fft myorg/custom-7b on h200 x8 using HuggingFaceH4/ultrachat_200k fp32 1.5 epochs",
     R(model="myorg/custom-7b", method="full", gpu="h200", gpu_count=8, dataset="HuggingFaceH4/ultrachat_200k",
       precision="fp32", epochs=1.5)),
    ("what GPU do I need for qwen2.5-72b full fine-tune with bf16?",
     R(model="Qwen/Qwen2.5-72B", method="full", precision="bf16")),
    ("lora llama 3.1 8b 8xH100", R(model=LLAMA8, method="lora", gpu="h100-sxm", gpu_count=8)),
    ("lora llama 3.1 8b H100x8", R(model=LLAMA8, method="lora", gpu="h100-sxm", gpu_count=8)),
    ("lora llama 3.1 8b on 2 x rtx 4090", R(model=LLAMA8, method="lora", gpu="rtx-4090", gpu_count=2)),
    ("lora llama 3.1 8b 4×A100", R(model=LLAMA8, method="lora", gpu="a100-80gb", gpu_count=4)),
    ("lora llama 3.1 8b dual 3090", R(model=LLAMA8, method="lora", gpu="rtx-3090", gpu_count=2)),
    ("lora llama 3.1 8b on a pair of 3090s", R(model=LLAMA8, method="lora", gpu="rtx-3090", gpu_count=2)),
    ("lora llama 3.1 8b on 1x a100 40gb", R(model=LLAMA8, method="lora", gpu="a100-40gb", gpu_count=1)),
    ("qlora llama 3.1 8b on nvidia geforce rtx 3090", R(model=LLAMA8, method="qlora", gpu="rtx-3090")),
    ("qlora llama 3.1 8b on v100 32gb", R(model=LLAMA8, method="qlora", gpu="v100-32gb")),
    ("lora-r16 llama 3.1 8b, ckpt off", R(model=LLAMA8, method="lora", lora_rank=16, gradient_checkpointing=False)),
    ("lora llama 3.1 8b with r 8 and 3 epochs", R(model=LLAMA8, method="lora", lora_rank=8, epochs=3)),
    ("lora llama-3.1-8b, gradient checkpointing on, max_seq_length=1024",
     R(model=LLAMA8, method="lora", gradient_checkpointing=True, seq_len=1024)),
    ("lora llama-3.1-8b on an A100-SXM4-80GB", R(model=LLAMA8, method="lora", gpu="a100-80gb")),
    ("lora llama-3.1-8b on H100 PCIe 80GB", R(model=LLAMA8, method="lora", gpu="h100-pcie")),
    ("qlora llama-3.1-8b lora rank of 256 seq len 512", R(model=LLAMA8, method="qlora", lora_rank=256, seq_len=512)),
    ("qlora llama-3.1-8b sequence length 1.5k, 0.5 epochs", R(model=LLAMA8, method="qlora", seq_len=1536, epochs=0.5)),
    ("qlora mixtral 8x7b on 8xa100", R(model=MIXTRAL, method="qlora", gpu="a100-80gb", gpu_count=8)),
    ("lora llama-3.1-8b batch size 4 x 8 accumulation",
     R(model=LLAMA8, method="lora", micro_batch_size=4, effective_batch_size=32)),
    ("train llama 3.1 8b, full, on 4 h100 gpus", R(model=LLAMA8, method="full", gpu="h100-sxm", gpu_count=4)),
    ("llama 3.1 8b full precision lora", R(model=LLAMA8, method="lora", precision="fp32")),
    ("lora Qwen2.5-7B-Instruct on 4090", R(model=QWEN7_INSTRUCT, method="lora", gpu="rtx-4090")),
    ("lora https://huggingface.co/Qwen/Qwen2.5-7B on 4090 with https://huggingface.co/datasets/tatsu-lab/alpaca",
     R(model=QWEN7, method="lora", gpu="rtx-4090", dataset="tatsu-lab/alpaca")),
    ("lora llama-3.1-8b on 4090 with data.jsonl", R(model=LLAMA8, method="lora", gpu="rtx-4090", dataset="data.jsonl")),
    ("lora llama-3.1-8b on 4090 using my_data/", R(model=LLAMA8, method="lora", gpu="rtx-4090", dataset="my_data/")),
    ("lora ./checkpoints/my-model on 4090 with ./data.jsonl",
     R(model="./checkpoints/my-model", method="lora", gpu="rtx-4090", dataset="./data.jsonl")),
    ("lora llama 3.1 8b on 2 gpus with dataset imdb", R(model=LLAMA8, method="lora", gpu_count=2, dataset="imdb")),
    ("lora llama-3.1-8b, gradient_checkpointing=false, bf16 amp",
     R(model=LLAMA8, method="lora", gradient_checkpointing=False, precision="bf16_mixed")),
    ("lora llama-3.1-8b on h100 with activation checkpointing, 3 epochs on 5000 samples",
     R(model=LLAMA8, method="lora", gpu="h100-sxm", gradient_checkpointing=True, epochs=3)),
    ("LoRA on Mixtral-8x7B-v0.1, 4 x L40S, adamw, micro_batch_size: 2, seq=2048",
     R(model=MIXTRAL, method="lora", gpu="l40s", gpu_count=4, optimizer="adamw", micro_batch_size=2, seq_len=2048)),
    ("qwen1.5-moe-a2.7b q-lora on rtx5090", R(model="Qwen/Qwen1.5-MoE-A2.7B", method="qlora", gpu="rtx-5090")),
    ("Full FT of Llama-3.2-3B on a Tesla V100, 3 epochs, fp16 mixed precision",
     R(model="meta-llama/Llama-3.2-3B", method="full", gpu="v100-16gb", epochs=3, precision="fp16_mixed")),
    ("nf4 lora gemma3 1b on l4, rank 8",
     R(model="google/gemma-3-1b-pt", method="qlora", gpu="l4", lora_rank=8)),
    ("qlora qwen3 0.6b on a10g 24gb, bs=16, 512 token sequences, two epochs, with HuggingFaceH4/no_robots",
     R(model="Qwen/Qwen3-0.6B", method="qlora", gpu="a10g", micro_batch_size=16, seq_len=512, epochs=2,
       dataset="HuggingFaceH4/no_robots")),
    ("lora mistral-7b-v0.3 on H200, grad accumulation 4, micro batch 8, use paged adamw 32bit",
     R(model=MISTRAL, method="lora", gpu="h200", micro_batch_size=8, effective_batch_size=32, optimizer="adamw")),
    ("4 a100s, llama-3.1-70b, qlora, ZeRO-3", R(model=LLAMA70, method="qlora", gpu="a100-80gb", gpu_count=4, zero_stage=3)),
    ("lora llama-3.1-8b, mixed precision with fp16, grad ckpt = 1",
     R(model=LLAMA8, method="lora", precision="fp16_mixed", gradient_checkpointing=True)),
    ("gradient checkpointing 1 epochs on mi300 x2", R(gradient_checkpointing=True, epochs=1, gpu="mi300x", gpu_count=2)),
    ("lora LLaMA-3.1-8B, 3 × 4090, 2k seq, bs=1, r=8, AdamW 8bit, no gc",
     R(model=LLAMA8, method="lora", gpu="rtx-4090", gpu_count=3, seq_len=2048, micro_batch_size=1, lora_rank=8,
       optimizer="adamw_8bit", gradient_checkpointing=False)),
    ("Plan QLoRA for Mixtral 8x7B on one H100 80GB with gradient checkpointing and paged 8-bit AdamW",
     R(model=MIXTRAL, method="qlora", gpu="h100-sxm", gpu_count=1, gradient_checkpointing=True,
       optimizer="paged_adamw_8bit")),
    ("I want to finetune llama3.1 8b instruct on my 3090 with my own data at ./d/train.jsonl. Will it fit at 16k context?",
     R(model=LLAMA8_INSTRUCT, gpu="rtx-3090", dataset="./d/train.jsonl", seq_len=16384)),
    ("qlora on 3090 using meta-llama/Llama-3.1-8B with tatsu-lab/alpaca",
     R(model=LLAMA8, method="qlora", gpu="rtx-3090", dataset="tatsu-lab/alpaca")),
    ("train on my-org/my-data the model my-org/my-model", R(model="my-org/my-model", dataset="my-org/my-data")),
    ("lora llama 3.1 8b on 4090, max_steps 1000, save every 500 steps, eval batch size 8, lr 2e-4, 10% warmup",
     R(model=LLAMA8, method="lora", gpu="rtx-4090")),
    ("lora llama 3.1 8b on 4090, learning rate 1e-5, weight decay 0.1, bs 2",
     R(model=LLAMA8, method="lora", gpu="rtx-4090", micro_batch_size=2)),
    ("gpu: h100, model: qwen2.5-1.5b, method: lora, epochs: 2, rank: 8",
     R(model="Qwen/Qwen2.5-1.5B", method="lora", gpu="h100-sxm", epochs=2, lora_rank=8)),
    ("qlora llama-3.1-8b on 3090, lora on all linear layers",
     R(model=LLAMA8, method="qlora", gpu="rtx-3090", lora_targets=("all-linear",))),
    ("lora r=16 mixtral-8x7b on h100 target_modules: all-linear",
     R(model=MIXTRAL, method="lora", gpu="h100-sxm", lora_rank=16, lora_targets=("all-linear",))),
    ("lora qwen2.5-7b on a100 80gb, attention only",
     R(model=QWEN7, method="lora", gpu="a100-80gb", lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))),
    ("hello there", R()),
    ("", R()),
]


@pytest.mark.parametrize(("text", "expected"), CORPUS, ids=[t[:60] for t, _ in CORPUS])
def test_corpus(text, expected):
    assert parse_request(text) == expected


def test_corpus_is_large_and_distinct():
    texts = [t for t, _ in CORPUS]
    assert len(set(texts)) == len(texts) >= 45


# ------------------------------------------------------------------------------ errors and issues


@pytest.mark.parametrize(
    ("text", "part", "says"),
    [
        ("qlora llama-3.1-8b on 3900", "gpu", ["'3900'", "rtx-3090", "aegis gpus"]),
        ("lora on l40 with mixtral", "gpu", ["'l40'", "l40s"]),
        ("plan lora llama-3.1-8b on a 3900", "gpu", ["'3900'", "rtx-3090"]),
        ("plan lora llama-3.1-8b on an h300", "gpu", ["'h300'", "h200"]),
        ("lora llama 3.1 8b on 2x rtx 3080", "gpu", ["'rtx 3080'", "rtx-3090"]),
        ("lora deepseek 7b on 4090", "model", ["'deepseek 7b'", "config.json"]),
        ("fine tune deepseek-v4 on 4090", "model", ["'deepseek-v4'", "config.json"]),
        ("lora gemma-3-19b on h100", "model", ["'gemma-3-19b'", "google/gemma-3-", "--model ./path/config.json"]),
        ("lora llama-3.1-8b mixed precision fp32", "precision", ["fp32", "keep one"]),
        ("qlora lama-8b on 3090", "model", ["'lama-8b'", LLAMA8, "aegis models"]),
        ("lora llama 19b on a100", "model", ["'llama 19b'", "aegis models"]),
        ("teach a small qwen to write SQL on my 4090", "model", ["'small qwen'", "which qwen", "Qwen/"]),
        ("lora mixtral on 3090 or 4090", "gpu", ["rtx-3090", "rtx-4090", "keep one"]),
        ("lora qwen2.5 7b and llama 3.1 8b on 4090", "model", [QWEN7, LLAMA8]),
        ("lora mistral on a100 40gb, 3 epochs, then 2 epochs", "epochs", ["3", "2", "keep one"]),
        ("qlora llama-3.1-8b on 3090 bs 0", "micro_batch_size", ["'bs 0'", "out of range"]),
        ("qlora llama-3.1-8b rank 5000", "lora_rank", ["4096"]),
        ("full lora llama-3.1-8b", "method", ["full", "lora"]),
        ("lora llama-3.1-8b bf16/fp16", "precision", ["fp16_mixed", "bf16"]),
        ("lora llama-3.1-8b bs=4, grad_accum=8, global batch 64", "effective_batch_size", ["32", "64"]),
        ("lora llama-3.1-8b 2x 4090 on 4 gpus", "gpu_count", ["2", "4"]),
        ("x" * (MAX_REQUEST_CHARS + 1), "request", [str(MAX_REQUEST_CHARS)]),
    ],
)
def test_unknown_or_ambiguous_parts_name_the_part_and_the_fix(text, part, says):
    result = parse_request_lenient(text)
    assert part in [issue.part for issue in result.issues]
    with pytest.raises(RequestParseError) as err:
        parse_request(text)
    message = str(err.value)
    assert "\n" not in message
    for fragment in says:
        assert fragment in message


def test_a_count_before_an_unknown_gpu_is_not_a_second_unknown_gpu():
    issues = parse_request_lenient("lora llama-3.1-8b on 2x 3900").issues
    assert [(i.part, i.text) for i in issues] == [("gpu", "3900")]


def test_unknown_gpu_message_comes_from_the_catalog_lookup():
    with pytest.raises(Exception) as lookup:
        find_gpu("3900")
    result = parse_request_lenient("qlora llama-3.1-8b on 3900")
    issue = next(i for i in result.issues if i.part == "gpu")
    assert issue.message == str(lookup.value)
    assert "rtx-3090" in issue.suggestions
    assert result.request.model == LLAMA8 and result.request.gpu is None  # the rest is still read


def test_unknown_model_suggestions_are_catalog_ids():
    result = parse_request_lenient("qlora lama-8b on 3090")
    issue = next(i for i in result.issues if i.part == "model")
    ids = {m.id for m in catalog.models()}
    assert issue.suggestions and set(issue.suggestions) <= ids
    assert issue.suggestions[0] == LLAMA8
    assert result.request.gpu == "rtx-3090"


def test_lenient_reports_notes_and_unparsed_words():
    result = parse_request_lenient("lora llama-3.1-8b on 4090, mixed precision, with lots of love")
    assert result.ok and result.request.precision == "bf16_mixed"
    assert any("bf16_mixed" in note for note in result.notes)
    assert "love" in result.unparsed and "lots" in result.unparsed
    assert "lora" not in result.unparsed and "on" not in result.unparsed


def test_settings_the_planner_does_not_use_are_noted_not_misread():
    result = parse_request_lenient("lora llama 3.1 8b on 4090, eval batch size 8, lora_alpha=32, seed 42")
    assert result.ok and result.request == R(model=LLAMA8, method="lora", gpu="rtx-4090")
    assert any("eval batch size 8" in note and "seed 42" in note for note in result.notes)


@pytest.mark.parametrize("name", ["gemma-2-9b-it", "llama-3.1-8b-chat", "qwen2.5-7b-chat"])
def test_instruct_variant_is_noted(name):
    """An instruct/base sibling planned with another bundled config says which config it is."""
    from aegis.models.resolve import match_model

    found = match_model(name)
    result = parse_request_lenient(f"lora {name} on a10g")
    assert result.request.model == found.model_id
    if found.note:
        assert found.note.startswith(f"{found.model_id} (config used for {name})") and found.note in result.notes


def test_local_model_folder_with_config_is_a_model(tmp_path):
    plain = tmp_path / "rows"
    plain.mkdir()
    model_dir = tmp_path / "tiny-llama"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    request = parse_request(f"lora {plain} on 4090 with {model_dir}")
    assert request.model == str(model_dir)
    assert request.dataset == str(plain)


def test_flags_win_over_text():
    parsed = parse_request("qlora llama-3.1-8b on 3090 bs 4")
    flags = R(gpu="rtx-4090", micro_batch_size=2)
    merged = parsed.merged(flags)
    assert merged == R(model=LLAMA8, method="qlora", gpu="rtx-4090", micro_batch_size=2)


# ------------------------------------------------------------------------ catalog-wide properties

MODEL_NAMES = [(name, m.id) for m in catalog.models() for name in (m.id, m.id.split("/", 1)[1], *m.aliases)]
GPU_NAMES = [(name, g.id) for g in catalog.gpus() for name in (g.id, g.name, *g.aliases)]


@pytest.mark.parametrize(("name", "model_id"), MODEL_NAMES)
def test_every_model_alias_parses_to_its_catalog_id(name, model_id):
    assert canonical_model_id(name) == model_id  # the loader agrees: the parser reads the same catalog
    # the request names the weights the name means (an -Instruct sibling keeps its own repo), whose config is
    # the entry's
    weights = match_model(name).weights_id
    assert parse_request(f"lora {name} on 4090").model == weights
    assert parse_request(f"qlora {name.upper()}").model == weights
    assert resolve_model(weights).model_id == model_id


@pytest.mark.parametrize(("name", "gpu_id"), GPU_NAMES)
def test_every_gpu_name_parses_to_its_catalog_id(name, gpu_id):
    assert find_gpu(name).id == gpu_id
    request = parse_request(f"lora llama-3.1-8b on 2x {name}")
    assert (request.gpu, request.gpu_count) == (gpu_id, 2)


_PHRASES = {
    "method": {"qlora": "qlora", "lora": "LoRA", "full": "full fine-tune"},
    "lora_rank": "r={}",
    "micro_batch_size": "batch size {}",
    "effective_batch_size": "effective batch {}",
    "seq_len": "seq_len={}",
    "epochs": "{} epochs",
    "optimizer": {"adamw": "adamw", "adamw_8bit": "8-bit adam", "paged_adamw_8bit": "paged adamw", "sgd": "sgd",
                  "adafactor": "adafactor"},
    "gradient_checkpointing": {True: "gradient checkpointing", False: "no gradient checkpointing"},
    "precision": {"bf16": "bf16", "bf16_mixed": "bf16 mixed", "fp16_mixed": "fp16", "fp32": "fp32"},
}


@st.composite
def _requests(draw):
    """A random request and one way of writing it, its parts in random order."""
    fields = {}
    parts = []
    if draw(st.booleans()):
        alias, _ = draw(st.sampled_from(MODEL_NAMES))
        fields["model"] = match_model(alias).weights_id  # the weights the name means (its config: the entry's)
        parts.append(alias)
    if draw(st.booleans()):
        name, fields["gpu"] = draw(st.sampled_from(GPU_NAMES))
        if draw(st.booleans()):
            fields["gpu_count"] = draw(st.integers(1, 64))
            name = draw(st.sampled_from(["{n}x {g}", "{n} x {g}", "{g} x{n}", "{n}× {g}"])).format(n=fields["gpu_count"], g=name)
        parts.append("on " + name)
    if draw(st.booleans()):
        fields["dataset"] = draw(st.sampled_from(["./data/chat.jsonl", "~/d/train.parquet", "/srv/rows.csv"]))
        parts.append("with " + fields["dataset"])
    for key, phrase in _PHRASES.items():
        if not draw(st.booleans()):
            continue
        if isinstance(phrase, dict):
            fields[key] = draw(st.sampled_from(sorted(phrase, key=str)))
            parts.append(phrase[fields[key]])
        else:
            value = draw(st.integers(1, 4096) if key != "epochs" else st.sampled_from([1, 2, 3, 0.5, 1.5, 10]))
            fields[key] = value
            parts.append(phrase.format(value))
    order = draw(st.permutations(parts))
    joiner = draw(st.sampled_from([", ", " ", "; "]))
    return joiner.join(order), R(**fields)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_requests())
def test_generated_requests_round_trip(case):
    text, expected = case
    assert parse_request(text) == expected


# ------------------------------------------------------------------------------- arbitrary text

_WORDY = st.lists(
    st.sampled_from(
        ["lora", "qlora", "full", "llama", "8b", "3.1", "on", "with", "x", "2x", "h100", "a100", "80gb", "bs", "r", "=",
         "seq", "4k", "epochs", "1.5", "0", "-", "/", "./", ".jsonl", "config.json", "org/name", "gpus", "no", "grad",
         "ckpt", "adam", "8-bit", "paged", "fp16", "bf16", "mixed", "rank", "batch", "size", "effective", "×", ",",
         "3090", "3900", "qwen", "mixtral", "gemma", "phi", "data", "dataset", "two", "s", "k", "b", "m", "999999999999999"]
    ),
    max_size=25,
).map(" ".join)


def _check_never_raises_unexpectedly(text: str) -> None:
    result = parse_request_lenient(text)
    assert isinstance(result, ParsedRequest)
    try:
        request = parse_request(text)
    except RequestParseError as err:
        assert result.issues and str(err)
    else:
        assert not result.issues and request == result.request


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_raises(text):
    _check_never_raises_unexpectedly(text)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(_WORDY)
def test_request_like_noise_never_raises(text):
    _check_never_raises_unexpectedly(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=string.ascii_letters + string.digits + " ,.-_/=:x", max_size=200))
def test_ascii_junk_never_raises(text):
    _check_never_raises_unexpectedly(text)


def _zen_words() -> list[str]:
    import codecs
    import this  # noqa: F401  (prints the Zen once; its text is English prose with no request in it)

    return codecs.decode(this.s, "rot13").replace("--", " ").split()


def test_prose_and_junk_mostly_give_empty_requests(capsys):
    words = _zen_words()
    capsys.readouterr()
    rng = random.Random(0)
    prose = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 30))) for _ in range(500)]
    junk = ["".join(rng.choice(string.ascii_letters + string.digits + "     ,.-_") for _ in range(rng.randint(0, 80)))
            for _ in range(500)]

    def empty(text):
        result = parse_request_lenient(text)
        return result.ok and result.request == R()

    assert all(empty(text) for text in prose)
    assert sum(map(empty, junk)) >= 0.9 * len(junk)


def test_plain_prose_gives_an_empty_request():
    text = "Could you please tell me whether my job will fit and how long it will take to run?"
    result = parse_request_lenient(text)
    assert result.ok and result.request == R()



def test_a_leading_word_is_not_part_of_an_unknown_model_name() -> None:
    """'what about mistral-small-24b?': the name starts at its family word; a glued word stays ('dolphin-mistral')."""
    result = parse_request_lenient("what about mistral-small-24b?")
    assert [i.text for i in result.issues] == ["mistral-small-24b"]
    assert [i.text for i in parse_request_lenient("lora dolphin-mistral:7b on h100").issues] == ["dolphin-mistral:7b"]


# ---- numbers are read whole, with their sign, unit and fraction, and checked against one range per setting ------

@pytest.mark.parametrize(
    ("text", "part", "says"),
    [
        ("lora llama-3.1-8b on 3090 bs -2", "micro_batch_size", ["micro batch size -2", "'bs -2'", "1 to 65536"]),
        ("lora llama-3.1-8b on 3090 bs=-4", "micro_batch_size", ["-4"]),
        ("lora llama-3.1-8b on -2x 3090", "gpu_count", ["GPU count -2", "'-2x 3090'", "1 to 4096"]),
        ("lora llama-3.1-8b on -2 gpus", "gpu_count", ["GPU count -2"]),
        ("lora llama-3.1-8b on h100 num_gpus=-3", "gpu_count", ["GPU count -3"]),
        ("lora llama-3.1-8b on 1.5x 3090", "gpu_count", ["GPU count 1.5", "whole number"]),
        ("lora llama-3.1-8b on h100 x 100000", "gpu_count", ["GPU count 100000", "1 to 4096"]),
        ("lora llama-3.1-8b on 3090 seq 1000000000", "seq_len", ["sequence length 1000000000", "1 to 16777216"]),
        ("lora llama-3.1-8b on 3090 seq 1e9", "seq_len", ["sequence length 1000000000"]),
        ("lora llama-3.1-8b on 3090 seq -512", "seq_len", ["sequence length -512"]),
        ("lora llama-3.1-8b on 3090 seq 4kb", "seq_len", ["'4kb'", "unit 'kb'", "4k"]),
        ("lora llama-3.1-8b on 3090 rank 0.5", "lora_rank", ["LoRA rank 0.5", "whole number"]),
        ("lora llama-3.1-8b on 3090 rank -8", "lora_rank", ["LoRA rank -8", "1 to 4096"]),
        ("lora llama-3.1-8b on 3090 bs 99999999999999999999", "micro_batch_size", ["99999999999999999999"]),
        ("lora llama-3.1-8b on 3090 -3 epochs", "epochs", ["epochs -3"]),
        ("lora llama-3.1-8b on 3090 epochs 1e999", "epochs", ["'1e999'", "out of range"]),
        ("lora llama-3.1-8b on 3090 dropout -0.1", "request", ["LoRA dropout -0.1", "0 to 0.99"]),
        ("lora llama-3.1-8b on 3090 transformers 99", "request", ["'99'", "4.x or 5.x"]),
        ("lora llama-3.1-8b on a100 100gb", "gpu", ["'a100 100gb'", "a100-40gb (40 GB)", "a100-80gb (80 GB)"]),
        ("lora llama-3.1-8b on 3090 12gb", "gpu", ["'3090 12gb'", "rtx-3090 (24 GB)"]),
    ],
)
def test_signs_fractions_units_and_huge_numbers_are_refused_naming_value_and_range(text, part, says):
    result = parse_request_lenient(text)
    assert part in [issue.part for issue in result.issues], result
    message = str(pytest.raises(RequestParseError, parse_request, text).value)
    assert "\n" not in message
    for fragment in says:
        assert fragment in message


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("lora llama-3.1-8b on h100 rank-16", {"lora_rank": 16}),  # a '-' glued to a word is a separator
        ("lora llama-3.1-8b on h100 seq 4,096", {"seq_len": 4096}),
        ("lora llama-3.1-8b on h100 seq 2.5k", {"seq_len": 2560}),
        ("lora llama-3.1-8b on h100 seq 8k tokens", {"seq_len": 8192}),
        ("lora llama-3.1-8b on 3090 epochs 2", {"gpu": "rtx-3090", "epochs": 2}),  # not 3090 epochs
        ("lora llama-3.1-8b on 3090 seq 512", {"gpu": "rtx-3090", "seq_len": 512}),
        ("lora llama-3.1-8b on 4096x h100", {"gpu_count": 4096}),
        ("lora llama-3.1-8b on h100 transformers 4.48.1", {"transformers_version": "4.48.1"}),
        ("lora llama-3.1-8b on a100 40gb", {"gpu": "a100-40gb"}),
        ("lora llama-3.1-8b on 3090 24gb, bs 2", {"gpu": "rtx-3090", "micro_batch_size": 2}),
    ],
)
def test_numbers_in_range_are_read_as_typed(text, fields):
    request = parse_request(text)
    assert {k: getattr(request, k) for k in fields} == fields


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(min_value=-10**12, max_value=10**12), form=st.sampled_from(["bs {}", "bs={}", "batch size {}",
                                                                                "micro batch {}"]))
def test_a_micro_batch_is_read_whole_or_refused_naming_it(n, form):
    """Whatever the integer, the request reads exactly it (1 to 65536) or refuses it naming it: never a part of it."""
    result = parse_request_lenient(f"lora llama-3.1-8b on h100 {form.format(n)}")
    if 1 <= n <= 65536:
        assert result.ok and result.request.micro_batch_size == n
    else:
        assert result.request.micro_batch_size is None
        assert [i.part for i in result.issues] == ["micro_batch_size"] and str(n) in result.issues[0].message


def test_transformers_versions_are_4x_or_5x():
    from aegis.planning.parse import transformers_version_problem

    for ok in ("4", "4.48", "4.48.1", "5", "5.0.0rc1", "v4.57.1", "4.x"):
        assert transformers_version_problem(ok) is None, ok
    for bad in ("99", "3.36", "6", "latest", "", "4.48.1.2", "-4"):
        assert "4.x or 5.x" in transformers_version_problem(bad), bad


@pytest.mark.parametrize("text", ["rank 64 / an a100", "qlora llama-3.1-8b on 3090 \\ bs 2", "lora qwen2.5-7b . on h100",
                                  "lora qwen2.5-7b .. ~ on h100"])
def test_a_lone_separator_is_not_a_path(text: str) -> None:
    """'/' exists on every machine, but a slash between two requests' words names no dataset."""
    assert parse_request_lenient(text).request.dataset is None
