"""Understanding a chat message: which tool to call with which arguments, or what to answer at once.

Deterministic first, in this order: run commands in the supervisor's grammar (``set_lr 1e-5``,
``resume``, ``interrupt`` …), starting a run, run status, a question about the current plan
(`aegis_agent.questions`: "what eats the most memory?", "why checkpointing?", "how long will it take?"),
GPU comparison, catalog listings, "explain <memory component>", and finally a planning request read by
`aegis.planning.parse` ("what if I use rank 64?" is a follow-up plan). A planning
message is a follow-up when the conversation already has a request: what it names replaces the
previous value, everything else carries over ("on a 4090 instead", "rank 32", "with 8-bit adam").
Only when the parser reads nothing, or names something unknown, is the optional LLM asked
(`aegis_agent.llm.RequestExtractor`), and its answer goes through the same carry-over. A message naming one
model Aegis cannot resolve ('gemma-3-27b') is answered with that one-line error (close models, how to pass a
config.json) — never planned, compared or explained as another model, and not handed to the LLM; a model the LLM
names is read by the same decision (`aegis.models.resolve.match_model`) as the parser's.
With a remote ``policy`` (`aegis.access.PathPolicy`), a message naming a local path outside the allowed
roots is answered with the refusal before the parser looks at the file system.

    u = understand("rank 32", request=PlanRequest(model="meta-llama/Llama-3.1-8B", gpu="rtx-4090"))
    u.call.name, u.call.args["lora_rank"]        # 'plan_finetune', 32
"""

from __future__ import annotations

import re
from typing import Any

from aegis.access import PathPolicy
from aegis.errors import AegisError, CommandError, PathNotAllowedError
from aegis.planning.parse import ParseIssue, parse_request_lenient
from aegis.schema import Frozen, PlanRequest
from aegis.supervise.commands import COMMAND_NAMES, parse_command
from pydantic import Field

from aegis_agent.questions import PlanQuestion, QuestionKind, classify

__all__ = ["HELP", "ToolCall", "Understanding", "carry_over", "understand"]

HELP = (
    "I plan fine-tunes and steer training runs. Try:\n"
    "- `qlora llama-3.1-8b on 3090` (then follow up: `on a 4090 instead`, `rank 32`, `with 8-bit adam`)\n"
    "- `compare gpus` — which GPUs fit the current request, cheapest first\n"
    "- `explain the optimizer states` — where a memory figure comes from; after a plan: `what eats the most memory?`, "
    "`why checkpointing?`, `how long will it take?`, `what if I use rank 64?`\n"
    "- `list models`, `list gpus`\n"
    "- `start the run`, `status`, and run commands: `set_lr 1e-5`, `blacklist_samples 12 40`, `skip_batch`, "
    "`interrupt`, `resume`, `stop`"
)

_CARRIED = ("model", "method", "gpu", "dataset")
"""Fields a follow-up naming a different model keeps from the previous request."""

_START = re.compile(
    r"^\s*(?:please\s+)?(?:start|launch|kick\s+off|begin|run)\b.*\b(?:run|training|train|job|it|this)\b"
    r"|^\s*(?:train|run)\s+(?:it|this|that)\b",
    re.IGNORECASE,
)
_STATUS = re.compile(r"\bstatus\b|\bhow(?:'s| is) (?:the |my )?(?:run|training)\b|\bprogress\b", re.IGNORECASE)
_COMPARE = re.compile(r"\bcompare\b|\bwhich gpus?\b|\bwhat gpus?\b.*\bfit|\bcheapest\b", re.IGNORECASE)
_MODELS = re.compile(r"^\s*(?:list|show|which|what)\b.*\bmodels\b|^\s*models\s*\??\s*$", re.IGNORECASE)
_GPUS = re.compile(r"^\s*(?:list|show)\b.*\bgpus\b|^\s*gpus\s*\??\s*$", re.IGNORECASE)
_EXPLAIN = re.compile(
    r"^\s*(?:explain|why\s+(?:is|are|does|do)|what\s+(?:is|are)|what's|tell me about|break down)\s+(.+)$", re.IGNORECASE
)
_HELP = re.compile(r"^\s*(?:help|hi|hello|hey|\?|what can you do\??)\s*[!.?]*\s*$", re.IGNORECASE)
_RUN_ID = re.compile(r"\b((?:run|demo|chat|slack)-[\w-]+)\b")
_GPU_WORD = re.compile(
    r"\b(?:on|about|with|to|try)\s+(?:an?\s+|the\s+|\d+\s*x\s*)?([a-z]*-?\d{3,4}[a-z0-9-]*)\b", re.IGNORECASE
)
_FILLER = re.compile(
    r"\b(?:the|a|an|of|for|this|that|my|so|big|large|much|memory|component|line|figure|number|here|it|its)\b|[?.!]",
    re.IGNORECASE,
)


class ToolCall(Frozen):
    """A tool the agent will call."""

    name: str = Field(description="Tool name (see `aegis_agent.tools`).")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments, as the tool's schema takes them.")


class Understanding(Frozen):
    """What to do with a message: call a tool, or answer directly."""

    call: ToolCall | None = None
    reply: str | None = Field(default=None, description="An immediate answer (help, a question back, an input error).")
    source: str = Field(default="parser", description="'parser', 'llm' or 'rules': what understood the message.")


def carry_over(previous: PlanRequest | None, new: PlanRequest, implied: tuple[str, ...] = ()) -> PlanRequest:
    """``new`` as a follow-up of ``previous``: what it names wins; a new model keeps only model/method/GPU/dataset.
    A field ``new`` only implies (the LoRA method of 'and with lora dropout 0.1') keeps the previous value."""
    if previous is None:
        return new
    kept = {k: None for k in implied if getattr(previous, k, None) is not None}
    if kept:
        new = new.model_copy(update=kept)
    base = previous
    if new.model and new.model != previous.model:
        base = PlanRequest(
            **{k: getattr(previous, k) for k in _CARRIED if getattr(previous, k) is not None},
            gpu_count=previous.gpu_count,
        )
    if new.gpu and new.gpu != base.gpu and new.gpu_count is None:
        base = base.model_copy(update={"gpu_count": None})  # "on a 4090 instead" of "2x a100": one 4090
    return base.merged(new)


def _request_args(req: PlanRequest) -> dict[str, Any]:
    return req.model_dump(exclude_none=True)


def _command(text: str, run_id: str | None) -> Understanding | None:
    words = text.split()
    if not words:
        return None
    verb = words[0].lower().replace("-", "_")
    if verb not in COMMAND_NAMES or verb == "status":
        return None
    if verb == "stop" and len(words) > 1 or verb == "resume" and len(words) > 2:
        return None  # prose such as "stop worrying about ..." is not a command
    try:
        cmd = parse_command(text)
    except CommandError as err:
        return Understanding(reply=f"That command is malformed: {err}", source="rules")
    return Understanding(
        call=ToolCall(name="send_run_command", args={"command": cmd.text, "run_id": run_id}), source="rules"
    )


def understand(
    text: str,
    *,
    request: PlanRequest | None = None,
    run_id: str | None = None,
    extractor: Any = None,
    policy: PathPolicy | None = None,
) -> Understanding:
    """Decide what ``text`` asks for, given the conversation's current request and run (and what paths it may name)."""
    text = (text or "").strip()
    if not text or _HELP.match(text):
        return Understanding(reply=HELP, source="rules")
    said_run = _RUN_ID.search(text)
    run = said_run.group(1) if said_run else run_id
    cmd = _command(_RUN_ID.sub("", text).strip() if said_run else text, run)
    if cmd is not None:
        return cmd
    if _START.search(text):
        return Understanding(
            call=ToolCall(name="start_run", args={"request": _request_args(request) if request else None}),
            source="rules",
        )
    if _STATUS.search(text):
        return Understanding(call=ToolCall(name="run_status", args={"run_id": run}), source="rules")
    question = classify(text)
    if policy is not None:
        try:
            policy.check_mentions(text)  # before the parser stats paths a remote user may not use
        except PathNotAllowedError as err:
            return Understanding(reply=str(err), source="rules")
    parsed = parse_request_lenient(text)
    unknown_model = _unknown_model(parsed.issues)
    if unknown_model:
        return Understanding(reply=unknown_model, source="parser")
    if question is not None and not _names_a_change(parsed.request):
        return _question(question, request, "rules")
    if _COMPARE.search(text):
        req = carry_over(request, parsed.request, parsed.implied)
        return Understanding(call=ToolCall(name="compare_gpus", args=_request_args(req)), source="rules")
    if _MODELS.search(text):
        return Understanding(call=ToolCall(name="list_models"), source="rules")
    if _GPUS.search(text):
        return Understanding(call=ToolCall(name="list_gpus"), source="rules")
    explain = _EXPLAIN.match(text)
    if explain and not parsed.request.model_dump(exclude_none=True):
        phrase = " ".join(_FILLER.sub(" ", explain.group(1)).split())
        if phrase:
            return Understanding(
                call=ToolCall(
                    name="explain_memory_component",
                    args={"component": phrase, "request": _request_args(request) if request else None},
                ),
                source="rules",
            )
    if parsed.request.model_dump(exclude_none=True) and not parsed.issues:
        return _plan(carry_over(request, parsed.request, parsed.implied), "parser")
    if extractor is not None:
        try:
            req = extractor.extract(text, current=request)
        except AegisError as err:
            return Understanding(reply=f"The language model could not read that: {err}", source="llm")
        if isinstance(req, PlanQuestion):
            return _question(req.kind, request, "llm")
        if req.model:
            try:
                req = _checked_model(req)
            except AegisError as err:
                return Understanding(reply=str(err), source="llm")
        if req.model_dump(exclude_none=True):
            return _plan(carry_over(request, req), "llm")
    if not parsed.issues:
        unknown = _unknown_gpu(text)
        if unknown:
            return Understanding(reply=f"I could not read part of that request:\n- {unknown}", source="parser")
    if parsed.issues:
        lines = "\n".join(f"- {issue.message}" for issue in parsed.issues)
        return Understanding(reply=f"I could not read part of that request:\n{lines}", source="parser")
    return Understanding(reply="I did not find a request in that. " + HELP, source="parser")


def _names_a_change(parsed: PlanRequest) -> bool:
    """The message names a variant to plan ('how long would it take on an a100'), not only a question: a field
    beyond the checkpointing a 'why checkpointing?' implies."""
    return bool(parsed.model_dump(exclude_none=True, exclude={"gradient_checkpointing"}))


def _question(kind: QuestionKind, request: PlanRequest | None, source: str) -> Understanding:
    """Answer a question about the current plan (a question back when there is none yet)."""
    if request is None:
        return Understanding(reply="Plan something first (e.g. `qlora llama-3.1-8b on 3090`), then ask about it.",
                             source=source)
    return Understanding(
        call=ToolCall(name="answer_plan_question", args={"kind": kind, "request": _request_args(request)}),
        source=source,
    )


def _unknown_model(issues: tuple[ParseIssue, ...]) -> str | None:
    """The error for a model the message names precisely ('gemma-3-27b', 'mistral nemo') and Aegis cannot
    resolve: the whole answer. A vague one ('a small qwen') is left to the LLM, when there is one."""
    from aegis.models.resolve import names_one_model

    return next((i.message for i in issues if i.part == "model" and names_one_model(i.text)), None)


def _checked_model(req: PlanRequest) -> PlanRequest:
    """``req`` with the LLM's model read as the parser reads one (bundled id, Hub id or path); UnknownModelError."""
    from aegis.models.resolve import match_model

    assert req.model is not None
    return req.model_copy(update={"model": match_model(req.model).model_id})


def _unknown_gpu(text: str) -> str | None:
    """The catalog's error for a GPU-like word ('on a 3900') the parser skipped, if any."""
    from aegis.planning.hardware import find_gpu

    for word in _GPU_WORD.findall(text):
        try:
            find_gpu(word)
        except AegisError as err:
            return str(err)
    return None


def _plan(req: PlanRequest, source: str) -> Understanding:
    return Understanding(call=ToolCall(name="plan_finetune", args=_request_args(req)), source=source)
