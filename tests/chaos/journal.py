"""What the chaos run's clients saw, kept in the harness's memory: every publish's outcome,
every job handed to a worker (by consumer and message id, with its attempt), every completion
the broker confirmed, and a timeline of faults and notable events for the violation report."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

# (consumer id, message id): one job.
JobKey = tuple[str, str]


@dataclass(frozen=True)
class Receipt:
    attempt: int
    at: float
    answer: int | None = None  # push: the status the receiver answered (None: pulled)


@dataclass(frozen=True)
class Completion:
    kind: str  # "ack" or "term", confirmed by the broker (202)
    attempt: int
    at: float


@dataclass
class Journal:
    started: float = field(default_factory=time.monotonic)
    # message id -> "created" (201), "exists" (409: an earlier try stored it), "unknown"
    published: dict[str, str] = field(default_factory=dict)
    receipts: defaultdict[JobKey, list[Receipt]] = field(default_factory=lambda: defaultdict(list))
    completions: defaultdict[JobKey, list[Completion]] = field(
        default_factory=lambda: defaultdict(list)
    )
    operations: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    events: list[tuple[float, str, str]] = field(default_factory=list)

    def now(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def event(self, kind: str, detail: str) -> None:
        self.events.append((self.now(), kind, detail))

    def received(self, key: JobKey, attempt: int, answer: int | None = None) -> None:
        self.receipts[key].append(Receipt(attempt, self.now(), answer))

    def completed(self, key: JobKey, kind: str, attempt: int) -> None:
        self.completions[key].append(Completion(kind, attempt, self.now()))

    def around(self, at: float, seconds: float = 5.0) -> list[tuple[float, str, str]]:
        """The timeline's events near a moment (a violation's context)."""
        return [e for e in self.events if abs(e[0] - at) <= seconds]
