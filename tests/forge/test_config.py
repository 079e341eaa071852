"""mergekit's YAML keys parse as mergekit reads them; parameter gradients and filters evaluate as
mergekit's ``evaluate_setting`` does; bad keys are one-line errors that name the key and the fix."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from aegis.errors import InvalidConfigError
from aegis.forge.merge_config import Conditional, evaluate_setting, load_merge_config

YAML = """
merge_method: ties
base_model: ./base
models:
  - model: ./base
  - model: ./a
    parameters:
      density: [1, 0.7, 0.1]
      weight:
        - filter: mlp
          value: 0.3
        - value: 0.5
  - model: ./b
    parameters: {weight: 0.4, density: 0.5}
parameters:
  normalize: true
  int8_mask: true
dtype: bfloat16
tokenizer_source: base
"""

SETTINGS = [
    0.5,
    "1e-3",
    (0, 0.5, 1),
    (1, 0.7, 0.1),
    (0.2, 0.9, 0.4, 0.6, 1.0),
    (True, False),
    (Conditional(filter="self_attn", value=(0, 0.5, 1)), Conditional(filter="mlp", value=0.3), Conditional(value=0.7)),
    (Conditional(filter="mlp", value=(1, 0)),),
]


def test_mergekit_yaml_parses():
    cfg = load_merge_config(YAML)
    assert cfg.merge_method == "ties" and cfg.dtype == "bfloat16" and cfg.tokenizer_source == "base"
    assert [m.model for m in cfg.models] == ["./base", "./a", "./b"]
    assert cfg.models[1].parameters["density"] == (1, 0.7, 0.1)
    assert cfg.models[1].parameters["weight"][0] == Conditional(filter="mlp", value=0.3)
    assert cfg.referenced_models() == ["./base", "./a", "./b"]


def test_yaml_file_and_slices(tmp_path):
    path = tmp_path / "merge.yml"
    path.write_text(
        "merge_method: passthrough\nslices:\n  - sources:\n      - model: a\n        layer_range: [0, 3]\n"
        "  - sources:\n      - {model: b, layer_range: [2, 4]}\n"
    )
    cfg = load_merge_config(path)
    assert [s.sources[0].layer_range for s in cfg.slices] == [(0, 3), (2, 4)]


@pytest.mark.parametrize("kind", [float, bool])
@pytest.mark.parametrize("t", [0.0, 0.2, 1 / 3, 0.5, 0.9, 1.0])
def test_settings_evaluate_as_in_mergekit(kind, t):
    mk_config = pytest.importorskip("mergekit.config")
    validate = TypeAdapter(kind).validate_python
    for setting in SETTINGS:
        if kind is bool and setting in ("1e-3", 0.5) or kind is bool and not isinstance(setting, tuple):
            continue
        theirs_setting = (
            [mk_config.ConditionalParameter(filter=c.filter, value=list(c.value) if isinstance(c.value, tuple) else c.value)
             for c in setting]
            if isinstance(setting, tuple) and isinstance(setting[0], Conditional)
            else list(setting) if isinstance(setting, tuple) else setting
        )
        for name in ("model.layers.3.mlp.up_proj.weight", "model.layers.3.self_attn.q_proj.weight", "model.norm.weight"):
            try:
                theirs = mk_config.evaluate_setting(name, theirs_setting, t, validate=validate)
            except Exception:  # mergekit refuses it: so must we
                with pytest.raises(Exception):
                    evaluate_setting(name, setting, t, validate)
                continue
            assert evaluate_setting(name, setting, t, validate) == theirs, (setting, t, name)


@pytest.mark.parametrize(
    "text, message",
    [
        ("merge_methd: ties\nmodels: [{model: a}]", "unknown key 'merge_methd'; did you mean 'merge_method'?"),
        ("merge_method: ties\nmodels: [{model: a, paramters: {weight: 1}}]",
         "unknown key 'paramters' in models[0]; did you mean 'parameters'?"),
        ("merge_method: passthrough\nslices: [{sources: [{model: a, layer_rang: [0, 2]}]}]", "did you mean 'layer_range'?"),
        ("merge_method: tie\nmodels: [{model: a}]", "merge_method: unknown merge method 'tie'; did you mean 'ties'?"),
        ("merge_method: della\nmodels: [{model: a}]", "'della' is a mergekit method aegis does not implement yet"),
        ("merge_method: linear", "give exactly one of `models:` and `slices:`"),
        ("merge_method: linear\nmodels: [{model: a}]\nslices: [{sources: [{model: a, layer_range: [0, 1]}]}]",
         "give exactly one of"),
        ("merge_method: linear\nmodels: [{parameters: {weight: 1}}]", "missing key 'models[0].model'"),
        ("merge_method: passthrough\nslices: [{sources: [{model: a, layer_range: [3, 1]}]}]",
         "slices[0].sources[0].layer_range: Value error, layer_range [3, 1] must be"),
        ("merge_method: linear\nmodels: [{model: a}]\ndtype: float8", "dtype: Input should be"),
        ("merge_method: linear\nmodules: {}\nmodels: [{model: a}]", "modules: multi-module `modules:` configs are not supported"),
        ("merge_method: linear\nmodels: [{model: a, parameters: {weight: {value: [1, {x: 2}]}}}]", "models[0].parameters: weight: expected a number"),
        ("merge_method: linear\nmodels: [{model: a, parameters: {weight: {filtr: x, value: 1}}}]",
         "models[0].parameters: weight: unknown key 'filtr' in a {filter, value} entry; did you mean 'filter'?"),
        ("merge_method: [linear", "not valid YAML at line"),
        ("- just a list", "a merge config is a YAML mapping"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(text, message):
    with pytest.raises(InvalidConfigError) as err:
        load_merge_config(text)
    assert message.replace("Value error, ", "") in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(InvalidConfigError, match="cannot read merge config .*nope.yml"):
        load_merge_config(tmp_path / "nope.yml")
