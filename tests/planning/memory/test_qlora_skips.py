"""Which layer linears bitsandbytes leaves unquantised, against transformers' own choice
(`transformers.quantizers.base.get_keys_to_not_convert`: the tied modules, the output embedding, and the module of the
model's last named parameter). A tied model whose final norm has no parameter (OLMo-1B) keeps its last layer's
last linear in full precision; every other bundled layout keeps none."""

from __future__ import annotations

import pytest

from aegis.models import catalog
from aegis.models.resolve import resolve_model

ONE_PER_MODEL_TYPE = list({catalog.read_model_config(m)["model_type"]: m for m in catalog.models()}.values())
TIED = [m for m in catalog.models() if resolve_model(m.id).tie_word_embeddings and not resolve_model(m.id).is_moe]
CASES = list({m.id: m for m in ONE_PER_MODEL_TYPE + TIED}.values())


def _transformers_skips(config: dict) -> set[str]:
    """Short names of the decoder-layer modules transformers keeps out of 4-bit quantisation."""
    import torch
    import transformers
    from transformers.quantizers.base import get_keys_to_not_convert

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    head = model.get_output_embeddings()
    linears = {name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear) and module is not head}
    return {k.rsplit(".", 1)[-1] for k in get_keys_to_not_convert(model) if k in linears}


@pytest.mark.parametrize("entry", CASES, ids=[m.id for m in CASES])
def test_the_planner_leaves_unquantised_the_layer_linears_transformers_skips(entry):
    profile = resolve_model(entry.id)
    quantised = {m.name for m in profile.linear_modules if m.quantizable}
    planned = {m.name.rsplit(".", 1)[-1] for m in profile.linear_modules if not m.quantizable and m.name in quantised}
    assert planned == _transformers_skips(catalog.read_model_config(entry))


def test_olmo_1b_keeps_its_last_down_proj_and_only_that():
    profile = resolve_model("allenai/OLMo-1B-hf")
    kept = [m for m in profile.linear_modules if m.name == "down_proj" and not m.quantizable]
    assert [m.count for m in kept] == [1]
    assert sum(m.count for m in profile.linear_modules if m.name == "down_proj") == profile.num_layers
