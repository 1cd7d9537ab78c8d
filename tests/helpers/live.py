"""The app served by uvicorn on a free loopback port, for tests that need real HTTP (a
streaming body, a fuzzer in another process): the ASGI test transport would buffer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import uvicorn

from app.api.app import create_app
from app.config import Config
from app.runtime import Runtime
from tests.helpers.waiting import eventually


@contextlib.asynccontextmanager
async def served(config: Config, runtime: Runtime) -> AsyncIterator[str]:
    """Its base URL while it runs."""
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config, runtime),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
        )
    )
    task = asyncio.create_task(server.serve())

    def started() -> bool:
        assert not task.done(), "uvicorn exited"
        return bool(server.started)

    await eventually(started, 30, 0.01, what="uvicorn started")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
