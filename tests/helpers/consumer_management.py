"""Raw JetStream API requests over a nats-py connection, and what of a consumer's config the
side-by-side scripts compare: shared by the consumer-management, push-consumer and
deliver-policy scenarios, which send the same requests to real JetStream and the bridge."""

from __future__ import annotations

import json
from typing import Any

API = "$JS.API"

# What is compared of a consumer's config: every field both servers set alike (max_batch and
# max_expires are the bridge's process limits: the reference sets them equal).
COMPARED = (
    "durable_name",
    "name",
    "description",
    "deliver_policy",
    "ack_policy",
    "ack_wait",
    "max_deliver",
    "backoff",
    "filter_subject",
    "replay_policy",
    "max_waiting",
    "max_ack_pending",
    "metadata",
)
PUSHED = ("deliver_group", "flow_control", "idle_heartbeat", "ack_policy", "max_waiting")


def config_seen(document: dict[str, Any]) -> dict[str, Any]:
    config = document.get("config") or {}
    return {k: config.get(k) for k in COMPARED}


def pushed_config(document: dict[str, Any]) -> dict[str, Any]:
    config = document.get("config") or {}
    return {k: config.get(k) for k in PUSHED} | {"has_deliver_subject": "deliver_subject" in config}


async def request(nc: Any, subject: str, body: dict[str, Any] | bytes | None = None) -> Any:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode() if body else b""
    reply = await nc.request(f"{API}.{subject}", payload, timeout=5)
    return json.loads(reply.data)


def create_body(config: dict[str, Any], action: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"stream_name": "orders", "config": config}
    if action:
        body["action"] = action
    return body
