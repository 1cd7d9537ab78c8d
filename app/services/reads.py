"""Reads that may be served by the replica ([rdbms] replica-url): which database answers, the
lag measurement behind that choice, and where each request's reads went.

Only reads come through here, as a function of one transaction (`Reads.read`): the services'
changes keep their own transactions on the primary, so nothing that changes state can reach
the replica (which would refuse it anyway: a hot standby is read-only).

The choice costs no round trip: the lag is measured by a background task (`watch`) every
check_interval, and each read asks the pure policy (app/domain/replica.py) about the last
measurement. A read the replica fails (it went down since, a recovery conflict) runs again on
the primary at once, and the replica is taken out until the next measurement finds it well.
A read the replica answers with a refusal or a miss (no such message, a token that does not
match) runs again on the primary too: the replica may not have replayed the change yet, so
only the primary's answer may say no. Changes are not otherwise read back (no read-your-writes):
a status or list may lag a write by up to [rdbms] replica-max-lag, as SQS's approximate counts
and a NATS mirror's stream info do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TypeVar

from app.domain.errors import BrokerError, Unavailable
from app.domain.replica import (
    ReadFrom,
    ReplicaHealth,
    ReplicaState,
    WalSample,
    check_interval,
    choose,
    lag_from_samples,
    samples_kept,
    state_of,
)
from app.store.db import Database, Tx
from app.store.replica import primary_position, replay_position

log = logging.getLogger(__name__)

T = TypeVar("T")

# A check whose statement takes longer than this counts as failed (the replica as down).
CHECK_TIMEOUT_SECONDS = 2.0


class ReadNote:
    """Where one request's reads went: the API's X-Broker-Read-From. Once a read of the request
    went to the primary, the rest follow it there, so one answer never mixes a newer and an
    older view."""

    __slots__ = ("source",)

    def __init__(self) -> None:
        self.source: ReadFrom | None = None

    @property
    def header(self) -> dict[str, str]:
        return {"X-Broker-Read-From": (self.source or ReadFrom.PRIMARY).value}


# Carried with the request's task: a request's reads may pass through several services, and
# threading a note through every signature would put the HTTP header's concern into them all.
_NOTE: ContextVar[ReadNote | None] = ContextVar("webhook_broker_read_note", default=None)


class Reads:
    def __init__(
        self,
        primary: Database,
        replica: Database | None = None,
        max_lag: float = 5.0,
        *,
        observe_read: Callable[[str], None] | None = None,
        observe_lag: Callable[[float | None], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.replica = replica
        self.max_lag = max_lag
        self._observe_read = observe_read or (lambda _source: None)
        self._observe_lag = observe_lag or (lambda _lag: None)
        self._clock = clock
        self._samples: deque[WalSample] = deque()
        # Not measured yet: the primary answers until the first check says otherwise.
        self._health = ReplicaHealth(up=True, lag=None, measured_at=clock())
        self._state: ReplicaState | None = None

    @classmethod
    def primary_only(cls, db: Database) -> Reads:
        return cls(db)

    @staticmethod
    def begin_request() -> ReadNote:
        """A new note for the request running in this task; its reads record into it."""
        note = ReadNote()
        _NOTE.set(note)
        return note

    def source(self) -> ReadFrom:
        """Where a read would go now (no I/O)."""
        health = self._health if self.replica is not None else None
        return choose(health, self.max_lag, self._clock())

    async def read(self, work: Callable[[Tx], Awaitable[T]]) -> T:
        """`work` in one read transaction, on the replica when it is within the limit."""
        note = _NOTE.get()
        source = ReadFrom.PRIMARY if note and note.source is ReadFrom.PRIMARY else self.source()
        if source is ReadFrom.REPLICA and self.replica is not None:
            try:
                async with self.replica.transaction() as tx:
                    result = await work(tx)
            except Unavailable:
                self._replica_failed()
            except BrokerError:
                pass  # the primary's answer decides a refusal or a miss
            else:
                self._served(note, ReadFrom.REPLICA)
                return result
        async with self.primary.transaction() as tx:
            result = await work(tx)
        self._served(note, ReadFrom.PRIMARY)
        return result

    def _served(self, note: ReadNote | None, source: ReadFrom) -> None:
        if note is not None and note.source is not ReadFrom.PRIMARY:
            note.source = source
        if self.replica is not None:
            self._observe_read(source.value)

    def _replica_failed(self) -> None:
        self._settle(ReplicaHealth(up=False, lag=None, measured_at=self._clock()), "a read failed")

    async def check(self) -> None:
        """One measurement: the primary's WAL position, then the replica's replay position."""
        if self.replica is None:
            return
        taken = self._clock()
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                position = await primary_position(self.primary)
        except (Unavailable, TimeoutError):
            # Nothing to compare with; the last measurement ages towards the limit meanwhile.
            return
        self._samples.append(WalSample(taken, position))
        while self._samples and taken - self._samples[0].at > samples_kept(self.max_lag):
            self._samples.popleft()
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                replayed = await replay_position(self.replica)
        except (Unavailable, TimeoutError):
            self._settle(ReplicaHealth(up=False, lag=None, measured_at=taken), "unreachable")
            return
        if replayed is None:
            self._settle(ReplicaHealth(up=False, lag=None, measured_at=taken), "not a standby")
            return
        lag, at_least = lag_from_samples(self._samples, replayed)
        self._settle(ReplicaHealth(up=True, lag=lag, measured_at=taken, lag_at_least=at_least))

    def _settle(self, health: ReplicaHealth, why: str = "") -> None:
        self._health = health
        self._observe_lag(health.shown_lag if health.up else None)
        state = state_of(health, self.max_lag, self._clock())
        if state is self._state:
            return
        # Logged once per change of state, never per read.
        if state is ReplicaState.SERVING:
            log.info("replica: reads go to the replica (lag %.3f s)", health.shown_lag)
        elif state is ReplicaState.LAGGING:
            log.warning(
                "replica: %.3f s behind%s, over [rdbms] replica-max-lag %g s: reads go to the "
                "primary",
                health.shown_lag,
                "" if health.lag is not None else " at least",
                self.max_lag,
            )
        else:
            log.warning("replica: %s: reads go to the primary", why)
        self._state = state

    async def watch(self, stop: asyncio.Event) -> None:
        """Measure the lag every check_interval until `stop`."""
        interval = check_interval(self.max_lag)
        while not stop.is_set():
            try:
                await self.check()
            except Exception:  # a bug must not end the checks, which would freeze the choice
                log.exception("replica: the lag check failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)

    async def close(self) -> None:
        if self.replica is not None:
            await self.replica.dispose()
