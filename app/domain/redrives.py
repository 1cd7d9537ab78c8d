"""What a redrive request may ask for: which finished jobs, and how fast (SQS's message move
task is the model: a source, an optional rate, one at a time is not required)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.domain.errors import InvalidInput
from app.domain.jobs import JobStatus
from app.domain.times import utc_moment

DEFAULT_PER_SECOND = 500
MAX_PER_SECOND = 100_000
FIELDS = {"from", "since", "until", "perSecond"}


@dataclass(frozen=True, slots=True)
class RedriveRequest:
    from_status: JobStatus = JobStatus.DEAD
    since: datetime | None = None  # status reached at or after
    until: datetime | None = None  # ... and before
    per_second: int = DEFAULT_PER_SECOND


def _moment(body: dict[str, Any], key: str) -> datetime | None:
    raw = body.get(key)
    if raw is None:
        return None
    moment = utc_moment(raw)
    if moment is None:
        raise InvalidInput(f"{key} must be an RFC 3339 time with an offset, within years 1-9999")
    return moment


def parse_redrive_request(body: object) -> RedriveRequest:
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise InvalidInput(f"unknown field(s) {', '.join(unknown)}; known: {sorted(FIELDS)}")
    source = body.get("from", "DEAD")
    if source not in ("DEAD", "DELIVERED"):
        raise InvalidInput("from must be DEAD or DELIVERED (to replay)")
    rate = body.get("perSecond", DEFAULT_PER_SECOND)
    if isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= MAX_PER_SECOND:
        raise InvalidInput(f"perSecond must be an integer from 1 to {MAX_PER_SECOND}")
    since, until = _moment(body, "since"), _moment(body, "until")
    if since is not None and until is not None and since >= until:
        raise InvalidInput("since must be before until")
    return RedriveRequest(JobStatus(source), since, until, rate)
