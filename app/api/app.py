"""create_app(): the FastAPI application over one process's services."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api import hot
from app.api.deps import ApiServices
from app.api.errors import install_error_handlers
from app.api.gateway import GatewayHmac
from app.api.limits import UnreadBodyCloses
from app.api.openapi import install_openapi, operation_id
from app.api.requests import RequestIds
from app.api.routes import consumers, jobs, messages, pull, redrives, stakeholders, status
from app.config import Config
from app.ui import install_console

log = logging.getLogger(__name__)

# The requests a busy broker answers most, matched before every other route (app/api/hot.py).
HOT = (messages.broadcast, pull.pull, pull.ack, pull.ack_many)


def create_app(
    config: Config,
    runtime: ApiServices | None = None,
    *,
    owned: bool = False,
    on_started: Callable[[], None] | None = None,
) -> FastAPI:
    """The API over `runtime`. Owned (a process of its own: `webhook-broker api|serve`), the
    app's lifespan starts it, calls `on_started`, and stops it at shutdown; otherwise (tests)
    the caller does. Without `runtime` the app only describes itself (its OpenAPI document)."""
    if owned and runtime is None:
        raise ValueError("an owned lifespan needs the services it starts")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runtime is None or not owned:
            yield
            return
        try:
            await runtime.start()
        except Exception as exc:
            log.error("start failed: %s", exc)
            raise
        if on_started is not None:
            on_started()
        try:
            yield
        finally:
            await runtime.stop()

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
    if runtime is not None:
        install_console(app, config)  # /ui: the operator console (docs/console.md)
    hot.install(app, HOT)  # after every route: it checks them all
    if config.gateway_auth.enabled:
        app.add_middleware(GatewayHmac, config=config)
    # Outside the gateway: its refusals leave bodies unread too.
    app.add_middleware(UnreadBodyCloses)
    app.add_middleware(RequestIds)  # the outermost: a refused signature has its id too
    return app
