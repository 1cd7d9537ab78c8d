"""Publishing: a message and its fan-out of jobs land in one transaction, or not at all."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypedDict

from app.domain.errors import Conflict, InvalidInput, PayloadTooLarge, PreconditionFailed
from app.domain.headers import is_credential, name_refusal, value_refusal
from app.domain.models import Message
from app.domain.times import utc_moment
from app.services.auth import publishing_producer
from app.store.db import Database
from app.store.messages import MessageStore
from app.store.queue import NewMessage, Queue

DEFAULT_CONTENT_TYPE = "application/octet-stream"
MAX_CONTENT_TYPE_LENGTH = 255
# message.priority and job.priority are 32-bit INTEGER columns.
MAX_PRIORITY = 2**31 - 1
# The consumer token header of pushes when the runtime names none ([consumer-connection]).
DEFAULT_TOKEN_HEADER = "X-Broker-Consumer-Token"


@dataclass(frozen=True, slots=True)
class Broadcast:
    """What a producer sent: credentials, the raw body and the X-Broker-* headers."""

    channel_token: str | None
    producer_id: str | None
    producer_token: str | None
    payload: bytes
    content_type: str | None
    priority: str | None
    message_id: str | None
    metadata_header_names: str | None
    headers: Mapping[str, str]
    scheduled_for: str | None = None  # X-Broker-Scheduled-For, RFC 3339


def parse_priority(raw: str | None) -> int:
    """The Go original stores the absolute value of the priority it is given (a producer that
    sends -5 gets 5 there), so it is here too; what is not an integer is a 400 here, where Go
    takes it as 0 in silence."""
    if raw is None or raw.strip() == "":
        return 0
    try:
        value = abs(int(raw.strip()))
    except ValueError:
        raise InvalidInput("X-Broker-Message-Priority must be an integer") from None
    if value > MAX_PRIORITY:
        raise InvalidInput(
            f"X-Broker-Message-Priority must be between -{MAX_PRIORITY} and {MAX_PRIORITY}"
        )
    return value


def metadata_headers(
    names: str | None, headers: Mapping[str, str], token_header: str = DEFAULT_TOKEN_HEADER
) -> dict[str, str]:
    """The request headers named in X-Broker-Metadata-Headers, as sent, minus credentials;
    InvalidInput naming one a push could not carry (app/domain/headers): decided here, once,
    rather than at each delivery."""
    if not names:
        return {}
    picked: dict[str, str] = {}
    seen: set[str] = set()
    for raw in names.split(","):
        name = raw.strip()
        if not name or name.lower() in seen:
            continue
        seen.add(name.lower())
        if is_credential(name):
            continue
        refusal = name_refusal(name, token_header)
        if refusal is not None:
            raise InvalidInput(f"X-Broker-Metadata-Headers: {refusal}")
        value = headers.get(name)
        if not value:
            continue
        refusal = value_refusal(name, value)
        if refusal is not None:
            raise InvalidInput(f"X-Broker-Metadata-Headers: {refusal}")
        picked[name] = value
    return picked


def parse_schedule(raw: str | None, min_delay_seconds: int) -> datetime | None:
    """When a scheduled message's jobs fall due: RFC 3339, at least the configured delay
    ahead ([scheduler] min-schedule-delay-minutes), as the Go original says it."""
    if raw is None or not raw.strip():
        return None
    moment = utc_moment(raw)
    if moment is None:
        raise InvalidInput(
            "invalid date format for X-Broker-Scheduled-For, expected ISO-8601/RFC3339 format"
        )
    if moment < datetime.now(UTC) + timedelta(seconds=min_delay_seconds):
        raise PreconditionFailed(
            f"scheduled time must be at least {min_delay_seconds // 60} minutes in the future"
        )
    return moment


class PublishFields(TypedDict):
    message_id: str
    payload: bytes
    content_type: str
    priority: int
    headers: dict[str, str]
    scheduled_for: datetime | None


class PublishingService:
    def __init__(
        self,
        db: Database,
        queue: Queue,
        max_message_size: int,
        min_schedule_delay: int = 120,
        token_header: str = DEFAULT_TOKEN_HEADER,
    ) -> None:
        self._db = db
        self._token_header = token_header
        self._queue = queue
        self._max_size = max_message_size
        self._min_schedule_delay = min_schedule_delay

    async def publish(self, channel_id: str, request: Broadcast) -> Message:
        """One statement stores the message and its jobs; when it stores nothing, read-only
        checks say why, in the Go original's order (credentials first, then the body)."""
        try:
            fields = self._fields(request)
        except (InvalidInput, PayloadTooLarge, PreconditionFailed):
            fields = None
        if fields is not None and request.channel_token is not None and request.producer_id:
            for _ in range(2):
                published = await self._queue.publish(
                    NewMessage(
                        channel_id=channel_id,
                        channel_token=request.channel_token,
                        producer_id=request.producer_id,
                        producer_token=request.producer_token or "",
                        **fields,
                    )
                )
                if published is not None:
                    return published.message
                await self._explain(channel_id, request, fields["message_id"])
            # Both refused, and nothing explains it: the credentials or the message id were
            # changed by another request each time.
            raise Conflict("the channel or producer changed while publishing; retry")
        await self._explain(channel_id, request, None)
        self._fields(request)  # raises: it failed above
        raise AssertionError("unreachable")

    async def check_credentials(self, channel_id: str, request: Broadcast) -> None:
        """The publish's credentials alone (404, 403, 401, 403), for a body the API reads only
        once they hold."""
        await self._explain(channel_id, request, None)

    async def _explain(self, channel_id: str, request: Broadcast, message_id: str | None) -> None:
        """Raise why a publish stored nothing: credentials, or a repeated message id."""
        async with self._db.transaction() as tx:
            await publishing_producer(
                tx, channel_id, request.channel_token, request.producer_id, request.producer_token
            )
            if message_id is not None and await MessageStore(tx).get(channel_id, message_id):
                raise Conflict(f"message {message_id!r} already exists in channel {channel_id!r}")

    def _fields(self, request: Broadcast) -> PublishFields:
        """The message as it will be stored; InvalidInput or PayloadTooLarge if it cannot be."""
        if not request.payload:
            raise InvalidInput("the message body must not be empty")
        if len(request.payload) > self._max_size:
            raise PayloadTooLarge(
                f"the body is {len(request.payload)} bytes; the limit is {self._max_size}"
            )
        content_type = (request.content_type or "").strip() or DEFAULT_CONTENT_TYPE
        if len(content_type) > MAX_CONTENT_TYPE_LENGTH or "\x00" in content_type:
            raise InvalidInput(
                f"Content-Type must be at most {MAX_CONTENT_TYPE_LENGTH} characters, without NUL"
            )
        message_id = (request.message_id or "").strip() or uuid.uuid4().hex
        if len(message_id) > 255 or "\x00" in message_id:
            raise InvalidInput("X-Broker-Message-ID must be at most 255 characters, without NUL")
        return PublishFields(
            message_id=message_id,
            payload=request.payload,
            content_type=content_type,
            priority=parse_priority(request.priority),
            headers=metadata_headers(
                request.metadata_header_names, request.headers, self._token_header
            ),
            scheduled_for=parse_schedule(request.scheduled_for, self._min_schedule_delay),
        )
