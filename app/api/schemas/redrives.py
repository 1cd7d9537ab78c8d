"""Redrives: what starting one may ask for, and what the redrive routes answer."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BeforeValidator, Field, StrictInt, model_validator
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from app.api.schemas.common import Body, MaybeTime, Says, SelfLink, Time
from app.domain.redrives import DEFAULT_PER_SECOND, MAX_PER_SECOND
from app.domain.times import utc_moment


def _moment(value: Any) -> datetime:
    moment = utc_moment(value)
    if moment is None:
        raise PydanticCustomError("moment", "not a time")
    return moment


Moment = Annotated[
    datetime,
    BeforeValidator(_moment),
    Says({"*": "{name} must be an RFC 3339 time with an offset, within years 1-9999"}),
]


class RedriveBody(Body):
    """Move the consumer's DEAD jobs (or DELIVERED ones, to replay) that reached that state in
    [since, until) back to QUEUED, perSecond at most."""

    unknown: ClassVar[str] = (
        "unknown field(s) {names}; known: ['from', 'perSecond', 'since', 'until']"
    )

    from_: Annotated[
        Literal["DEAD", "DELIVERED"], Says({"*": "from must be DEAD or DELIVERED (to replay)"})
    ] = Field("DEAD", alias="from")
    since: Moment | None = Field(None, description="inclusive")
    until: Moment | None = Field(None, description="exclusive, after since")
    perSecond: Annotated[
        StrictInt,
        Field(ge=1, le=MAX_PER_SECOND),
        Says({"*": f"perSecond must be an integer from 1 to {MAX_PER_SECOND}"}),
    ] = DEFAULT_PER_SECOND

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("since must be before until")
        return self


class Redrive(TypedDict):
    ID: str
    Status: Literal["RUNNING", "COMPLETED", "CANCELLED"]
    From: Literal["DEAD", "DELIVERED"]
    Since: MaybeTime
    Until: MaybeTime
    PerSecond: int
    Total: int
    Moved: int
    CreatedAt: Time
    FinishedAt: MaybeTime
    Links: SelfLink


class Redrives(TypedDict):
    Result: list[Redrive]
