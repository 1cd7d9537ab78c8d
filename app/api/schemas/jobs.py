"""The seed spec's pull API: a job's state change (JSON), the DLQ's form, and their answers."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict

from app.api.schemas.common import (
    MAX_INT32,
    Body,
    JobMessage,
    MaybeTime,
    NumberOnly,
    Pages,
    Says,
    Time,
    Whole,
)
from app.api.schemas.status import JobStatusName
from app.domain.jobs import JobStatus

ONE_OF = "NextState must be one of INFLIGHT, DELIVERED, DEAD"


def _unknown_state(given: Any) -> str:
    return f"unknown NextState {given!r}" if isinstance(given, str) else ONE_OF


class NextStateBody(Body):
    """Move a job (the Go original's body; other fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    NextState: Annotated[JobStatus, Says({"enum": _unknown_state, "*": ONE_OF})]
    IncrementalTimeout: Annotated[Whole, Field(ge=0, le=MAX_INT32), NumberOnly] | None = None


class DlqForm(BaseModel):
    """The Go original's requeue form, in place of the consumer's X-Broker-Channel-Token and
    X-Broker-Consumer-Token (other fields are ignored)."""

    requeue: str | None = None


class JobState(TypedDict):
    ID: str
    Status: JobStatusName
    Attempt: int
    RetryCount: int
    Priority: int
    IncrementalTimeout: int
    LeaseExpiresAt: MaybeTime
    EarliestNextAttemptAt: MaybeTime
    StatusChangedAt: Time
    CreatedAt: Time
    DeadReason: str | None
    LastError: str | None


class QueuedJob(TypedDict):
    ID: str
    Priority: int
    IncrementalTimeout: int
    Message: JobMessage


class QueuedJobs(TypedDict):
    Result: list[QueuedJob]
    Pages: Pages


class JobLinks(TypedDict):
    self: str
    message: str
    consumer: str
    requeue: str


class Job(JobState):
    Message: JobMessage
    Links: JobLinks


class DeadJob(JobState):
    JobURL: str
    JobRequeueURL: str


class DeadJobs(TypedDict):
    DeadJobs: list[DeadJob]
    Pages: Pages


class Deleted(TypedDict):
    deletedCount: int


class Requeued(TypedDict):
    Requeued: int
