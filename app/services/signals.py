"""In-process wake-ups for waiters on a consumer's queue (long polls, dispatchers)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

# Subscribing to this key hears about every consumer (the push dispatcher serves them all).
ANY_CONSUMER = -1


class Signals:
    """Fan-out of "this consumer's queue changed" to every local waiter.

    On SQLite the database wakes them after a commit; on PostgreSQL the NOTIFY listener
    does, so waiters in every process hear about jobs published by any process.
    """

    def __init__(self) -> None:
        self._waiters: defaultdict[int, set[asyncio.Event]] = defaultdict(set)
        # Moves on with every announced change of a consumer's settings, and whenever one may
        # have been missed (the listener's reconnections): what was read of consumers under an
        # older value is stale. A number, so that a dispatcher checks it per claim for the
        # cost of a comparison.
        self.consumers_version = 0

    def wake(self, consumer_pks: Iterable[int]) -> None:
        woke_any = False
        for pk in consumer_pks:
            for event in self._waiters.get(pk, ()):
                event.set()
            woke_any = True
        if woke_any:
            for event in self._waiters.get(ANY_CONSUMER, ()):
                event.set()

    def changed(self, consumer_pks: Iterable[int]) -> None:
        """Consumers' settings changed (callback URL, tokens, secret, type, enabled, or they
        were created or deleted); their waiters are woken by the wake-up that comes with it."""
        self.consumers_version += 1

    def wake_all(self) -> None:
        """After a lost listener connection: notifications may have been missed."""
        for events in self._waiters.values():
            for event in events:
                event.set()

    @contextmanager
    def subscribe(self, consumer_pk: int) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self._waiters[consumer_pk].add(event)
        try:
            yield event
        finally:
            waiters = self._waiters[consumer_pk]
            waiters.discard(event)
            if not waiters:
                del self._waiters[consumer_pk]
