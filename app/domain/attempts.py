"""One entry of a job's attempt history (app/store/attempts.py writes them), as shown."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Attempt:
    number: int  # the attempt's number, counted back from the job's attempt count
    started_at: datetime | None
    duration_ms: int | None
    outcome: str
    code: int | None
    error: str | None


def attempts_of(entries: object, attempt_count: int) -> list[Attempt]:
    """The stored entries, newest first; anything malformed is shown as far as it can be."""
    if not isinstance(entries, list):
        return []
    shown: list[Attempt] = []
    number = attempt_count
    for entry in reversed(entries):
        if not isinstance(entry, dict):
            continue
        shown.append(
            Attempt(
                number=number,
                started_at=_moment(entry.get("at")),
                duration_ms=_whole(entry.get("ms")),
                outcome=str(entry.get("outcome") or "?"),
                code=_whole(entry.get("code")),
                error=str(entry["error"]) if entry.get("error") else None,
            )
        )
        number -= 1
    return shown


def _moment(value: Any) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), UTC)
    return None


def _whole(value: Any) -> int | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    return None
