"""The demo is an explicit config of ordinary paths: the bundled tiny llama is a model folder whose
tokenizer_config.json names the byte tokenizer, its data a JSONL file; nothing downstream knows their names."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import numpy as np
import pytest

import aegis
from aegis.data import ByteTokenizer, tiny_llama_config, tiny_llama_path, toy_dataset_path
from aegis.errors import DatasetError
from aegis.supervise.run_config import RunConfig, load_run_config
from aegis.supervise.demo import demo_config, demo_dir
from aegis.supervise.engine_handle import load_examples, make_renderer, resolve_model_input
from aegis.train.data import load_jsonl

ROOT = Path(aegis.__file__).parents[2]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.sample_id == y.sample_id and x.domain == y.domain and np.array_equal(x.input_ids, y.input_ids)
        and np.array_equal(x.loss_mask, y.loss_mask) for x, y in zip(a, b)
    )


def test_a_copy_of_the_demo_folder_trains_on_a_copy_of_the_toy_file_as_the_strict_reader_reads_it(tmp_path):
    """Under another name and path, the folder and file give the same model, tokenizer and examples: no name check."""
    folder = tmp_path / "my-model"
    shutil.copytree(tiny_llama_path(), folder)
    data = tmp_path / "rows.jsonl"
    shutil.copy(toy_dataset_path(), data)
    reference = load_jsonl(toy_dataset_path(), ByteTokenizer())  # text and messages rows, byte tokens
    for model, path in ((str(tiny_llama_path()), str(toy_dataset_path())), (str(folder), str(data))):
        cfg = RunConfig(model=model, init="random", data=path, train_config={"method": "full", "seq_len": 512})
        model_input = resolve_model_input(cfg.model, cfg.init)
        assert model_input.random_init and model_input.config == tiny_llama_config()
        assert isinstance(make_renderer(cfg, model_input), ByteTokenizer)
        examples, report = load_examples(cfg, model_input)
        assert _same(examples, reference) and report.rows == 252 and report.problems == []
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    with pytest.raises(DatasetError, match="cannot load the tokenizer"):  # another class: the model's own files
        make_renderer(cfg, resolve_model_input(str(folder), "random"))


def test_the_demo_config_names_the_bundled_folder_with_random_weights():
    cfg = demo_config()
    assert (Path(cfg.model), cfg.init, Path(cfg.data)) == (tiny_llama_path(), "random", demo_dir() / "demo.jsonl")
    assert load_run_config(demo_dir() / "demo.yaml") == cfg


def test_no_engine_renderer_status_or_front_end_module_compares_anything_with_the_demo_names():
    """No comparison with 'tiny-llama' or 'toy' (==, in) anywhere in the SDK, the agent or the apps."""
    found = []
    for top in ("sdk/aegis", "agent", "apps"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Compare):
                    found += [f"{path.relative_to(ROOT)}:{node.lineno}" for part in (node.left, *node.comparators)
                              for c in ast.walk(part) if isinstance(c, ast.Constant) and c.value in ("tiny-llama", "toy")]
    assert found == []
