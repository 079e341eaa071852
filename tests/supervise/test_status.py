"""Status rendering: sparkline and table."""

from rich.console import Console

from aegis.supervise.status import RunStatusReport, render_status, sparkline


def test_sparkline_scales_between_min_and_max_and_marks_nonfinite():
    assert sparkline([1.0, 2.0, 3.0, float("nan"), 3.0]) == "▁▄█!█"
    assert sparkline([2.0, 2.0]) == "▁▁"
    assert len(sparkline(list(range(500)), width=60)) == 60


def test_render_status_shows_what_the_run_waits_for():
    report = RunStatusReport(
        run_id="r1", run_dir="/runs/r1", status="paused", live=False, step=40, total_steps=100, lr=1e-4,
        grad_clip=1.0, blacklist=("toxic-1",), pending_reason="3 automatic repairs", suggested_actions=("resume", "stop"),
        losses=(3.0, 2.0, 1.5), checkpoints=(20, 40),
    )
    console = Console(record=True, width=120)
    console.print(render_status(report))
    text = console.export_text()
    for fragment in ("paused", "40 / 100", "toxic-1", "3 automatic repairs", "resume | stop", "20, 40", "last 1.5"):
        assert fragment in text
