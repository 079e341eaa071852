"""A merge with a ``tokenizer_source`` over models whose vocabularies differ equals mergekit's: the same output
vocabulary, and embedding and head rows merged by token (each model's row for the token, mergekit's default row
where a model lacks it: the one model that has it, the base's, the mean of the others', zeros).

A union's appended tokens get ids in an order mergekit takes from a Rust hash map (it changes between its runs);
there the test compares the token sets, the base's ids, and the rows token by token.

Four tiny llama folders with tokenizers trained here on different corpora, sizes and special tokens; mergekit runs
in this process on the same YAML (skipped when it is not installed).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aegis.errors import InvalidConfigError
from aegis.forge import merge_models
from tests.forge.conftest import config_of, fill, max_abs_diff, read_folder
from tests.hf_folders import SPECIALS, corpus

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

# name -> (corpus seed, BPE vocabulary size, special tokens)
TOKENIZERS = {
    "va": (0, 300, SPECIALS),
    "vb": (1, 280, [*SPECIALS[:3], "<|tool|>"]),
    "vc": (2, 300, SPECIALS),
    "vd": (3, 260, [*SPECIALS[:3], "<|tool|>", "<|sep|>"]),
}


def _tokenizer(seed: int, size: int, specials: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(120, seed), trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>")


@pytest.fixture(scope="module")
def vocab_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vocab-models")
    out = {}
    for i, (name, (seed, size, specials)) in enumerate(TOKENIZERS.items()):
        tok = _tokenizer(seed, size, specials)
        cfg = transformers.AutoConfig.for_model(
            "llama", vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        )
        torch.manual_seed(i)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[name] = root / name
    return out


def _vocab(folder: Path) -> dict[str, int]:
    return transformers.AutoTokenizer.from_pretrained(folder).get_vocab()


LINEAR = {
    "merge_method": "linear", "base_model": "va",
    "models": [{"model": "va", "parameters": {"weight": 0.6}}, {"model": "vb", "parameters": {"weight": 0.4}}],
}
CASES = {
    "base": {**LINEAR, "tokenizer_source": "base"},
    "union": {**LINEAR, "tokenizer_source": "union"},
    "model": {**LINEAR, "tokenizer_source": "vb"},
    # tokens of vd no merged model has get zero rows
    "ties-unmerged-model": {
        "merge_method": "ties", "base_model": "va",
        "models": [{"model": "vb", "parameters": {"weight": 1.0, "density": 0.7}}, {"model": "vc", "parameters": {"weight": 0.5}}],
        "tokenizer_source": "vd",
    },
    # no base: a token two of the three models have gets the mean of their rows in the third
    "linear-mean": {
        "merge_method": "linear",
        "models": [{"model": m, "parameters": {"weight": w}} for m, w in [("va", 0.5), ("vb", 0.3), ("vc", 0.2)]],
        "tokenizer_source": "vd",
    },
    "model-bf16": {
        **LINEAR, "models": [{"model": "va", "parameters": {"weight": 1}}, {"model": "vb", "parameters": {"weight": 2}}],
        "tokenizer_source": "vb", "dtype": "bfloat16",
    },
    "union-three-models": {
        "merge_method": "task_arithmetic", "base_model": "va",
        "models": [{"model": m, "parameters": {"weight": w}} for m, w in [("vb", 0.7), ("vd", 0.4)]],
        "tokenizer_source": "union",
    },
    "slerp-union": {
        "merge_method": "slerp", "base_model": "vb", "models": [{"model": "vb"}, {"model": "vd"}],
        "parameters": {"t": 0.3}, "tokenizer_source": "union",
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_rows_merged_by_token_as_mergekit(case, vocab_models, mergekit_merge, tmp_path):
    cfg = fill(CASES[case], vocab_models)
    merge_models(cfg, tmp_path / "aegis")
    theirs = mergekit_merge(cfg, tmp_path / "mergekit")

    vocab, their_vocab = _vocab(tmp_path / "aegis"), _vocab(theirs)
    if cfg["tokenizer_source"] == "union":
        base = _vocab(cfg["base_model"])
        assert set(vocab) == set(their_vocab) and all(vocab[t] == their_vocab[t] == base[t] for t in base)
    else:
        assert vocab == their_vocab
    tokens = sorted(vocab)
    ours_t, theirs_t = read_folder(tmp_path / "aegis"), read_folder(theirs)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert ours_t[name].shape[0] == len(vocab)
        ours_rows = ours_t.pop(name)[[vocab[t] for t in tokens]].astype(np.float64)
        their_rows = theirs_t.pop(name)[[their_vocab[t] for t in tokens]].astype(np.float64)
        np.testing.assert_allclose(ours_rows, their_rows, rtol=0, atol=1e-6)
    assert max_abs_diff(ours_t, theirs_t) <= 1e-6
    assert config_of(tmp_path / "aegis")["vocab_size"] == config_of(theirs)["vocab_size"] == len(vocab)


def test_shared_tokens_take_each_models_own_row(vocab_models, tmp_path):
    """The formula, without mergekit: a linear merge of a token both models have mixes their rows for that token."""
    merge_models(fill(CASES["base"], vocab_models), tmp_path / "out")
    out, a, b = (read_folder(p)["model.embed_tokens.weight"] for p in (tmp_path / "out", vocab_models["va"], vocab_models["vb"]))
    va, vb = _vocab(vocab_models["va"]), _vocab(vocab_models["vb"])
    shared = [t for t in va if t in vb]
    moved = [t for t in shared if va[t] != vb[t]]
    assert len(moved) > 100  # the case the issue found merged by index
    for tok in shared:
        np.testing.assert_allclose(out[va[tok]], 0.6 * a[va[tok]] + 0.4 * b[vb[tok]], rtol=0, atol=1e-6)
    for tok in (t for t in va if t not in vb):  # only the base has it: the base's row for both
        np.testing.assert_allclose(out[va[tok]], a[va[tok]], rtol=0, atol=1e-6)


def test_the_merged_folder_loads_with_its_tokenizer(vocab_models, tmp_path):
    merge_models(fill(CASES["union"], vocab_models), tmp_path / "out")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    ids = tok("please reset the password <|tool|>")["input_ids"]
    assert max(ids) >= 300  # a token only vb had, appended by the union
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape == (1, len(ids), len(tok))


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"merge_method": "linear", "models": [{"model": "va"}, {"model": "vb"}], "tokenizer_source": "union"},
         "union without base_model over models whose vocabularies differ"),
        ({"merge_method": "linear", "models": [{"model": "va"}, {"model": "vb"}], "tokenizer_source": "base"},
         "base without base_model over models whose vocabularies differ"),
    ],
)
def test_a_base_tokenizer_mergekit_picks_by_set_order_is_refused(cfg, message, vocab_models, tmp_path):
    with pytest.raises(InvalidConfigError, match=message):
        merge_models(fill(cfg, vocab_models), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_tokens_past_the_embedding_rows_are_refused(vocab_models, tmp_path):
    import shutil

    short = tmp_path / "short"
    shutil.copytree(vocab_models["vb"], short)
    conf = json.loads((short / "config.json").read_text())
    conf["vocab_size"] -= 1
    (short / "config.json").write_text(json.dumps(conf))
    cfg = {**LINEAR, "models": [{"model": "va"}, {"model": str(short)}], "tokenizer_source": "union"}
    with pytest.raises(InvalidConfigError, match=f"has 1 token\\(s\\) past its {conf['vocab_size']} embedding rows"):
        merge_models(fill(cfg, vocab_models), tmp_path / "out")


def test_differing_vocabularies_without_tokenizer_source_warn(vocab_models, tmp_path):
    cfg = {"merge_method": "linear", "models": [{"model": "va"}, {"model": "vc"}], "parameters": {"weight": 1}}
    result = merge_models(fill(cfg, vocab_models), tmp_path / "out")
    assert any("vocabularies differ" in w and "tokenizer_source" in w for w in result.warnings)
    import shutil

    twin = shutil.copytree(vocab_models["va"], tmp_path / "twin")
    same = merge_models(fill({**cfg, "models": [{"model": "va"}, {"model": str(twin)}]}, vocab_models), tmp_path / "same")
    assert not any("vocabularies differ" in w for w in same.warnings)
