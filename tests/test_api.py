"""The public SDK surface: every name in `aegis.__all__` imports, and importing stays light."""

import json
import subprocess
import sys

import aegis

HEAVY = ("jax", "torch", "transformers", "gradio", "tensorflow", "datasets", "langgraph")


def test_every_public_name_imports():
    for name in aegis.__all__:
        assert getattr(aegis, name) is not None, name


def test_import_and_plan_import_nothing_heavy():
    code = (
        "import sys, json, aegis\n"
        "aegis.estimate_memory('llama-3.1-8b', method='qlora', micro_batch_size=4, seq_len=1024)\n"
        "aegis.plan('qlora llama-3.1-8b on 3090')\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_cli_plan_imports_nothing_heavy():
    code = (
        "import sys, json\n"
        "from aegis.cli import main\n"
        "try:\n    main(['plan', 'qlora llama-3.1-8b on 3090', '--json'])\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == []


def test_estimate_path_skips_what_it_does_not_use():
    """`import aegis` + an estimate (the 0.3 s budget) leaves out asyncio (typing_extensions < 4.16 imported it for
    every @deprecated function of pydantic_core: ~50 ms) and the plan-report types (built when a plan needs them)."""
    code = (
        "import sys, json, aegis\n"
        "aegis.estimate_memory('llama-3.1-8b', method='qlora', micro_batch_size=4, seq_len=1024)\n"
        "print(json.dumps([m for m in ('asyncio', 'aegis.schema.report', 'aegis.planning.planner') if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []
    assert aegis.PlanReport.__name__ == "PlanReport"  # still public, from aegis and aegis.schema alike
