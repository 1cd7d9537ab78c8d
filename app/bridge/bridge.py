"""`webhook-broker bridge`: JetStream pull clients served from the broker's database.

Two transports ([nats] mode):
- client: one nats-py connection answers the API subjects (`<api-prefix>.>`), delivers jobs to
  the requesters' inboxes with `<ack-prefix>.<channel>.<consumer>....` replies and receives the
  acks. Works on any NATS server; only nats-py's `msg.metadata` (which wants `$JS.ACK`) fails.
- hybrid: the nats-py connection answers the API; a leafnode link (app/bridge/leaf.py)
  delivers with `$JS.ACK.` replies, receives the acks, and sees requesters' inboxes come and go.

Every subscription is a queue subscription (`queue-group`), so several bridges share the load;
all state lives in the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from app.bridge import protocol as p
from app.bridge.acks import AckProcessor, InboundAck
from app.bridge.activity import Activity
from app.bridge.advisories import AdvisoryPublisher
from app.bridge.api import ApiHandler, ConsumerCache, InfoLimits
from app.bridge.backfill import Backfiller
from app.bridge.client import DirectClient, client_options, tls_context
from app.bridge.engine import EngineLimits, Outbound, PullEngine
from app.bridge.leaf import LeafCredentials, LeafLink
from app.bridge.push import FLOW_CONTROL_PREFIX, PushDeliveries
from app.config import Config, NatsConfig
from app.domain.errors import Unavailable
from app.domain.nats_consumers import ProcessLimits
from app.logging import log_failure
from app.services.advisories import Advisories
from app.services.bridge import BridgeService
from app.services.scheduler import PullScheduler
from app.services.tokens import TokenKeys

log = logging.getLogger(__name__)

CLIENT_MODE_NOTICE = (
    "NATS bridge %s runs in client mode: a pulled delivery's msg.subject is the requester's "
    "inbox (not the channel) and its reply is under %s (not $JS.ACK), so @nats-io/jetstream "
    "(JavaScript), nats-jetstream (Python), nats-py's ordered consumers, heartbeats and "
    "msg.metadata need [nats] mode=hybrid (a leafnode link); nats-py's fetch and acks work"
)

HYBRID_ACK_PREFIX = p.DEFAULT_ACK_PREFIX
# An AckNone consumer's delivery, acknowledged by the bridge as it is sent.
SENT = p.parse_ack(b"+ACK")
# How long stopping waits for the last writes and the connection's close.
CLOSE_SECONDS = 5.0


class ClientOutbound:
    """Writes raw PUB/HPUB commands through nats-py, so statuses carry the exact status line
    (nats-py's publish() can only write `Status:` headers)."""

    def __init__(self, nc: DirectClient) -> None:
        self._nc = nc
        self._buffer: list[bytes] = []
        self._scheduled: asyncio.Task[None] | None = None

    def ready(self) -> bool:
        return bool(self._nc.is_connected)

    def interest(self, subject: str) -> bool | None:
        return None

    def send(self, subject: str, reply: str | None, header: bytes | None, payload: bytes) -> None:
        self._buffer.append(p.encode_message("PUB", subject, reply, header, payload))
        if self._scheduled is None:
            self._scheduled = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        try:
            await self.flush()
        finally:
            self._scheduled = None

    async def flush(self) -> None:
        if not self._buffer:
            return
        buffer, self._buffer = self._buffer, []
        if not self._nc.is_connected:
            return  # deliveries for requests that cannot be answered: the leases handle them
        # One command for the lot (nats-py's pending list took each delivery with an await).
        await self._nc._send_command(b"".join(buffer))
        await self._nc._flush_pending()


class BridgeParts(Protocol):
    """What a bridge needs of its process (app/roots/pulling.PullingProcess): a Protocol, so
    the bridge names no composition root."""

    config: Config
    tokens: TokenKeys
    scheduler: PullScheduler
    advisories: Advisories

    def bridge_service(self) -> BridgeService: ...


class Bridge:
    def __init__(self, runtime: BridgeParts, config: NatsConfig, *, name: str = "") -> None:
        self.runtime = runtime
        self.config = config
        self.name = name or "webhook-broker-bridge"
        broker = runtime.config
        self.service = runtime.bridge_service()
        self.cache = ConsumerCache(self.service)
        self.nc = DirectClient()
        self.hybrid = config.mode == "hybrid"
        self.ack_prefix = HYBRID_ACK_PREFIX if self.hybrid else config.ack_prefix
        self.leaf: LeafLink | None = None
        client_out = ClientOutbound(self.nc)
        self.out: Outbound = client_out
        if self.hybrid:
            self.leaf = LeafLink(
                config.leaf_url,
                name=self.name,
                credentials=LeafCredentials(
                    config.leaf_user or config.user,
                    config.leaf_password or config.password,
                    config.leaf_token or config.token,
                ),
                subscriptions=[(f"{self.ack_prefix}.>", config.queue_group or None)],
                on_message=self._leaf_message,
                on_interest=self._interest,
                on_state=self._delivery_link_state,
                tls=tls_context(config),
            )
            self.out = self.leaf
        pull = broker.pull
        max_expires = pull.max_expires_seconds * p.NANOS
        self.engine = PullEngine(
            runtime.scheduler,
            self.out,
            self.ack_prefix,
            EngineLimits(
                max_batch=pull.max_batch,
                max_expires=max_expires,
                # A plain client cannot see a requester leave: cap requests with no expiry.
                unbounded_cap=None if self.hybrid else float(pull.max_expires_seconds),
            ),
            stored_subject=self.hybrid,
            apply_backoff=self.service.apply_backoff,
        )
        self.management = self.service.management(
            runtime.tokens,
            ProcessLimits(
                max_waiting=pull.max_waiting,
                max_batch=pull.max_batch,
                max_expires=max_expires,
                default_ack_wait=broker.default_ack_wait_seconds,
                max_retry=broker.broker.retry_policy.max_retry,
            ),
        )
        self.api = ApiHandler(
            self.service,
            self.cache,
            self.engine,
            config.api_prefix,
            InfoLimits(pull.max_waiting, pull.max_batch, max_expires),
            self.management,
            manage=config.allow_consumer_management,
        )
        self.backfill = Backfiller(self.service.backfill())
        self.api.created = self.backfill.created
        self.acks = AckProcessor(self.service, self.cache.get, self.engine, self.out, self._publish)
        self.activity = Activity(self.service.mark_active, self.engine.num_waiting)
        self.engine.activity = self.activity
        self.engine.settle = self._settle
        self.push = PushDeliveries(self.engine, runtime.scheduler, self.service.push_consumers)
        self.engine.push = self.push
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: set[asyncio.Task[None]] = set()
        self._subs: list[Subscription] = []
        self._awaiting_lookup: dict[tuple[str, str], list[tuple[str, bytes]]] = {}

    # -- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        options = client_options(config, self.name) | {
            "disconnected_cb": self._client_disconnected,
            "reconnected_cb": self._client_reconnected,
            "error_cb": self._client_error,
        }
        await self.nc.connect(**options)
        # The services' advisories (pins, lapsed leases) go out on this connection.
        self.runtime.advisories.attach(AdvisoryPublisher(self._publish))
        if self.leaf is not None:
            self._tasks.append(asyncio.create_task(self.leaf.run(self._stop), name="bridge-leaf"))
            await asyncio.wait_for(self.leaf.connected.wait(), timeout=10)
        self._tasks.append(asyncio.create_task(self.acks.run(self._stop), name="bridge-acks"))
        self._tasks.append(
            asyncio.create_task(self.activity.run(self._stop), name="bridge-activity")
        )
        self._tasks.append(asyncio.create_task(self.push.run(self._stop), name="bridge-push"))
        self._tasks.append(
            asyncio.create_task(self.backfill.run(self._stop), name="bridge-backfill")
        )
        # Flow control replies: each bridge hears them all and takes those it asked for.
        self._subs.append(
            await self.nc.subscribe(f"{FLOW_CONTROL_PREFIX}.>", cb=self._flow_control_reply)
        )
        queue = config.queue_group
        api = config.api_prefix
        for subject in (
            f"{api}.INFO",
            f"{api}.STREAM.NAMES",
            f"{api}.STREAM.INFO.*",
            f"{api}.CONSUMER.INFO.*.*",
            f"{api}.CONSUMER.CREATE.>",
            f"{api}.CONSUMER.UNPIN.*.*",
            f"{api}.CONSUMER.PAUSE.*.*",
            f"{api}.CONSUMER.DURABLE.CREATE.*.*",
            f"{api}.CONSUMER.DELETE.*.*",
            f"{api}.CONSUMER.NAMES.*",
            f"{api}.CONSUMER.LIST.*",
            f"{api}.STREAM.LIST",
        ):
            self._subs.append(await self.nc.subscribe(subject, queue=queue, cb=self._api_request))
        self._subs.append(
            await self.nc.subscribe_direct(
                f"{api}.CONSUMER.MSG.NEXT.*.*", queue, self._pull_request
            )
        )
        if not self.hybrid:
            self._subs.append(
                await self.nc.subscribe_direct(f"{self.ack_prefix}.>", queue, self._ack)
            )
        await self.nc.flush()
        log.info(
            "NATS bridge %s up (mode=%s, api=%s, acks=%s)",
            self.name,
            self.config.mode,
            api,
            self.ack_prefix,
        )
        if not self.hybrid:
            # Said once per start: clients that break in client mode fail in their own
            # words (missed heartbeats, "not a JetStream message"), far from the cause.
            log.warning(CLIENT_MODE_NOTICE, self.name, self.ack_prefix)

    async def stop(self) -> None:
        """Stop taking requests, answer what is queued, apply every received ack, close."""
        self.runtime.advisories.attach(None)
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=2)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.settled(), timeout=5)
        self.push.close()
        await self.engine.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.acks.wait_idle(), timeout=10)
        self._stop.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=10)
            for task in pending:
                task.cancel()
        self._tasks.clear()
        # A peer that stopped reading must not hold the shutdown: what is unsent by then is
        # covered by the leases.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.out.flush(), timeout=CLOSE_SECONDS)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.nc.close(), timeout=CLOSE_SECONDS)

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    async def settled(self) -> None:
        """Until every API request taken so far is answered (one that comes meanwhile too)."""
        while self._inflight:
            await asyncio.wait(set(self._inflight))

    # -- inbound ------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _api_request(self, msg: Msg) -> None:
        if msg.reply:
            self._spawn(self._answer_api(msg.subject, msg.reply, msg.data))

    async def _answer_api(self, subject: str, reply: str, body: bytes) -> None:
        try:
            answer = await self.api.answer(subject, body)
        except Unavailable:
            log.warning("API request %s: the database is unavailable", subject)
            # What nats-server answers while its JetStream cannot serve: clients retry.
            answer = p.api_error(
                "io.nats.jetstream.api.v1.error",
                503,
                10008,
                "JetStream system temporarily unavailable",
            )
        except Exception:
            log_failure(log, "API request %s failed", subject)
            answer = p.api_error("io.nats.jetstream.api.v1.error", 500, 10000, "bridge error")
        if answer is not None:
            await self.nc.publish(reply, answer)

    def _pull_request(self, subject: str, reply: str | None, body: bytes) -> None:
        if not reply:
            return
        tokens = subject.split(".")
        key = (tokens[-2], tokens[-1])
        queued = self._awaiting_lookup.get(key)
        if queued is not None:  # keep arrival order behind a lookup in progress
            queued.append((reply, body))
            return
        cached = self.cache.fresh(*key)
        if cached is not None and cached.consumer is not None:
            self.engine.submit(cached.consumer, reply, body)
            return
        self._awaiting_lookup[key] = [(reply, body)]
        self._spawn(self._pull_after_lookup(key))

    async def _pull_after_lookup(self, key: tuple[str, str]) -> None:
        try:
            found = await self.cache.get(*key)
        except Exception:
            log_failure(log, "consumer lookup for %s.%s failed", *key)
            self._awaiting_lookup.pop(key, None)
            return
        for reply, body in self._awaiting_lookup.pop(key, []):
            if found.consumer is None:
                # No such consumer: what the server answers when nobody serves the subject.
                self.out.send(reply, None, p.NO_RESPONDERS, b"")
                continue
            try:
                self.engine.submit(found.consumer, reply, body)
            except Exception:  # one bad request must not cost the others queued beside it
                log_failure(log, "pull request for %s.%s failed", *key)

    async def _flow_control_reply(self, msg: Msg) -> None:
        self.push.flow_control_reply(msg.subject)

    def _settle(self, token: p.AckToken) -> None:
        self.acks.submit(InboundAck(token, SENT, None, sent=True))

    def _ack(self, subject: str, reply: str | None, payload: bytes) -> None:
        token = p.parse_ack_subject(self.ack_prefix, subject)
        if token is None:
            if reply and not p.ack_subject_shaped(self.ack_prefix, subject):
                # No consumer's ack subscription on nats-server matches it: the server
                # answers the request itself, with no responders.
                self.out.send(reply, None, p.NO_RESPONDERS, b"")
            return
        self.acks.submit(InboundAck(token, p.parse_ack(payload), reply or None))

    def _leaf_message(
        self, subject: str, reply: str | None, header: bytes | None, payload: bytes
    ) -> None:
        self._ack(subject, reply, payload)

    def _interest(self, subject: str, present: bool) -> None:
        if not present:
            self.engine.interest_gone(subject)

    def _delivery_link_state(self, up: bool) -> None:
        if not up:
            self.engine.drop_all()

    async def _publish(self, subject: str, body: bytes) -> None:
        if self.nc.is_connected:
            await self.nc.publish(subject, body)

    async def _client_disconnected(self) -> None:
        log.warning("NATS client connection lost; waiting pull requests are dropped")
        self.engine.drop_all()

    async def _client_reconnected(self) -> None:
        log.info("NATS client connection re-established")

    async def _client_error(self, exc: Exception) -> None:
        log.warning("NATS client error: %s", exc)
