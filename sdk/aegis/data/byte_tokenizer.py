"""A byte-level tokenizer with chat special tokens: no vocabulary file, no download.

Every UTF-8 byte is its own token (ids 0-255); special tokens follow. It is what the bundled
toy dataset and the tests train on (after nanochat's ``ByteTokenizer``), and it is a valid
stand-in wherever a real tokenizer is not at hand.

    from aegis.data import ByteTokenizer
    tok = ByteTokenizer()
    ids = tok.encode("hello")                      # [104, 101, 108, 108, 111]
    ids, mask = tok.render_conversation([{"role": "user", "content": "hi"},
                                         {"role": "assistant", "content": "hello"}])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from aegis.errors import DatasetError

__all__ = ["ByteTokenizer", "SPECIAL_TOKENS", "names_byte_tokenizer"]

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|pad|>",
    "<|bos|>",
    "<|eos|>",
    "<|user_start|>",
    "<|user_end|>",
    "<|assistant_start|>",
    "<|assistant_end|>",
)
"""Special tokens, in id order after the 256 byte ids."""

_ROLE_TOKENS = {
    "user": ("<|user_start|>", "<|user_end|>"),
    "system": ("<|user_start|>", "<|user_end|>"),
    "assistant": ("<|assistant_start|>", "<|assistant_end|>"),
}


def names_byte_tokenizer(folder: str | Path) -> bool:
    """Whether a model folder's tokenizer_config.json names this module's tokenizer (``"tokenizer_class":
    "ByteTokenizer"``, as the bundled tiny llama's does): its tokens are bytes, it has no vocabulary file."""
    try:
        config = json.loads((Path(folder) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("tokenizer_class") == "ByteTokenizer"


class ByteTokenizer:
    """UTF-8 bytes as tokens plus the chat specials in :data:`SPECIAL_TOKENS`."""

    def __init__(self) -> None:
        self._special = {name: 256 + i for i, name in enumerate(SPECIAL_TOKENS)}
        self.vocab_size = 256 + len(SPECIAL_TOKENS)
        self.pad_id = self._special["<|pad|>"]
        self.bos_id = self._special["<|bos|>"]
        self.eos_id = self._special["<|eos|>"]

    def special_id(self, name: str) -> int:
        """Id of a special token, e.g. ``special_id("<|assistant_start|>")``."""
        try:
            return self._special[name]
        except KeyError:
            raise DatasetError(f"unknown special token {name!r}; valid: {', '.join(SPECIAL_TOKENS)}") from None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``: its UTF-8 bytes."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens are written by name."""
        out: list[str] = []
        raw = bytearray()
        names = {v: k for k, v in self._special.items()}
        for i in ids:
            if i < 256:
                raw.append(int(i))
                continue
            out.append(raw.decode("utf-8", errors="replace"))
            raw.clear()
            out.append(names.get(int(i), f"<|{int(i)}|>"))
        out.append(raw.decode("utf-8", errors="replace"))
        return "".join(out)

    def render(self, item: Sequence[tuple[str, str]] | str) -> tuple[list[int], list[bool]]:
        """(ids, loss mask) of a row as :mod:`aegis.data.render` renders it: (role, content) turns or a raw text."""
        if isinstance(item, str):
            ids = [self.bos_id, *self.encode(item), self.eos_id]
            return ids, [False] + [True] * (len(ids) - 1)
        return self.render_conversation([{"role": r, "content": c} for r, c in item])

    def render_conversation(self, messages: Sequence[dict]) -> tuple[list[int], list[bool]]:
        """Token ids of a chat and, per token, whether training predicts it (assistant turns only).

        Layout: ``<|bos|> <|user_start|> text <|user_end|> <|assistant_start|> text <|assistant_end|> ... <|eos|>``;
        an assistant turn's text and its end token are targets, everything else is context.
        """
        ids = [self.bos_id]
        mask = [False]
        for i, msg in enumerate(messages):
            role = msg.get("role") if isinstance(msg, dict) else None
            if role not in _ROLE_TOKENS or not isinstance(msg.get("content"), str):
                raise DatasetError(
                    f"message {i} needs a role in {sorted(_ROLE_TOKENS)} and a string content, got {msg!r}"
                )
            start, end = (self._special[t] for t in _ROLE_TOKENS[role])
            body = self.encode(msg["content"])
            target = role == "assistant"
            ids += [start, *body, end]
            mask += [False, *([target] * len(body)), target]
        ids.append(self.eos_id)
        mask.append(False)
        return ids, mask
