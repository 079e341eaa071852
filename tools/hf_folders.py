"""Real Hugging Face model folders for tests and benchmarks: a tiny transformers model saved with
``save_pretrained`` and a byte-level BPE tokenizer trained here with ``tokenizers``, with a chat template of its own.
The one home of these builders: tests import them (``tests/hf_folders.py`` re-exports), and so do `tools/bench`
scripts, which import nothing from ``tests``. Needs the ``test`` extra (torch, transformers, tokenizers).

    folder = make_model_folder(tmp_path / "m", template=CHATML)            # llama, random weights
    folder = make_model_folder(tmp_path / "m", template=CHATML_GENERATION) # {% generation %} tags
    write_sharegpt(tmp_path / "d.jsonl", n=64)                            # a learnable ShareGPT file

Nothing comes from the Hub; everything is built in a second or two.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

__all__ = [
    "CHATML", "CHATML_GENERATION", "LLAMA_LIKE", "SPECIALS", "corpus", "make_model_folder", "make_tokenizer",
    "write_alpaca", "write_messages", "write_sharegpt",
]

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_GENERATION = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA_LIKE = (  # a template in Llama 2 style: BOS rendered by the template, no end-of-turn per user turn
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}{% else %}<<SYS>>{{ m['content'] }}<</SYS>>"
    "{% endif %}{% endfor %}"
)

_WORDS = (
    "the a reset password account billing invoice refund order shipping delivery login email support help please "
    "thanks customer issue problem solved click settings profile update card payment plan subscription cancel"
).split()


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 20))) for _ in range(n)]


def make_tokenizer(template: str | None, vocab_size: int = 320) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>",
    )
    if template is not None:
        fast.chat_template = template
    return fast


def make_model_folder(
    folder: Path,
    *,
    template: str | None = CHATML,
    model_type: str = "llama",
    hidden: int = 64,
    layers: int = 2,
    tie: bool = False,
    seed: int = 0,
    max_shard_size: str | None = None,
) -> Path:
    """A transformers model folder (config, safetensors, tokenizer with ``template``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = make_tokenizer(template)
    vocab = len(tok)
    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    tok.save_pretrained(folder)
    return folder


_ANSWERS = (
    "please reset the password in settings then login again",
    "the refund is on the card within a week thanks",
    "update the billing plan in the profile settings please",
    "the order shipping delivery email is on the way",
)


def _chat(rng: random.Random) -> tuple[str, str]:
    q = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 8)))
    # a learnable answer: one of four support replies, chosen by the question's first word
    return q, _ANSWERS[_WORDS.index(q.split()[0]) % len(_ANSWERS)]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_sharegpt(path: Path, n: int = 64, seed: int = 0) -> Path:
    rng = random.Random(seed)
    chats = [_chat(rng) for _ in range(n)]
    return _write(path, [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]} for q, a in chats])


def write_alpaca(path: Path, n: int = 64, seed: int = 1) -> Path:
    rng = random.Random(seed)
    return _write(path, [{"instruction": q, "input": "", "output": a} for q, a in (_chat(rng) for _ in range(n))])


def write_messages(path: Path, n: int = 64, seed: int = 2) -> Path:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        (q, a), (q2, a2) = _chat(rng), _chat(rng)
        rows.append({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": q},
                                  {"role": "assistant", "content": a}, {"role": "user", "content": q2},
                                  {"role": "assistant", "content": a2}]})
    return _write(path, rows)
