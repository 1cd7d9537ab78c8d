"""create_app(): the FastAPI application for one Runtime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api.errors import install_error_handlers
from app.api.gateway import GatewayHmac
from app.api.limits import UnreadBodyCloses
from app.api.openapi import install_openapi, operation_id
from app.api.requests import RequestIds
from app.api.routes import consumers, jobs, messages, pull, redrives, stakeholders, status
from app.config import Config
from app.runtime import Runtime


def create_app(
    config: Config, runtime: Runtime | None = None, *, run_sweeper: bool = False
) -> FastAPI:
    """With `runtime` given (tests), the caller starts and stops it; otherwise the lifespan does."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runtime is not None:
            app.state.runtime = runtime
            yield
            return
        owned = Runtime(config, run_sweeper=run_sweeper)
        await owned.start()
        app.state.runtime = owned
        try:
            yield
        finally:
            await owned.stop()

    app = FastAPI(
        title="webhook-broker",
        version="0.1.0",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
    )
    if runtime is not None:
        app.state.runtime = runtime
    install_error_handlers(app)
    install_openapi(app, config)
    for module in (status, stakeholders, consumers, messages, jobs, pull, redrives):
        app.include_router(module.router)
    if config.gateway_auth.enabled:
        app.add_middleware(GatewayHmac, config=config)
    # Outside the gateway: its refusals leave bodies unread too.
    app.add_middleware(UnreadBodyCloses)
    app.add_middleware(RequestIds)  # the outermost: a refused signature has its id too
    return app
