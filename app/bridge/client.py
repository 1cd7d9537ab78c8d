"""How this broker's processes connect to NATS as a client ([nats] url and credentials)."""

from __future__ import annotations

import logging
import ssl
from typing import Any

from app.config import NatsConfig

log = logging.getLogger(__name__)


async def _connection_error(exc: Exception) -> None:
    # nats-py's default logs each failed reconnect (every reconnect_time_wait) with a
    # traceback; one line says the same while the server is away.
    log.warning("NATS connection: %s", exc or type(exc).__name__)


def tls_context(config: NatsConfig) -> ssl.SSLContext | None:
    """The TLS settings of both connections ([nats] tls-ca-file, tls-cert-file, tls-key-file):
    None when nothing is configured, so the library's defaults apply (the system's CAs)."""
    if not (config.tls_ca_file or config.tls_cert_file):
        return None
    # Verifies the server's certificate and name, as the default context does.
    context = ssl.create_default_context(cafile=config.tls_ca_file or None)
    if config.tls_cert_file:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file or None)
    return context


def client_options(config: NatsConfig, name: str) -> dict[str, Any]:
    """nats-py connect() options: every server of `url`, reconnecting for ever; TLS with the
    configured files when the URL says tls:// or the server requires it."""
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
    context = tls_context(config)
    if context is not None:
        options["tls"] = context
    return options
