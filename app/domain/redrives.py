"""What a redrive request may ask for: which finished jobs, and how fast (SQS's message move
task is the model: a source, an optional rate, one at a time is not required)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.domain.jobs import JobStatus

DEFAULT_PER_SECOND = 500
MAX_PER_SECOND = 100_000


@dataclass(frozen=True, slots=True)
class RedriveRequest:
    from_status: JobStatus = JobStatus.DEAD
    since: datetime | None = None  # status reached at or after
    until: datetime | None = None  # ... and before
    per_second: int = DEFAULT_PER_SECOND
