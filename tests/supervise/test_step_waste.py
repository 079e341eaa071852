"""Each supervised step logs where its positions went (padding, trained-on targets) and the host time the device
waited on; `aegis status` summarises the last steps."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from aegis.cli.supervised import app
from aegis.supervise.events import read_jsonl
from aegis.supervise.status import RunStatusReport, speed_line, status_markdown
from tests.supervise.conftest import run_config

runner = CliRunner()


@pytest.mark.slow
@pytest.mark.parametrize("packing", [True, False])
def test_step_records_carry_batch_fill_and_host_wait_and_status_shows_them(tmp_path, packing):
    """A supervised run packs by default: its batches are >= 90% tokens where one example per row (the arithmetic
    rows are ~10-20 tokens in rows of 64) leaves them ~20% tokens."""
    from aegis.supervise.engine_handle import load_examples
    from aegis.supervise.run_config import RunConfig

    cfg = run_config(tmp_path, training={"steps_per_window": 2, "total_steps": 4, "packing": packing},
                     checkpoints={"interval": 4})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    res = runner.invoke(app, ["run", "--config", str(tmp_path / "run.yaml"), "--run-id", "w", "--runs-dir", str(runs), "-q"])
    assert res.exit_code == 0, res.output

    examples, _ = load_examples(RunConfig.model_validate(cfg))
    by_id = {ex.sample_id: ex for ex in examples}
    batch, seq = cfg["train_config"]["micro_batch_size"], cfg["train_config"]["seq_len"]
    records = [r for r in read_jsonl(runs / "w" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        held = [by_id[i] for i in r["sample_ids"]]
        # the reference: the examples the step's batch held, their tokens and trained-on targets over its positions
        assert r["useful_token_fraction"] == pytest.approx(sum(min(len(ex), seq) for ex in held) / (batch * seq))
        targets = sum(int(ex.loss_mask[1:min(len(ex), seq)].sum()) for ex in held)
        assert r["loss_token_fraction"] == pytest.approx(targets / (batch * seq))
        assert r["tokens"] == targets  # what the device's loss counted agrees with the host's mask
        assert 0 < r["useful_token_fraction"] <= 1 and r["host_wait_s"] >= 0 and r["step_time_s"] > 0
    fill = sum(r["useful_token_fraction"] for r in records) / 4
    if packing:  # several examples per row, each once
        assert fill >= 0.9 and all(len(r["sample_ids"]) > 2 * batch for r in records), fill
    else:  # one example per row
        assert fill <= 0.3 and all(len(r["sample_ids"]) == batch for r in records), fill
    assert all(len(set(r["sample_ids"])) == len(r["sample_ids"]) for r in records)

    res = runner.invoke(app, ["status", "--run-id", "w", "--runs-dir", str(runs)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert f"batches {fill:.0%} tokens" in res.output and "host wait" in res.output and "tokens/s" in res.output


def test_the_speed_line_reads_the_report_and_is_absent_before_a_step():
    base = dict(run_id="r", run_dir="/r", status="running", live=True, step=3, total_steps=9)
    assert speed_line(RunStatusReport(**base)) is None
    report = RunStatusReport(**base, tokens_per_s=1234.4, useful_token_fraction=0.964, loss_token_fraction=0.61,
                             host_wait_s=0.0002)
    assert speed_line(report) == "1,234 tokens/s; batches 96% tokens (61% trained on); host wait 0.2 ms/step"
    assert "- Speed: 1,234 tokens/s" in status_markdown(report)


@pytest.mark.slow
def test_length_buckets_fill_the_supervised_runs_batches(tmp_path):
    """The same run with `training.length_buckets`: its batches hold the same share of trained-on targets per
    example but far less padding (the arithmetic rows are ~10-20 tokens in rows of 64)."""
    cfg = run_config(tmp_path, training={"steps_per_window": 2, "total_steps": 4, "length_buckets": True},
                     checkpoints={"interval": 4})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    res = runner.invoke(app, ["run", "--config", str(tmp_path / "run.yaml"), "--run-id", "b", "--runs-dir", str(runs), "-q"])
    assert res.exit_code == 0, res.output
    records = read_jsonl(runs / "b" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    fill = sum(r["useful_token_fraction"] for r in records) / 4
    assert fill >= 0.7, fill  # padded to 64 the same rows fill ~0.2 (the test above, packing off)
    assert all(len(r["sample_ids"]) == 8 for r in records)
