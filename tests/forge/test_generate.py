"""`aegis generate`: greedy tokens equal transformers' generate on the same folder; packed models sample; bad input
is one line."""

from __future__ import annotations

import pytest


def test_greedy_generation_matches_transformers_and_streams(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aegis.forge.generate import generate
    from tools.hf_folders import make_model_folder

    folder = make_model_folder(tmp_path / "m", hidden=32, layers=2)
    pieces: list[str] = []
    r = generate(folder, "hello there", max_new_tokens=5, temperature=0, on_text=pieces.append)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": "hello there"}], add_generation_prompt=True,
                                  tokenize=True, return_dict=True)["input_ids"]
    ref = AutoModelForCausalLM.from_pretrained(folder).generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False,
                                                                 eos_token_id=None, pad_token_id=tok.pad_token_id)
    assert r["tokens"] == ref[0, len(ids):].tolist()[: len(r["tokens"])]
    assert "".join(pieces) == r["text"]


def test_generate_bad_model_is_one_line(tmp_path):
    from aegis.cli import app, main  # noqa: F401

    import pytest

    with pytest.raises(SystemExit) as exc:
        main(["generate", str(tmp_path / "missing"), "hi"])
    assert exc.value.code == 2


@pytest.mark.slow
def test_a_quietstar_cognate_model_generates_with_its_thoughts_in_the_engine(tmp_path):
    """A phase-3 Cognate folder (auto_map, quietstar.json) is served by the engine, which runs its thoughts;
    transformers' remote code would ignore them. Each thought is the Cognate forward's greedy continuation after
    the start marker."""
    import json

    import jax
    import jax.numpy as jnp
    import numpy as np
    from safetensors.numpy import save_file

    from aegis.forge.cognate.engine import build_cognate
    from aegis.forge.cognate.hf_folder import save_pretrained
    from aegis.forge.cognate.hyperparams import TINY_MODEL, CognateConfig
    from aegis.forge.generate import generate
    from aegis.forge.quietstar.core import init_mixer
    from aegis.forge.quietstar.reasoning_data import END, START, THOUGHT_TOKENS
    from tests.forge.conftest import random_cognate_params
    from tools.hf_folders import make_tokenizer

    tok = make_tokenizer(None)
    tok.add_special_tokens({"additional_special_tokens": list(THOUGHT_TOKENS)})
    cfg = CognateConfig(**{**TINY_MODEL, "vocab_size": len(tok), "ltm_slots": 32})
    meta = {"start_token": START, "end_token": END, "thought_length": 3, "tokens": list(THOUGHT_TOKENS)}
    folder = save_pretrained(random_cognate_params(cfg, 0), cfg, tmp_path / "qs", tokenizer=tok,
                             extra_files={"quietstar.json": json.dumps(meta)})
    mixer = init_mixer(jax.random.key(0), cfg.hidden_size)
    save_file({f"mixer.{k}": np.asarray(v) for k, v in mixer.items()}, str(folder / "mixer.safetensors"))

    r = generate(folder, "alpha beta", max_new_tokens=2, temperature=0, show_thoughts=True)
    assert r["kind"] == "engine (Cognate), Quiet-STaR" and len(r["thoughts"]) == len(r["tokens"]) == 2
    model = build_cognate(json.loads((folder / "config.json").read_text()))
    params = model.load(folder)
    ids = [tok.bos_token_id] + tok.encode("alpha beta", add_special_tokens=False) + [tok.convert_tokens_to_ids(START)]
    want = []
    for _ in range(3):  # the first thought, greedy (the start marker banned), until the model's own end marker
        logits = np.array(model.apply(params, jnp.asarray([ids], jnp.int32)))[0, -1]
        logits[tok.convert_tokens_to_ids(START)] = -np.inf
        nxt = int(np.argmax(logits))
        if nxt == tok.convert_tokens_to_ids(END):
            break
        want.append(nxt)
        ids.append(nxt)
    assert r["thoughts"][0] == tok.decode(want)
