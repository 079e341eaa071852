"""Merged tensors equal mergekit's for the same YAML (fp32 within 1e-6), for every method aegis implements.

mergekit runs in this process on the same tiny model folders; the test is skipped when it is not installed.
DARE's random masks cannot match draw for draw, so DARE runs here at density 1 (the masks keep everything
and the formula is checked); tests/forge/test_dare.py checks the masks statistically. TIES trimming of
half-precision tensors is checked in test_methods.py (ties between equal magnitudes may break otherwise).
"""

from __future__ import annotations

import pytest

from aegis.forge import merge_models
from tests.forge.conftest import config_of, fill, max_abs_diff, read_folder

T_FILTERED = [
    {"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
    {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]},
    {"value": 0.5},
]

CASES = {
    "linear": {
        "merge_method": "linear",
        "models": [
            {"model": "base", "parameters": {"weight": 0.5}},
            {"model": "a", "parameters": {"weight": 0.3}},
            {"model": "b", "parameters": {"weight": 0.2}},
        ],
    },
    "linear-gradient-unnormalized": {
        "merge_method": "linear",
        "models": [{"model": "a", "parameters": {"weight": [1, 0]}}, {"model": "b", "parameters": {"weight": [0, 1.5]}}],
        "parameters": {"normalize": False},
    },
    "linear-bf16": {
        "merge_method": "linear",
        "models": [{"model": "a", "parameters": {"weight": 1}}, {"model": "b", "parameters": {"weight": 2}}],
        "dtype": "bfloat16",
    },
    "linear-bf16-inexact-weights": {  # products that round: mergekit's addcmul_ rounds once (a fused multiply-add)
        "merge_method": "linear",
        "models": [{"model": "a", "parameters": {"weight": 0.6}}, {"model": "far", "parameters": {"weight": 0.4}}],
        "dtype": "bfloat16",
    },
    "slerp": {
        "merge_method": "slerp",
        "base_model": "base",
        "models": [{"model": "base"}, {"model": "far"}],
        "parameters": {"t": T_FILTERED},
    },
    "slerp-near-lerp": {
        "merge_method": "slerp",
        "base_model": "base",
        "models": [{"model": "base"}, {"model": "near"}],
        "parameters": {"t": 0.3},
    },
    "slerp-slices": {
        "merge_method": "slerp",
        "base_model": "base",
        "slices": [
            {"sources": [{"model": "base", "layer_range": [0, 2]}, {"model": "a", "layer_range": [0, 2]}],
             "parameters": {"t": [0.2, 0.8]}},
            {"sources": [{"model": "base", "layer_range": [2, 4]}, {"model": "a", "layer_range": [2, 4]}]},
        ],
        "parameters": {"t": T_FILTERED},
        "dtype": "float32",
    },
    "task_arithmetic": {
        "merge_method": "task_arithmetic",
        "base_model": "base",
        "models": [{"model": "a", "parameters": {"weight": 1.0}}, {"model": "b", "parameters": {"weight": 0.5}}],
        "parameters": {"lambda": 0.8},
    },
    "ties": {
        "merge_method": "ties",
        "base_model": "base",
        "models": [
            {"model": "base"},
            {"model": "a", "parameters": {"weight": 1.0, "density": 0.5}},
            {"model": "b", "parameters": {"weight": 0.7, "density": [0.3, 0.9]}},
        ],
    },
    "ties-filtered-unnormalized": {
        "merge_method": "ties",
        "base_model": "base",
        "models": [
            {"model": "a", "parameters": {"weight": 0.6, "density": [{"filter": "mlp", "value": 0.2}, {"value": 0.6}]}},
            {"model": "b", "parameters": {"weight": [0.2, 1.0]}},
            {"model": "far", "parameters": {"weight": 0.4, "density": 0.7}},
        ],
        "parameters": {"normalize": False, "int8_mask": True, "density": 0.4, "lambda": 1.1},
    },
    "task_arithmetic-bf16": {
        "merge_method": "task_arithmetic",
        "base_model": "base",
        "models": [{"model": "a", "parameters": {"weight": 0.7}}, {"model": "b", "parameters": {"weight": 0.4}}],
        "parameters": {"lambda": 0.9, "normalize": True},
        "dtype": "bfloat16",
    },
    "ties-fp16-untrimmed": {
        "merge_method": "ties",
        "base_model": "base",
        "models": [{"model": "a", "parameters": {"weight": 0.7}}, {"model": "far", "parameters": {"weight": 0.3}}],
        "dtype": "float16",
    },
    "dare_ties-density-1": {
        "merge_method": "dare_ties",
        "base_model": "base",
        "models": [{"model": "a", "parameters": {"weight": 0.6}}, {"model": "b", "parameters": {"weight": 0.4}}],
        "parameters": {"normalize": True},
    },
    "dare_linear-density-1": {
        "merge_method": "dare_linear",
        "base_model": "base",
        "models": [{"model": "a", "parameters": {"weight": 0.6}}, {"model": "b", "parameters": {"weight": 0.4}}],
    },
    "passthrough-frankenmerge": {
        "merge_method": "passthrough",
        "slices": [
            {"sources": [{"model": "base", "layer_range": [0, 3]}]},
            {"sources": [{"model": "a", "layer_range": [1, 4]}]},
        ],
    },
    "passthrough-scaled": {
        "merge_method": "passthrough",
        "slices": [
            {"sources": [{"model": "a", "layer_range": [0, 2]}]},
            {"sources": [{"model": "b", "layer_range": [2, 4], "parameters": {"scale": [{"filter": "o_proj", "value": 0.5}]}}]},
            {"sources": [{"model": "b", "layer_range": [3, 4]}]},
        ],
    },
}
TOLERANCE = {  # half precision: every operation rounds as torch's does, so the results are bit-identical
    "linear-bf16": 0.0, "linear-bf16-inexact-weights": 0.0, "task_arithmetic-bf16": 0.0, "ties-fp16-untrimmed": 0.0,
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_tensors_as_mergekit(case, models, mergekit_merge, tmp_path):
    cfg = fill(CASES[case], models)
    ours = merge_models(cfg, tmp_path / "aegis")
    theirs = mergekit_merge(cfg, tmp_path / "mergekit")

    diff = max_abs_diff(read_folder(tmp_path / "aegis"), read_folder(theirs))
    assert diff <= TOLERANCE.get(case, 1e-6), f"{case}: max |aegis - mergekit| = {diff:.3g}"
    ours_cfg, their_cfg = config_of(tmp_path / "aegis"), config_of(theirs)
    assert ours_cfg["num_hidden_layers"] == their_cfg["num_hidden_layers"] == ours.num_layers
    assert ours.tensors == len(read_folder(theirs))
