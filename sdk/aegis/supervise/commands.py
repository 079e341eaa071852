"""Human-in-the-loop commands: one grammar shared by the CLI, the chat agent and the Slack bot.

Grammar (one command per line, words separated by spaces; ids may also be comma-separated)::

    resume                          continue training (after a human review)
    stop                            end the run after the current window
    set_lr <value>                  new learning rate, 0 < value <= 1, e.g. set_lr 1e-5
    skip_batch                      leave the anomalous batch's samples out and retry
    blacklist_samples <id> [<id>…]  never train on these sample ids again
    status                          report the run's state (changes nothing)
    interrupt                       pause for a human review at the next step

:func:`parse_command` turns text into a typed command or raises a one-line ``CommandError``;
:func:`validate_command` checks it against a run (known sample ids, a batch to skip, a run
that is not finished). A rejected command changes nothing.

    cmd = parse_command("set_lr 1e-5")        # SetLR(value=1e-05)
    cmd.text                                  # 'set_lr 1e-05'
"""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Literal, Union

from pydantic import Field, TypeAdapter

from aegis.errors import CommandError
from aegis.schema import Frozen
from aegis.supervise.state import RunState

__all__ = [
    "COMMAND_NAMES",
    "Resume",
    "Stop",
    "SetLR",
    "SkipBatch",
    "BlacklistSamples",
    "Status",
    "Interrupt",
    "Command",
    "parse_command",
    "validate_command",
    "usage",
]

MAX_LR = 1.0


class Resume(Frozen):
    """Continue training."""

    name: Literal["resume"] = "resume"

    @property
    def text(self) -> str:
        return "resume"


class Stop(Frozen):
    """End the run."""

    name: Literal["stop"] = "stop"

    @property
    def text(self) -> str:
        return "stop"


class SetLR(Frozen):
    """Set the learning rate used from the next window on."""

    name: Literal["set_lr"] = "set_lr"
    value: float = Field(gt=0, le=MAX_LR)

    @property
    def text(self) -> str:
        return f"set_lr {self.value:g}"


class SkipBatch(Frozen):
    """Leave the anomalous batch out and retry."""

    name: Literal["skip_batch"] = "skip_batch"

    @property
    def text(self) -> str:
        return "skip_batch"


class BlacklistSamples(Frozen):
    """Exclude sample ids from all future batches."""

    name: Literal["blacklist_samples"] = "blacklist_samples"
    ids: tuple[str, ...] = Field(min_length=1)

    @property
    def text(self) -> str:
        return "blacklist_samples " + " ".join(self.ids)


class Status(Frozen):
    """Report the run's state."""

    name: Literal["status"] = "status"

    @property
    def text(self) -> str:
        return "status"


class Interrupt(Frozen):
    """Pause for a human review."""

    name: Literal["interrupt"] = "interrupt"

    @property
    def text(self) -> str:
        return "interrupt"


Command = Annotated[
    Union[Resume, Stop, SetLR, SkipBatch, BlacklistSamples, Status, Interrupt], Field(discriminator="name")
]
"""Any command; ``cmd.name`` tells which, ``cmd.text`` is its canonical text."""

_ADAPTER: TypeAdapter[Command] = TypeAdapter(Command)

_USAGE = {
    "resume": "resume",
    "stop": "stop",
    "set_lr": "set_lr <value>",
    "skip_batch": "skip_batch",
    "blacklist_samples": "blacklist_samples <id> [<id> ...]",
    "status": "status",
    "interrupt": "interrupt",
}
COMMAND_NAMES: tuple[str, ...] = tuple(_USAGE)


def usage() -> str:
    """The grammar on one line."""
    return " | ".join(_USAGE.values())


def parse_command(text: str) -> Command:
    """Parse one command line; CommandError (one line, with the fix) when malformed."""
    if not isinstance(text, str) or not text.strip():
        raise CommandError(f"empty command: use one of {usage()}")
    words = text.replace(",", " ").split()
    verb, args = words[0].lower().replace("-", "_"), words[1:]
    if verb not in _USAGE:
        close = difflib.get_close_matches(verb, COMMAND_NAMES, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise CommandError(f"unknown command '{words[0]}': {hint}use one of {usage()}")
    if verb == "set_lr":
        if len(args) != 1:
            raise CommandError(f"set_lr takes exactly one value, e.g. `set_lr 1e-5` (got {len(args)} arguments)")
        try:
            value = float(args[0])
        except ValueError:
            raise CommandError(f"set_lr needs a number, e.g. `set_lr 1e-5`, got '{args[0]}'") from None
        if not math.isfinite(value) or value <= 0 or value > MAX_LR:
            raise CommandError(f"set_lr value must be a finite number in (0, {MAX_LR:g}], got '{args[0]}'")
        return SetLR(value=value)
    if verb == "blacklist_samples":
        if not args:
            raise CommandError("blacklist_samples needs at least one sample id, e.g. `blacklist_samples toy-17 toy-42`")
        return BlacklistSamples(ids=tuple(dict.fromkeys(args)))
    if args:
        raise CommandError(f"{verb} takes no arguments, got '{' '.join(args)}'")
    return _ADAPTER.validate_python({"name": verb})


def validate_command(cmd: Command, state: RunState | None, known_ids: set[str] | None) -> None:
    """Check a parsed command against the run; CommandError if it cannot apply (nothing is changed)."""
    if cmd.name == "status":
        return
    if state is not None and state.status in ("completed", "stopped"):
        raise CommandError(
            f"run '{state.run_id}' is {state.status}; only `status` applies — start a new run with `aegis run`"
        )
    if cmd.name == "blacklist_samples" and known_ids is not None:
        unknown = [i for i in cmd.ids if i not in known_ids]
        if unknown:
            shown = ", ".join(unknown[:3]) + (" ..." if len(unknown) > 3 else "")
            raise CommandError(f"unknown sample id(s) {shown}: ids are listed in the run's samples.json")
    if cmd.name == "skip_batch" and (state is None or state.anomaly is None or not state.anomaly.batch_sample_ids):
        raise CommandError("skip_batch needs an anomalous batch to skip and this run has none; use `blacklist_samples`")
    if cmd.name == "resume" and state is not None and state.status == "running" and not state.human.pending:
        raise CommandError("the run is not paused, so there is nothing to resume; `status` shows what it is doing")
