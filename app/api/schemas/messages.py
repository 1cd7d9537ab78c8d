"""Messages: what a channel's message and scheduled-message reads answer."""

from __future__ import annotations

from typing import Literal, NotRequired

from typing_extensions import TypedDict

from app.api.schemas.common import MaybeTime, Pages, Time
from app.api.schemas.status import JobStatusName


class MessageJob(TypedDict):
    ID: str
    ListenerName: str
    ConsumerURL: str
    Status: JobStatusName
    StatusChangedAt: Time
    Attempt: int
    RetryCount: int


class Message(TypedDict):
    ID: str
    Payload: str
    PayloadEncoding: NotRequired[Literal["base64"]]
    ContentType: str
    Priority: int
    ProducedBy: str
    ReceivedAt: Time
    ScheduledFor: MaybeTime
    Headers: dict[str, str]
    Jobs: list[MessageJob]


class ScheduledMessage(TypedDict):
    id: str
    messageId: str
    contentType: str
    priority: int
    producedBy: str
    dispatchSchedule: Time
    dispatchedAt: MaybeTime
    status: Literal["SCHEDULED", "DISPATCHED"]
    payload: str
    payloadEncoding: NotRequired[Literal["base64"]]
    headers: dict[str, str]


class ScheduledLinks(TypedDict):
    result: list[str]
    pages: Pages


class Count(TypedDict):
    Count: int


# QUEUED, INFLIGHT, DELIVERED, DEAD and SCHEDULED
class Counts(TypedDict):
    QUEUED: Count
    INFLIGHT: Count
    DELIVERED: Count
    DEAD: Count
    SCHEDULED: Count


class MessagesStatus(TypedDict):
    Counts: Counts
