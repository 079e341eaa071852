"""Optional LLM understanding: free-form text → the same typed `PlanRequest` the parser returns.

Used only when the deterministic parser reads nothing (or names something unknown) and an LLM is
configured. The LLM sees the conversation's current request so it can resolve follow-ups, and
returns a `PlanRequest` — or a `PlanQuestion` when the message asks about the current plan ("which part is
hogging the VRAM?") — validated by pydantic-ai, which retries a malformed answer.

    extractor = RequestExtractor.from_settings(settings)          # None when no LLM is configured
    req = extractor.extract("teach a small qwen SQL on my 24 GB card", current=PlanRequest(...))

Tests pass a pydantic-ai ``TestModel``/``FunctionModel`` as ``model``; nothing reaches a network.
"""

from __future__ import annotations

from typing import Any

from aegis.errors import AegisError
from aegis.schema import PlanRequest

from aegis_agent.questions import PlanQuestion
from aegis_agent.settings import AgentSettings

__all__ = ["INSTRUCTIONS", "RequestExtractor"]

INSTRUCTIONS = (
    "You turn a user's message about fine-tuning a language model into a planning request. "
    "Fill only the fields the user states or clearly implies; leave the others null. "
    "model: a Hugging Face id or a short alias such as 'llama-3.1-8b' or 'qwen2.5-7b'. "
    "method: 'full', 'lora' or 'qlora' (4-bit LoRA). gpu: a GPU name such as 'rtx-3090', 'rtx-4090', "
    "'a100-80gb', 'h100'. gpu_count: number of GPUs. lora_rank, micro_batch_size, effective_batch_size, "
    "seq_len, epochs: numbers. optimizer: adamw, adamw_8bit, paged_adamw_8bit, sgd or adafactor. "
    "lora_targets: LoRA module names such as ['q_proj', 'v_proj'], or ['all-linear']. "
    "When a current request is given, the message may be a follow-up: return only what changes. "
    "When the message asks about the current plan instead of changing it (which part uses the most memory, why "
    "gradient checkpointing is on or off, how long the run takes or what it costs), return a PlanQuestion."
)


class RequestExtractor:
    """A pydantic-ai agent whose output type is `PlanRequest`."""

    def __init__(self, model: Any) -> None:
        from pydantic_ai import Agent

        self._agent = Agent(model, output_type=[PlanRequest, PlanQuestion], instructions=INSTRUCTIONS, retries=2)

    @classmethod
    def from_settings(cls, settings: AgentSettings) -> RequestExtractor | None:
        """The extractor for ``settings.llm_model`` (None when no LLM is configured)."""
        if not settings.llm_model:
            return None
        if not settings.llm_base_url:
            return cls(settings.llm_model)
        try:
            from pydantic_ai.models.openai import OpenAIChatModel
            from pydantic_ai.providers.openai import OpenAIProvider
        except ImportError as err:
            raise AegisError(
                "AEGIS_LLM_BASE_URL needs the OpenAI client: `uv pip install 'pydantic-ai-slim[openai]'`, "
                "or unset AEGIS_LLM_MODEL to use the parser only"
            ) from err
        provider = OpenAIProvider(base_url=settings.llm_base_url, api_key=settings.llm_api_key or "not-needed")
        return cls(OpenAIChatModel(settings.llm_model, provider=provider))

    def extract(self, text: str, current: PlanRequest | None = None) -> PlanRequest | PlanQuestion:
        """The request ``text`` describes (fields it does not mention are None), or the question it asks about the
        current plan."""
        prompt = text
        if current is not None and current.model_dump(exclude_none=True):
            prompt = f"Current request: {current.model_dump_json(exclude_none=True)}\nMessage: {text}"
        result = self._agent.run_sync(prompt)
        return result.output
