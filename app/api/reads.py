"""X-Broker-Read-From: the routes whose reads may go to the replica take a ReadNoteDep and put
its header on their answer."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from app.services.reads import ReadNote, Reads

READ_FROM = "X-Broker-Read-From"


async def read_note() -> ReadNote:
    # Async, so that it runs in the request's own task: the services' reads record into the
    # note through the task's context (a sync dependency would run in a worker thread).
    return Reads.begin_request()


ReadNoteDep = Annotated[ReadNote, Depends(read_note)]
