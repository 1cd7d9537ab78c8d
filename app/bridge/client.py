"""How this broker's processes connect to NATS as a client ([nats] url and credentials)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription

from app.config import NatsConfig
from app.logging import log_failure

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


# subject, reply (None when the message has none), payload
DirectHandler = Callable[[str, str | None, bytes], None]


class DirectClient(NatsClient):
    """nats-py's client, with subscriptions whose messages go straight from its parser to a
    plain function: no `Msg` built, no queue and no task per subscription between them. The
    bridge takes its acks and pull requests this way; through a subscription's callback,
    nats-py's handling of each ack cost the bridge about a fifth of its CPU per delivery
    (docs/performance.md, "The NATS bridge"). A handler must not block and must not raise:
    what it raises is logged and the message dropped, as nats-py's callbacks are treated.
    A direct subscription has no message limit (`unsubscribe(limit=...)` is not for it)."""

    def __init__(self) -> None:
        super().__init__()
        self._direct: dict[int, DirectHandler] = {}

    async def subscribe_direct(
        self, subject: str, queue: str, handler: DirectHandler
    ) -> Subscription:
        # Registered under the sid subscribe() takes next before it runs: a message that
        # arrives while it awaits its SUB's flush must not reach nats-py's own path, where a
        # subscription without a callback would keep it unread.
        sid = self._sid + 1
        self._direct[sid] = handler
        try:
            sub = await self.subscribe(subject, queue=queue)
        except BaseException:
            self._direct.pop(sid, None)
            raise
        if sub._id != sid:  # not the sid foreseen: register the one it took
            self._direct.pop(sid, None)
            self._direct[sub._id] = handler
        return sub

    def _remove_sub(self, sid: int, max_msgs: int = 0) -> None:
        self._direct.pop(sid, None)
        super()._remove_sub(sid, max_msgs)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        handler = self._direct.get(sid)
        if handler is None:
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        try:
            handler(subject.decode(), reply.decode() if reply else None, data)
        except Exception:
            log_failure(log, "NATS message on %r failed", subject[:200])
