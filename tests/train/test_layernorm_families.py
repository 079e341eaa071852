"""The contract every LayerNorm family keeps with transformers and PEFT, over one table of tiny configs: Phi-1/1.5/2
(``phi``, ``phi_qk``), StarCoder2, StableLM (sequential, parallel), GPT-NeoX (parallel on two LayerNorms, sequential)
Falcon (multi-query on one LayerNorm, ``new_decoder_architecture``, sequential) GPT-2 (learned positions, Conv1D
linears under ``transformer.h.{i}``) OPT (learned positions offset by 2, ``model.decoder.layers.{i}``) GPT-BigCode (StarCoder: GPT-2's layout in
nn.Linear, multi-query or per-head q/k/v) and Cohere (Command R: the parallel block on weight-only LayerNorms, RoPE over
adjacent pairs, scaled logits; ``use_qk_norm``'s LayerNorm weight per head; Cohere 2's sliding layers with RoPE and
global layers without), OLMo 1 (LayerNorms with no parameter, ``clip_qkv``) and GPT-J (Phi's block under GPT-2's names,
RoPE over adjacent pairs of the first ``rotary_dim`` dims, an lm_head bias). For each:

- (planner == engine tree == transformers' meta-device count, in total and per layer, for the tiny configs and every
  bundled config: tests/models/test_three_way_counts.py, the one home of that property;)
- every parameter's gradient equals torch autograd's through transformers' model, and the training loss is torch's
  cross-entropy;
- a checkpoint round trip keeps transformers' names (``model.final_layernorm``, ``gpt_neox.*`` and ``embed_out``,
  ``transformer.h.{i}.self_attention.*``, ``ln_attn``/``ln_mlp``, a tied head left out) and transformers reloads it
  to the same logits;
- LoRA sizes: planner == PEFT == the engine for "all-linear", the plan's defaults (the models' own module names) and
  a few named modules; PEFT loads the engine's adapter to the engine's logits.

Family-specific behaviour (defaults, refusals, the catalog's names) is in test_plain_mlp_families.py,
test_stablelm.py, test_gpt_neox.py and test_falcon.py; logits parity in test_parity.py; dropouts in
test_model_dropout.py."""

from __future__ import annotations

import pytest
from aegis.models import catalog
from conftest import tiny_config
from family_checks import (
    check_checkpoint_round_trip,
    check_every_gradient_matches_torch,
    check_lora_sizes_equal_peft,
    check_peft_loads_the_engines_adapter,
    check_training_loss_is_torch_cross_entropy,
)

_NEOX = ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")
DEFAULT_TARGETS = {  # model type -> (the plan's default LoRA targets, a few named modules)
    "phi": (("q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"), ("q_proj", "v_proj")),
    "starcoder2": (("q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"), ("q_proj", "v_proj")),
    "stablelm": (("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), ("q_proj", "v_proj")),
    "gpt_neox": (_NEOX, ("query_key_value",)),
    "falcon": (_NEOX, ("query_key_value",)),
    "gpt2": (("c_attn", "c_proj", "c_fc"), ("c_attn",)),  # Conv1D: PEFT wraps them fan_in_fan_out
    "opt": (("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"), ("q_proj", "v_proj")),
    "gpt_bigcode": (("c_attn", "c_proj", "c_fc"), ("c_attn",)),
    "cohere": (("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), ("q_proj", "v_proj")),
    "cohere2": (("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), ("q_proj", "v_proj")),
    "olmo": (("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), ("q_proj", "v_proj")),
    "gptj": (("q_proj", "k_proj", "v_proj", "out_proj", "fc_in", "fc_out"), ("q_proj", "v_proj")),
}
NAMES = ["phi", "phi_qk", "starcoder2", "stablelm", "stablelm_parallel", "gpt_neox", "gpt_neox_sequential", "falcon",
         "falcon_new", "falcon_sequential", "gpt2", "gpt2_inner", "opt", "opt_nobias", "gpt_bigcode",
         "gpt_bigcode_mha", "cohere", "cohere_qk", "cohere2", "cohere2_types", "olmo", "olmo_clip", "gptj", "gptj_full"]
BUNDLED = [m for m in catalog.models() if catalog.read_model_config(m)["model_type"] in DEFAULT_TARGETS]
ADAPTERS = [  # (tiny config, modules adapted with random B)
    ("phi", ("dense", "fc2", "q_proj")),  # the parallel block's dense and fc2
    ("stablelm_parallel", ("o_proj", "down_proj", "q_proj")),
    ("gpt_neox", ("query_key_value", "dense_4h_to_h")),  # LoRA B rows in the per-head q/k/v layout
    ("gpt_neox_sequential", ("query_key_value", "dense_4h_to_h")),
    ("falcon", ("query_key_value", "dense_4h_to_h")),  # multi-query: [q; k; v]
    ("falcon_new", ("query_key_value", "dense_4h_to_h")),  # grouped per key/value head
    ("gpt2", ("c_attn", "c_proj", "c_fc")),  # Conv1D weights [in, out]; c_proj in attention and the MLP
    ("gpt2_inner", ("c_attn", "c_proj")),
    ("opt", ("out_proj", "fc1", "q_proj")),  # fc1/fc2 sit on the layer itself (no mlp. module)
    ("gpt_bigcode", ("c_attn", "c_proj")),  # multi-query: [q; k; v]
    ("gpt_bigcode_mha", ("c_attn", "c_fc")),  # [q_h; k_h; v_h] per head
    ("cohere", ("o_proj", "down_proj", "q_proj")),  # the parallel block's outputs; q rotated over adjacent pairs
    ("cohere_qk", ("q_proj", "k_proj", "up_proj")),  # adapted q and k go through the per-head LayerNorms
    ("cohere2", ("q_proj", "k_proj", "down_proj")),  # q and k rotated on sliding layers, not on global ones
    ("olmo", ("q_proj", "down_proj")),  # no norm parameters at all; a tied head
    ("olmo_clip", ("q_proj", "k_proj", "v_proj")),  # the adapted projections are clamped after the adapter's delta
    ("gptj", ("q_proj", "k_proj", "fc_out")),  # adapted q and k rotated over adjacent pairs of their first dims
    ("gptj_full", ("k_proj", "out_proj", "fc_in")),
]


@pytest.mark.parametrize("name", NAMES)
def test_every_gradient_matches_torch_autograd(name, hf_checkpoint):
    check_every_gradient_matches_torch(*hf_checkpoint(name))


@pytest.mark.parametrize("name", NAMES)
def test_the_training_loss_is_torch_cross_entropy(name, hf_checkpoint):
    check_training_loss_is_torch_cross_entropy(*hf_checkpoint(name))


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_keeps_transformers_names_and_values(name, hf_checkpoint, tmp_path):
    check_checkpoint_round_trip(*hf_checkpoint(name), tmp_path / "saved")


@pytest.mark.parametrize("name", NAMES)
def test_lora_adapter_sizes_equal_peft_and_the_engine(name):
    config = tiny_config(name)
    defaults, few = DEFAULT_TARGETS[config["model_type"]]
    check_lora_sizes_equal_peft(config, defaults, few)


@pytest.mark.parametrize(("name", "targets"), ADAPTERS, ids=[n for n, _ in ADAPTERS])
def test_peft_loads_the_engines_adapter_to_the_engines_logits(name, targets, hf_checkpoint, tmp_path):
    check_peft_loads_the_engines_adapter(*hf_checkpoint(name), targets, tmp_path / "adapter")
