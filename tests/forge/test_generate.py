"""`aegis generate`: greedy tokens equal transformers' generate on the same folder; packed models sample; bad input
is one line."""

from __future__ import annotations

from typer.testing import CliRunner


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
