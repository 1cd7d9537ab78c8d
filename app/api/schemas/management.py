"""Producers, channels and consumers: their answers, and the forms a PUT sends (read by
app/api/deps.form_fields and checked by app/services/admin; the models document them)."""

from __future__ import annotations

from typing import Annotated, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict

from app.api.schemas.common import MAX_INT32, MaybeTime, Time

Policy = Literal["none", "overflow", "pinned_client", "prioritized"]
OnlyOnPut = Field(description="only in the answer to a PUT")


class Stakeholder(TypedDict):
    ID: str
    Name: str
    ChangedAt: Time
    Token: NotRequired[Annotated[str, OnlyOnPut]]


class Breaker(TypedDict):
    State: Literal["closed", "open", "half_open"]
    ConsecutiveFailures: int
    OpenUntil: MaybeTime


class Consumer(Stakeholder):
    CallbackURL: str
    DeadLetterQueueURL: str
    Type: Literal["push", "pull"]
    AckWait: int
    MaxAckPending: int | None
    PriorityGroups: list[str]
    PriorityPolicy: Policy
    PriorityTimeout: int | None
    # Claims and pushes stopped (PUT .../pause); until when (null: until resumed, or running).
    Paused: bool
    PausedUntil: MaybeTime
    # push consumers only
    SigningSecret: NotRequired[Annotated[str | None, OnlyOnPut]]
    MaxInFlight: NotRequired[int]
    RateLimit: NotRequired[float | None]
    SigningSecretRotatedUntil: NotRequired[MaybeTime]
    Enabled: NotRequired[bool]
    DisabledAt: NotRequired[MaybeTime]
    DisabledReason: NotRequired[str | None]
    Breaker: NotRequired[Breaker]


FormField = Annotated[str, Field(max_length=255)]
Generated = Field(max_length=255, description="made by the broker when left out")
Positive = Field(ge=1, le=MAX_INT32)
BASE64_24_TO_64_BYTES = "([A-Za-z0-9+/]{4}){8,20}([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"


class StakeholderForm(BaseModel):
    """A producer's or channel's PUT (other fields are ignored)."""

    token: str | None = Generated
    name: FormField | None = None


class ConsumerForm(StakeholderForm):
    """A consumer's PUT; a push consumer (the default) needs its callback URL."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {
                        "not": {"required": ["type"], "properties": {"type": {"const": "pull"}}}
                    },
                    "then": {"required": ["callbackUrl"]},
                }
            ]
        }
    )

    callbackUrl: str | None = Field(
        None,
        pattern="^https?://[^/?#]+",
        description="an absolute http(s) URL, not a link-local address; push consumers",
    )
    type: Literal["push", "pull"] = Field("push", description="push when left out")
    ackWait: int | None = Field(None, ge=1, le=MAX_INT32, description="lease seconds")
    maxAckPending: int | None = Positive
    priorityGroups: str | None = Field(
        None,
        pattern="^[a-zA-Z0-9/_=-]{1,16}$",
        description="a pull consumer's one group, with a priorityPolicy other than none",
    )
    priorityPolicy: Policy = "none"
    priorityTimeout: int | None = Field(
        None, ge=1, le=MAX_INT32, description="pinned_client: seconds"
    )
    maxInFlight: int | None = Positive
    rateLimit: float | None = Field(None, gt=0, le=1_000_000)
    signingSecret: str | None = Field(
        None,
        pattern=f"^(rotate|whsec_{BASE64_24_TO_64_BYTES})$",
        description="whsec_ and the base64 of 24 to 64 bytes, or rotate (a new one)",
    )
    signingSecretOverlap: int | None = Field(None, ge=1, le=MAX_INT32, description="seconds")
    enabled: bool | None = None


class PauseForm(BaseModel):
    """A pause (PUT .../consumer/{id}/pause); no body pauses until resumed."""

    until: str | None = Field(
        None,
        description="RFC 3339 time with an offset: the consumer resumes by itself then (a time "
        "already past resumes it now)",
    )
