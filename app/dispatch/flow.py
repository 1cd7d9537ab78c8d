"""One consumer's share of a dispatcher: how many deliveries may be in flight (AIMD between 1
and its maxInFlight: halved when the receiver pushes back, one more per success) and, with a
rateLimit, a token bucket (a second's worth of burst). Both are per dispatcher process: with
several dispatchers a consumer may get up to that many times its limits (docs/guides/push.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


@dataclass
class Lane:
    max_in_flight: int
    rate: float | None = None
    window: float = 0.0  # current in-flight limit (AIMD); 0 until first set
    in_flight: int = 0
    tokens: float = 0.0
    refilled_at: float = 0.0

    def configure(self, max_in_flight: int, rate: float | None, now: float) -> None:
        if self.window == 0.0 or self.window > max_in_flight:
            self.window = float(max_in_flight)
        self.max_in_flight = max_in_flight
        if rate != self.rate:
            self.rate = rate
            self.tokens = min(self.tokens, self._burst())
        self._refill(now)

    def _burst(self) -> float:
        return max(1.0, self.rate or 0.0)

    def _refill(self, now: float) -> None:
        if self.rate is not None:
            elapsed = max(0.0, now - self.refilled_at) if self.refilled_at else 1.0
            self.tokens = min(self._burst(), self.tokens + elapsed * self.rate)
        self.refilled_at = now

    def allowance(self, now: float) -> int:
        """Deliveries this lane may start now."""
        self._refill(now)
        room = max(0, math.floor(self.window) - self.in_flight)
        if self.rate is not None:
            room = min(room, math.floor(self.tokens))
        return room

    def until_token(self) -> float | None:
        """Seconds until the bucket holds a whole token (None: no rate limit, or it does)."""
        if self.rate is None or self.tokens >= 1.0:
            return None
        return (1.0 - self.tokens) / self.rate

    def started(self, n: int) -> None:
        self.in_flight += n
        if self.rate is not None:
            self.tokens -= n

    def ended(self) -> None:
        self.in_flight -= 1

    def succeeded(self) -> None:
        self.window = min(float(self.max_in_flight), self.window + 1.0 / max(1.0, self.window))

    def pushed_back(self) -> None:
        self.window = max(1.0, self.window / 2)


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """A Retry-After header: delay-seconds or an HTTP date; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - (now or datetime.now(UTC))).total_seconds())
