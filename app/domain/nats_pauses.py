"""JetStream's consumer pause (nats-server 2.11+), as its API reads and answers it:
`$JS.API.CONSUMER.PAUSE.<stream>.<consumer>` with `{"pause_until": <RFC 3339>}` (a zero or
absent time resumes), and `pause_until` in a new consumer's config."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from app.domain.nats_consumers import ConsumerApiError, go_depth_error, jetstream_error

PAUSE_TYPE = "io.nats.jetstream.api.v1.consumer_pause_response"
GO_ZERO = datetime(1, 1, 1, tzinfo=UTC)
NANOS = 1_000_000_000

# RFC 3339 as Go's time.Time unmarshals it, up to nine fraction digits.
_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})"
)


def _invalid(text: str) -> ConsumerApiError:
    return jetstream_error(400, 10025, f"invalid JSON: {text}")


def go_time(value: object) -> datetime | None:
    """A time.Time field in UTC (sub-microsecond digits dropped); None for Go's zero time,
    which nats-server takes as no pause."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise _invalid("json: cannot unmarshal into Go value of type time.Time")
    match = _RFC3339.fullmatch(value)
    if match is None:
        raise _invalid(f'parsing time {json.dumps(value)} as "2006-01-02T15:04:05Z07:00"')
    day, clock, fraction, zone = match.groups()
    micros = (fraction or "").ljust(6, "0")[:6]
    offset = "+00:00" if zone in ("Z", "z") else zone
    try:
        moment = datetime.fromisoformat(f"{day}T{clock}.{micros}{offset}").astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise _invalid(f"parsing time {json.dumps(value)}: {exc}") from None
    return None if moment == GO_ZERO else moment


def pause_request(body: bytes) -> datetime | None:
    """CONSUMER.PAUSE's pause_until; nats-server reads the body only when it is a JSON object or
    array, so an empty body (or anything else) resumes."""
    text = body.decode("utf-8", "replace").strip()
    if not text.startswith(("{", "[")):
        return None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise _invalid(str(exc)) from None
    except RecursionError:
        raise _invalid(go_depth_error(body)) from None
    if not isinstance(document, dict):
        raise _invalid(
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
