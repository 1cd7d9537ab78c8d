"""The chaos run's clients, each retrying the way docs/operations/reliability.md tells users
to: publishers with message ids as idempotency keys, HTTP pullers with fenced acks, nats-py
pullers through the bridges, and a push receiver that fails, times out and pushes back at
random. All of them write what they saw to the journal; the invariants are checked against
it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import nats
from aiohttp import web
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError

from devtools.pg import free_port
from tests.chaos.journal import Journal

CHANNEL = "chaos"
CHANNEL_TOKEN = "chaos-token"
PRODUCER = "producer"
PRODUCER_TOKEN = "producer-token"
HTTP_CONSUMER = "http-workers"
NATS_CONSUMER = "nats-workers"
PUSH_CONSUMER = "hook"
DOOMED_CONSUMER = "doomed"  # deleted mid-run
ACK_WAIT_SECONDS = 3
PULL_EXPIRES_SECONDS = 5
PAYLOAD_MARK = "chaos-payload-body"  # in every payload: no log may show it


def token(consumer_id: str) -> str:
    return f"{consumer_id}-token"


@dataclass
class Phase:
    """Where the run is: clients misbehave until `draining`, then only complete their work."""

    publishing: bool = True
    draining: bool = False
    stopped: bool = False


@dataclass
class Apis:
    """The API processes' clients; a request that cannot connect moves to the next one."""

    clients: Sequence[httpx.AsyncClient]
    turn: int = 0

    def current(self) -> httpx.AsyncClient:
        return self.clients[self.turn % len(self.clients)]

    def rotate(self) -> None:
        self.turn += 1

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request; a connection error moves to the next API process and is raised."""
        client = self.current()
        try:
            return await client.request(method, path, **kwargs)
        except httpx.TransportError:
            self.rotate()
            raise


async def backoff(attempt: int, rng: random.Random) -> None:
    """Exponential backoff with full jitter, 0.1 s doubling to 2 s (as the reliability page
    says)."""
    await asyncio.sleep(rng.uniform(0, min(2.0, 0.1 * 2**attempt)))


@dataclass
class Publisher:
    index: int
    apis: Apis
    journal: Journal
    phase: Phase
    rng: random.Random
    per_second: float

    async def run(self) -> None:
        n = 0
        while self.phase.publishing:
            message_id = f"m{self.index}-{n}"
            n += 1
            await self.publish(message_id)
            await asyncio.sleep(self.rng.expovariate(self.per_second))

    async def publish(self, message_id: str) -> None:
        headers = {
            "X-Broker-Channel-Token": CHANNEL_TOKEN,
            "X-Broker-Producer-ID": PRODUCER,
            "X-Broker-Producer-Token": PRODUCER_TOKEN,
            "X-Broker-Message-ID": message_id,
            "Content-Type": "application/json",
        }
        body = f'{{"message": "{message_id}", "mark": "{PAYLOAD_MARK}"}}'.encode()
        self.journal.published[message_id] = "unknown"
        attempt = 0
        while self.phase.publishing:
            self.journal.operations["publish requests"] += 1
            try:
                r = await self.apis.request(
                    "POST", f"/channel/{CHANNEL}/broadcast", content=body, headers=headers
                )
            except httpx.TransportError:
                r = None
            if r is not None and r.status_code == 201:
                self.journal.published[message_id] = "created"
                return
            if r is not None and r.status_code == 409 and "already exists" in r.text:
                self.journal.published[message_id] = "exists"
                return
            if r is not None and r.status_code < 500 and r.status_code != 409:
                self.journal.event("publish refused", f"{message_id}: {r.status_code} {r.text}")
                self.journal.published[message_id] = f"refused {r.status_code}"
                return
            if r is not None:
                self.journal.operations[f"publish answered {r.status_code}"] += 1
            await backoff(attempt, self.rng)
            attempt += 1


@dataclass
class HttpPuller:
    """Pulls with long polls; per job: ack, nak, term, progress then ack, vanish (the lease
    runs out), or a worker slower than the ack wait."""

    consumer_id: str
    apis: Apis
    journal: Journal
    phase: Phase
    rng: random.Random
    gone: bool = False  # the consumer was deleted (404): the worker stops

    @property
    def base(self) -> str:
        return f"/channel/{CHANNEL}/consumer/{self.consumer_id}"

    @property
    def auth(self) -> dict[str, str]:
        return {
            "X-Broker-Channel-Token": CHANNEL_TOKEN,
            "X-Broker-Consumer-Token": token(self.consumer_id),
        }

    async def run(self) -> None:
        failures = 0
        while not self.phase.stopped and not self.gone:
            body = {"batch": 10, "expires": PULL_EXPIRES_SECONDS}
            try:
                r = await self.apis.request(
                    "POST", f"{self.base}/pull", json=body, headers=self.auth
                )
            except httpx.TransportError:
                r = None
            if r is None or r.status_code != 200:
                if r is not None:
                    self.journal.operations[f"pull answered {r.status_code}"] += 1
                    # The deleted consumer: its token names nobody now (401), or it is gone.
                    if r.status_code in (401, 404) and self.consumer_id == DOOMED_CONSUMER:
                        self.gone = True
                        return
                await backoff(failures, self.rng)
                failures += 1
                continue
            failures = 0
            self.journal.operations["pulls"] += 1
            for job in r.json()["Jobs"]:
                await self.work(job)

    async def work(self, job: dict[str, Any]) -> None:
        key = (self.consumer_id, job["Message"]["MessageID"])
        attempt = int(job["Attempt"])
        self.journal.received(key, attempt)
        self.journal.operations["jobs pulled over HTTP"] += 1
        roll = 0.0 if self.phase.draining else self.rng.random()
        if roll < 0.70:
            await self.settle(key, job["ID"], {"type": "ack", "attempt": attempt})
        elif roll < 0.78:
            nak = {"type": "nak", "attempt": attempt, "delay": round(self.rng.uniform(0, 1), 2)}
            await self.settle(key, job["ID"], nak)
        elif roll < 0.82:
            await self.settle(key, job["ID"], {"type": "term", "attempt": attempt})
        elif roll < 0.88:
            await self.settle(key, job["ID"], {"type": "progress", "attempt": attempt})
            await self.settle(key, job["ID"], {"type": "ack", "attempt": attempt})
        elif roll < 0.95:
            self.journal.operations["jobs abandoned"] += 1  # the worker vanished
        else:
            await asyncio.sleep(ACK_WAIT_SECONDS + 1)  # slower than its lease
            await self.settle(key, job["ID"], {"type": "ack", "attempt": attempt})

    async def settle(self, key: tuple[str, str], job_id: str, body: dict[str, Any]) -> None:
        """One ack, retried on a connection error (a retry after an applied ack gets a 409:
        then the outcome is unknown, and only a 202 counts as confirmed)."""
        kind = body["type"]
        for attempt in range(3):
            try:
                r = await self.apis.request(
                    "POST", f"{self.base}/job/{job_id}/ack", json=body, headers=self.auth
                )
            except httpx.TransportError:
                await backoff(attempt, self.rng)
                continue
            self.journal.operations[f"{kind} answered {r.status_code}"] += 1
            if r.status_code == 202 and kind in ("ack", "term"):
                self.journal.completed(key, kind, body["attempt"])
            if r.status_code < 500:
                return
            await backoff(attempt, self.rng)
        self.journal.operations[f"{kind} outcome unknown"] += 1


@dataclass
class NatsPuller:
    """An unmodified nats-py JetStream pull consumer of the bridges."""

    index: int
    url: str
    ack_prefix: str
    journal: Journal
    phase: Phase
    rng: random.Random

    async def run(self) -> None:
        nc = await nats.connect(
            self.url,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            allow_reconnect=True,
            name=f"chaos-nats-{self.index}",
            error_cb=self.connection_error,
        )
        try:
            await self.pull(nc)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    async def connection_error(self, exc: Exception) -> None:
        self.journal.operations[f"nats connection {type(exc).__name__}"] += 1

    async def pull(self, nc: NatsClient) -> None:
        js = nc.jetstream(timeout=5)
        psub = None
        failures = 0
        while not self.phase.stopped:
            try:
                if psub is None:
                    psub = await js.pull_subscribe(CHANNEL, durable=NATS_CONSUMER, stream=CHANNEL)
                msgs = await psub.fetch(10, timeout=3)
            except NatsTimeoutError:
                continue
            except (NatsError, OSError) as error:
                self.journal.operations[f"nats fetch {type(error).__name__}"] += 1
                await backoff(failures, self.rng)
                failures += 1
                continue
            failures = 0
            self.journal.operations["nats fetches"] += 1
            for msg in msgs:
                await self.work(msg)

    async def work(self, msg: Any) -> None:
        tokens = msg.reply.split(".")
        # <prefix>._.<job id>.<stream>.<consumer>.<delivered>...: the delivery count is the
        # attempt (the ack form with domain and account-hash tokens, app/bridge).
        attempt = int(tokens[len(self.ack_prefix.split(".")) + 4])
        key = (NATS_CONSUMER, msg.headers["Nats-Msg-Id"])
        self.journal.received(key, attempt)
        self.journal.operations["jobs fetched over NATS"] += 1
        roll = 0.0 if self.phase.draining else self.rng.random()
        try:
            if roll < 0.80:
                await msg.ack()
            elif roll < 0.88:
                await msg.nak()
            elif roll < 0.91:
                await msg.term()
            else:
                self.journal.operations["jobs abandoned"] += 1
        except (NatsError, OSError):
            self.journal.operations["nats ack failed"] += 1


@dataclass
class PushReceiver:
    """The push consumer's endpoint. Its answer to a delivery is a function of the seed, the
    message and the attempt: 200, 500, 429 or 503 with Retry-After, or too slow (past the
    dispatcher's timeout). While draining it answers 200."""

    journal: Journal
    phase: Phase
    seed: int
    runner: web.AppRunner | None = None
    port: int = 0
    answered: dict[str, int] = field(default_factory=dict)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def roll(self, message_id: str, attempt: int) -> float:
        digest = hashlib.sha256(f"{self.seed}:{message_id}:{attempt}".encode()).digest()
        return int.from_bytes(digest[:8]) / 2**64

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        message_id = request.headers["X-Broker-Message-ID"]
        attempt = int(request.headers["X-Broker-Delivery-Attempt"])
        roll = 0.0 if self.phase.draining else self.roll(message_id, attempt)
        self.journal.operations["push deliveries received"] += 1
        key = (PUSH_CONSUMER, message_id)
        if roll < 0.72:
            self.journal.received(key, attempt, 200)
            return web.Response(status=200)
        if roll < 0.82:
            self.journal.received(key, attempt, 500)
            return web.Response(status=500)
        if roll < 0.90:
            self.journal.received(key, attempt, 429)
            return web.Response(status=429, headers={"Retry-After": "1"})
        if roll < 0.94:
            self.journal.received(key, attempt, 503)
            return web.Response(status=503, headers={"Retry-After": "1"})
        # Past the dispatcher's timeout: it counts a failure whatever comes after.
        self.journal.received(key, attempt, None)
        await asyncio.sleep(2.5)
        return web.Response(status=200)
