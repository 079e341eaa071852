"""Phase 3, Quiet-STaR: thinking tokens, prompt baking, then parallel thoughts trained with REINFORCE.

    aegis quietstar MODEL reasoning.jsonl OUT        # the CLI (aegis.cli.forge.quietstar)

    from aegis.forge.quietstar import QuietStarSettings, run_quietstar, parity_rows
    report = run_quietstar("merged/", parity_rows(256), "out/", QuietStarSettings(bake_steps=400, rl_steps=40))

Modules: ``data`` (the 12 tokens, reasoning rows from JSONL or an OpenAI-compatible endpoint through pydantic-ai,
the bundled parity task), ``core`` (the JAX maths: thoughts, mixing head, loss), ``run`` (the phase: baking,
Quiet-STaR, anti-theater checks with rollback, ablation, report, resume). Importing this package imports no JAX.
"""

from __future__ import annotations

from aegis.forge.quietstar.reasoning_data import (
    END, START, STRATEGIES, THOUGHT_TOKENS, GenerationLimits, ReasoningRow, generate_reasoning, load_reasoning,
    parity_rows,
)
from aegis.forge.quietstar.run import QuietStarSettings, load_quietstar_model, run_quietstar

__all__ = ["START", "END", "STRATEGIES", "THOUGHT_TOKENS", "GenerationLimits", "ReasoningRow", "generate_reasoning",
           "load_reasoning", "parity_rows", "QuietStarSettings", "run_quietstar", "load_quietstar_model"]
