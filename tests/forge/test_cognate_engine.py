"""A Cognate model in the forge's later phases: EvoMerge's fitness evaluates an exported Cognate folder with the
same NLL and accuracy as transformers' run of the folder's own modeling code (trust_remote_code), and a DFS merge
keeps the Cognate config's depth fields in step."""

from __future__ import annotations

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _cognate_folder(tmp_path, tok):
    from aegis.forge.cognate.hf_folder import save_pretrained
    from aegis.forge.cognate.hyperparams import TINY_MODEL, CognateConfig, param_shapes
    from aegis.forge.cognate.model import from_flat

    cfg = CognateConfig(**{**TINY_MODEL, "vocab_size": len(tok), "ltm_slots": 16, "memory_chunk": 4, "window": 8,
                           "num_layers": 2})
    rng = np.random.default_rng(0)
    flat = {}
    for name, shape in param_shapes(cfg).items():
        scale = 0.2 if len(shape) == 1 else shape[-1] ** -0.5
        centre = 1.0 if name.endswith(("norm.weight", "attn_weight", "mem_weight")) else 0.0
        flat[name] = (centre + scale * rng.standard_normal(shape)).astype(np.float32)
    return save_pretrained(from_flat(flat, cfg), cfg, tmp_path / "cognate", tokenizer=tok)


def test_evomerge_fitness_of_a_cognate_folder_equals_transformers_remote_code(tmp_path, monkeypatch):
    from aegis.data.render import ChatRenderer
    from aegis.forge import _vocab
    from aegis.forge._evo_fitness import Evaluator, flops_per_token, plan_eval_batch
    from aegis.train.data import load_examples

    from tests.hf_folders import corpus, make_tokenizer

    tok = make_tokenizer(None)
    folder = _cognate_folder(tmp_path, tok)
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus(6, seed=3)))
    prompts: list = []
    monkeypatch.setattr("builtins.input", lambda *a: prompts.append(a) or "n")
    renderer = ChatRenderer.from_folder(folder)  # the tokenizer alone: no "run the custom code?" prompt
    _vocab._load(folder)  # as merge reads each model's tokenizer
    assert prompts == []
    examples, _ = load_examples(str(data), renderer, seq_len=24)
    config = json.loads((folder / "config.json").read_text())
    batch = plan_eval_batch(config, 24, len(examples))
    assert batch == 4  # the largest power of two <= 6 rows that fits (a host's memory holds a tiny model)
    assert plan_eval_batch(config, 24, len(examples), budget_bytes=1) == 1
    assert flops_per_token(config, 24) > 0
    m = Evaluator(examples, seq_len=24, batch_size=batch).evaluate(folder)

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)
    nll = right = count = 0.0
    with torch.no_grad():
        for ex in examples:  # one example at a time: no packing, no padding
            ids = torch.tensor(np.asarray(ex.input_ids)[None].astype(np.int64))
            logp = torch.log_softmax(model(ids).logits[0, :-1], -1).numpy()
            tgt, mask = np.asarray(ex.input_ids)[1:], np.asarray(ex.loss_mask)[1:]
            nll -= float((logp[np.arange(len(tgt)), tgt] * mask).sum())
            right += float(((logp.argmax(-1) == tgt) * mask).sum())
            count += float(mask.sum())
    assert m.tokens == int(count)
    assert abs(m.nll - nll / count) < 1e-4, (m.nll, nll / count)
    assert abs(m.accuracy - right / count) <= 1.0 / count
    assert m.num_layers == 2


def test_a_merge_that_changes_depth_updates_both_cognate_depth_fields(tmp_path):
    from aegis.forge.merge import merge_models

    from tests.hf_folders import make_tokenizer

    folder = _cognate_folder(tmp_path, make_tokenizer(None))
    conf = {"merge_method": "passthrough", "dtype": "float32",
            "slices": [{"sources": [{"model": str(folder), "layer_range": [0, 2]}]},
                       {"sources": [{"model": str(folder), "layer_range": [1, 2]}]}]}
    merge_models(conf, tmp_path / "deeper")
    cfg = json.loads((tmp_path / "deeper" / "config.json").read_text())
    assert cfg["num_layers"] == cfg["num_hidden_layers"] == 3


def test_quietstar_sees_a_cognate_model_through_hidden_states_and_grows_its_tied_embeddings(tmp_path):
    import jax.numpy as jnp

    from aegis.forge.cognate.engine import build_cognate
    from aegis.forge.cognate.model import forward
    from aegis.forge.quietstar.reasoning_data import THOUGHT_TOKENS, add_thinking_tokens

    from tests.hf_folders import make_tokenizer

    tok = make_tokenizer(None)
    folder = _cognate_folder(tmp_path, tok)
    model = build_cognate(json.loads((folder / "config.json").read_text()))
    params = model.load(folder)
    ids = jnp.asarray(np.random.default_rng(1).integers(0, len(tok), (2, 13)))
    want = np.asarray(forward(params, model.cfg, ids)["logits"])
    h = model.hidden(params, ids)
    np.testing.assert_allclose(np.asarray(model.project(h, model.head_weight(params))), want, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(np.asarray(model.apply(params, ids)), want)

    vocab = len(tok)
    spelled = tok.encode("thinking", add_special_tokens=False)
    grown, new_params, size = add_thinking_tokens(model, params, tok)
    emb = np.asarray(new_params["model.embed_tokens.weight"])
    assert emb.shape[0] == grown.cfg.vocab_size == len(tok) == vocab + len(THOUGHT_TOKENS) == size.vocab_after
    old = np.asarray(params["model.embed_tokens.weight"])
    np.testing.assert_allclose(emb[tok.convert_tokens_to_ids("[thinking]")], old[spelled].mean(0), rtol=1e-6)
    assert size.params_added == len(THOUGHT_TOKENS) * model.cfg.hidden_size  # one tied matrix grew
    assert grown.apply(new_params, ids).shape == (2, 13, vocab + len(THOUGHT_TOKENS))


def test_a_packed_cognate_model_loads_with_the_absmean_ternary_weights(tmp_path):
    import jax.numpy as jnp

    from aegis.forge.bitnet import compress_model, load_packed
    from aegis.forge.cognate.hf_folder import load_pretrained
    from aegis.forge.cognate.model import forward, from_flat, to_flat

    from tests.hf_folders import make_tokenizer

    folder = _cognate_folder(tmp_path, make_tokenizer(None))
    r = compress_model(folder, tmp_path / "packed")
    params, cfg = load_pretrained(folder)
    assert r.total_params == cfg.num_parameters()
    flat = {k: np.asarray(v) for k, v in to_flat(params).items()}
    assert "model.layers.1.q_proj.weight" in r.packed and "model.embed_tokens.weight" in r.preserved
    for name in r.packed:  # BitNet b1.58: gamma = mean |W|, W_q = RoundClip(W / (gamma + eps), -1, 1)
        w = flat[name]
        gamma = np.abs(w).mean()
        flat[name] = np.clip(np.round(w / (gamma + 1e-5)), -1, 1) * gamma
    pm = load_packed(tmp_path / "packed")
    ids = jnp.asarray(np.random.default_rng(2).integers(0, cfg.vocab_size, (1, 11)))
    want = forward(from_flat(flat, cfg), cfg, ids)["logits"]
    np.testing.assert_allclose(np.asarray(pm.model.apply(pm.dense_params(), ids)), np.asarray(want), atol=1e-4,
                               rtol=1e-4)
