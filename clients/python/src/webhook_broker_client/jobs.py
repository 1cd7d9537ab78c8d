"""A job as a pull hands it out, and the acks its worker sends for it."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from webhook_broker_client.errors import BrokerError, ServerError


class AckSender(Protocol):
    async def send(self, item: dict[str, Any]) -> dict[str, Any]:
        """One ack item of the batch-ack API; its result item, or the error it stands for."""


# Acks after which the job is no longer the worker's: any later one is ignored locally.
TERMINAL = frozenset({"ack", "nak", "term"})


class Job:
    """One delivery of a message to this consumer, under one attempt. Every ack sends the
    attempt, so an ack from a worker whose lease ran out (and whose job went to another) is
    refused (`StaleAck`) instead of settling someone else's delivery."""

    __slots__ = (
        "id",
        "attempt",
        "priority",
        "lease_expires_at",
        "message_id",
        "payload",
        "content_type",
        "headers",
        "pin_id",
        "_acks",
        "_settled",
        "_on_settled",
    )

    def __init__(
        self,
        *,
        id: str,
        attempt: int,
        priority: int,
        lease_expires_at: datetime,
        message_id: str,
        payload: bytes,
        content_type: str,
        headers: dict[str, str],
        pin_id: str | None,
        acks: AckSender,
    ) -> None:
        self.id = id
        self.attempt = attempt
        self.priority = priority
        self.lease_expires_at = lease_expires_at
        self.message_id = message_id
        self.payload = payload
        self.content_type = content_type
        self.headers = headers
        self.pin_id = pin_id
        self._acks = acks
        self._settled: str | None = None
        self._on_settled: Callable[[Job], None] | None = None

    @classmethod
    def from_wire(cls, body: dict[str, Any], acks: AckSender, pin_id: str | None = None) -> Job:
        message = body["Message"]
        raw = message.get("Payload") or ""
        if message.get("PayloadEncoding") == "base64":
            payload = base64.b64decode(raw)
        else:
            payload = raw.encode("utf-8")
        return cls(
            id=str(body["ID"]),
            attempt=int(body["Attempt"]),
            priority=int(body.get("Priority", 0)),
            lease_expires_at=datetime.fromisoformat(body["LeaseExpiresAt"]),
            message_id=message.get("MessageID", ""),
            payload=payload,
            content_type=message.get("ContentType", ""),
            headers=dict(message.get("Headers") or {}),
            pin_id=pin_id,
            acks=acks,
        )

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, attempt={self.attempt}, message_id={self.message_id!r})"

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.payload)

    @property
    def settled(self) -> bool:
        """An ack, nak or term was sent (or is being sent) for it."""
        return self._settled is not None

    async def ack(self) -> None:
        """Done: DELIVERED."""
        await self._finish({"type": "ack"})

    async def nak(self, delay: float | None = None) -> None:
        """Failed: queued again after `delay` seconds (or the broker's backoff), a retry
        counted."""
        if delay is not None and not delay >= 0:
            raise ValueError("delay must be a non-negative number of seconds")
        await self._finish({"type": "nak", **({} if delay is None else {"delay": delay})})

    async def term(self, reason: str | None = None) -> None:
        """Never to be retried: DEAD, with the reason."""
        await self._finish({"type": "term", **({} if reason is None else {"reason": reason})})

    async def hand_back(self) -> None:
        """Never started: queued again at once, no retry counted."""
        await self._finish({"type": "nak", "counted": False})

    async def in_progress(self) -> datetime:
        """Still working on it: the lease is extended by the consumer's ack wait."""
        result = await self._acks.send(self._item({"type": "progress"}))
        self.lease_expires_at = datetime.fromisoformat(result["LeaseExpiresAt"])
        return self.lease_expires_at

    async def _finish(self, fields: dict[str, Any]) -> None:
        if self._settled is not None:
            return  # it is settled (or being settled) already: nothing more to say
        self._settled = fields["type"]
        try:
            await self._acks.send(self._item(fields))
        except Exception as exc:
            if isinstance(exc, ServerError) or not isinstance(exc, BrokerError):
                self._settled = None  # it may never have got there: the worker may try again
            raise
        finally:
            if self._settled is not None and self._on_settled is not None:
                callback, self._on_settled = self._on_settled, None
                callback(self)

    def _item(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "attempt": self.attempt, **fields}
