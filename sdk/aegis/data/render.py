"""The one renderer: dataset rows -> token ids and an assistant-token mask, with the model's own
tokenizer and chat template. Planning (token statistics) and training (examples) both go through it,
so the token counts a plan reports are the tokens a run trains.

    r = ChatRenderer.from_folder("./my-model")              # tokenizer.json + its chat template
    ids, mask = r.render([("user", "hi"), ("assistant", "hello")])   # mask: loss on assistant tokens
    ids, mask = r.render("raw text")                        # raw text: BOS + text + EOS, loss on all but BOS
    r.lengths(items)                                        # the same lengths, batched (the planner's path)
    ids, mask, problems = fit_to_seq_len(ids, mask, 1024)   # a row cut to seq_len, as plan and run cut it

Chats render exactly as transformers' ``apply_chat_template`` renders them (it *is* that call). The
loss mask is transformers' ``return_assistant_tokens_mask`` where the template marks assistant text
with ``{% generation %}``; otherwise each assistant turn's span is found by rendering prefixes (the
conversation up to the turn with the generation prompt, then up to and including the turn, less the
whitespace after its end-of-turn token) and mapping the characters to tokens through the tokenizer's
offsets. Rows of every format the planner detects
(:mod:`aegis.data.reading`) are read by the same reader and turned into turns by the same function.

The data layer, bottom to top: reading rows (:mod:`aegis.data.reading`) -> this renderer -> token counting
for plans (:mod:`aegis.data.tokenizers`, whose exact counter is this renderer) -> dataset statistics
(:mod:`aegis.data.profile`); training examples and batches (:mod:`aegis.train.data`, whose
``load_examples`` renders a dataset with a :class:`ChatRenderer`) sit on top. Nothing here imports them.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from aegis.errors import DatasetError, InvalidConfigError

__all__ = ["ChatRenderer", "load_chat_template", "fit_to_seq_len", "overlong_reason", "auto_tokenizer", "Item"]

Item = list[tuple[str, str]] | str
"""A row as (role, content) turns, or a raw text (``aegis.data.reading.to_conversation``'s output)."""

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def load_chat_template(value: str) -> str:
    """A ``chat_template:`` setting: a path to a .jinja file, or the Jinja text itself."""
    p = Path(value).expanduser()
    if "{" not in value and p.suffix in (".jinja", ".j2", ".txt"):
        if not p.is_file():
            raise InvalidConfigError(f"chat_template file {p} does not exist; pass a .jinja file or the template text")
        return p.read_text(encoding="utf-8")
    return value


def auto_tokenizer() -> Any:
    """transformers' ``AutoTokenizer``, imported without its "PyTorch was not found" advice: Aegis uses
    transformers for tokenizers only, where torch is not needed (ImportError when transformers is missing)."""
    if "transformers" in sys.modules:
        from transformers import AutoTokenizer

        return AutoTokenizer
    before = os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    try:
        from transformers import AutoTokenizer
    finally:
        if before is None:
            os.environ.pop("TRANSFORMERS_NO_ADVISORY_WARNINGS", None)
        else:
            os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = before
    return AutoTokenizer


def _load_tokenizer(folder: Path) -> Any:
    try:
        AutoTokenizer = auto_tokenizer()  # noqa: N806
    except ImportError as err:
        raise InvalidConfigError("training on a model's own tokenizer needs transformers: pip install 'aegis-ml[data]'") from err
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any((folder / n).is_file() for n in names):
        raise DatasetError(
            f"{folder} has no tokenizer files (tokenizer.json / tokenizer_config.json); copy the model's tokenizer "
            "into the folder (`hf download <org/name> --include 'tokenizer*' --local-dir <folder>`)"
        )
    try:
        # no remote code: a folder whose config.json has an auto_map (a Cognate export) would otherwise prompt
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as err:  # transformers raises OSError/ValueError/... for broken tokenizer files
        line = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise DatasetError(f"cannot load the tokenizer in {folder}: {line}") from err


class ChatRenderer:
    """A tokenizer and its chat template, rendering rows for planning and training alike."""

    def __init__(self, tokenizer: Any, *, chat_template: str | None = None, name: str = "tokenizer") -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.template: str | None = chat_template or getattr(tokenizer, "chat_template", None) or None
        if isinstance(self.template, dict):  # several named templates: the default one
            self.template = self.template.get("default")
        self.generation_tags = bool(self.template and _GENERATION_TAG.search(self.template))
        self.eos_id: int | None = getattr(tokenizer, "eos_token_id", None)
        self.bos_id: int | None = getattr(tokenizer, "bos_token_id", None)

    @classmethod
    def from_folder(cls, folder: str | Path, *, chat_template: str | None = None) -> "ChatRenderer":
        folder = Path(folder)
        template = load_chat_template(chat_template) if chat_template else None
        return cls(_load_tokenizer(folder), chat_template=template, name=str(folder))

    @property
    def has_template(self) -> bool:
        return bool(self.template)

    def require_template(self) -> str:
        """The chat template chats render with: the given one, else the tokenizer's own; DatasetError
        when there is neither. The one decision: planning (token counts) and training both ask here, so a
        tokenizer without a template is never planned with another family's."""
        if not self.template:
            raise DatasetError(
                f"the tokenizer in {self.name} has no chat template, and the data is chats: set `chat_template:` in "
                f"the run config (a .jinja file or the template text; `chat_template=` to analyze_dataset), put the "
                "template in the model folder as chat_template.jinja, or train on a text dataset"
            )
        return self.template

    _need_template = require_template

    # ------------------------------------------------------------------ rendering

    @staticmethod
    def _messages(turns: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in turns]

    def render_text(self, turns: Sequence[tuple[str, str]], *, generation_prompt: bool = False) -> str:
        """The conversation as the template renders it (``apply_chat_template(tokenize=False)``)."""
        try:
            return self.tokenizer.apply_chat_template(
                self._messages(turns), chat_template=self.require_template(), tokenize=False,
                add_generation_prompt=generation_prompt,
            )
        except DatasetError:
            raise
        except Exception as err:  # the template's raise_exception() (roles not alternating, ...)
            raise ValueError(f"the chat template refused the row: {(str(err).splitlines() or [''])[0][:160]}") from err

    def _encode_text(self, text: str) -> tuple[list[int], list[bool]]:
        ids = list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        if self.eos_id is not None:
            ids.append(int(self.eos_id))
        return ids, [False] + [True] * (len(ids) - 1)

    def _encode_chat(self, turns: Sequence[tuple[str, str]]) -> tuple[list[int], list[bool]]:
        template = self.require_template()
        if self.generation_tags:
            try:
                out = self.tokenizer.apply_chat_template(
                    self._messages(turns), chat_template=template, tokenize=True, return_dict=True,
                    return_assistant_tokens_mask=True,
                )
            except Exception as err:
                raise ValueError(f"the chat template refused the row: {(str(err).splitlines() or [''])[0][:160]}") from err
            return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]
        full = self.render_text(turns)
        spans = self._assistant_spans(turns, full)
        enc = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        mask = [False] * len(ids)
        for k, (start, end) in enumerate(enc["offset_mapping"]):
            if end > start and any(s <= start < e for s, e in spans):
                mask[k] = True
        return ids, mask

    def _assistant_spans(self, turns: Sequence[tuple[str, str]], full: str) -> list[tuple[int, int]]:
        """Character spans of assistant turns: between the prefix rendered with the generation prompt and
        the prefix rendered through the turn (its end-of-turn tokens included). When a template renders
        earlier turns differently once later turns exist, the turn's content is located in the text."""
        spans: list[tuple[int, int]] = []
        cursor = 0
        for i, (role, content) in enumerate(turns):
            if role != "assistant":
                continue
            before = self.render_text(turns[:i], generation_prompt=True) if i else ""
            through = self.render_text(turns[: i + 1])
            if full.startswith(before) and full.startswith(through) and len(through) > len(before) >= cursor:
                # the turn and its end-of-turn token; not the whitespace a template puts between turns
                end = max(len(through.rstrip()), len(before) + 1)
                spans.append((len(before), end))
                cursor = len(through)
                continue
            at = full.find(content, cursor) if content else -1
            if at >= 0:
                spans.append((at, at + len(content)))
                cursor = at + len(content)
        return spans

    def render(self, item: Item) -> tuple[list[int], list[bool]]:
        """(token ids, loss mask) of one row: assistant tokens for chats, all but the first for text."""
        return self._encode_text(item) if isinstance(item, str) else self._encode_chat(item)

    def texts(self, items: Sequence[Item]) -> list[str]:
        """Rendered texts (chat template applied; raw text as is)."""
        return [it if isinstance(it, str) else self.render_text(it) for it in items]

    def count(self, texts: Sequence[str], *, special: bool) -> list[int]:
        """Token counts of texts (the Rust batch encoder when there is one)."""
        if not texts:
            return []
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None and hasattr(backend, "encode_batch_fast"):
            return [len(e.ids) for e in backend.encode_batch_fast(list(texts), add_special_tokens=special)]
        return [len(ids) for ids in self.tokenizer(list(texts), add_special_tokens=special)["input_ids"]]

    def lengths(self, items: Sequence[Item]) -> list[int]:
        """``len(render(item)[0])`` for each item, batched."""
        texts = [it for it in items if isinstance(it, str)]
        chats = [it for it in items if not isinstance(it, str)]
        text_n = iter([n + (self.eos_id is not None) for n in self.count(texts, special=True)])
        chat_n = iter(self.count(self.texts(chats), special=False))
        return [next(text_n) if isinstance(it, str) else next(chat_n) for it in items]


# ---------------------------------------------------------------------------------------------- seq_len


def fit_to_seq_len(
    ids: list[int], mask: list[bool] | None, seq_len: int | None, overlong: Literal["truncate", "drop"] = "truncate"
) -> tuple[list[int] | None, list[bool] | None, list[str]]:
    """A rendered row cut to ``seq_len`` as training takes it: (ids, mask, problems), ids None when the row is
    dropped. Problems: ``truncated`` (longer than seq_len, cut), ``overlong`` (longer, dropped with
    ``overlong="drop"``), ``no_targets`` (no assistant token left to learn; dropped). ``mask`` None: not known
    (an approximate tokenizer), no ``no_targets`` check. The planner asks the same of the rows it tokenizes."""
    problems: list[str] = []
    if seq_len is not None and len(ids) > seq_len:
        if overlong == "drop":
            return None, None, ["overlong"]
        ids, mask = ids[:seq_len], (None if mask is None else mask[:seq_len])
        problems.append("truncated")
    if len(ids) < 2 or (mask is not None and not any(mask[1:])):
        return None, None, [*problems, "no_targets"]
    return ids, mask, problems


def overlong_reason(kind: str, tokens: int, seq_len: int | None) -> str:
    """Why :func:`fit_to_seq_len` cut or dropped a row of ``tokens`` tokens (the plan's and the run's words)."""
    if kind == "no_targets":
        return f"no assistant token in its first {seq_len:,}" if seq_len is not None else "no assistant token"
    return f"{tokens:,} tokens, seq_len {seq_len:,}"
