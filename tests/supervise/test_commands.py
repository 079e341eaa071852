"""Command grammar: parsing, validation, canonical text."""

import pytest

from aegis.errors import CommandError
from aegis.supervise.commands import COMMAND_NAMES, parse_command, validate_command
from aegis.supervise.state import Anomaly, HumanInterrupt, RunState


def test_every_command_parses_to_its_canonical_text():
    cases = {
        "resume": "resume",
        "stop": "stop",
        "set_lr 1e-5": "set_lr 1e-05",
        "  SET_LR   0.0003 ": "set_lr 0.0003",
        "skip_batch": "skip_batch",
        "blacklist_samples a b,c a": "blacklist_samples a b c",
        "status": "status",
        "interrupt": "interrupt",
    }
    for text, canonical in cases.items():
        assert parse_command(text).text == canonical
    assert {parse_command(t).name for t in cases} == set(COMMAND_NAMES)
    assert parse_command("set_lr 1e-5").value == pytest.approx(1e-5)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty command"),
        ("resum", "did you mean 'resume'"),
        ("launch rockets", "unknown command 'launch'"),
        ("set_lr", "exactly one value"),
        ("set_lr fast", "needs a number"),
        ("set_lr -1", "(0, 1]"),
        ("set_lr nan", "(0, 1]"),
        ("set_lr 5", "(0, 1]"),
        ("set_lr 1e-5 2e-5", "exactly one value"),
        ("blacklist_samples", "at least one sample id"),
        ("stop now", "takes no arguments"),
    ],
)
def test_malformed_commands_give_one_line_errors(text, fragment):
    with pytest.raises(CommandError) as err:
        parse_command(text)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def _state(**kw):
    return RunState.new("r", lr=1e-3, grad_clip=1.0, weights={}).update(**kw)


def test_validation_against_the_run():
    paused = _state(status="paused", human=HumanInterrupt(pending=True, reason="x"))
    validate_command(parse_command("resume"), paused, None)
    with pytest.raises(CommandError, match="not paused"):
        validate_command(parse_command("resume"), _state(), None)
    with pytest.raises(CommandError, match="unknown sample id"):
        validate_command(parse_command("blacklist_samples a zz"), _state(), {"a", "b"})
    validate_command(parse_command("blacklist_samples a b"), _state(), {"a", "b"})
    with pytest.raises(CommandError, match="needs an anomalous batch"):
        validate_command(parse_command("skip_batch"), _state(), None)
    with_batch = _state(anomaly=Anomaly(type="loss_spike", step=3, batch_sample_ids=("a",)))
    validate_command(parse_command("skip_batch"), with_batch, None)
    done = _state(status="completed")
    with pytest.raises(CommandError, match="completed"):
        validate_command(parse_command("set_lr 1e-4"), done, None)
    validate_command(parse_command("status"), done, None)
