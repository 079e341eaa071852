"""The merged folder is a Hugging Face model transformers loads (config with the new depth, shards with
their index above the shard size, the tokenizer of tokenizer_source); bad inputs are one-line errors
naming the key, model or tensor, raised before anything is written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from aegis.errors import InvalidConfigError, OutputPathError
from aegis.forge import merge_models
from tests.forge.conftest import config_of, fill, read_folder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FRANKEN = {
    "merge_method": "passthrough",
    "slices": [
        {"sources": [{"model": "base", "layer_range": [0, 3]}]},
        {"sources": [{"model": "a", "layer_range": [1, 4]}]},
    ],
}
TIES = {
    "merge_method": "ties",
    "base_model": "base",
    "models": [{"model": "a", "parameters": {"weight": 1.0, "density": 0.5}}, {"model": "b", "parameters": {"weight": 0.5}}],
    "parameters": {"density": 0.7},
}


def _logits(folder, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits.numpy()


def test_frankenmerge_loads_with_the_new_depth_and_tokenizer(models, tmp_path):
    result = merge_models(fill(FRANKEN, models), tmp_path / "out")
    out = tmp_path / "out"
    assert result.num_layers == 6 and config_of(out)["num_hidden_layers"] == 6
    tensors = read_folder(out)
    a, base = read_folder(models["a"]), read_folder(models["base"])
    # layer 4 of the output is layer 2 of `a`; embeddings come from the first slice, the head from the last
    np.testing.assert_array_equal(tensors["model.layers.4.mlp.up_proj.weight"], a["model.layers.2.mlp.up_proj.weight"])
    np.testing.assert_array_equal(tensors["model.layers.1.self_attn.q_proj.weight"], base["model.layers.1.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(tensors["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    np.testing.assert_array_equal(tensors["lm_head.weight"], a["lm_head.weight"])
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok("please reset the password")["input_ids"]
    logits = _logits(out, ids)
    assert logits.shape == (1, len(ids), len(tok)) and np.isfinite(logits).all()
    assert tok.chat_template == transformers.AutoTokenizer.from_pretrained(models["base"]).chat_template
    assert (out / "mergekit_config.yml").is_file() and (out / "generation_config.json").is_file()


def test_shards_and_index_above_the_shard_size(models, tmp_path):
    single = merge_models(fill(TIES, models), tmp_path / "single")
    sharded = merge_models(fill(TIES, models), tmp_path / "sharded", max_shard_bytes=150_000)
    assert single.shards == ("model.safetensors",) and len(sharded.shards) > 2
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(sharded.shards)
    assert index["metadata"]["total_size"] == sharded.total_bytes == single.total_bytes
    assert all((tmp_path / "sharded" / f).stat().st_size < 150_000 + 20_000 for f in sharded.shards)
    ids = [5, 17, 42, 99, 3]
    np.testing.assert_array_equal(_logits(tmp_path / "single", ids), _logits(tmp_path / "sharded", ids))


def test_tokenizer_source_and_dtype(models, tmp_path):
    other = tmp_path / "other-tok"
    shutil.copytree(models["b"], other)
    cfg_path = other / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["model_max_length"] = 1234
    cfg_path.write_text(json.dumps(tok_cfg))
    cfg = fill({**TIES, "tokenizer_source": str(other), "dtype": "bfloat16", "out_dtype": "float16"}, models)
    merge_models(cfg, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["model_max_length"] == 1234
    assert config_of(tmp_path / "out")["dtype"] == "float16"
    assert {t.dtype for t in read_folder(tmp_path / "out").values()} == {np.dtype(np.float16)}


def test_relative_paths_resolve_from_the_yaml_folder(models, tmp_path):
    for name in ("base", "a"):
        shutil.copytree(models[name], tmp_path / "zoo" / name)
    (tmp_path / "zoo" / "merge.yml").write_text(
        "merge_method: slerp\nbase_model: base\nmodels:\n  - model: base\n  - model: a\nparameters:\n  t: [0, 1]\n"
    )
    result = merge_models(tmp_path / "zoo" / "merge.yml", tmp_path / "out")
    assert result.num_layers == 4
    assert (tmp_path / "out" / "mergekit_config.yml").read_text().startswith("merge_method: slerp")


def test_tied_embeddings_merge_with_untied_models(models, tmp_path, mergekit_merge):
    tied = tmp_path / "tied"
    shutil.copytree(models["b"], tied)
    tensors = {k: torch.from_numpy(v) for k, v in read_folder(tied).items() if k != "lm_head.weight"}
    from safetensors.torch import save_file

    save_file(tensors, tied / "model.safetensors", metadata={"format": "pt"})
    conf = config_of(tied)
    conf["tie_word_embeddings"] = True
    (tied / "config.json").write_text(json.dumps(conf))
    cfg = fill({"merge_method": "linear", "models": [
        {"model": "a", "parameters": {"weight": 0.5}}, {"model": str(tied), "parameters": {"weight": 0.5}}]}, models)
    merge_models(cfg, tmp_path / "aegis")
    ours = read_folder(tmp_path / "aegis")
    theirs = read_folder(mergekit_merge(cfg, tmp_path / "mergekit"))
    expect = 0.5 * read_folder(models["a"])["lm_head.weight"] + 0.5 * tensors["model.embed_tokens.weight"].numpy()
    np.testing.assert_allclose(ours["lm_head.weight"], expect, atol=1e-7)
    np.testing.assert_allclose(ours["lm_head.weight"], theirs["lm_head.weight"], atol=1e-6)


def test_unused_parameters_are_warnings(models, tmp_path):
    cfg = fill({"merge_method": "linear", "models": [
        {"model": "a", "parameters": {"weight": 1, "density": 0.5, "normalize": False}}, {"model": "b", "parameters": {"weight": 1}}]},
        models)
    result = merge_models(cfg, tmp_path / "out")
    assert any("models[0].parameters.density is not a parameter of linear" in w for w in result.warnings)
    assert any("models[0].parameters.normalize is one value per tensor" in w for w in result.warnings)


def _broken(models, tmp_path, what):
    """A copy of `a` with one defect."""
    from safetensors.torch import save_file

    dst = tmp_path / f"a-{what}"
    shutil.copytree(models["a"], dst)
    tensors = {k: torch.from_numpy(v) for k, v in read_folder(dst).items()}
    conf = config_of(dst)
    if what == "missing":
        del tensors["model.layers.1.mlp.down_proj.weight"]
    elif what == "shape":
        tensors["model.layers.2.self_attn.q_proj.weight"] = tensors["model.layers.2.self_attn.q_proj.weight"][:32]
    elif what == "arch":
        conf["architectures"], conf["model_type"] = ["MistralForCausalLM"], "mistral"
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(conf))
    return str(dst)


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({**TIES, "models": [{"model": "missing", "parameters": {"weight": 1}}]}, "tensor model.layers.1.mlp.down_proj.weight is missing from"),
        ({**TIES, "models": [{"model": "shape", "parameters": {"weight": 1}}]}, "tensor model.layers.2.self_attn.q_proj.weight: shapes differ"),
        ({**TIES, "models": [{"model": "arch", "parameters": {"weight": 1}}]}, "the models mix architectures"),
        ({**TIES, "models": [{"model": "a", "parameters": {"weight": 1, "desnity": 0.5}}]},
         "models[0].parameters: unknown parameter 'desnity'; did you mean 'density'?"),
        ({**TIES, "models": [{"model": "a"}]}, "missing parameter 'weight' for"),
        ({**TIES, "base_model": None}, "base_model: ties needs a base_model"),
        ({**TIES, "models": [{"model": "./no/such/folder", "parameters": {"weight": 1}}]}, "models[0].model: model folder ./no/such/folder does not exist"),
        ({"merge_method": "slerp", "base_model": "base", "parameters": {"t": 0.5},
          "models": [{"model": "base"}, {"model": "a"}, {"model": "b"}]}, "models: slerp merges exactly 2 models (the base included), got 3"),
        ({"merge_method": "linear", "base_model": "base", "models": [{"model": "a", "parameters": {"weight": 1}}]},
         "missing parameter 'weight' for"),
        ({"merge_method": "slerp", "base_model": "b", "parameters": {"t": 0.5}, "slices": [
            {"sources": [{"model": "base", "layer_range": [0, 4]}, {"model": "a", "layer_range": [0, 4]}]}]},
         "slices[0]: base_model"),
        ({"merge_method": "passthrough", "slices": [{"sources": [{"model": "a", "layer_range": [2, 6]}]}]},
         "slices[0].sources[0].layer_range: [2, 6] is past the end of"),
        ({"merge_method": "slerp", "base_model": "base", "parameters": {"t": 0.5}, "slices": [
            {"sources": [{"model": "base", "layer_range": [0, 2]}, {"model": "a", "layer_range": [0, 3]}]}]},
         "slices[0]: all sources of a slice must span the same number of layers (got 2, 3)"),
        ({"merge_method": "passthrough", "slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}, {"model": "b", "layer_range": [0, 2]}]}]},
         "slices[0]: passthrough merges exactly 1 model, got 2"),
        ({"merge_method": "slerp", "base_model": "base", "models": [{"model": "base"}, {"model": "a"}], "parameters": {"t": "half"}},
         "parameters.t: t 'half' is not a number"),
    ],
)
def test_bad_inputs_are_one_line_errors_and_write_nothing(models, tmp_path, cfg, message):
    names = {**models, **{w: _broken(models, tmp_path, w) for w in ("missing", "shape", "arch") if f"'{w}'" in repr(cfg)}}
    with pytest.raises(InvalidConfigError) as err:
        merge_models(fill(cfg, names), tmp_path / "out")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial*"))


def test_output_folder_is_not_clobbered(models, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(OutputPathError, match="is not empty and Aegis did not write it .it holds notes.txt.; pass --overwrite"):
        merge_models(fill(TIES, models), tmp_path / "out")
    merge_models(fill(TIES, models), tmp_path / "out", overwrite=True)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine" and (tmp_path / "out" / "model.safetensors").is_file()
    with pytest.raises(InvalidConfigError, match="is one of the input models"):
        merge_models(fill(TIES, models), models["a"], overwrite=True)


def test_per_layer_config_lists_follow_the_layers_taken(models, tmp_path):
    names = {}
    for name, tag in (("base", "x"), ("a", "y")):
        names[name] = tmp_path / name
        shutil.copytree(models[name], names[name])
        conf = config_of(names[name])
        conf["layer_types"] = [f"{tag}{i}" for i in range(4)]
        (names[name] / "config.json").write_text(json.dumps(conf))
    merge_models(fill(FRANKEN, names), tmp_path / "out")
    assert config_of(tmp_path / "out")["layer_types"] == ["x0", "x1", "x2", "y1", "y2", "y3"]


def test_public_names_import():
    import aegis.forge

    for name in aegis.forge.__all__:
        assert getattr(aegis.forge, name) is not None
    assert set(aegis.forge.merge_methods()) == {
        "linear", "slerp", "task_arithmetic", "ties", "dare_ties", "dare_linear", "passthrough"}
