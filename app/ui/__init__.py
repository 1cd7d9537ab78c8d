"""The operator console at /ui: server-rendered pages over the API process's services, its
static files (htmx, its SSE extension and uPlot vendored: app/ui/static/VENDORED.md) served
from the package, so it works offline and needs no build step."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from app.config import Config

STATIC = Path(__file__).parent / "static"
log = logging.getLogger(__name__)


def console_enabled(config: Config) -> bool:
    """[ui] enabled, on a loopback listener or with a token to sign in with: a console on an
    open non-loopback listener would hand every action to whoever reaches it."""
    http = config.http
    return config.ui.enabled and (http.loopback or bool(http.admin_token or http.reader_token))


def install_console(app: FastAPI, config: Config) -> None:
    if not console_enabled(config):
        return
    from app.ui.routes import router  # Jinja2 loads only where the console is served

    http = config.http
    if not (http.admin_token or http.reader_token):
        log.warning(
            "the console at /ui is open without a token on the loopback listener %s:%d: "
            "anyone on this machine signs in as admin; it answers only requests to localhost, "
            "127.0.0.1 or [::1]",
            http.host,
            http.port,
        )
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
