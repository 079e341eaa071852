"""Phase 3's vocabulary and data: the thinking/strategy tokens, reasoning rows (local JSONL or generated through an
OpenAI-compatible endpoint with pydantic-ai), and the bundled synthetic task.

A reasoning row is ``{"prompt": ..., "reasoning": "[thinking] <step> ... [/endthinking]", "answer": ...}``; baking
trains on ``prompt + reasoning + answer``, Quiet-STaR on ``prompt + answer`` (the thought is latent there).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from aegis.errors import DatasetError

__all__ = ["START", "END", "STRATEGIES", "THOUGHT_TOKENS", "ReasoningRow", "SizeChange", "add_thinking_tokens",
           "load_reasoning", "validate_row", "parity_rows", "generate_reasoning", "GenerationLimits", "endpoint_model",
           "read_prompts", "write_reasoning"]

START, END = "[thinking]", "[/endthinking]"
STRATEGIES = ("<step>", "<mece>", "<falsify>", "<expert>", "<orthogonal>", "<doubt>", "<bayesian>", "<multidomain>",
              "<correct>", "<uncertain>")
THOUGHT_TOKENS = (START, END, *STRATEGIES)
"""The seed's 12 tokens: two outer markers and ten strategies."""


@dataclass(frozen=True)
class ReasoningRow:
    prompt: str
    reasoning: str
    answer: str


@dataclass(frozen=True)
class SizeChange:
    """What adding the tokens did to the model."""

    tokens_added: int
    vocab_before: int
    vocab_after: int
    params_before: int
    params_after: int

    @property
    def params_added(self) -> int:
        return self.params_after - self.params_before


def validate_row(row: dict[str, Any], where: str = "row") -> ReasoningRow:
    """A reasoning row with both markers in order and a strategy token between them; else a DatasetError."""
    if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("prompt", "reasoning", "answer")):
        raise DatasetError(f"{where}: a reasoning row needs string fields prompt, reasoning and answer")
    r = row["reasoning"]
    a, b = r.find(START), r.find(END)
    if a < 0 or b < a:
        raise DatasetError(f"{where}: reasoning must hold {START} ... {END} in that order")
    if not any(s in r[a:b] for s in STRATEGIES):
        raise DatasetError(f"{where}: reasoning holds no strategy token ({', '.join(STRATEGIES)})")
    return ReasoningRow(row["prompt"], r, row["answer"])


def load_reasoning(path: str | Path) -> list[ReasoningRow]:
    """Rows of a local JSONL file, each validated (the line number is in the error)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path} is not a file: pass a JSONL of {{prompt, reasoning, answer}} rows")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{path}:{n} is not JSON ({err.msg}); one object per line") from None
        rows.append(validate_row(obj, f"{path}:{n}"))
    if len(rows) < 2:
        raise DatasetError(f"{path} holds {len(rows)} reasoning rows; need at least 2 (one held out)")
    return rows


def parity_rows(n: int, bits: int = 8, seed: int = 0) -> list[ReasoningRow]:
    """The bundled synthetic task: parity of ``bits`` bits, whose carry chain the thought writes out.

    ``prompt "1 0 1 1 ... ="``, ``reasoning "[thinking] <step> 1 1 0 1 ... [/endthinking]"`` (running parities:
    each is the previous one xor the next bit), ``answer " 1"``. Parity in one forward pass is hard for a small
    transformer; each scratchpad step is a two-token lookup. Distinct inputs, in random order."""
    rng = random.Random(seed)
    values = rng.sample(range(2**bits), min(n, 2**bits))
    rows = []
    for v in values:
        xs = [(v >> i) & 1 for i in range(bits)]
        run = list(np.cumsum(xs) % 2)
        rows.append(ReasoningRow(" ".join(map(str, xs)) + " =",
                                 f" {START} <step> " + " ".join(map(str, run)) + f" {END}", f" {run[-1]}"))
    return rows


def add_thinking_tokens(model: Any, params: dict[str, Any], tokenizer: Any,
                        tokens: tuple[str, ...] = THOUGHT_TOKENS) -> tuple[Any, dict[str, Any], SizeChange]:
    """Add ``tokens`` to the tokenizer (special, never split) and grow the embeddings and the LM head to hold them.

    Each new row is the mean of the rows of the tokens its name spells (``"[thinking]"`` -> ``thinking``), as
    Quiet-STaR initialises its markers from existing tokens. Returns ``(model, params, size change)``; the model
    is rebuilt with the new ``vocab_size``."""
    import jax.numpy as jnp

    from aegis.train.modeling import build_model

    count = lambda p: int(sum(np.prod(np.shape(x)) for x in __import__("jax").tree.leaves(p)))  # noqa: E731
    before_params = count(params)
    vocab_before = int(model.config["vocab_size"])
    new = [t for t in tokens if t not in tokenizer.get_vocab()]
    spell = {t: tokenizer.encode(t.strip("[]<>/").replace("end", "end "), add_special_tokens=False) or [0] for t in new}
    tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)}, replace_extra_special_tokens=False)
    vocab_after = max(vocab_before, len(tokenizer))
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in new}

    def grow(w: Any) -> Any:
        w = np.asarray(w)
        out = np.concatenate([w, np.zeros((vocab_after - w.shape[0], w.shape[1]), w.dtype)]) if vocab_after > w.shape[0] else w.copy()
        for t, i in ids.items():
            out[i] = w[[j for j in spell[t] if j < w.shape[0]] or [0]].mean(0)
        return jnp.asarray(out)

    params = dict(params)
    if getattr(model, "family", None) == "cognate":  # flat names, the head tied to the embeddings
        params["model.embed_tokens.weight"] = grow(params["model.embed_tokens.weight"])
        return model.with_vocab(vocab_after), params, SizeChange(len(new), vocab_before, vocab_after, before_params,
                                                                 count(params))
    params["model"] = dict(params["model"])
    params["model"]["embed_tokens"] = {**params["model"]["embed_tokens"],
                                       "weight": grow(params["model"]["embed_tokens"]["weight"])}
    if "lm_head" in params:
        params["lm_head"] = {**params["lm_head"], "weight": grow(params["lm_head"]["weight"])}
    config = dict(model.config, vocab_size=vocab_after)
    new_model = build_model(config, dtype=model.dtype, param_dtype=model.param_dtype)
    return new_model, params, SizeChange(len(new), vocab_before, vocab_after, before_params, count(params))


@dataclass(frozen=True)
class GenerationLimits:
    """Limits of generating reasoning rows through an endpoint."""

    cost_limit_usd: float = 5.0
    usd_per_1k_tokens: float = 0.002
    retries: int = 3
    requests_per_minute: float = 50.0


def generate_reasoning(model: Any, prompts: list[str], *, strategy: str = "<step>",
                       limits: GenerationLimits = GenerationLimits(),
                       sleep: Callable[[float], None] = time.sleep) -> tuple[list[ReasoningRow], dict[str, Any]]:
    """Ask ``model`` (a pydantic-ai model: an OpenAI-compatible endpoint, or ``FunctionModel`` in tests) for one
    reasoning row per prompt, in the markers' format; rows whose markers fail validation are retried (up to
    ``limits.retries``), then dropped. Stops before the cost limit; paces requests to the rate limit.
    Returns ``(rows, stats)``."""
    from pydantic import BaseModel
    from pydantic_ai import Agent

    class Reasoning(BaseModel):
        reasoning: str
        answer: str

    system = (f"Think step by step. Write the reasoning as '{START} {strategy} ... {END}' using one of the "
              f"strategy tokens {', '.join(STRATEGIES)} inside the markers, then give the final answer alone.")
    agent = Agent(model, output_type=Reasoning, system_prompt=system)
    rows: list[ReasoningRow] = []
    stats = {"requests": 0, "tokens": 0, "cost_usd": 0.0, "rejected": 0, "stopped_at_cost_limit": False}
    gap = 60.0 / limits.requests_per_minute
    last = -1e9
    for prompt in prompts:
        for _ in range(limits.retries + 1):
            if stats["cost_usd"] >= limits.cost_limit_usd:
                stats["stopped_at_cost_limit"] = True
                return rows, stats
            wait = gap - (time.monotonic() - last)
            if wait > 0:
                sleep(wait)
            last = time.monotonic()
            try:
                result = agent.run_sync(prompt)
            except Exception as err:  # noqa: BLE001 - an endpoint error is retried, then the prompt skipped
                stats["rejected"] += 1
                stats["last_error"] = f"{type(err).__name__}: {err}"[:200]
                continue
            usage = result.usage
            tokens = int((usage.input_tokens or 0) + (usage.output_tokens or 0))
            stats["requests"] += 1
            stats["tokens"] += tokens
            stats["cost_usd"] += tokens / 1000 * limits.usd_per_1k_tokens
            try:
                rows.append(validate_row({"prompt": prompt, "reasoning": result.output.reasoning,
                                          "answer": result.output.answer}))
                break
            except DatasetError:
                stats["rejected"] += 1
    return rows, stats



def endpoint_model(base_url: str, model_name: str, api_key: str | None = None) -> Any:
    """A pydantic-ai model for an OpenAI-compatible chat endpoint (vLLM, llama.cpp's server, OpenAI itself...) at
    ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``) serving ``model_name``."""
    from aegis.errors import MissingExtraError

    try:
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider
    except ImportError as err:
        raise MissingExtraError(
            "generating reasoning rows through an endpoint needs the 'llm' extra (pydantic-ai's OpenAI client): "
            "pip install 'aegis-ml[llm]'"
        ) from err
    return OpenAIChatModel(model_name, provider=OpenAIProvider(base_url=base_url, api_key=api_key or "not-needed"))


PROMPT_FIELDS = ("prompt", "question", "instruction", "problem", "input")


def read_prompts(source: str | Path) -> list[str]:
    """The prompts to generate reasoning for: a ``.txt`` file (one prompt per non-empty line), or any dataset
    `aegis.data.reading.iter_records` reads (JSONL / JSON / CSV / Parquet, a dataset folder, a cached Hub id) whose
    rows carry one of :data:`PROMPT_FIELDS`."""
    path = Path(source).expanduser()
    if path.suffix.lower() == ".txt":
        if not path.is_file():
            raise DatasetError(f"no such file: {source}; give a .txt (one prompt per line) or a .jsonl with 'prompt'")
        prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        from aegis.data.reading import iter_records

        prompts = []
        for n, row in enumerate(iter_records(str(source)), 1):
            field = next((f for f in PROMPT_FIELDS if isinstance(row.get(f), str) and row[f].strip()), None)
            if field is None:
                raise DatasetError(f"{source} row {n} has no prompt: give each row one of {', '.join(PROMPT_FIELDS)}")
            prompts.append(row[field].strip())
    if not prompts:
        raise DatasetError(f"{source} holds no prompts")
    return prompts


def write_reasoning(rows: list[ReasoningRow], path: str | Path, *, overwrite: bool = False) -> Path:
    """``rows`` as the JSONL `load_reasoning` reads (and `aegis quietstar` bakes on), written atomically; an existing
    file is replaced only with ``overwrite``."""
    from aegis._outdir import write_output_file

    text = "".join(json.dumps({"prompt": r.prompt, "reasoning": r.reasoning, "answer": r.answer},
                              ensure_ascii=False) + "\n" for r in rows)
    return write_output_file(path, text, overwrite=overwrite)
