"""A transformers version that does not have the model's architecture: refused when given, a note when detected.

The first release of each model type is the architecture registry's ``transformers_since`` (measured on the PyPI
wheels); this checks the rule and that the installed transformers agrees with the table."""

from __future__ import annotations

import pytest

import aegis
import aegis.planning.stack as stack_mod
from aegis.models.architectures import registry
from aegis.errors import InvalidConfigError
from aegis.schema import StackProfile


@pytest.mark.parametrize(
    ("request_text", "version", "first"),
    [("lora gpt-oss-20b on h100", "4.48", "4.55.0"), ("qlora gemma-3-4b on a100", "4.48.1", "4.50.0"),
     ("lora qwen3-8b on h100", "4.50.3", "4.51.0"), ("lora deepseek-v2-lite on h100", "4.53", "4.54.0")],
)
def test_a_given_version_without_the_architecture_is_refused_in_one_line(request_text, version, first):
    with pytest.raises(InvalidConfigError) as err:
        aegis.plan(request_text, transformers_version=version)
    message = str(err.value)
    assert "\n" not in message and f"first in transformers {first}" in message and "--transformers" in message


@pytest.mark.parametrize(
    ("request_text", "version"),
    [("lora qwen3-8b on h100", "4.51.0"), ("lora qwen3-8b on h100", "4"), ("qlora mixtral-8x7b on a100", "4.48.1"),
     ("lora gpt-oss-20b on h100", "5")],
)
def test_versions_that_have_the_architecture_plan(request_text, version):
    report = aegis.plan(request_text, transformers_version=version)
    assert not any("has no" in n for n in report.notes)


def test_a_detected_old_version_is_a_note_not_an_error(monkeypatch):
    monkeypatch.setattr(stack_mod, "detect_stack", lambda: {"transformers_version": "4.46.3"})
    report = aegis.plan("lora qwen3-8b on h100")
    note = next(n for n in report.notes if "has no Qwen3ForCausalLM" in n)
    assert "4.51.0" in note and "upgrade" in note


def test_check_reads_the_registry_and_ignores_unknown_types():
    old = StackProfile(transformers_version="4.40.0")
    assert stack_mod.check_model_in_stack("phimoe", old, {"transformers_version": "detected"})
    assert stack_mod.check_model_in_stack("mamba", old, {"transformers_version": "given"}) is None
    assert stack_mod.check_model_in_stack("llama", old, {"transformers_version": "given"}) is None


def test_the_installed_transformers_is_not_older_than_any_entry_says():
    from importlib.metadata import version

    from transformers import CONFIG_MAPPING

    installed = stack_mod._release(version("transformers"))
    for entry in registry.all_entries():
        assert stack_mod._release(entry.transformers_since) <= installed, entry.model_type
        assert entry.model_type in CONFIG_MAPPING
