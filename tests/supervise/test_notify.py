"""Webhook notifications: ids and statistics, never sample text (HTTP mocked with respx)."""

import json

import httpx
import respx

from aegis.supervise.run_config import NotificationsSection
from aegis.supervise.notify import build_payload, send_webhook
from aegis.supervise.state import Anomaly, DiagnosisReport, OutlierStats, RunState

SECRET_TEXT = "the patient's card number is 4111"


def _state():
    stats = OutlierStats(median_grad_norm=1.0, max_grad_norm=90.0, mad_grad_norm=0.1, median_loss=1.0, max_loss=9.0, num_samples=8)
    diag = DiagnosisReport(batch_id="step-7", checkpoint_step=5, verdict="outliers", outlier_indices=(3,),
                           outlier_stats=stats, suspected_samples=("row-17",), report_path="/r/diag.json")
    return RunState.new("run-1", lr=1e-3, grad_clip=1.0, weights={}).update(
        step=5, anomaly=Anomaly(type="loss_spike", step=7, value=9.0, threshold=2.0, detail="loss 9 > 2",
                                batch_sample_ids=("row-1", "row-17")), diagnosis=diag)


@respx.mock
def test_webhook_posts_ids_and_stats_without_text():
    route = respx.post("https://hooks.example/aegis").mock(return_value=httpx.Response(200))
    cfg = NotificationsSection(webhook_url="https://hooks.example/aegis")
    payload = build_payload(_state(), "3 repairs without a clean window", slack_channel="#runs")
    ok, err = send_webhook(cfg, payload)
    assert ok and err is None and route.called
    body = json.loads(route.calls[0].request.content)
    assert body["run_id"] == "run-1" and body["sample_ids"] == ["row-17"]
    assert body["anomaly"]["type"] == "loss_spike" and body["stats"]["diagnosis"]["max_grad_norm"] == 90.0
    assert "blacklist_samples row-17" in body["suggested_actions"]
    assert SECRET_TEXT not in route.calls[0].request.content.decode()
    assert set(body) == {"run_id", "step", "reason", "anomaly", "stats", "suggested_actions", "sample_ids", "slack_channel"}


@respx.mock
def test_failures_are_reported_not_raised():
    respx.post("https://hooks.example/down").mock(return_value=httpx.Response(503))
    ok, err = send_webhook(NotificationsSection(webhook_url="https://hooks.example/down"), build_payload(_state(), "x"))
    assert not ok and "503" in err
    assert send_webhook(NotificationsSection(), build_payload(_state(), "x")) == (False, None)
