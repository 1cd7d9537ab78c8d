"""Registering channels, producers and consumers (the management API)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from app.config import DEFAULT_DENIED_CALLBACK_NETWORKS
from app.domain.callbacks import CallbackPolicy, parse_callback_url
from app.domain.errors import InvalidInput, NotFound, PreconditionFailed
from app.domain.models import (
    MAX_FIELD_LENGTH,
    Consumer,
    ConsumerType,
    Cursor,
    Page,
    PushSettings,
    PushState,
    Stakeholder,
)
from app.domain.priority import NO_PRIORITY, PrioritySettings, parse_policy, priority_settings
from app.domain.signing import new_signing_secret, parse_signing_secret
from app.services.reads import Reads
from app.services.tokens import TokenKeys
from app.store.bridge import BridgeStore
from app.store.db import Database, Tx
from app.store.push_state import PushStateStore
from app.store.stakeholders import (
    ConsumerStore,
    StakeholderStore,
    channel_token_matches,
    channels,
    producers,
)

PAGE_SIZE = 25
# ackWait and maxAckPending are 32-bit INTEGER columns.
MAX_INTEGER = 2**31 - 1
MAX_RATE = 1_000_000.0  # deliveries per second


def http_date(moment: datetime) -> str:
    """The Last-Modified form of a timestamp (whole seconds, GMT)."""
    return format_datetime(moment.astimezone(UTC).replace(microsecond=0), usegmt=True)


def check_unmodified_since(current: datetime, header: str | None) -> None:
    """Updating an existing object needs If-Unmodified-Since equal to its Last-Modified."""
    if not header:
        raise InvalidInput("updating an existing object needs an If-Unmodified-Since header")
    if header.strip() != http_date(current):
        raise PreconditionFailed("the object was modified since If-Unmodified-Since")


def check_text(
    field: str, value: str, *, limit: int | None = MAX_FIELD_LENGTH, header_safe: bool = True
) -> str:
    """PostgreSQL refuses over-long VARCHARs and any NUL character; both are a 400 here."""
    if limit is not None and len(value) > limit:
        raise InvalidInput(f"{field} must be at most {limit} characters")
    if "\x00" in value:
        raise InvalidInput(f"{field} must not contain NUL characters")
    if header_safe and any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        # Ids and tokens travel in push headers, where a line break would end the header.
        raise InvalidInput(f"{field} must not contain control characters")
    return value


def new_token() -> str:
    return secrets.token_urlsafe(18)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ConsumerForm:
    token: str | None
    name: str | None
    callback_url: str | None
    type: str | None
    ack_wait: str | None = None
    max_ack_pending: str | None = None
    priority_groups: str | None = None  # comma-separated (one group; more are refused)
    priority_policy: str | None = None
    priority_timeout: str | None = None
    # push: limits, the Standard Webhooks secret ("rotate" makes a new one), re-enabling
    max_in_flight: str | None = None
    rate_limit: str | None = None
    signing_secret: str | None = None
    signing_secret_overlap: str | None = None
    enabled: str | None = None


def parse_consumer_type(raw: str | None) -> ConsumerType:
    if not raw:
        return ConsumerType.PUSH
    try:
        return ConsumerType(raw.strip().lower())
    except ValueError:
        raise InvalidInput(f"type must be push or pull, not {raw!r}") from None


def _optional_positive(name: str, raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be a positive integer") from None
    if not 1 <= value <= MAX_INTEGER:
        raise InvalidInput(f"{name} must be a positive integer up to {MAX_INTEGER}")
    return value


def _optional_rate(raw: str | None) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_RATE:  # NaN fails this too
        raise InvalidInput(f"rateLimit must be a number of deliveries per second up to {MAX_RATE}")
    return value


def push_values(
    form: ConsumerForm, existing: PushSettings | None, default_overlap: int, now: datetime
) -> dict[str, str | int | float | datetime | None]:
    """The consumer columns of its push settings. A secret is made for a new consumer and kept
    on a PUT that does not name one; a new one (given, or "rotate") keeps the old one valid,
    and signed beside it, for the overlap."""
    kept = existing or PushSettings()
    values: dict[str, str | int | float | datetime | None] = {
        "max_in_flight": _optional_positive("maxInFlight", form.max_in_flight),
        "rate_limit": _optional_rate(form.rate_limit),
    }
    overlap = _optional_positive("signingSecretOverlap", form.signing_secret_overlap)
    raw = (form.signing_secret or "").strip()
    if not raw:
        values["signing_secret"] = kept.signing_secret or new_signing_secret()
        return values
    secret = new_signing_secret() if raw == "rotate" else parse_signing_secret(raw)
    values["signing_secret"] = secret
    if kept.signing_secret is not None and kept.signing_secret != secret:
        values["previous_signing_secret"] = kept.signing_secret
        seconds = default_overlap if overlap is None else overlap
        values["previous_secret_until"] = now + timedelta(seconds=seconds)
    return values


def parse_enabled(raw: str | None) -> bool | None:
    if raw is None or raw == "":
        return None
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise InvalidInput("enabled must be true or false")


def priority_values(
    form: ConsumerForm, consumer_type: ConsumerType, existing: PrioritySettings | None
) -> dict[str, str | int | None]:
    """The consumer columns of its priority settings; a field the form leaves out keeps what
    the consumer has."""
    kept = existing or NO_PRIORITY
    raw_groups = form.priority_groups
    groups = [g.strip() for g in raw_groups.split(",")] if raw_groups and raw_groups.strip() else []
    settings = priority_settings(
        groups if raw_groups is not None else kept.groups,
        parse_policy(form.priority_policy) if form.priority_policy is not None else kept.policy,
        _optional_positive("priorityTimeout", form.priority_timeout)
        if form.priority_timeout is not None
        else kept.timeout_seconds,
        pull=consumer_type is ConsumerType.PULL,
        existing=existing,
    )
    return {
        "priority_group": settings.group,
        "priority_policy": settings.policy.value,
        "priority_timeout_seconds": settings.timeout_seconds,
    }


class AdminService:
    def __init__(
        self,
        db: Database,
        tokens: TokenKeys,
        default_signing_overlap: int = 86_400,
        *,
        callbacks: CallbackPolicy | None = None,
        reads: Reads | None = None,
    ) -> None:
        self._db = db
        # The lists may be read from the replica; single objects are read from the primary,
        # since their Last-Modified goes back as If-Unmodified-Since on the next change.
        self._reads = reads or Reads.primary_only(db)
        # A callback URL that is a denied address is refused at once; a name, at delivery.
        self._callbacks = callbacks or CallbackPolicy.of(DEFAULT_DENIED_CALLBACK_NETWORKS)
        self._tokens = tokens
        self._overlap = default_signing_overlap

    async def put_stakeholder(
        self,
        kind: str,
        id_: str,
        token: str | None,
        name: str | None,
        if_unmodified_since: str | None,
    ) -> Stakeholder:
        """Create or conditionally update a channel or producer. The token is stored as its
        keyed hash; the answer carries it as given (or made) this once, as the Go API does."""
        check_text(f"{kind} id", id_)
        name = check_text("name", name or id_)
        token = check_text("token", token or new_token())
        stored = self._tokens.digest(token)
        async with self._db.transaction() as tx:
            store = self._store(kind, tx)
            existing = await store.get(id_, for_update=True)
            if existing is not None:
                check_unmodified_since(existing.updated_at, if_unmodified_since)
                item = await store.update(id_, name, stored, utcnow())
            else:
                created = await store.insert(id_, name, stored, utcnow())
                if created is None:
                    raise PreconditionFailed(f"{kind} {id_!r} was created by another request")
                item = created
        return replace(item, token=token)

    async def channel_token_matches(self, channel_id: str, stored_token: str) -> bool:
        """Whether the channel's token is this one (in its stored form); 404 without the
        channel."""
        async with self._db.transaction() as tx:
            matches = await channel_token_matches(tx, channel_id, stored_token)
        if matches is None:
            raise NotFound(f"channel {channel_id!r} not found")
        return matches

    async def get_stakeholder(self, kind: str, id_: str) -> Stakeholder:
        async with self._db.transaction() as tx:
            found = await self._store(kind, tx).get(id_)
        if found is None:
            raise NotFound(f"{kind} {id_!r} not found")
        return found

    async def list_stakeholders(self, kind: str, cursor: Cursor) -> Page[Stakeholder]:
        return await self._reads.read(lambda tx: self._store(kind, tx).list(cursor, PAGE_SIZE))

    @staticmethod
    def _store(kind: str, tx: Tx) -> StakeholderStore:
        return channels(tx) if kind == "channel" else producers(tx)

    async def put_consumer(
        self, channel_id: str, consumer_id: str, form: ConsumerForm, if_unmodified_since: str | None
    ) -> Consumer:
        check_text("consumer id", consumer_id)
        consumer_type = parse_consumer_type(form.type)
        url = check_text(
            "callbackUrl", (form.callback_url or "").strip(), limit=None, header_safe=False
        )
        refusal = self._callbacks.literal_refusal(parse_callback_url(url)) if url else None
        if refusal is not None:
            raise InvalidInput(f"callbackUrl refused: {refusal}")
        enabled = parse_enabled(form.enabled)
        if consumer_type is ConsumerType.PUSH and not url:
            raise InvalidInput("a push consumer needs an absolute callbackUrl")
        values: dict[str, datetime | str | int | float | None] = {
            "name": check_text("name", form.name or consumer_id),
            "token": check_text("token", form.token or new_token()),
            "callback_url": url,
            "type": consumer_type.value,
            "ack_wait_seconds": _optional_positive("ackWait", form.ack_wait),
            "max_ack_pending": _optional_positive("maxAckPending", form.max_ack_pending),
            "updated_at": utcnow(),
        }
        async with self._db.transaction() as tx:
            if await channels(tx).get(channel_id) is None:
                raise NotFound(f"channel {channel_id!r} not found")
            store = ConsumerStore(tx)
            existing = await store.get(channel_id, consumer_id, for_update=True)
            values |= priority_values(
                form, consumer_type, existing.priority if existing is not None else None
            )
            values |= push_values(
                form, existing.push if existing else None, self._overlap, utcnow()
            )
            if existing is not None:
                check_unmodified_since(existing.updated_at, if_unmodified_since)
                updated = await store.update(existing.pk, values)
                if enabled is True:
                    await PushStateStore(tx).enable(updated.pk)
                elif enabled is False:
                    await PushStateStore(tx).disable(updated.pk, "disabled by a PUT")
                # Queued jobs may now be claimable by a different kind of worker, and every
                # dispatcher must drop the settings it read (a callback moved away from).
                tx.announce_change([updated.pk])
                return updated
            created = await store.insert(
                {
                    **values,
                    "channel_id": channel_id,
                    "consumer_id": consumer_id,
                    "created_at": values["updated_at"],
                }
            )
            if created is None:
                raise PreconditionFailed(f"consumer {consumer_id!r} was created by another request")
            if enabled is False:
                await PushStateStore(tx).disable(created.pk, "disabled by a PUT")
            tx.announce_change([created.pk])
            return created

    async def push_state(self, item: Consumer) -> PushState | None:
        """What the dispatchers learned of a push consumer's endpoint (None: a pull one)."""
        if item.type is not ConsumerType.PUSH:
            return None
        async with self._db.transaction() as tx:
            return (await PushStateStore(tx).of([item.pk])).get(item.pk, PushState())

    async def get_consumer(self, channel_id: str, consumer_id: str) -> Consumer:
        async with self._db.transaction() as tx:
            found = await ConsumerStore(tx).get(channel_id, consumer_id)
        if found is None:
            raise NotFound(f"consumer {consumer_id!r} not found in channel {channel_id!r}")
        return found

    async def delete_consumer(
        self,
        channel_id: str,
        consumer_id: str,
        if_unmodified_since: str | None,
        *,
        unconditional: bool = False,
        only_if_inactive: bool = False,
    ) -> bool:
        """`unconditional`: without the If-Unmodified-Since check (a NATS CONSUMER.DELETE,
        which has no such header). `only_if_inactive`: the sweeper's, for a consumer past its
        inactive threshold; False when it was used meanwhile (kept)."""
        async with self._db.transaction() as tx:
            store = ConsumerStore(tx)
            existing = await store.get(channel_id, consumer_id, for_update=True)
            if existing is None:
                raise NotFound(f"consumer {consumer_id!r} not found in channel {channel_id!r}")
            if not unconditional:
                check_unmodified_since(existing.updated_at, if_unmodified_since)
            if only_if_inactive and not await BridgeStore(tx).still_inactive(existing.pk):
                return False
            await store.delete(existing.pk)
            # Pulls waiting on this consumer re-check it, find it gone and return.
            tx.announce_change([existing.pk])
        return True

    async def list_consumers(self, channel_id: str, cursor: Cursor) -> Page[Consumer]:
        async def read(tx: Tx) -> Page[Consumer]:
            if await channels(tx).get(channel_id) is None:
                raise NotFound(f"channel {channel_id!r} not found")
            return await ConsumerStore(tx).list(channel_id, cursor, PAGE_SIZE)

        return await self._reads.read(read)
