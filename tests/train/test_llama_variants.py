"""Gemma 1, OLMo 2 and Granite: planner, engine and transformers agree on parameters, checkpoints and LoRA.

Logits parity with transformers is in test_parity.py (their tiny configs are in conftest.TINY_CONFIGS);
here (the three parameter counts are tests/models/test_three_way_counts.py's, for every tiny and bundled config): a transformers checkpoint
loaded into JAX and saved back unchanged (and read by transformers), and LoRA adapter sizes equal to
PEFT's for "all-linear" and the plan's default targets.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny_config
from family_checks import meta_model

from aegis.models import catalog
from aegis.models.profiles import profile_from_config
from aegis.schema import default_lora_targets
from aegis.train.modeling import build_model
from aegis.train.weights import load_checkpoint, save_checkpoint, to_hf_state_dict

NAMES = ["gemma", "olmo2", "granite"]
BUNDLED = [m for m in catalog.models() if catalog.read_model_config(m)["model_type"] in NAMES]


def test_the_catalog_serves_the_new_families():
    assert {"gemma", "olmo2"} <= {catalog.read_model_config(m)["model_type"] for m in BUNDLED}
    assert catalog.find_model("gemma-7b").id == "google/gemma-7b"
    assert catalog.find_model("OLMo-2-1124-13B-Instruct").id == "allenai/OLMo-2-1124-13B"


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_keeps_transformers_names_and_values(name, hf_checkpoint, tmp_path):
    """load_checkpoint then save_checkpoint writes transformers' own tensors (tied heads left out), which
    transformers loads back to the same logits."""
    from transformers import AutoModelForCausalLM

    hf, folder = hf_checkpoint(name)
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    ours = to_hf_state_dict(model, params)
    theirs = {k: v.numpy() for k, v in hf.state_dict().items()}
    if model.spec.tie_embeddings:
        theirs.pop("lm_head.weight")
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)
    out = save_checkpoint(model, params, tmp_path / "saved")
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    ids = torch.arange(3, 19).reshape(1, 16)
    with torch.no_grad():
        np.testing.assert_allclose(reloaded(ids).logits.numpy(), hf(ids).logits.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_lora_adapter_sizes_equal_peft(name):
    """The planner's adapter count equals PEFT's on the transformers model for "all-linear" and for the plan's
    default targets (the seven q/k/v/o/gate/up/down projections in these families)."""
    import peft

    import aegis

    config = tiny_config(name)
    profile = profile_from_config(config, model_id=name, source="path")
    defaults = default_lora_targets(profile.linear_modules)
    assert defaults == aegis.schema.ALL_LINEAR_TARGETS
    for targets in (("all-linear",), defaults):
        hf = meta_model(config)
        peft_targets = "all-linear" if targets == ("all-linear",) else list(targets)
        wrapped = peft.get_peft_model(hf, peft.LoraConfig(r=8, target_modules=peft_targets))
        trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        assert profile.trainable_params("lora", aegis.LoRAConfig(rank=8, target_modules=targets)) == trainable


@pytest.mark.parametrize("model_id", [m.id for m in BUNDLED])
def test_memory_estimates_run_for_the_bundled_models(model_id):
    import aegis

    est = aegis.estimate_memory(model_id, method="qlora", micro_batch_size=2, seq_len=1024)
    assert est.total_bytes > 0
