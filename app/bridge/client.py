"""How this broker's processes connect to NATS as a client ([nats] url and credentials)."""

from __future__ import annotations

import logging
from typing import Any

from app.config import NatsConfig

log = logging.getLogger(__name__)


async def _connection_error(exc: Exception) -> None:
    # nats-py's default logs each failed reconnect (every reconnect_time_wait) with a
    # traceback; one line says the same while the server is away.
    log.warning("NATS connection: %s", exc or type(exc).__name__)


def client_options(config: NatsConfig, name: str) -> dict[str, Any]:
    """nats-py connect() options: every server of `url`, reconnecting for ever."""
    options: dict[str, Any] = {
        "servers": [u.strip() for u in config.url.split(",") if u.strip()],
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 5,
        "error_cb": _connection_error,
    }
    if config.user:
        options["user"] = config.user
        options["password"] = config.password
    if config.token:
        options["token"] = config.token
    if config.credentials:
        options["user_credentials"] = config.credentials
    return options
