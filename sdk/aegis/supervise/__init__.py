"""Self-healing supervised training: a LangGraph state machine over the JAX engine.

Train in windows → Monitor (loss spike, grad explosion, NaN/Inf) → Forensics (per-sample
gradient norms of the offending batch) → Repair (blacklist samples, stabilise LR/clip, next
fallback config on OOM) → Human review (interrupt; resumes on a command). State, checkpoints,
commands and events live in the run folder, so a run survives ``kill -9``.

    from aegis.supervise import Supervisor, load_run_config
    out = Supervisor("runs").start(load_run_config("run.yaml"))   # RunStatusReport: the one run-state model

Importing this package does not import JAX, LangGraph or Orbax; running a run does.
"""

from aegis.supervise.commands import COMMAND_NAMES, parse_command, usage
from aegis.supervise.run_config import RunConfig, load_run_config, parse_run_config, run_config_from_plan
from aegis.supervise.runner import CommandReceipt, Supervisor
from aegis.supervise.state import RunState
from aegis.supervise.status import RunStatusReport

__all__ = [
    "COMMAND_NAMES",
    "CommandReceipt",
    "RunConfig",
    "RunState",
    "RunStatusReport",
    "Supervisor",
    "load_run_config",
    "parse_command",
    "parse_run_config",
    "run_config_from_plan",
    "usage",
]
