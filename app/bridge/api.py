"""The JSON side of the JetStream API the bridge answers: INFO, STREAM.NAMES / LIST / INFO,
CONSUMER.INFO / UNPIN, and consumer management: CONSUMER.CREATE / DURABLE.CREATE (create or
update a pull consumer), DELETE, NAMES and LIST (app/services/consumer_management.py).

Stream name = channel id, consumer name = pull consumer id, the stream's subject = channel id.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from app.bridge import protocol as p
from app.bridge.engine import PullEngine
from app.domain.models import Consumer, ConsumerType, StreamState
from app.domain.nats_consumers import (
    ConsumerApiError,
    CreateRequest,
    check_config,
    go_depth_error,
    jetstream_error,
    parse_create_request,
    required_level,
    resolve_name,
)
from app.domain.nats_pauses import PAUSE_TYPE, pause_request, pause_state
from app.domain.priority import GROUP_NAME, GROUP_NAME_RULE, PriorityConfigError
from app.services.bridge import BridgeService, Lookup
from app.services.consumer_management import ConsumerManagement, Created

NAMES_PAGE = 1024


class ConsumerCache:
    """Channel/consumer lookups for the hot paths (pull requests, acks), kept `ttl` seconds.
    Misses are never cached, so a consumer created over HTTP is served at once."""

    def __init__(self, service: BridgeService, ttl: float = 2.0) -> None:
        self._service = service
        self._ttl = ttl
        self._entries: dict[tuple[str, str], tuple[float, Lookup]] = {}
        self._flights: dict[tuple[str, str], asyncio.Future[Lookup]] = {}

    def forget(self, channel_id: str, consumer_id: str) -> None:
        """A consumer changed or went away through this process: look it up again."""
        self._entries.pop((channel_id, consumer_id), None)

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


class StreamStates:
    """STREAM.INFO's state counts a channel's messages and sums their sizes, a scan of the
    channel: each process reads it at most once per channel every `ttl` seconds (requests in
    between, and those arriving while it is read, share the answer). Clients ask on every bind,
    and an ordered consumer binds again after every gap."""

    def __init__(self, load: Callable[[str], Awaitable[StreamState | None]], ttl: float = 1.0):
        self._load = load
        self._ttl = ttl
        self._entries: dict[str, tuple[float, StreamState | None]] = {}
        self._flights: dict[str, asyncio.Future[StreamState | None]] = {}

    async def get(self, channel_id: str) -> StreamState | None:
        now = asyncio.get_running_loop().time()
        entry = self._entries.get(channel_id)
        if entry is not None and entry[0] > now:
            return entry[1]
        flight = self._flights.get(channel_id)
        if flight is None:
            flight = asyncio.ensure_future(self._load(channel_id))
            self._flights[channel_id] = flight
            flight.add_done_callback(lambda _: self._flights.pop(channel_id, None))
        state = await asyncio.shield(flight)
        if len(self._entries) > MAX_STREAM_STATES:
            self._entries.clear()
        self._entries[channel_id] = (now + self._ttl, state)
        return state


MAX_STREAM_STATES = 10_000


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
        management: ConsumerManagement,
        *,
        manage: bool = True,
    ) -> None:
        self._service = service
        self._streams = StreamStates(service.stream_state)
        # Told of a consumer created with a history deliver policy (app/bridge/backfill.py).
        self.created: Callable[[Created], None] = _nothing
        self._cache = cache
        self._engine = engine
        self._prefix = prefix
        self._limits = limits
        self._management = management
        # [nats] allow-consumer-management: CREATE / DELETE may make, change and remove.
        self._manage = manage
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
            return await self._create(tokens, body)
        if len(tokens) == 5 and tokens[:3] == ["CONSUMER", "DURABLE", "CREATE"]:
            return await self._create(tokens, body)
        if len(tokens) == 4 and tokens[:2] == ["CONSUMER", "DELETE"]:
            return await self._delete(tokens[2], tokens[3], body)
        if len(tokens) == 3 and tokens[:2] == ["CONSUMER", "NAMES"]:
            return await self._consumer_page(tokens[2], body, infos=False)
        if len(tokens) == 3 and tokens[:2] == ["CONSUMER", "LIST"]:
            return await self._consumer_page(tokens[2], body, infos=True)
        if tokens == ["STREAM", "LIST"]:
            return await self._stream_list(body)
        if len(tokens) == 4 and tokens[:2] == ["CONSUMER", "UNPIN"]:
            return await self._unpin(tokens[2], tokens[3], body)
        if len(tokens) == 4 and tokens[:2] == ["CONSUMER", "PAUSE"]:
            return await self._pause(tokens[2], tokens[3], body)
        return None

    async def _pause(self, stream: str, name: str, body: bytes) -> bytes:
        """CONSUMER.PAUSE, answered as jsConsumerPauseRequest answers it."""
        kind = PAUSE_TYPE
        if not self._manage:
            return p.api_error(
                kind,
                400,
                None,
                "consumer management over NATS is turned off on this bridge "
                "([nats] allow-consumer-management=false): pause consumers over HTTP",
            )
        try:
            until = pause_request(body)
            await self._management.pause(stream, name, until)
        except ConsumerApiError as exc:
            return p.api_error(kind, exc.code, exc.err_code, exc.description)
        self._cache.forget(stream, name)
        paused, remaining = pause_state(until, datetime.now(UTC))
        document: dict[str, object] = {
            "type": kind,
            "paused": paused,
            "pause_until": p.rfc3339(until) if until else p.GO_ZERO_TIME,
        }
        if remaining:
            document["pause_remaining"] = remaining
        return json.dumps(document, separators=(",", ":")).encode()

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
            except RecursionError:
                depth = go_depth_error(body)
                return p.api_error(p.STREAM_INFO_TYPE, 400, 10025, f"invalid JSON: {depth}")
        state = await self._streams.get(stream)
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
        return p.consumer_info(await self._view(consumer), datetime.now(UTC), kind)

    async def _view(self, consumer: Consumer) -> p.ConsumerView:
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
        spec = self._management.spec(consumer)
        return p.ConsumerView(
            stream=consumer.channel_id,
            name=consumer.id,
            created=consumer.created_at,
            ack_wait=spec.ack_wait,
            max_deliver=spec.max_deliver,
            max_waiting=spec.max_waiting,
            max_ack_pending=spec.max_ack_pending,
            max_batch=limits.max_batch,
            max_expires=limits.max_expires,
            delivered=delivered,
            ack_floor=ack_floor,
            num_ack_pending=stats.inflight,
            num_redelivered=state.redelivered,
            num_waiting=0 if spec.deliver_subject else self._engine.num_waiting(consumer.pk),
            num_pending=stats.due,
            backoff=spec.backoff,
            priority=consumer.priority,
            pinned_id=snapshot.pin.pinned_id if snapshot.pin else None,
            pinned_at=snapshot.pin.pinned_at if snapshot.pin else None,
            description=spec.description,
            deliver_policy=spec.deliver_policy,
            metadata=spec.metadata_dict(),
            # setStaticConsumerMetadata: a pause needs API level 1.
            required_level=max(required_level(spec), 1 if consumer.paused_until else 0),
            durable=spec.durable,
            ack_policy=spec.ack_policy,
            inactive_threshold=spec.inactive_threshold,
            deliver_subject=spec.deliver_subject,
            deliver_group=spec.deliver_group,
            idle_heartbeat=spec.idle_heartbeat,
            flow_control=spec.flow_control,
            opt_start_seq=spec.opt_start_seq,
            opt_start_time=spec.opt_start_time,
            mem_storage=spec.mem_storage,
            push_bound=self._engine.push_bound(consumer),
            pause_until=consumer.paused_until,
        )

    async def _create(self, tokens: list[str], body: bytes) -> bytes:
        """CONSUMER.CREATE.<stream>[.<consumer>[.<filter>]] and
        CONSUMER.DURABLE.CREATE.<stream>.<consumer>, checked in jsConsumerCreateRequest's order."""
        kind = p.CREATE_TYPE
        try:
            request = parse_create_request(body)
            stream, name = _create_target(tokens, request)
            if not self._manage:
                await self._refuse_management(stream, request)
            created = await self._management.create(stream, request)
        except ConsumerApiError as exc:
            return p.api_error(kind, exc.code, exc.err_code, exc.description)
        if created.changed:
            self._cache.forget(created.consumer.channel_id, created.consumer.id)
            self._engine.consumer_changed(created.consumer)
            self.created(created)
        return await self.info_document(created.consumer, kind)

    async def _refuse_management(self, stream: str, request: CreateRequest) -> None:
        """With management off, CREATE only binds to a consumer that exists with this config."""
        found = await self._service.lookup(stream, resolve_name(request.config))
        if found.consumer is not None and found.consumer.type is ConsumerType.PULL:
            try:
                wanted = check_config(request.config)
            except ConsumerApiError:
                wanted = None
            if wanted == self._management.spec(found.consumer):
                return
        raise ConsumerApiError(
            400,
            None,
            "consumer management over NATS is turned off on this bridge "
            "([nats] allow-consumer-management=false): create or change consumers over HTTP",
        )

    async def _delete(self, stream: str, name: str, body: bytes) -> bytes:
        kind = p.DELETE_TYPE
        if not _empty_request(body):
            return p.api_error(kind, 400, 10038, "expected an empty request payload")
        if not self._manage:
            return p.api_error(
                kind,
                400,
                None,
                "consumer management over NATS is turned off on this bridge "
                "([nats] allow-consumer-management=false): delete consumers over HTTP",
            )
        try:
            await self._management.delete(stream, name)
        except ConsumerApiError as exc:
            return p.api_error(kind, exc.code, exc.err_code, exc.description)
        self._cache.forget(stream, name)
        return p.consumer_deleted()

    async def _consumer_page(self, stream: str, body: bytes, *, infos: bool) -> bytes:
        kind = p.CONSUMER_LIST_TYPE if infos else p.CONSUMER_NAMES_TYPE
        try:
            offset = p.parse_page_request(body)
        except p.BadRequest as exc:
            return p.api_error(kind, 400, 10025, f"invalid JSON: {exc}")
        limit = p.CONSUMER_LIST_LIMIT if infos else p.CONSUMER_NAMES_LIMIT
        try:
            total, consumers = await self._management.page(stream, offset, limit)
        except ConsumerApiError as exc:
            return p.api_error(kind, exc.code, exc.err_code, exc.description)
        offset = min(offset, total)
        if not infos:
            return p.consumer_names([c.id for c in consumers], total, offset)
        now = datetime.now(UTC)
        documents = [p.consumer_info_document(await self._view(c), now, None) for c in consumers]
        return p.consumer_list(documents, total, offset)

    async def _stream_list(self, body: bytes) -> bytes:
        kind = p.STREAM_LIST_TYPE
        wanted: str | None = None
        offset = 0
        if body.strip()[:1] in (b"{", b"["):
            try:
                wanted, offset = p.parse_stream_names_request(body, "JSApiStreamListRequest")
            except p.BadRequest as exc:
                return p.api_error(kind, 400, 10025, f"invalid JSON: {exc.description}")
        names = await self._service.channel_ids()
        if wanted is not None:
            names = [n for n in names if p.subjects_overlap(wanted, n)]
        offset = min(offset, len(names))
        now = datetime.now(UTC)
        documents = []
        for name in names[offset : offset + p.CONSUMER_LIST_LIMIT]:
            state = await self._streams.get(name)
            if state is not None:  # deleted meanwhile
                documents.append(p.stream_info_document(name, state, now))
        return p.stream_list(documents, len(names), offset)


def _create_target(tokens: list[str], request: CreateRequest) -> tuple[str, str]:
    """The stream and consumer a CREATE subject names, checked against its body as
    jsConsumerCreateRequest checks them; fills the config's name as the server does."""
    config = request.config
    if tokens[:3] == ["CONSUMER", "DURABLE", "CREATE"]:
        stream, name = tokens[3], tokens[4]
        if stream != request.stream_name:
            raise jetstream_error(400, 10056, "stream name in subject does not match request")
        if "\\" in name or "/" in name:
            raise jetstream_error(400, 10127, "Consumer name can not contain path separators")
        if not config.get("durable_name"):
            raise jetstream_error(
                400, 10018, "consumer expected to be durable but a durable name was not set"
            )
        if config["durable_name"] != name:
            raise jetstream_error(
                400, 10017, "consumer name in subject does not match durable name in request"
            )
        config["name"] = name
        return stream, name
    stream = tokens[2]
    name = tokens[3] if len(tokens) > 3 else ""
    filtered = ".".join(tokens[4:])
    if stream != request.stream_name:
        raise jetstream_error(400, 10056, "stream name in subject does not match request")
    if not name:
        name = str(config.get("name") or "")
    if name and ("\\" in name or "/" in name):
        raise jetstream_error(400, 10127, "Consumer name can not contain path separators")
    if len(tokens) > 3:
        durable = config.get("durable_name")
        if durable and durable != name:
            raise jetstream_error(
                400, 10017, "consumer name in subject does not match durable name in request"
            )
        config["name"] = name
    elif config.get("durable_name"):
        raise jetstream_error(
            400, 10020, "consumer expected to be ephemeral but a durable name was set in request"
        )
    if filtered and config.get("filter_subjects"):
        raise jetstream_error(
            400,
            10137,
            "consumer with multiple subject filters cannot use subject based API",
        )
    if filtered and config.get("filter_subject") != filtered:
        raise jetstream_error(
            400,
            10131,
            "Consumer create request did not match filtered subject from create subject",
        )
    if int(config.get("num_replicas") or 0) > 1:
        raise jetstream_error(500, 10074, "replicas > 1 not supported in non-clustered mode")
    return stream, name


def _nothing(created: Created) -> None:
    pass


def _empty_request(body: bytes) -> bool:
    """As nats-server reads a request that takes no payload: nothing, or an empty JSON object."""
    if not body:
        return True
    try:
        parsed: object = json.loads(body)
    except (ValueError, RecursionError):
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
