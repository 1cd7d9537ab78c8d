"""The fault schedule: drawn from the seed, one fault at a time, every kind once per round (a
shuffled deck) so that even a short run meets each of them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from devtools.pg import Cluster
from tests.chaos.journal import Journal
from tests.chaos.processes import BrokerProcess
from tests.helpers.natsproc import NatsServer

KINDS = ("kill", "pause", "stop", "pg-restart", "pg-outage", "nats-restart")


@dataclass
class Faults:
    rng: random.Random
    journal: Journal
    processes: Sequence[BrokerProcess]
    cluster: Cluster
    nats: NatsServer
    delete_consumer: Callable[[], Awaitable[None]]
    gap: tuple[float, float]  # seconds between faults
    _kinds: list[str] = field(default_factory=list)
    # The archive of a job partition, which the broker's sweepers then detach and drop; True
    # once one was ready (tried after each fault from drop_at on).
    archive_partition: Callable[[], Awaitable[bool]] | None = None

    async def run(self, until: float, delete_at: float, drop_at: float | None = None) -> None:
        """Inject faults until the journal's clock passes `until`; the consumer deletion once,
        after `delete_at`; a partition archived and dropped once, after `drop_at`."""
        deck: list[str] = []
        deleted = False
        dropped = False
        while True:
            await asyncio.sleep(self.rng.uniform(*self.gap))
            if self.journal.now() >= until:
                return
            ready = drop_at is not None and self.journal.now() >= drop_at
            if ready and not dropped and self.archive_partition is not None:
                dropped = await self.archive_partition()
                if dropped:
                    self.journal.faults["partition-drop"] += 1
            if not deleted and self.journal.now() >= delete_at:
                deleted = True
                await self.inject("consumer-delete")
                continue
            if not deck:
                deck = list(KINDS)
                self.rng.shuffle(deck)
            await self.inject(deck.pop())

    def target(self) -> BrokerProcess:
        """A running process, its kind drawn from a deck of its own so that each kind meets
        each process fault."""
        if not self._kinds:
            self._kinds = sorted({p.command for p in self.processes})
            self.rng.shuffle(self._kinds)
        kind = self._kinds.pop()
        running = [p for p in self.processes if p.command == kind and p.running()]
        return self.rng.choice(running or [p for p in self.processes if p.running()])

    async def inject(self, kind: str) -> None:
        self.journal.faults[kind] += 1
        if kind == "consumer-delete":
            self.journal.event("fault", kind)
            await self.delete_consumer()
            return
        if kind == "pg-restart":  # pg_ctl restart -m immediate
            self.journal.event("fault", kind)
            await asyncio.to_thread(self.cluster.down)
            await asyncio.to_thread(self.cluster.up)
            return
        if kind == "pg-outage":  # connections refused for a while
            seconds = round(self.rng.uniform(2, 5), 1)
            self.journal.event("fault", f"{kind} {seconds}s")
            await asyncio.to_thread(self.cluster.down)
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.cluster.up)
            return
        if kind == "nats-restart":
            self.journal.event("fault", kind)
            await asyncio.to_thread(self.nats.stop)
            await asyncio.sleep(self.rng.uniform(0.5, 2))
            await asyncio.to_thread(self.nats.start)
            return
        target = self.target()
        self.journal.event("fault", f"{kind} {target.name}")
        target.busy = True
        try:
            await self._process_fault(kind, target)
        finally:
            target.busy = False

    async def _process_fault(self, kind: str, target: BrokerProcess) -> None:
        if kind == "kill":
            await asyncio.to_thread(target.kill)
            await asyncio.sleep(self.rng.uniform(0.5, 2))
            target.start()
        elif kind == "pause":  # a process that hangs: SIGSTOP, later SIGCONT
            target.pause()
            await asyncio.sleep(self.rng.uniform(1, 5))
            target.resume()
        elif kind == "stop":  # a graceful restart: SIGTERM, its exit, a new process
            gone = await asyncio.to_thread(target.stop)
            self.journal.event("exit", f"{target.name} {gone.code} after {gone.seconds}s")
            target.start()
        else:
            raise ValueError(kind)
