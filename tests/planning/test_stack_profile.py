"""The stack profile a plan is sized for: flags and SDK keywords, detection from package metadata, where each part
came from, the report and the emitted configs naming it."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest

import aegis
from aegis.planning import stack as stack_mod
from aegis.cli import main
from aegis.errors import InvalidConfigError
from aegis.planning.report.emit import emit
from aegis.planning.report.text import render_text
from aegis.schema import StackProfile


@pytest.fixture
def installed(monkeypatch, tmp_path):
    """Make ``sys.path`` one folder holding a ``{name}-{version}.dist-info`` for each of these distributions."""

    def use(dists: dict[str, str]):
        for name, version in dists.items():
            info = tmp_path / f"{name}-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
        monkeypatch.setattr(sys, "path", [str(tmp_path)])
        stack_mod.detect_stack.cache_clear()

    yield use
    stack_mod.detect_stack.cache_clear()


def test_detected_versions_agree_with_importlib_metadata():
    found = stack_mod.installed_versions(("transformers", "peft", "pydantic"))
    assert found == {name: metadata.version(name) for name in ("transformers", "peft", "pydantic")}


@pytest.mark.parametrize(
    ("dists", "trainer"),
    [
        ({"transformers": "4.48.1"}, None),
        ({"transformers": "4.48.1", "peft": "0.14.0", "trl": "0.14.0"}, "trl"),
        ({"transformers": "4.48.1", "trl": "0.14.0", "axolotl": "0.8.0"}, "axolotl"),
        ({"transformers": "4.48.1", "trl": "0.14.0", "axolotl": "0.8.0", "unsloth": "2025.1.5"}, "unsloth"),
    ],
)
def test_detection_reads_metadata_with_a_fixed_precedence(installed, dists, trainer):
    installed(dists)
    found = stack_mod.detect_stack()
    assert found.get("trainer") == trainer
    assert found["transformers_version"] == "4.48.1"


def test_given_beats_detected_beats_default(installed):
    installed({"transformers": "4.48.1", "unsloth": "2025.1.5"})
    stack, source = stack_mod.resolve_stack(trainer="trl")
    assert (stack.trainer, stack.transformers_version, stack.checkpointing) == ("trl", "4.48.1", "non_reentrant")
    assert source == {"trainer": "given", "transformers_version": "detected", "kbit_prep": "default",
                      "liger": "default", "checkpointing": "default"}
    stack, source = stack_mod.resolve_stack()
    assert (stack.trainer, stack.checkpointing, stack.kbit_prep_effective) == ("unsloth", "offload", False)
    stack, source = stack_mod.resolve_stack(detect=False)
    assert stack == StackProfile() and set(source.values()) == {"default"}


def test_nothing_installed_is_the_default(installed):
    installed({})
    assert stack_mod.resolve_stack()[0] == StackProfile()


@pytest.mark.parametrize("bad", [{"trainer": "deepspeed"}, {"transformers_version": "3.2"}, {"checkpointing": "sometimes"}])
def test_bad_stack_settings_are_one_line_errors(bad):
    with pytest.raises(InvalidConfigError) as err:
        stack_mod.resolve_stack(detect=False, **bad)
    assert "\n" not in str(err.value)


def test_kbit_prep_default_follows_the_trainer():
    assert [StackProfile(trainer=t).kbit_prep_effective for t in ("hf", "trl", "axolotl", "peft", "unsloth")] == \
        [True, True, True, False, False]
    assert StackProfile(trainer="peft", kbit_prep=True).kbit_prep_effective


def test_sdk_keywords_size_the_plan_for_that_stack():
    kw = dict(model="llama-3.1-8b", method="qlora", gpu="a100-80gb", seq_len=2048, micro_batch_size=2,
              gradient_checkpointing=True, detect_stack=False)
    trl = aegis.plan(trainer="trl", transformers_version="4.48.1", **kw)
    peft = aegis.plan(trainer="peft", transformers_version="4.48.1", **kw)
    assert trl.stack == StackProfile(trainer="trl", transformers_version="4.48.1")
    assert trl.stack_source["trainer"] == "given" and trl.stack_source["liger"] == "default"
    assert trl.recommended.config.stack == trl.stack
    assert peft.recommended.memory.tensor_bytes < trl.recommended.memory.tensor_bytes
    text = render_text(trl)
    assert ("Stack: TRL SFTTrainer (given), transformers 4.48.1 (given), k-bit prep: fp32 norms, bf16 embeddings/head "
            "(TRL casts them back under bf16=True), bf16=True: bf16 autocast LoRA:") in " ".join(text.split())  # wrapped lines
    explained = render_text(trl, explain=True)
    assert "shifted fp32 copy of the logits" in explained and "prepare_model_for_kbit_training" in explained


def test_lora_dropout_reaches_the_estimate():
    kw = dict(model="llama-3.2-1b", method="lora", gpu="a100-80gb", seq_len=1024, micro_batch_size=4,
              gradient_checkpointing=False, detect_stack=False)
    with_dropout = aegis.plan(lora_dropout=0.1, **kw).recommended
    without = aegis.plan(**kw).recommended
    assert with_dropout.config.lora.dropout == 0.1
    assert with_dropout.memory.tensor_bytes > without.memory.tensor_bytes


def test_emitted_configs_name_the_profile_and_follow_it():
    report = aegis.plan(model="llama-3.1-8b", method="qlora", gpu="a100-80gb", trainer="peft",
                        transformers_version="4.48.1", gradient_checkpointing=True, detect_stack=False)
    hf = emit(report, "hf")
    assert "Sized for the stack: plain PEFT loop (given), transformers 4.48.1 (given), no k-bit prep: bf16 embeddings/head/norms" in hf
    assert "prepare_model_for_kbit_training(model" not in hf and "NOTE:" not in hf
    unsloth = emit(report, "unsloth")
    assert "NOTE: the plan was sized for peft, this config runs unsloth" in unsloth
    axolotl = emit(report.model_copy(update={"stack": StackProfile(trainer="axolotl", liger=True)}), "axolotl")
    assert "# Sized for the stack: axolotl" in axolotl and "liger_fused_linear_cross_entropy: true" in axolotl


def test_cli_flags(capsys):
    main(["plan", "qlora llama-3.1-8b on a100 80gb", "--trainer", "trl", "--transformers", "4.48", "--lora-dropout", "0.1"])
    out = capsys.readouterr().out
    assert "Stack: TRL SFTTrainer (given), transformers 4.48 (given)" in out
    assert "dropout 0.1" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--trainer", "deepspeed"], "trainer"),
    (["--transformers", "3.0"], "transformers"),
])
def test_cli_bad_stack_flags_are_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "qlora llama-3.1-8b on 3090", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
