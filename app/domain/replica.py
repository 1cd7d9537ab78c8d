"""Where a read goes: the replica while its staleness is provably within the limit, the primary
otherwise. Pure: the measurements come in, a decision goes out.

The lag is measured as positions in the primary's write-ahead log, not as the age of the last
replayed transaction (pg_last_xact_replay_timestamp): on an idle primary that timestamp grows
old although the replica misses nothing, and a time-based check would send every read back to
the primary exactly when the replica is most current. Instead the primary's WAL position is
sampled with the time it was taken; the replica's replay position then says which sample it has
reached, and so up to which moment it holds everything the primary had committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class ReadFrom(StrEnum):
    """Where a read was served, as the X-Broker-Read-From header says it."""

    REPLICA = "replica"
    PRIMARY = "primary"


class ReplicaState(StrEnum):
    """What the last measurement found (a change of it is logged once)."""

    SERVING = "serving"  # within the limit
    LAGGING = "lagging"  # reachable, past the limit (or its lag not yet known)
    DOWN = "down"  # unreachable, failing, or not a standby


@dataclass(frozen=True, slots=True)
class WalSample:
    """The primary's WAL write position (bytes) at `at` (seconds, a monotonic clock)."""

    at: float
    position: int


@dataclass(frozen=True, slots=True)
class ReplicaHealth:
    """One measurement: `lag`, seconds the replica was behind at `measured_at` (None: not
    known to be within any sample, i.e. at least `lag_at_least`)."""

    up: bool
    lag: float | None
    measured_at: float
    lag_at_least: float = 0.0

    @property
    def shown_lag(self) -> float:
        """For the gauge: the lag, or its lower bound when not known exactly."""
        return self.lag if self.lag is not None else self.lag_at_least


DOWN = ReplicaHealth(up=False, lag=None, measured_at=0.0)


def lag_from_samples(samples: Sequence[WalSample], replayed: int) -> tuple[float | None, float]:
    """(lag, lower bound) at the newest sample's time. `samples` oldest first, the newest taken
    just before `replayed` (the replica's replay position) was read: the replica holds all the
    primary had written at the newest sample it has reached, so it is at most that old."""
    if not samples:
        return None, 0.0
    newest = samples[-1]
    for sample in reversed(samples):
        if sample.position <= replayed:
            return newest.at - sample.at, newest.at - sample.at
    return None, newest.at - samples[0].at


def state_of(health: ReplicaHealth, max_lag: float, now: float) -> ReplicaState:
    """The measurement's age counts as lag: replay may have stopped just after it, so at `now`
    the replica is behind by at most the measured lag plus the time since."""
    if not health.up:
        return ReplicaState.DOWN
    if health.lag is None:
        return ReplicaState.LAGGING
    bound = health.lag + max(0.0, now - health.measured_at)
    return ReplicaState.SERVING if bound <= max_lag else ReplicaState.LAGGING


def choose(health: ReplicaHealth | None, max_lag: float, now: float) -> ReadFrom:
    """None: no replica configured."""
    if health is None:
        return ReadFrom.PRIMARY
    serving = state_of(health, max_lag, now) is ReplicaState.SERVING
    return ReadFrom.REPLICA if serving else ReadFrom.PRIMARY


def check_interval(max_lag: float) -> float:
    """How often the lag is measured: a fifth of the limit, so a healthy replica's measurement
    is never old enough to push it past the limit by its age alone, at most once a second (two
    one-row statements a second per process), at least every 50 ms."""
    return min(1.0, max(0.05, max_lag / 5))


def samples_kept(max_lag: float) -> float:
    """Seconds of WAL samples kept: older ones could only prove a lag past the limit."""
    return max_lag + 2 * check_interval(max_lag)
