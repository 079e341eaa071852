"""Trainer-config emitters: each output loads back with the plan's values under names the trainer documents."""

from __future__ import annotations

import ast
import inspect
import runpy

import peft
import pytest
import transformers
import yaml
from transformers.training_args import OptimizerNames

from aegis.errors import InvalidConfigError, NothingFitsError
from aegis.models.resolve import resolve_model
from aegis.planning.memory.estimate import estimate
from aegis.planning.planner import plan
from aegis.schema import ALL_LINEAR_TARGETS
from aegis.planning.report import EMIT_KINDS, emit

# Top-level keys of axolotl's config reference (https://docs.axolotl.ai/docs/config-reference.html).
AXOLOTL_KEYS = {
    "base_model", "load_in_4bit", "load_in_8bit", "adapter", "lora_r", "lora_alpha", "lora_dropout",
    "lora_target_modules", "datasets", "chat_template", "val_set_size", "output_dir", "sequence_len",
    "sample_packing", "pad_to_sequence_len", "micro_batch_size", "gradient_accumulation_steps", "num_epochs",
    "optimizer", "lr_scheduler", "learning_rate", "warmup_ratio", "max_grad_norm", "bf16", "fp16", "tf32",
    "gradient_checkpointing", "gradient_checkpointing_kwargs", "flash_attention", "sdp_attention",
    "chunked_cross_entropy", "fsdp_version", "fsdp_config", "logging_steps", "saves_per_epoch", "seed",
}
AXOLOTL_DATASET_KEYS = {"path", "ds_type", "type", "field_messages", "message_property_mappings", "roles"}
# Named parameters of unsloth's FastLanguageModel (unsloth/models/loader.py; unsloth is not installed here).
UNSLOTH_FROM_PRETRAINED = {"model_name", "max_seq_length", "dtype", "load_in_4bit", "load_in_8bit", "full_finetuning", "token",
                           "device_map", "rope_scaling", "fix_tokenizer", "trust_remote_code", "use_gradient_checkpointing"}
UNSLOTH_GET_PEFT_MODEL = {"r", "target_modules", "lora_alpha", "lora_dropout", "bias", "use_gradient_checkpointing",
                          "random_state", "use_rslora", "loftq_config", "modules_to_save"}


def _calls(source: str, name: str) -> list[ast.Call]:
    tree = ast.parse(source)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if called == name:
                out.append(node)
    return out


def _literal_kwargs(call: ast.Call) -> dict:
    out = {}
    for kw in call.keywords:
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            out[kw.arg] = ast.unparse(kw.value)
    return out


def test_axolotl_yaml(example_report):
    cfg = example_report.recommended.config
    data = yaml.safe_load(emit(example_report, "axolotl"))
    assert set(data) <= AXOLOTL_KEYS
    assert data["base_model"] == example_report.model.model_id
    assert data["adapter"] == "qlora" and data["load_in_4bit"] is True
    assert data["lora_r"] == cfg.lora_config.rank and data["lora_alpha"] == cfg.lora_config.alpha
    assert data["lora_dropout"] == cfg.lora_config.dropout
    assert data["lora_target_modules"] == list(cfg.lora_config.target_modules)
    assert data["sequence_len"] == cfg.seq_len
    assert data["micro_batch_size"] == cfg.micro_batch_size
    assert data["gradient_accumulation_steps"] == cfg.gradient_accumulation_steps
    assert data["num_epochs"] == example_report.epochs
    assert data["gradient_checkpointing"] is cfg.gradient_checkpointing
    assert data["sdp_attention"] is (cfg.attention == "sdpa") and data["flash_attention"] is (cfg.attention == "flash")
    assert data["optimizer"] in {o.value for o in OptimizerNames}
    [ds] = data["datasets"]
    assert set(ds) <= AXOLOTL_DATASET_KEYS
    assert ds["path"] == example_report.dataset.source and ds["ds_type"] == "json"
    # the example dataset is ShareGPT: axolotl's chat_template loader with from/value mappings
    assert ds["type"] == "chat_template" and ds["field_messages"] == "conversations"
    assert ds["message_property_mappings"] == {"role": "from", "content": "value"}


def test_axolotl_full_and_multi_gpu(full_report, multi_gpu_report):
    full = yaml.safe_load(emit(full_report, "axolotl"))
    assert "adapter" not in full and "lora_r" not in full and full["load_in_4bit"] is False
    assert "datasets" not in full  # no dataset given: left as a comment to fill in
    lora = yaml.safe_load(emit(multi_gpu_report, "axolotl"))
    assert lora["adapter"] == "lora" and lora["load_in_4bit"] is False
    assert ("fsdp_config" in lora) == (multi_gpu_report.multi_gpu.assumed == "fsdp")


def _field_names(cls) -> set[str]:
    """Keyword names ``cls(...)`` accepts by name (a catch-all ``**kwargs`` does not count)."""
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}


def test_hf_script_compiles_with_real_argument_names(example_report, multi_gpu_report, full_report):
    for report in (example_report, multi_gpu_report, full_report):
        source = emit(report, "hf")
        compile(source, "train_hf.py", "exec")
        cfg = report.recommended.config
        [args] = _calls(source, "TrainingArguments")
        kwargs = _literal_kwargs(args)
        assert set(kwargs) <= _field_names(transformers.TrainingArguments)
        assert kwargs["per_device_train_batch_size"] == cfg.micro_batch_size
        assert kwargs["gradient_accumulation_steps"] == cfg.gradient_accumulation_steps
        assert kwargs["num_train_epochs"] == report.epochs
        assert kwargs["gradient_checkpointing"] is cfg.gradient_checkpointing
        assert kwargs["optim"] in {o.value for o in OptimizerNames}
        lora_calls = _calls(source, "LoraConfig")
        bnb_calls = _calls(source, "BitsAndBytesConfig")
        if report.method == "full":
            assert not lora_calls and not bnb_calls
            continue
        lora = _literal_kwargs(lora_calls[0])
        assert set(lora) <= _field_names(peft.LoraConfig)
        assert lora["r"] == cfg.lora_config.rank and lora["target_modules"] == list(cfg.lora_config.target_modules)
        if report.method == "qlora":
            bnb = _literal_kwargs(bnb_calls[0])
            assert set(bnb) <= _field_names(transformers.BitsAndBytesConfig)
            assert bnb["load_in_4bit"] is True and bnb["bnb_4bit_quant_type"] == "nf4"
        else:
            assert not bnb_calls


def test_hf_script_data_helpers(example_report, tmp_path):
    """The generated script's own helpers turn every dataset format into chat messages and pad batches."""
    path = tmp_path / "train_hf.py"
    path.write_text(emit(example_report, "hf"))
    ns = runpy.run_path(str(path), run_name="aegis_emitted")
    to_messages, collate = ns["to_messages"], ns["collate"]
    user_asst = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert to_messages({"instruction": "q", "input": "", "output": "a"}, "alpaca") == user_asst
    assert to_messages({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}, "sharegpt") == user_asst
    assert to_messages({"messages": user_asst}, "messages") == user_asst
    assert to_messages({"prompt": "q", "completion": "a"}, "prompt_completion") == user_asst
    assert to_messages({"text": "t"}, "text") is None
    batch = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [8, -100, -100]]
    assert ns["SEQ_LEN"] == example_report.recommended.config.seq_len


def test_unsloth_script(example_report, full_report):
    source = emit(example_report, "unsloth")
    compile(source, "train_unsloth.py", "exec")
    cfg = example_report.recommended.config
    load = _literal_kwargs(_calls(source, "from_pretrained")[0])
    assert set(load) <= UNSLOTH_FROM_PRETRAINED
    assert load["max_seq_length"] == "SEQ_LEN" and load["load_in_4bit"] is True
    assert f"SEQ_LEN = {cfg.seq_len}" in source
    peft_kwargs = _literal_kwargs(_calls(source, "get_peft_model")[0])
    assert set(peft_kwargs) <= UNSLOTH_GET_PEFT_MODEL
    assert peft_kwargs["r"] == cfg.lora_config.rank
    assert peft_kwargs["target_modules"] == list(cfg.lora_config.target_modules)
    assert peft_kwargs["use_gradient_checkpointing"] == ("unsloth" if cfg.gradient_checkpointing else False)
    full = emit(full_report, "unsloth")
    compile(full, "train_unsloth.py", "exec")
    assert "full_finetuning=True" in full and "get_peft_model" not in full


def test_emit_errors(example_report, nothing_fits_report):
    with pytest.raises(NothingFitsError, match="nothing to emit"):
        emit(nothing_fits_report, "axolotl")
    with pytest.raises(InvalidConfigError, match="axolotl, hf, unsloth"):
        emit(example_report, "deepspeed")  # type: ignore[arg-type]
    assert EMIT_KINDS == ("axolotl", "hf", "unsloth")


def _tiny_model_folder(folder, texts):
    """A 2-layer Llama with a BPE tokenizer trained on ``texts`` and a chat template, saved like a hub model."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=fast.pad_token_id, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)


def _chat_data_and_tiny_model(tmp_path, n: int):
    """A chat JSONL of ``n`` rows and a tiny Llama folder whose tokenizer is trained on it."""
    import json

    rows = [{"messages": [{"role": "user", "content": f"what is {i} plus {i}?"},
                          {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]} for i in range(n)]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    model_dir = tmp_path / "tiny"
    _tiny_model_folder(model_dir, [m["content"] for r in rows for m in r["messages"]])
    return data, model_dir


@pytest.mark.slow
@pytest.mark.parametrize("targets", [None, ("all-linear",)], ids=["default", "all-linear"])
def test_hf_script_trains_a_tiny_model(targets, tmp_path, monkeypatch):
    """The emitted LoRA script runs end to end on CPU: tokenizes, trains two steps, saves the adapter (with
    all-linear too: PEFT takes it as the bare string)."""
    import json

    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    data, model_dir = _chat_data_and_tiny_model(tmp_path, 24)
    script = tmp_path / "train_hf.py"
    report = plan("lora qwen2.5-7b on 2x a100 80gb", lora_targets=targets)
    script.write_text(emit(report, "hf"))
    ns = runpy.run_path(str(script), run_name="aegis_emitted")
    out = tmp_path / "out"
    ns["main"](["--model", str(model_dir), "--data", str(data), "--output-dir", str(out), "--max-steps", "2", "--cpu"])
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    saved = json.loads((out / "adapter_config.json").read_text())
    cfg = report.recommended.config.lora_config
    expected = ALL_LINEAR_TARGETS if targets else cfg.target_modules  # all-linear: every projection of the tiny llama
    names = {t.rsplit(".", 1)[-1] for t in saved["target_modules"]}  # PEFT saves all-linear as module paths
    assert saved["r"] == cfg.rank and names == set(expected)


@pytest.mark.parametrize("request_text", [
    "lora qwen2.5-0.5b on t4", "qlora llama-3.1-8b on 3090", "full qwen2.5-0.5b on a100", "lora llama-3.2-1b fp32 on a100",
    "full qwen2.5-0.5b fp16 mixed on v100-32gb",
])
def test_the_plan_is_sized_under_the_autocast_the_emitted_flags_turn_on(request_text):
    """bf16=True / fp16=True make accelerate wrap the forward in torch.autocast (Accelerator.native_amp), whatever
    dtype the weights load in; an fp32 run has neither flag. Every tier the report sizes assumes the same."""
    report = plan(request_text)
    kwargs = _literal_kwargs(_calls(emit(report, "hf"), "TrainingArguments")[0])
    tiers = [t for t in (report.recommended, report.aggressive, *report.fallbacks) if t is not None]
    assert tiers and {t.config.autocast_effective for t in tiers} == {kwargs["bf16"] or kwargs["fp16"]}


@pytest.mark.parametrize(("trainer", "kind", "autocast"), [
    ("hf", "hf", True), ("trl", "hf", True), ("axolotl", "axolotl", True), ("unsloth", "unsloth", True), ("peft", "hf", False),
])
def test_the_emitted_precision_flags_follow_the_trainers_autocast(trainer, kind, autocast):
    """Every Trainer-based stack autocasts under bf16=True; a plain PEFT loop does not, and the script emitted for its
    plan trains the bf16 model as loaded, as the plan sized it."""
    report = plan("qlora llama-3.2-1b on a100", trainer=trainer, detect_stack=False)
    assert all(t.config.autocast_effective is autocast for t in (report.recommended, *report.fallbacks))
    text = emit(report, kind)
    flags = yaml.safe_load(text)["bf16"] if kind == "axolotl" else _literal_kwargs(_calls(text, "TrainingArguments")[0])["bf16"]
    assert flags is autocast


def test_mixed_precision_always_runs_under_autocast():
    """fp32 (or fp16) master weights train under autocast whatever the flag says; a plan saved with the old
    ``autocast: false`` default still loads and sizes the step the Trainer runs."""
    from aegis.schema import TrainConfig

    for precision in ("bf16_mixed", "fp16_mixed"):
        assert TrainConfig(method="full", precision=precision, autocast=False).autocast_effective


def test_a_plan_sized_without_autocast_emits_neither_flag():
    """``autocast=False`` (a pure bf16 step) is sized without autocast, and the script it emits sets neither
    bf16 nor fp16, so the Trainer runs the bf16 model as loaded; mixed precision without autocast is refused."""
    with_ac, without = plan("lora llama-3.2-1b on a100"), plan("lora llama-3.2-1b on a100", autocast=False)
    assert without.recommended.config.autocast_effective is False
    kwargs = _literal_kwargs(_calls(emit(without, "hf"), "TrainingArguments")[0])
    assert (kwargs["bf16"], kwargs["fp16"]) == (False, False)
    same = without.recommended.config.model_copy(update={"autocast": None})
    assert estimate(resolve_model("llama-3.2-1b"), same).tensor_bytes != without.recommended.memory.tensor_bytes
    assert with_ac.recommended.config.autocast_effective
    with pytest.raises(InvalidConfigError, match="autocast"):
        plan("lora qwen2.5-0.5b on t4", autocast=False)


@pytest.mark.slow
@pytest.mark.parametrize(("request_text", "base", "flags"), [
    ("lora qwen2.5-0.5b on t4", "float16", (False, True)),  # no bf16 tensor cores: fp16 base, loss-scaled fp16
    ("lora qwen2.5-0.5b on a100", "bfloat16", (True, False)),
    ("full qwen2.5-0.5b fp16 mixed on v100-32gb", "float32", (False, True)),  # fp32 master weights, fp16 autocast
])
def test_the_emitted_script_loads_the_dtypes_the_plan_sized(request_text, base, flags, tmp_path, monkeypatch):
    """What transformers and PEFT load from the emitted script has the dtypes the report's breakdown states (the
    base 2 bytes under LoRA in either half precision, fp32 adapters; fp32 master weights for mixed full
    fine-tuning), and the fp16 plan trains on CPU with the Trainer's loss scaling."""
    import datasets
    import torch

    from aegis.planning.report._facts import dtype_facts

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    data, model_dir = _chat_data_and_tiny_model(tmp_path, 16)
    report = plan(request_text)
    cfg = report.recommended.config
    source = emit(report, "hf")
    kwargs = _literal_kwargs(_calls(source, "TrainingArguments")[0])
    assert (kwargs["bf16"], kwargs["fp16"]) == flags
    assert cfg.autocast_effective, "the flags turn on accelerate's autocast: the plan must be sized under it"
    script = tmp_path / "train_hf.py"
    script.write_text(source)
    ns = runpy.run_path(str(script), run_name="aegis_emitted")
    model = ns["load_model"](str(model_dir))
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    frozen = {d for n, d in dtypes.items() if "lora_" not in n}
    assert frozen == {getattr(torch, base)}
    facts = dtype_facts(cfg)
    assert facts.base == {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[base]
    if cfg.method != "full":
        assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32} and facts.adapters == "fp32"
    if flags == (False, True) and cfg.method != "full":
        out = tmp_path / "out"
        ns["main"](["--model", str(model_dir), "--data", str(data), "--output-dir", str(out), "--max-steps", "2", "--cpu"])
        assert (out / "adapter_model.safetensors").exists()


@pytest.mark.slow
def test_the_emitted_fsdp_script_trains_under_torchrun(tmp_path):
    """A plan that shards LoRA over two GPUs emits a script the Trainer runs with FSDP: launched as its docstring
    says (torchrun, two processes; here on CPU over gloo), it trains two steps and saves the adapter."""
    import os
    import subprocess
    import sys

    report = plan("lora llama-3.1-70b on 2x h200", detect_stack=False)
    assert report.multi_gpu is not None and report.multi_gpu.assumed == "fsdp"
    source = emit(report, "hf")
    assert "torchrun --nproc_per_node 2 train_hf.py" in source
    data, model_dir = _chat_data_and_tiny_model(tmp_path, 16)
    script = tmp_path / "train_hf.py"
    script.write_text(source)
    out = tmp_path / "out"
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
         "--model", str(model_dir), "--data", str(data), "--output-dir", str(out), "--max-steps", "2", "--cpu"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out / "adapter_model.safetensors").exists()
