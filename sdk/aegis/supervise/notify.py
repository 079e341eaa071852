"""Notifications: an optional webhook POST when a run needs a human (spec §6.5, §14).

The payload carries the run id, the anomaly, statistics, suggested commands and sample **ids** —
never sample text: it is built only from :class:`RunState` fields, which hold no text.
Delivery failures are returned, not raised: a dead webhook must never stop a run.

    payload = build_payload(state, reason="3 repairs without a clean window")
    ok, error = send_webhook(cfg.notifications, payload)
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from aegis.schema import Frozen
from aegis.supervise.run_config import NotificationsSection
from aegis.supervise.repair import suggested_actions
from aegis.supervise.state import RunState

__all__ = ["NotificationPayload", "build_payload", "send_webhook"]


class NotificationPayload(Frozen):
    """JSON body of the webhook POST."""

    run_id: str
    step: int
    reason: str
    anomaly: dict[str, Any] | None = Field(description="type, step, value, threshold, detail.")
    stats: dict[str, Any] = Field(description="LR, clip, tier, repairs, blacklist size, outlier statistics.")
    suggested_actions: tuple[str, ...]
    sample_ids: tuple[str, ...] = Field(description="Suspected sample ids (ids only, never text).")
    slack_channel: str | None = None


def build_payload(state: RunState, reason: str, slack_channel: str | None = None) -> NotificationPayload:
    """The notification for ``state``, built from ids and numbers only."""
    anomaly = None
    if state.anomaly is not None:
        anomaly = state.anomaly.model_dump(mode="json", exclude={"batch_sample_ids"})
    stats: dict[str, Any] = {
        "lr": state.lr,
        "grad_clip": state.grad_clip,
        "fallback_tier": state.fallback_tier,
        "repair_attempts": state.repair_attempts,
        "blacklist_size": len(state.blacklist),
        "last_loss": state.metrics.loss_history[-1] if state.metrics.loss_history else None,
    }
    ids: tuple[str, ...] = ()
    if state.diagnosis is not None:
        stats["diagnosis"] = {
            "verdict": state.diagnosis.verdict,
            "batch_id": state.diagnosis.batch_id,
            **state.diagnosis.outlier_stats.model_dump(mode="json"),
        }
        ids = state.diagnosis.suspected_samples
    return NotificationPayload(
        run_id=state.run_id,
        step=state.step,
        reason=reason,
        anomaly=anomaly,
        stats=stats,
        suggested_actions=suggested_actions(state),
        sample_ids=ids,
        slack_channel=slack_channel,
    )


def send_webhook(cfg: NotificationsSection, payload: NotificationPayload) -> tuple[bool, str | None]:
    """POST the payload to ``cfg.webhook_url``: (delivered, error message). No URL: (False, None)."""
    if cfg.webhook_url is None:
        return False, None
    import httpx

    try:
        response = httpx.post(cfg.webhook_url, json=payload.model_dump(mode="json"), timeout=cfg.timeout_s)
        response.raise_for_status()
    except httpx.HTTPError as err:
        return False, f"{type(err).__name__}: {err}"
    return True, None
