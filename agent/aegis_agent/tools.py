"""The SDK's operations as langchain-core tools with pydantic argument schemas.

Each tool returns ``(content, artifact)``: ``content`` is Markdown for the user (rendered by the
SDK's renderers), ``artifact`` a small dict the graph reads to update the conversation (the
request that was planned, the run that was started) — never a whole report. Expected failures
(unknown GPU or model, nothing fits, unknown run, a rejected command, a path the policy refuses)
come back as content that says what to do, with ``artifact["error"]``; anything else propagates.

Every request's model and dataset pass the toolkit's `aegis.access.PathPolicy` before anything
reads them: for a remote front end, local paths only under the configured roots.

    toolkit = AegisToolkit(RunManager(settings), policy=settings.path_policy)
    tools = toolkit.tools()                 # list[StructuredTool]
    toolkit.last_report                     # the PlanReport of the latest successful plan
"""

from __future__ import annotations

import difflib
import inspect
import threading
from collections import OrderedDict
from typing import Any

from aegis.access import PathPolicy
from aegis.errors import AegisError
from aegis.units import gib
from aegis.planning.report._facts import breakdown_tier
from aegis.schema import Frozen, MemoryComponent, PlanReport, PlanRequest
from langchain_core.tools import StructuredTool
from pydantic import Field

from aegis_agent.questions import QuestionKind, answer
from aegis_agent.runs import RunManager, status_markdown

__all__ = [
    "TOOL_NAMES",
    "AegisToolkit",
    "ExplainArgs",
    "NoArgs",
    "QuestionArgs",
    "RunCommandArgs",
    "RunStatusArgs",
    "StartRunArgs",
    "explain_component",
]

TOOL_NAMES = (
    "plan_finetune",
    "compare_gpus",
    "explain_memory_component",
    "answer_plan_question",
    "list_models",
    "list_gpus",
    "start_run",
    "run_status",
    "send_run_command",
)
_CACHE_SIZE = 16


class NoArgs(Frozen):
    """No arguments."""


class ExplainArgs(Frozen):
    """Which memory component to explain, for which request."""

    component: str = Field(description="Component name or key, e.g. 'optimizer states', 'activations', 'logits'.")
    request: PlanRequest | None = Field(default=None, description="The planned request (None: the last plan).")


class QuestionArgs(Frozen):
    """A question about the current plan, answered from the plan's own figures."""

    kind: QuestionKind = Field(description="largest_component, why_checkpointing or time_and_cost.")
    request: PlanRequest | None = Field(default=None, description="The planned request (None: the last plan).")


class StartRunArgs(Frozen):
    """The plan whose recommended config (and fallbacks) the run trains."""

    request: PlanRequest | None = Field(default=None, description="The planned request (None: the last plan).")


class RunStatusArgs(Frozen):
    """Which run."""

    run_id: str | None = Field(default=None, description="Run id (None: the conversation's run, else the latest).")


class RunCommandArgs(Frozen):
    """A command for a run, in the supervisor's grammar."""

    command: str = Field(description="resume | stop | set_lr <v> | skip_batch | blacklist_samples <ids…> | interrupt")
    run_id: str | None = Field(default=None, description="Run id (None: the conversation's run, else the latest).")


def _gb(n: int) -> str:
    return gib(n, 2)


def _match(phrase: str, components: tuple[MemoryComponent, ...]) -> MemoryComponent | None:
    phrase = phrase.lower().strip()
    best, best_score = None, 0.0
    for c in components:
        names = [c.key.lower(), c.name.lower(), *c.name.lower().replace("(", " ").replace(")", " ").split()]
        score = max(difflib.SequenceMatcher(None, phrase, n).ratio() for n in names)
        if any(w in phrase.split() for w in (c.key.lower(), *c.name.lower().split()[:1])):
            score += 0.5
        if score > best_score:
            best, best_score = c, score
    return best if best_score >= 0.6 else None


def explain_component(report: PlanReport, phrase: str) -> tuple[str, MemoryComponent | None]:
    """Markdown explaining the memory component ``phrase`` names (or the list of components when none matches)."""
    tier = breakdown_tier(report)
    if tier is None:
        return f"Nothing fits, so there is no breakdown to explain: {report.nothing_fits}", None
    mem = tier.memory
    comp = _match(phrase, mem.components)
    listed = ", ".join(f"`{c.name}`" for c in mem.components)
    if comp is None:
        return f"I do not know a memory component called '{phrase}'. This plan has: {listed}.", None
    share = comp.bytes / mem.total_bytes if mem.total_bytes else 0.0
    lines = [
        f"**{comp.name}: {_gb(comp.bytes)}** ({share:.0%} of the {_gb(mem.total_bytes)} predicted peak, {tier.name} tier)",
        f"- **How:** {comp.formula}",
    ]
    if comp.note:
        lines.append(f"- **Why / what changes it:** {comp.note}")
    if not comp.in_peak:
        lines.append("- Shown for information: not counted in the training peak.")
    return "\n".join(lines), comp


class AegisToolkit:
    """The agent's tools, bound to one `RunManager`; remembers recent reports for the front ends."""

    def __init__(self, runs: RunManager, *, policy: PathPolicy | None = None) -> None:
        self.runs = runs
        self.policy = policy if policy is not None else runs.settings.path_policy
        self._reports: OrderedDict[str, PlanReport] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ reports

    def report_for(self, request: PlanRequest) -> PlanReport:
        """The plan of ``request`` (cached: follow-ups and front ends re-read it for free); PathNotAllowedError
        when the policy refuses its model or dataset, before anything is read."""
        from aegis.planning.planner import plan_request

        self.policy.check_request(request)
        key = request.model_dump_json(exclude_none=True)
        with self._lock:
            if key in self._reports:
                self._reports.move_to_end(key)
                return self._reports[key]
        report = plan_request(request)
        self._store(key, report)
        return report

    def _store(self, key: str, report: PlanReport) -> None:
        with self._lock:
            self._reports[key] = report
            self._reports.move_to_end(key)
            while len(self._reports) > _CACHE_SIZE:
                self._reports.popitem(last=False)

    def cached_report(self, request: PlanRequest) -> PlanReport | None:
        with self._lock:
            return self._reports.get(request.model_dump_json(exclude_none=True))

    # ------------------------------------------------------------------ tool bodies

    def plan_finetune(self, **fields: Any) -> tuple[str, dict[str, Any]]:
        """Plan a fine-tune: memory breakdown, recommended / aggressive / fallback configs, time, cost and risks.
        Give the model, method (full, lora, qlora) and GPU; optionally dataset, rank, batch, seq_len, epochs, optimizer."""
        from aegis.planning.report import render_markdown

        req = PlanRequest(**fields)
        try:
            report = self.report_for(req)
        except AegisError as err:
            return f"I could not plan that: {err}", {"error": str(err), "request": req.model_dump(exclude_none=True)}
        rec = report.recommended
        canonical = report.request.model_copy(update={"model": report.model.model_id, "gpu": report.gpu.id})
        self._store(canonical.model_dump_json(exclude_none=True), report)  # what follow-ups and front ends look up
        return render_markdown(report), {
            "request": canonical.model_dump(exclude_none=True),
            "fits": rec is not None,
            "total_bytes": rec.memory.total_bytes if rec else None,
        }

    def compare_gpus(self, **fields: Any) -> tuple[str, dict[str, Any]]:
        """Plan the same job on every catalog GPU and list which fit, cheapest first."""
        from aegis.planning.compare import compare_gpus, render_comparison

        req = PlanRequest(**fields)
        try:
            self.policy.check_request(req)
            rows = compare_gpus(**req.model_dump(exclude_none=True, exclude={"gpu", "gpu_count"}))
        except AegisError as err:
            return f"I could not compare GPUs: {err}", {"error": str(err)}
        fitting = [r.gpu_id for r in rows if r.fits]
        return render_comparison(rows, "markdown"), {"request": req.model_dump(exclude_none=True), "fits": fitting}

    def explain_memory_component(
        self, component: str, request: PlanRequest | dict | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Explain one line of the memory breakdown of the current plan: its size, the formula with the numbers, and
        what changes it."""
        if request is None:
            return "Plan something first (e.g. `qlora llama-3.1-8b on 3090`), then ask about a memory line.", {
                "error": "no plan"
            }
        req = request if isinstance(request, PlanRequest) else PlanRequest(**request)
        try:
            report = self.report_for(req)
        except AegisError as err:
            return f"I could not plan that: {err}", {"error": str(err)}
        text, comp = explain_component(report, component)
        return text, {"component": comp.key if comp else None, **({} if comp else {"error": "unknown component"})}

    def answer_plan_question(
        self, kind: QuestionKind, request: PlanRequest | dict | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Answer a question about the current plan from its own figures: which memory component is largest
        (largest_component), why gradient checkpointing is on or off (why_checkpointing: the same job planned the
        other way), how long the run takes and what it costs (time_and_cost)."""
        if request is None:
            return "Plan something first (e.g. `qlora llama-3.1-8b on 3090`), then ask about it.", {"error": "no plan"}
        req = request if isinstance(request, PlanRequest) else PlanRequest(**request)
        try:
            report = self.report_for(req)
        except AegisError as err:
            return f"I could not plan that: {err}", {"error": str(err)}
        return answer(report, kind, replan=self.report_for), {"question": kind}

    def list_models(self) -> tuple[str, dict[str, Any]]:
        """List the bundled models (usable offline), with parameter counts and aliases."""
        from aegis.planning.compare import render_models

        return render_models("markdown"), {}

    def list_gpus(self) -> tuple[str, dict[str, Any]]:
        """List the catalog GPUs with memory, framework overhead, bf16 TFLOPS and the cheapest price."""
        from aegis.planning.compare import render_gpus

        return render_gpus("markdown"), {}

    def start_run(self, request: PlanRequest | dict | None = None) -> tuple[str, dict[str, Any]]:
        """Start a supervised training run of the current plan (its recommended config and fallback chain)."""
        report = None
        if request is not None:
            req = request if isinstance(request, PlanRequest) else PlanRequest(**request)
            try:
                report = self.report_for(req)
            except AegisError as err:
                return f"I could not plan that run: {err}", {"error": str(err)}
            if report.recommended is None:
                return f"Nothing fits, so there is nothing to run: {report.nothing_fits}", {"error": "nothing fits"}
        try:
            st = self.runs.start(report)
        except AegisError as err:
            return f"The run did not start: {err}", {"error": str(err)}
        cfg = self.runs.run_config(report, st.run_id)
        model = cfg.model if isinstance(cfg.model, str) else "an inline model config"
        planned = report is not None and report.recommended is not None and cfg.train_config == report.recommended.config
        tiers = "the plan's recommended config" if planned else "the run template's config"
        text = (
            f"Started run `{st.run_id}`: trains {model} on {cfg.data} with {tiers} "
            f"({cfg.training.total_steps} steps, windows of {cfg.training.steps_per_window}). "
            "Say `status` to watch it, `interrupt` to pause it; I will tell you when it needs you."
        )
        return text, {"run_id": st.run_id}

    def _run_id(self, run_id: str | None) -> str | None:
        return run_id or self.runs.latest_run_id()

    def run_status(self, run_id: str | None = None) -> tuple[str, dict[str, Any]]:
        """Show a run's status: step, LR, loss, blacklist, the last anomaly and what it waits for."""
        rid = self._run_id(run_id)
        if rid is None:
            return "No runs yet: plan something, then say `start the run`.", {"error": "no run"}
        try:
            st = self.runs.status(rid)
        except AegisError as err:
            return str(err), {"error": str(err)}
        text = status_markdown(st)
        if self.runs.error(rid):
            text += f"\n- The run's process failed: {self.runs.error(rid)}"
        return text, {"run_id": rid, "status": st.status}

    def send_run_command(self, command: str, run_id: str | None = None) -> tuple[str, dict[str, Any]]:
        """Send a command to a run: resume, stop, set_lr <value>, skip_batch, blacklist_samples <ids…>, interrupt."""
        rid = self._run_id(run_id)
        if rid is None:
            return "No runs yet: plan something, then say `start the run`.", {"error": "no run"}
        try:
            receipt = self.runs.command(rid, command, source="chat")
        except AegisError as err:
            return f"Not sent: {err}", {"error": str(err), "run_id": rid}
        if receipt.status is not None:
            return status_markdown(receipt.status), {"run_id": rid, "command": receipt.command}
        where = "the run applies it at its next step" if receipt.live else "it applies when the run resumes"
        return f"Sent `{receipt.command}` to run `{rid}`: {where}.", {"run_id": rid, "command": receipt.command}

    # ------------------------------------------------------------------ tools

    def tools(self) -> list[StructuredTool]:
        """Every operation as a StructuredTool (description: the method's docstring)."""
        schemas: dict[str, type[Frozen]] = {
            "plan_finetune": PlanRequest,
            "compare_gpus": PlanRequest,
            "explain_memory_component": ExplainArgs,
            "answer_plan_question": QuestionArgs,
            "list_models": NoArgs,
            "list_gpus": NoArgs,
            "start_run": StartRunArgs,
            "run_status": RunStatusArgs,
            "send_run_command": RunCommandArgs,
        }
        out = []
        for name in TOOL_NAMES:
            fn = getattr(self, name)
            out.append(
                StructuredTool.from_function(
                    func=fn,
                    name=name,
                    description=" ".join(inspect.getdoc(fn).split()),
                    args_schema=schemas[name],
                    response_format="content_and_artifact",
                )
            )
        return out
