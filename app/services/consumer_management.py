"""Consumer management over NATS (CONSUMER.CREATE / DURABLE.CREATE / DELETE / NAMES / LIST):
a consumer made here is an ordinary pull consumer of the broker, seen and managed over HTTP
too; deleting one is the management API's delete (AdminService), so its jobs go the same way.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from app.domain.errors import NotFound
from app.domain.models import MAX_FIELD_LENGTH, Consumer, ConsumerType
from app.domain.nats_consumers import (
    ConsumerApiError,
    ConsumerSpec,
    CreateRequest,
    ProcessLimits,
    check_config,
    check_update,
    column_values,
    delivers_history,
    jetstream_error,
    refuse_unsupported,
    requested_threshold,
    spec_of,
    update_threshold,
)
from app.domain.nats_pauses import config_pause
from app.domain.priority import PriorityConfigError, priority_settings
from app.services.admin import AdminService, new_token
from app.services.backfill import CHUNK, Switched, finish
from app.store.backfill import BackfillStore
from app.store.bridge import BridgeStore
from app.store.db import Database, Tx
from app.store.pauses import PauseStore
from app.store.stakeholders import ConsumerStore, channels


def nameable(name: str) -> bool:
    """Could a channel or consumer id be this (at most 255 characters, no NUL, which PostgreSQL
    refuses): anything else is not found, without asking the database."""
    return len(name) <= MAX_FIELD_LENGTH and "\x00" not in name


def stream_not_found() -> ConsumerApiError:
    return jetstream_error(404, 10059, "stream not found")


def consumer_not_found() -> ConsumerApiError:
    return jetstream_error(404, 10014, "consumer not found")


def push_based(consumer: Consumer) -> ConsumerApiError:
    return ConsumerApiError(
        409,
        None,
        f"Consumer is push based: {consumer.id!r} delivers to its callback URL; "
        "the NATS bridge serves pull consumers only",
    )


EPHEMERAL_NAME_LENGTH = 8
_NAME_ALPHABET = string.ascii_letters + string.digits


def ephemeral_name() -> str:
    return "".join(secrets.choice(_NAME_ALPHABET) for _ in range(EPHEMERAL_NAME_LENGTH))


@dataclass(frozen=True, slots=True)
class Created:
    consumer: Consumer
    changed: bool  # False: the consumer already had this config
    switched: Switched | None = None  # made live with its history copied: for make_up


class ConsumerManagement:
    def __init__(self, db: Database, admin: AdminService, limits: ProcessLimits) -> None:
        self._db = db
        self._admin = admin
        self.limits = limits

    def spec(self, consumer: Consumer) -> ConsumerSpec:
        return spec_of(consumer, self.limits)

    async def create(self, stream: str, request: CreateRequest) -> Created:
        """Create or update a pull consumer in one transaction, as nats-server's
        addConsumerWithAction decides (the consumer row is locked while it is compared)."""
        if not nameable(stream):
            raise stream_not_found()
        async with self._db.transaction() as tx:
            if await channels(tx).get(stream) is None:
                raise stream_not_found()
            wanted = check_config(request.config)
            # Read for a new consumer only: an existing one keeps its pause (nats-server).
            paused_until = config_pause(request.config)
            if not wanted.name:
                # An ephemeral consumer the request does not name: named as nats-server names
                # one (createConsumerName), for the client to bind to.
                wanted = replace(wanted, name=ephemeral_name())
            store = ConsumerStore(tx)
            existing = await store.get(stream, wanted.name, for_update=True)
            if existing is None:
                if request.action == "update":
                    raise jetstream_error(400, 10149, "consumer does not exist")
                refuse_unsupported(wanted, request.config, stream, self.limits)
                history = delivers_history(wanted)
                if history:
                    # Publishes to the channel wait while its first chunk is copied (below).
                    await BackfillStore(tx).lock_channel(stream)
                now = datetime.now(UTC)
                created = await store.insert(
                    {
                        **column_values(wanted),
                        "channel_id": stream,
                        "consumer_id": wanted.name,
                        "name": wanted.name,
                        "token": new_token(),
                        "callback_url": "",
                        "type": ConsumerType.PULL.value,
                        "paused_until": paused_until,
                        "created_at": now,
                        "updated_at": now,
                    }
                )
                if created is None:
                    # Another request created it between the look-up and the insert.
                    raise jetstream_error(400, 10148, "consumer already exists")
                switched = None
                if history:
                    created, switched = await self._backfill(tx, created, wanted)
                tx.announce_change([created.pk])
                return Created(created, True, switched)
            if existing.type is not ConsumerType.PULL:
                raise push_based(existing)
            current = self.spec(existing)
            # A request without durable_name names an existing durable too (by the subject, or
            # by config.name on the bare CREATE subject): as on nats-server it updates it, but
            # the ephemeral default threshold is not stamped on a consumer that never expired.
            wanted = replace(wanted, inactive_threshold=update_threshold(current, request.config))
            if request.action == "create":
                # nats-server compares the request as sent, before any threshold is stamped.
                sent = replace(wanted, inactive_threshold=requested_threshold(request.config))
                if sent != current:
                    raise jetstream_error(400, 10148, "consumer already exists")
            if wanted == current:
                return Created(existing, False)
            check_update(current, wanted)
            refuse_unsupported(wanted, request.config, stream, self.limits)
            try:
                # The broker keeps a consumer's group and policy (its pins depend on them).
                priority_settings(
                    wanted.priority.groups,
                    wanted.priority.policy,
                    wanted.priority.timeout_seconds,
                    pull=True,
                    existing=existing.priority,
                )
            except PriorityConfigError as exc:
                raise ConsumerApiError(400, exc.err_code, exc.description) from None
            values = column_values(wanted)
            values["updated_at"] = datetime.now(UTC)
            updated = await store.update(existing.pk, values)
            tx.announce_change([updated.pk])
            return Created(updated, True)

    async def pause(self, stream: str, name: str, until: datetime | None) -> Consumer:
        """CONSUMER.PAUSE: paused until `until` (None: resumed), announced as the management
        API's pause is (app/services/pausing.py)."""
        if not nameable(stream):
            raise stream_not_found()
        async with self._db.transaction() as tx:
            if await channels(tx).get(stream) is None:
                raise stream_not_found()
            found = await ConsumerStore(tx).get(stream, name)
            changed = await PauseStore(tx).set(found.pk, until) if found else None
            if changed is None:
                raise consumer_not_found()
            tx.announce_change([changed.pk])
        return changed

    async def _backfill(
        self, tx: Tx, created: Consumer, wanted: ConsumerSpec
    ) -> tuple[Consumer, Switched | None]:
        """Its jobs for the channel's stored messages first: a short history copied here with
        the channel locked, and the consumer live at once (app/services/backfill.py's switch);
        a longer one by the bridges (app/bridge/backfill.py), publishes fanning out to it once
        they are done."""
        backfill = BackfillStore(tx)
        start = await backfill.start_at(
            created.channel_id, wanted.deliver_policy, wanted.opt_start_seq, wanted.opt_start_time
        )
        await backfill.begin(created.pk, start)
        if await backfill.more_than(created.channel_id, start, CHUNK):
            return replace(created, options=replace(created.options, backfilling=True)), None
        _, switched = await finish(tx, created.pk, created.channel_id, start, CHUNK)
        return created, switched

    async def delete(self, stream: str, name: str) -> Consumer:
        """The management API's delete, without its If-Unmodified-Since (NATS has none)."""
        if not nameable(stream):
            raise stream_not_found()
        if not nameable(name):
            raise consumer_not_found()
        async with self._db.transaction() as tx:
            if await channels(tx).get(stream) is None:
                raise stream_not_found()
            found = await ConsumerStore(tx).get(stream, name)
        if found is None:
            raise consumer_not_found()
        if found.type is not ConsumerType.PULL:
            raise push_based(found)
        try:
            await self._admin.delete_consumer(stream, name, None, unconditional=True)
        except NotFound:
            raise consumer_not_found() from None
        return found

    async def page(self, stream: str, offset: int, limit: int) -> tuple[int, Sequence[Consumer]]:
        if not nameable(stream):
            raise stream_not_found()
        async with self._db.transaction() as tx:
            if await channels(tx).get(stream) is None:
                raise stream_not_found()
            return await BridgeStore(tx).pull_consumer_page(stream, offset, limit)

    async def channel_page(self, offset: int, limit: int) -> tuple[int, list[str]]:
        async with self._db.transaction() as tx:
            names = await BridgeStore(tx).channel_ids()
        return len(names), names[offset : offset + limit]
