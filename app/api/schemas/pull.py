"""Our pull API: a pull, an unpin, single and batched acks, and what they answer. The limits
that come from [pull] (batch, expires, the acks in a batch) are checked by the pull service
and written into the document by app/api/openapi.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, Self

from pydantic import ConfigDict, Field, JsonValue, model_validator
from typing_extensions import TypedDict

from app.api.schemas.common import (
    MAX_ID,
    MAX_INT32,
    Body,
    Flag,
    JobId,
    JobMessage,
    MaybeMoment,
    MaybeTime,
    NumberOnly,
    Says,
    Seconds,
    Text,
    Whole,
)
from app.domain.jobs import AckType
from app.domain.priority import MAX_PRIORITY

DEFAULT_EXPIRES = 30.0


class PullBody(Body):
    """A pull; without expires it waits 30 s, or [pull] max-expires-seconds if that is lower."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {"required": ["idle_heartbeat"]},
                    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
                }
            ]
        }
    )

    no_wait: Flag = False
    stream: Annotated[Flag, Field(description="answer application/x-ndjson as jobs come")] = False
    batch: Annotated[Whole, Field(ge=1), NumberOnly] = 1
    max_bytes: Annotated[Whole, Field(ge=1, le=MAX_ID), NumberOnly] | None = None
    expires: Annotated[Seconds, Field(description="seconds to wait when nothing is due")] = (
        DEFAULT_EXPIRES
    )
    incremental_timeout: Annotated[Whole, Field(ge=0, le=MAX_INT32), NumberOnly] = 0
    # The priority group fields are JetStream's, with its names (app/domain/priority.py).
    group: Text | None = None
    min_pending: Annotated[Whole, Field(ge=0, le=MAX_ID), NumberOnly] = 0
    min_ack_pending: Annotated[Whole, Field(ge=0, le=MAX_ID), NumberOnly] = 0
    id: Annotated[Text, Field(description="the pin id (pinned_client)")] | None = None
    # The pull service refuses what is beyond 0-9 with JetStream's words.
    priority: Annotated[
        Whole,
        Field(
            ge=-MAX_INT32, le=MAX_INT32, json_schema_extra={"minimum": 0, "maximum": MAX_PRIORITY}
        ),
        NumberOnly,
    ] = 0
    idle_heartbeat: (
        Annotated[Seconds, Field(description="stream only: seconds, at most half of expires")]
        | None
    ) = None

    @model_validator(mode="after")
    def _streaming(self) -> Self:
        if self.idle_heartbeat is not None and not self.stream:
            raise ValueError("idle_heartbeat is only allowed with stream true")
        return self


class UnpinBody(Body):
    group: Annotated[
        Text,
        Field(min_length=1),
        Says(
            {
                "string_type": lambda given: (
                    "group is required" if given is None else "group must be a string"
                ),
                "string_pattern_mismatch": "group must not contain NUL characters",
                "*": "group is required",
            }
        ),
    ]


class AckFields(Body):
    type: Annotated[
        AckType,
        Says({"*": lambda given: f"type must be ack, nak, term or progress, not {given!r}"}),
    ] = AckType.ACK
    attempt: (
        Annotated[
            Whole,
            Field(ge=1, le=MAX_INT32, description="the pull's Attempt: a stale one is a 409"),
            NumberOnly,
        ]
        | None
    ) = None
    delay: Annotated[Seconds, Field(description="nak only: seconds")] | None = None
    reason: Annotated[Text, Field(description="term: why")] | None = None
    counted: Annotated[
        Flag, Field(description="nak only: false hands the job back unprocessed")
    ] = True

    @model_validator(mode="after")
    def _nak_only(self) -> Self:
        # What only a nak may carry: a delay, and counted false.
        if self.type is not AckType.NAK:
            if self.delay is not None:
                raise ValueError("delay is only allowed with type nak")
            if not self.counted:
                raise ValueError("counted is only allowed with type nak")
        return self


NAK_ONLY: list[JsonValue] = [
    {
        "if": {"required": ["delay"]},
        "then": {"required": ["type"], "properties": {"type": {"const": "nak"}}},
    },
    {
        "if": {"required": ["counted"], "properties": {"counted": {"const": False}}},
        "then": {"required": ["type"], "properties": {"type": {"const": "nak"}}},
    },
]


class AckBody(AckFields):
    """One job's ack (the path names the job)."""

    model_config = ConfigDict(json_schema_extra={"allOf": NAK_ONLY})

    id: Annotated[Any, Field(description="ignored: the path names the job")] = None


class AckItem(AckFields):
    """One item of a batched ack."""

    model_config = ConfigDict(json_schema_extra={"allOf": NAK_ONLY})

    id: JobId


class AcksBody(Body):
    """Acks of many jobs, each answered in its own result (other fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    acks: Annotated[list[AckItem], Says({"*": "acks must be a list of objects"})]


class PulledJob(TypedDict):
    ID: str
    Attempt: int
    Priority: int
    LeaseExpiresAt: MaybeMoment
    Message: JobMessage


class Pulled(TypedDict):
    Jobs: list[PulledJob]
    Pending: Annotated[int, Field(description="due jobs left, counted up to 1,000")]
    PinId: NotRequired[str]


class StreamJob(TypedDict):
    Job: PulledJob
    Pending: int
    PinId: NotRequired[str]


class StreamHeartbeat(TypedDict):
    Heartbeat: Literal[True]


class StreamStatus(TypedDict):
    Status: Literal[200, 404, 408, 409, 410, 423, 503]
    Reason: str
    PendingMessages: int
    PendingBytes: int


# One line of a streaming pull: a job, a heartbeat, or the last line.
StreamLine = StreamJob | StreamHeartbeat | StreamStatus


class ConsumerInfo(TypedDict):
    Channel: str
    Consumer: str
    Pending: int
    PendingBytes: int
    AckPending: int
    Waiting: int
    Redelivered: int
    LastDeliveredAt: MaybeTime
    NextDueAt: MaybeTime
    PinId: str | None


class Unpinned(TypedDict):
    Group: str
    Unpinned: bool


class Lease(TypedDict):
    LeaseExpiresAt: MaybeTime


class AckResult(TypedDict):
    id: str
    status: Annotated[
        Literal[200, 202, 404, 409],
        Field(description="what a single ack of the job would have answered"),
    ]
    detail: str
    LeaseExpiresAt: NotRequired[MaybeTime]


class AckResults(TypedDict):
    Results: list[AckResult]
