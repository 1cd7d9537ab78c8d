"""JetStream's consumer pause (nats-server 2.11+), as its API reads and answers it:
`$JS.API.CONSUMER.PAUSE.<stream>.<consumer>` with `{"pause_until": <RFC 3339>}` (a zero or
absent time resumes), and `pause_until` in a new consumer's config."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from app.domain.nats_consumers import (
    decode_go_json,
    go_iso_time,
    invalid_json,
    is_json_object_or_array,
)

PAUSE_TYPE = "io.nats.jetstream.api.v1.consumer_pause_response"
GO_ZERO = datetime(1, 1, 1, tzinfo=UTC)
NANOS = 1_000_000_000


def go_time(value: object) -> datetime | None:
    """A time.Time field in UTC (sub-microsecond digits dropped); None for Go's zero time,
    which nats-server takes as no pause."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_json("json: cannot unmarshal into Go value of type time.Time")
    iso = go_iso_time(value)
    if iso is None:
        raise invalid_json(f'parsing time {json.dumps(value)} as "2006-01-02T15:04:05Z07:00"')
    try:
        moment = datetime.fromisoformat(iso).astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise invalid_json(f"parsing time {json.dumps(value)}: {exc}") from None
    return None if moment == GO_ZERO else moment


def pause_request(body: bytes) -> datetime | None:
    """CONSUMER.PAUSE's pause_until; nats-server reads the body only when it is a JSON object or
    array, so an empty body (or anything else) resumes."""
    if not is_json_object_or_array(body):
        return None
    document = decode_go_json(body)
    if not isinstance(document, dict):
        raise invalid_json(
            "json: cannot unmarshal array into Go value of type JSApiConsumerPauseRequest"
        )
    return go_time(document.get("pause_until"))


def config_pause(config: Mapping[str, Any]) -> datetime | None:
    """A new consumer's pause_until (an existing one keeps its own, as nats-server does)."""
    return go_time(config.get("pause_until"))


def pause_state(until: datetime | None, now: datetime) -> tuple[bool, int]:
    """Paused, and for how many ns more (0 when not)."""
    if until is None or until <= now:
        return False, 0
    return True, int((until - now).total_seconds() * NANOS)
