"""The status routes' answers: liveness, readiness and the Go original's job counts."""

from __future__ import annotations

from typing import Literal

from typing_extensions import TypedDict

from app.api.schemas.common import MaybeTime

JobStatusName = Literal["QUEUED", "INFLIGHT", "DELIVERED", "DEAD"]


class Database(TypedDict):
    dialect: str
    status: str
    schema: str


class Status(TypedDict):
    status: Literal["ok", "degraded"]
    database: Database


class Ready(TypedDict):
    ready: bool
    reasons: list[str]


class StatusEntry(TypedDict):
    status: JobStatusName
    statusCode: int | None
    count: int
    oldestItemTimestamp: MaybeTime
    newestItemTimestamp: MaybeTime


# channel id -> consumer id -> one entry per job status
JobStatus = dict[str, dict[str, list[StatusEntry]]]


class DeadCount(TypedDict):
    channelId: str
    channelName: str
    consumerId: str
    consumerName: str
    deadCount: int


class DlqStatus(TypedDict):
    consumers: list[DeadCount]
