"""Push consumers over NATS: a consumer with a `deliver_subject` is delivered by the bridge to
that subject, as nats-server 2.15 delivers one (server/consumer.go: deliverMsg,
sendIdleHeartbeat, needFlowControl, sendFlowControl, processFlowControl).

Each push consumer is one standing request in the shared pull scheduler: a `Waiter` whose
sink is a `PushSink`, with no batch limit and no expiry. The scheduler claims for it as for any
pull request, so max_ack_pending (the claim's cap), redelivery, backoff, AckNone and the acks
on `$JS.ACK` are the pull path's, unchanged. The sink writes each delivery to the deliver
subject with its ack reply; a queue group (`deliver_group`) is NATS's to split. Its idle
heartbeat is the scheduler's per-request heartbeat; flow control is the sink's own window.

Every bridge process delivers every push consumer it knows: the claims (SKIP LOCKED) give each
job to one of them, so a job is sent once whichever bridge sends it. Across bridges the order
of deliveries is not the stream's, and each bridge sends its own heartbeats and flow control.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import string
from collections.abc import Awaitable, Callable, Hashable

from app.bridge import protocol as p
from app.bridge.engine import PullEngine
from app.domain.models import Consumer
from app.domain.pulls import Delivery, PullEnd
from app.logging import log_failure
from app.services.scheduler import PullScheduler, Waiter

log = logging.getLogger(__name__)

# Where flow control replies come back (nats-server's `$JS.FC.<stream>.<consumer>.<id>`).
FLOW_CONTROL_PREFIX = "$JS.FC"
# JsFlowControlMaxPending: the window's limit; it starts at a sixteenth and doubles with each
# answered flow control request.
FLOW_CONTROL_MAX_PENDING = 32 * 1024 * 1024
# How often the bridge reads which push consumers exist (those made by another bridge, or
# over HTTP, are found this way; those made through this bridge at once).
SCAN_SECONDS = 1.0
# A standing request has no batch: as many jobs as max_ack_pending lets out.
UNBOUNDED = 2**62
FLOW_CONTROL_REQUEST = b"NATS/1.0 100 FlowControl Request\r\n\r\n"
_ID_ALPHABET = string.digits + string.ascii_letters

ListPush = Callable[[], Awaitable[list[Consumer]]]


def settings(consumer: Consumer) -> tuple[object, ...]:
    """What a push consumer's standing request is made from: a change makes a new one."""
    o = consumer.options
    return (o.deliver_subject, o.idle_heartbeat, o.flow_control, o.ack_policy)


class PushSink:
    """The scheduler's sink for one push consumer's standing request."""

    numbered = True

    def __init__(self, pushes: PushDeliveries, consumer: Consumer) -> None:
        options = consumer.options
        # A claim made ahead and given back (the window full, the connection busy) has used up
        # delivery sequence numbers: an ordered consumer (AckNone) takes that for a gap and
        # makes itself again, so AckNone consumers claim only what they send.
        self.claims_ahead = options.ack_policy != "none"
        self.pushes = pushes
        self.engine = pushes.engine
        self.consumer_pk = consumer.pk
        self.subject = options.deliver_subject or ""
        self.settings = settings(consumer)
        self.closed = False
        self._fc_prefix = f"{FLOW_CONTROL_PREFIX}.{consumer.channel_id}.{consumer.id}."
        # Flow control, as nats-server keeps it: bytes sent since the last answered request
        # (pbytes), the window (maxpb, doubling up to its limit), the request awaiting its
        # reply (fcid) and the bytes it covers (fcsz).
        self.window = FLOW_CONTROL_MAX_PENDING // 16 if options.flow_control else 0
        self.pending_bytes = 0
        self.fc_reply: str | None = None
        self.fc_bytes = 0

    @property
    def outlet(self) -> Hashable:
        return self.engine

    def alive(self) -> bool:
        return not self.closed

    def active(self) -> bool:
        """Someone may be subscribed to the deliver subject (only a leafnode link can tell
        that nobody is: a plain client connection sees no interest)."""
        return self.engine.out.interest(self.subject) is not False

    def stalled(self) -> bool:
        return self.window > 0 and self.pending_bytes > self.window

    def ready(self) -> bool:
        return self.engine.out.ready() and self.active() and not self.stalled()

    def offer(self, consumer: Consumer, delivery: Delivery, bytes_left: int | None) -> int | None:
        size = self.engine.deliver(consumer, delivery, self.subject, None)
        if size is not None and self.window:
            self.pending_bytes += size
            self._flow_control(size)
        return size

    def _flow_control(self, size: int) -> None:
        if self.fc_reply is None and self.pending_bytes > self.window // 2:
            self.fc_reply = self._fc_prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in "1234")
            self.fc_bytes = self.pending_bytes
            self.engine.out.send(self.subject, self.fc_reply, FLOW_CONTROL_REQUEST, b"")
        elif self.fc_reply is not None and self.pending_bytes - self.fc_bytes >= self.window:
            self.fc_bytes += size

    def answered(self, subject: str) -> bool:
        """A flow control reply: the window opens (and grows) if it answers the latest."""
        if subject != self.fc_reply:
            return False
        self.window = min(self.window * 2, FLOW_CONTROL_MAX_PENDING)
        self.pending_bytes = max(self.pending_bytes - self.fc_bytes, 0)
        self.fc_reply, self.fc_bytes = None, 0
        return True

    def end(self, outcome: PullEnd, waiter: Waiter, pending: int) -> None:
        self.pushes.ended(self, outcome)

    def heartbeat(self, last_seq: int, last_stream_seq: int) -> None:
        if not self.active():
            return
        headers = [
            ("Nats-Last-Consumer", str(last_seq)),
            ("Nats-Last-Stream", str(last_stream_seq)),
        ]
        if self.fc_reply is not None:
            headers.append(("Nats-Consumer-Stalled", self.fc_reply))
        self.engine.out.send(self.subject, None, p.status_block(*p.HEARTBEAT, headers), b"")

    async def flush(self) -> None:
        await self.engine.out.flush()


class PushDeliveries:
    """This bridge's push consumers, each a standing request in the scheduler."""

    def __init__(self, engine: PullEngine, scheduler: PullScheduler, list_push: ListPush) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self._list_push = list_push
        self._sinks: dict[int, PushSink] = {}
        self._scan = asyncio.Event()
        self._closed = False

    # -- the engine's hooks ---------------------------------------------------------------------

    def bound(self, consumer: Consumer) -> bool:
        """push_bound: a subscriber is known to listen (a leafnode link sees it)."""
        subject = consumer.options.deliver_subject
        return bool(subject) and self.engine.out.interest(subject or "") is True

    def changed(self, consumer: Consumer) -> None:
        self._update(consumer)

    def delivers(self, consumer_pk: int) -> bool:
        return consumer_pk in self._sinks

    # -- standing requests ----------------------------------------------------------------------

    def _update(self, consumer: Consumer) -> None:
        if self._closed:
            return
        sink = self._sinks.get(consumer.pk)
        if sink is not None and sink.settings == settings(consumer):
            return
        if sink is not None:
            self._drop(sink)
        if not consumer.options.deliver_subject:
            return
        sink = PushSink(self, consumer)
        self._sinks[consumer.pk] = sink
        beat = consumer.options.idle_heartbeat
        self.scheduler.submit(
            consumer,
            Waiter(
                sink,
                batch_left=UNBOUNDED,
                expires_at=None,
                heartbeat=beat / p.NANOS if beat else None,
            ),
        )
        if self.engine.activity is not None:
            self.engine.activity.touch(consumer)

    def _drop(self, sink: PushSink) -> None:
        sink.closed = True
        if self._sinks.get(sink.consumer_pk) is sink:
            del self._sinks[sink.consumer_pk]
        self.scheduler.drop(lambda w: w.sink is sink)

    def ended(self, sink: PushSink, outcome: PullEnd) -> None:
        """Its request ended: the consumer was deleted, or the scheduler let it go (closing);
        the next scan makes it again if the consumer is still there."""
        if sink.closed:  # dropped here: replaced, or the consumer is gone
            return
        sink.closed = True
        if self._sinks.get(sink.consumer_pk) is sink:
            del self._sinks[sink.consumer_pk]
        if outcome is not PullEnd.CONSUMER_DELETED:
            self._scan.set()

    def flow_control_reply(self, subject: str) -> None:
        for sink in self._sinks.values():
            if sink.answered(subject):
                self.scheduler.wake(sink.consumer_pk)
                return

    async def scan(self) -> None:
        consumers = await self._list_push()
        seen = {c.pk for c in consumers}
        for consumer in consumers:
            self._update(consumer)
            if self.engine.activity is not None:
                # In use while delivered to, as nats-server keeps a push consumer with
                # interest (a plain client connection cannot see interest: always).
                sink = self._sinks.get(consumer.pk)
                if sink is not None and sink.active():
                    self.engine.activity.touch(consumer)
        for pk in [pk for pk in self._sinks if pk not in seen]:
            self._drop(self._sinks[pk])

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.scan()
            except Exception:
                log_failure(log, "reading the push consumers failed")
            self._scan.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (stop, self._scan)]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(waits, timeout=SCAN_SECONDS, return_when="FIRST_COMPLETED")
            for w in waits:
                w.cancel()

    def close(self) -> None:
        self._closed = True
        for sink in list(self._sinks.values()):
            self._drop(sink)
