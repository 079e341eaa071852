"""DFS merges (arXiv 2403.13187 §3.2): the folder ``aegis merge`` writes gives the logits of the source models'
layers run in the DFS order with the paper's input scaling, computed here in torch from the source models."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from aegis.errors import InvalidConfigError
from aegis.forge import merge_models
from aegis.forge.dfs import DFSParameters, dfs_path
from tests.forge.conftest import config_of, fill, read_folder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IDS = [5, 17, 42, 99, 3, 250, 7, 61]
# 4 + 4 stacked layers (M = 8), walked twice (T = 16)
INDICATOR = [1, 1, 0, 0, 0, 1, 1, 0,
             0, 0, 1, 0, 1, 0, 0, 1]
SCALES = [{"from": 1, "to": 5, "value": 0.8}, {"from": 5, "to": 6, "value": 1.3},
          {"from": 6, "to": 2, "value": 0.6}, {"from": 4, "to": 7, "value": 1.7}]


def _cfg(a, b, **dfs):
    return {"merge_method": "dfs", "models": [{"model": str(a)}, {"model": str(b)}],
            "dfs": {"repeats": 2, "indicator": INDICATOR, **dfs}}


def _load(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()


def reference_logits(folders, params: DFSParameters, ids) -> np.ndarray:
    """h_k = L_{j_k}(W[j_{k-1}, j_k] h_{k-1}) over the source models' own layers (float64), then the final
    norm and head of the last layer's model; embeddings of the first layer's model."""
    models = [_load(f) for f in folders]
    depths = [(str(i), m.config.num_hidden_layers) for i, m in enumerate(models)]
    steps = dfs_path(params, depths)
    x = torch.tensor([ids])
    first, last = models[int(steps[0].model)], models[int(steps[-1].model)]
    with torch.no_grad():
        h = first.model.embed_tokens(x)
        pos = torch.arange(len(ids))[None]
        rope = first.model.rotary_emb(h, pos)
        s = len(ids)
        mask = torch.full((s, s), float("-inf"), dtype=h.dtype).triu(1)[None, None]
        for st in steps:
            layer = models[int(st.model)].model.layers[st.layer]
            out = layer(h * st.scale, attention_mask=mask, position_ids=pos, position_embeddings=rope)
            h = out[0] if isinstance(out, tuple) else out
        return last.lm_head(last.model.norm(h)).numpy()


def _logits(folder, ids) -> np.ndarray:
    with torch.no_grad():
        return _load(folder)(torch.tensor([ids])).logits.numpy()


@pytest.fixture(scope="module")
def eps0(models, tmp_path_factory):
    """Copies of ``a`` and ``b`` with rms_norm_eps = 0 (scale-invariant norms: the fold is exact)."""
    root = tmp_path_factory.mktemp("eps0")
    out = []
    for name in ("a", "b"):
        dst = shutil.copytree(models[name], root / name)
        conf = json.loads((dst / "config.json").read_text())
        conf["rms_norm_eps"] = 0.0
        (dst / "config.json").write_text(json.dumps(conf))
        out.append(dst)
    return out


def test_scaled_path_equals_the_reference_exactly_when_eps_is_zero(eps0, tmp_path):
    cfg = _cfg(*eps0, scales=SCALES)
    result = merge_models(cfg, tmp_path / "out")
    steps = dfs_path(DFSParameters.model_validate(cfg["dfs"]), [("a", 4), ("b", 4)])
    assert [(s.model, s.layer) for s in steps] == [("a", 0), ("a", 1), ("b", 1), ("b", 2), ("a", 2), ("b", 0), ("b", 3)]
    assert [s.scale for s in steps] == [1.0, 1.0, 0.8, 1.3, 0.6, 1.0, 1.7]
    assert result.merge_method == "dfs" and result.num_layers == 7 == config_of(tmp_path / "out")["num_hidden_layers"]
    ref = reference_logits(eps0, DFSParameters.model_validate(cfg["dfs"]), IDS)
    got = _logits(tmp_path / "out", IDS)
    assert np.abs(ref).max() > 0.05  # the check is not vacuous
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
    # the scaling mattered: without it the logits differ
    plain = reference_logits(eps0, DFSParameters.model_validate({"repeats": 2, "indicator": INDICATOR}), IDS)
    assert np.abs(plain - ref).max() > 1e-3


def test_unit_scales_are_a_frankenmerge_of_the_chosen_layers(models, tmp_path):
    merge_models(_cfg(models["a"], models["b"]), tmp_path / "dfs")
    tensors, a, b = read_folder(tmp_path / "dfs"), read_folder(models["a"]), read_folder(models["b"])
    order = [(a, 0), (a, 1), (b, 1), (b, 2), (a, 2), (b, 0), (b, 3)]
    for out_layer, (src, layer) in enumerate(order):
        for rest in ("self_attn.o_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
            np.testing.assert_array_equal(tensors[f"model.layers.{out_layer}.{rest}"], src[f"model.layers.{layer}.{rest}"])
    np.testing.assert_array_equal(tensors["model.embed_tokens.weight"], a["model.embed_tokens.weight"])
    np.testing.assert_array_equal(tensors["lm_head.weight"], b["lm_head.weight"])
    ref = reference_logits([models["a"], models["b"]], DFSParameters(indicator=tuple(INDICATOR), repeats=2), IDS)
    np.testing.assert_allclose(_logits(tmp_path / "dfs", IDS), ref, rtol=0, atol=1e-5)


def test_with_eps_the_fold_is_close_and_says_so(models, tmp_path):
    cfg = _cfg(models["a"], models["b"], scales=SCALES)
    result = merge_models(cfg, tmp_path / "out")
    assert any("rms_norm_eps=0" in w for w in result.warnings)
    ref = reference_logits([models["a"], models["b"]], DFSParameters.model_validate(cfg["dfs"]), IDS)
    got = _logits(tmp_path / "out", IDS)
    assert np.abs(got - ref).max() < 1e-2 * np.abs(ref).max()


def test_full_matrix_equals_overrides(eps0, tmp_path):
    w = np.ones((8, 8))
    for s in SCALES:
        w[s["from"], s["to"]] = s["value"]
    merge_models(_cfg(*eps0, scales=w.tolist()), tmp_path / "matrix")
    merge_models(_cfg(*eps0, scales=SCALES), tmp_path / "overrides")
    x, y = read_folder(tmp_path / "matrix"), read_folder(tmp_path / "overrides")
    assert all(np.array_equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("dfs, message", [
    ({"repeats": 2, "indicator": INDICATOR[:-1]}, "indicator has 15 entries; it needs M * repeats = 8 * 2 = 16"),
    ({"repeats": 2, "indicator": INDICATOR, "scales": [{"from": 0, "to": 1, "value": -1}]}, "scales must be positive"),
    ({"repeats": 2, "indicator": INDICATOR, "scales": [{"from": 0, "to": 9, "value": 2}]}, "layer index 9 is past the 8"),
    ({"repeats": 2, "indicator": [0] * 16}, "selects no layer"),
    ({"repeats": 2, "indicater": INDICATOR}, "unknown key 'indicater' in dfs; did you mean 'indicator'?"),
])
def test_bad_dfs_settings_are_one_line(models, tmp_path, dfs, message):
    cfg = {"merge_method": "dfs", "models": [{"model": "a"}, {"model": "b"}], "dfs": dfs}
    with pytest.raises(InvalidConfigError, match=message.replace("*", r"\*").replace("(", r"\(")) as err:
        merge_models(fill(cfg, models), tmp_path / "out")
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_dfs_block_goes_with_the_method(models, tmp_path):
    with pytest.raises(InvalidConfigError, match="`dfs:` block goes with merge_method: dfs"):
        merge_models(fill({"merge_method": "dfs", "models": [{"model": "a"}]}, models), tmp_path / "x")
    with pytest.raises(InvalidConfigError, match="`dfs:` block goes with merge_method: dfs"):
        merge_models(fill({"merge_method": "linear", "models": [{"model": "a", "parameters": {"weight": 1}}],
                           "dfs": {"indicator": [1]}}, models), tmp_path / "y")


def test_aegis_merge_reads_a_dfs_yaml_with_relative_paths(eps0, tmp_path):
    import typer
    import yaml
    from typer.testing import CliRunner

    from aegis.cli.forge import merge

    app = typer.Typer(add_completion=False)
    app.command("merge")(merge)
    app.callback()(lambda: None)
    for name, src in zip(("a", "b"), eps0):
        shutil.copytree(src, tmp_path / name)
    cfg = tmp_path / "dfs.yml"
    cfg.write_text(yaml.safe_dump({"merge_method": "dfs", "models": [{"model": "a"}, {"model": "b"}],
                                   "dfs": {"repeats": 2, "indicator": INDICATOR, "scales": SCALES}}))
    result = CliRunner().invoke(app, ["merge", str(cfg), str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "merged (dfs): 7 layers" in result.output
    np.testing.assert_allclose(_logits(tmp_path / "out", IDS),
                               reference_logits(eps0, DFSParameters.model_validate(_cfg(*eps0)["dfs"] | {"scales": SCALES}), IDS),
                               rtol=0, atol=1e-5)
    assert yaml.safe_load((tmp_path / "out" / "mergekit_config.yml").read_text())["merge_method"] == "dfs"
