"""The JSON side of the JetStream API the bridge answers: STREAM.NAMES, CONSUMER.INFO,
CONSUMER.UNPIN and CONSUMER.CREATE / DURABLE.CREATE (which never create: they report an
existing pull consumer).

Stream name = channel id, consumer name = pull consumer id, the stream's subject = channel id.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from app.bridge import protocol as p
from app.bridge.engine import PullEngine
from app.domain.errors import InvalidInput
from app.domain.models import Consumer, ConsumerType
from app.domain.priority import (
    GROUP_NAME,
    GROUP_NAME_RULE,
    PriorityConfigError,
    PriorityPolicy,
    PrioritySettings,
    parse_policy,
    priority_settings,
)
from app.services.bridge import BridgeService, Lookup

NAMES_PAGE = 1024


class ConsumerCache:
    """Channel/consumer lookups for the hot paths (pull requests, acks), kept `ttl` seconds.
    Misses are never cached, so a consumer created over HTTP is served at once."""

    def __init__(self, service: BridgeService, ttl: float = 2.0) -> None:
        self._service = service
        self._ttl = ttl
        self._entries: dict[tuple[str, str], tuple[float, Lookup]] = {}
        self._flights: dict[tuple[str, str], asyncio.Future[Lookup]] = {}

    def fresh(self, channel_id: str, consumer_id: str) -> Lookup | None:
        entry = self._entries.get((channel_id, consumer_id))
        if entry is None or entry[0] < asyncio.get_running_loop().time():
            return None
        return entry[1]

    async def get(self, channel_id: str, consumer_id: str) -> Lookup:
        cached = self.fresh(channel_id, consumer_id)
        if cached is not None:
            return cached
        key = (channel_id, consumer_id)
        flight = self._flights.get(key)
        if flight is None:
            # One query per key at a time, however many requests arrive while it runs.
            flight = asyncio.ensure_future(self._service.lookup(channel_id, consumer_id))
            self._flights[key] = flight
            flight.add_done_callback(lambda _: self._flights.pop(key, None))
        found = await asyncio.shield(flight)
        if found.consumer is not None:
            expires = asyncio.get_running_loop().time() + self._ttl
            self._entries[key] = (expires, found)
        return found


@dataclass(frozen=True, slots=True)
class InfoLimits:
    max_waiting: int
    max_batch: int
    max_expires: int  # ns


class ApiHandler:
    def __init__(
        self,
        service: BridgeService,
        cache: ConsumerCache,
        engine: PullEngine,
        prefix: str,
        limits: InfoLimits,
    ) -> None:
        self._service = service
        self._cache = cache
        self._engine = engine
        self._prefix = prefix
        self._limits = limits
        self._answered = 0
        self._errors = 0

    async def answer(self, subject: str, body: bytes) -> bytes | None:
        """The JSON reply to one API request; None for subjects that are not ours."""
        if not subject.startswith(self._prefix + "."):
            return None
        tokens = subject[len(self._prefix) + 1 :].split(".")
        answer = await self._answer(tokens, body)
        if answer is not None:
            # The server counts every API request it answers, and those it answers with an
            # error, in INFO's `api` totals (this one included).
            self._answered += 1
            if b'"error":{' in answer:
                self._errors += 1
        return answer

    async def _answer(self, tokens: list[str], body: bytes) -> bytes | None:
        if tokens == ["INFO"]:
            streams, consumers = await self._service.account_counts()
            return p.account_info(streams, consumers, self._answered + 1, self._errors)
        if tokens == ["STREAM", "NAMES"]:
            return await self._stream_names(body)
        if len(tokens) == 3 and tokens[:2] == ["STREAM", "INFO"]:
            return await self._stream_info(tokens[2], body)
        if len(tokens) == 4 and tokens[:2] == ["CONSUMER", "INFO"]:
            if not _empty_request(body):
                return p.api_error(p.INFO_TYPE, 400, 10038, "expected an empty request payload")
            return await self._info(tokens[2], tokens[3], p.INFO_TYPE)
        if len(tokens) >= 3 and tokens[:2] == ["CONSUMER", "CREATE"]:
            return await self._create(tokens[2], tokens[3] if len(tokens) > 3 else None, body)
        if len(tokens) == 5 and tokens[:3] == ["CONSUMER", "DURABLE", "CREATE"]:
            return await self._create(tokens[3], tokens[4], body)
        if len(tokens) == 4 and tokens[:2] == ["CONSUMER", "UNPIN"]:
            return await self._unpin(tokens[2], tokens[3], body)
        return None

    async def _unpin(self, stream: str, name: str, body: bytes) -> bytes:
        """UNPIN, with nats-server's checks in its order."""
        kind = p.UNPIN_TYPE
        try:
            group = p.unpin_group(body)
        except p.BadRequest as exc:
            return p.api_error(kind, 400, 10025, str(exc))
        if not GROUP_NAME.match(group):
            return p.api_error(kind, 400, 10162, GROUP_NAME_RULE)
        found = await self._service.lookup(stream, name)
        if not found.channel_found:
            return p.stream_not_found(kind)
        if found.consumer is None:
            return p.consumer_not_found(kind)
        try:
            await self._service.unpin(found.consumer, group)
        except PriorityConfigError as exc:
            return p.api_error(kind, 400, exc.err_code, exc.description)
        return json.dumps({"type": kind}, separators=(",", ":")).encode()

    async def _stream_names(self, body: bytes) -> bytes:
        try:
            wanted, offset = p.parse_stream_names_request(body)
        except p.BadRequest as exc:
            return p.api_error(p.NAMES_TYPE, 400, 10025, f"invalid JSON: {exc.description}")
        names = await self._service.channel_ids()
        if wanted is not None:
            names = [n for n in names if p.subjects_overlap(wanted, n)]
        return p.stream_names(names, offset, NAMES_PAGE)

    async def _stream_info(self, stream: str, body: bytes) -> bytes:
        # The request may carry options (deleted_details, subjects_filter, offset), none of
        # which change what a channel reports; a body that is not JSON is refused as the
        # server refuses it.
        if body.strip():
            try:
                json.loads(body)
            except ValueError:
                return p.api_error(p.STREAM_INFO_TYPE, 400, 10025, "invalid JSON")
        state = await self._service.stream_state(stream)
        if state is None:
            return p.stream_not_found(p.STREAM_INFO_TYPE)
        return p.stream_info(stream, state, datetime.now(UTC))

    async def _info(self, stream: str, name: str, kind: str) -> bytes:
        found = await self._service.lookup(stream, name)
        if not found.channel_found:
            return p.stream_not_found(kind)
        consumer = found.consumer
        if consumer is None:
            return p.consumer_not_found(kind)
        if consumer.type is not ConsumerType.PULL:
            return _push_error(kind, consumer)
        return await self.info_document(consumer, kind)

    async def info_document(self, consumer: Consumer, kind: str = p.INFO_TYPE) -> bytes:
        snapshot = await self._service.snapshot(consumer)
        state, stats = snapshot.state, snapshot.stats
        delivered = p.SequenceInfo(
            state.last_delivery_seq, state.last_stream_seq, state.last_delivered_at
        )
        if state.outstanding == 0 or state.first_outstanding_id is None:
            ack_floor = p.SequenceInfo(state.last_delivery_seq, state.last_stream_seq)
        else:
            # Only the oldest job still open is known; the floor is everything before it.
            ack_floor = p.SequenceInfo(
                max(state.last_delivery_seq - state.outstanding, 0),
                max(state.first_outstanding_id - 1, 0),
            )
        limits = self._limits
        view = p.ConsumerView(
            stream=consumer.channel_id,
            name=consumer.id,
            created=consumer.created_at,
            ack_wait=self._service.ack_wait(consumer) * p.NANOS,
            max_deliver=self._service.policy.max_retry + 1,
            max_waiting=limits.max_waiting,
            max_ack_pending=consumer.max_ack_pending or -1,
            max_batch=limits.max_batch,
            max_expires=limits.max_expires,
            delivered=delivered,
            ack_floor=ack_floor,
            num_ack_pending=stats.inflight,
            num_redelivered=state.redelivered,
            num_waiting=self._engine.num_waiting(consumer.pk),
            num_pending=stats.due,
            priority=consumer.priority,
            pinned_id=snapshot.pin.pinned_id if snapshot.pin else None,
            pinned_at=snapshot.pin.pinned_at if snapshot.pin else None,
        )
        return p.consumer_info(view, datetime.now(UTC), kind)

    async def _create(self, stream: str, name: str | None, body: bytes) -> bytes:
        kind = p.CREATE_TYPE
        config: object = None
        try:
            request = json.loads(body) if body.strip() else {}
            config = request.get("config") if isinstance(request, dict) else None
        except ValueError:
            if name is None:
                return p.api_error(kind, 400, 10025, "invalid JSON")
        if name is None and isinstance(config, dict):
            candidate = config.get("name") or config.get("durable_name")
            name = candidate if isinstance(candidate, str) and candidate else None
        if name is None:
            return p.api_error(
                kind,
                400,
                None,
                "webhook-broker does not create consumers over NATS: create a pull consumer "
                f"on channel {stream!r} over HTTP and bind to it by name",
            )
        found = await self._service.lookup(stream, name)
        if not found.channel_found:
            return p.stream_not_found(kind)
        wanted = None
        if isinstance(config, dict):
            try:
                wanted = _priority_of(config)
            except PriorityConfigError as exc:
                return p.api_error(kind, 400, exc.err_code, exc.description)
            except InvalidInput as exc:
                return p.api_error(kind, 400, None, exc.detail)
        consumer = found.consumer
        if consumer is None:
            return p.api_error(
                kind,
                400,
                None,
                f"webhook-broker does not create consumers over NATS: consumer {name!r} does "
                f"not exist on channel {stream!r}; create it over HTTP "
                f"(PUT /channel/{stream}/consumer/{name} with type=pull)",
            )
        if consumer.type is not ConsumerType.PULL:
            return _push_error(kind, consumer)
        if wanted is not None and not _same_priority(wanted, consumer.priority):
            return p.api_error(
                kind,
                400,
                None,
                "webhook-broker does not change consumers over NATS: the priority settings "
                f"of {name!r} differ from the request's; change them over HTTP",
            )
        return await self.info_document(consumer, kind)


def _priority_of(config: dict[str, object]) -> PrioritySettings | None:
    """The priority settings a CREATE config asks for, checked as nats-server checks them
    (None: it names none)."""
    groups = config.get("priority_groups") or []
    policy = config.get("priority_policy") or "none"
    timeout = config.get("priority_timeout") or 0
    if not groups and policy == "none" and not timeout:
        return None
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise InvalidInput("priority_groups must be a list of names")
    if not isinstance(policy, str) or not isinstance(timeout, int):
        raise InvalidInput("priority_policy must be a name and priority_timeout nanoseconds")
    seconds = -(-timeout // p.NANOS) if timeout > 0 else None
    return priority_settings(groups, parse_policy(policy), seconds, pull=True)


def _same_priority(a: PrioritySettings, b: PrioritySettings) -> bool:
    pinned = a.policy is PriorityPolicy.PINNED_CLIENT
    return (a.group, a.policy) == (b.group, b.policy) and (not pinned or a.timeout() == b.timeout())


def _empty_request(body: bytes) -> bool:
    """As nats-server reads a request that takes no payload: nothing, or an empty JSON object."""
    if not body:
        return True
    try:
        parsed: object = json.loads(body)
    except ValueError:
        return False
    return parsed == {}


def _push_error(kind: str, consumer: Consumer) -> bytes:
    return p.api_error(
        kind,
        409,
        None,
        f"Consumer is push based: {consumer.id!r} delivers to its callback URL; "
        "the NATS bridge serves pull consumers only",
    )
