"""What the broker (or the way to it) said no with. Every error carries the HTTP status and the
broker's reason; the subclasses are the cases a caller acts on differently."""

from __future__ import annotations

from typing import Any


class BrokerError(Exception):
    """A request the broker refused (status >= 400), or a stream that ended in error."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}" if status else detail)
        self.status = status
        self.detail = detail


class InvalidRequest(BrokerError):
    """400: the request itself is wrong (its reason says how)."""


class Unauthorized(BrokerError):
    """401 or 403: an unknown producer or consumer, or a wrong token."""


class NotFound(BrokerError):
    """404: no such channel, message or job."""


class Conflict(BrokerError):
    """409: a duplicate message id, too many waiting pulls, a changed object."""


class ServerError(BrokerError):
    """5xx, or a connection that failed: worth trying again."""


class JobNotFound(NotFound):
    """An ack for a job the consumer does not have."""


class StaleAck(Conflict):
    """An ack the broker refused: the job is no longer in flight under this attempt (its lease
    expired and it was handed out again, or it was settled already)."""


class PinLost(BrokerError):
    """423: under pinned_client, another client holds the pin (or it lapsed)."""


class ConsumerGone(BrokerError):
    """consume() ended: the consumer was deleted, or its tokens no longer match."""


class HeartbeatError(BrokerError):
    """A streaming pull heard nothing (no job, heartbeat or status) for two idle heartbeats;
    the pull is given up and issued again."""

    def __init__(self, detail: str) -> None:
        super().__init__(0, detail)


_BY_STATUS: dict[int, type[BrokerError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
    423: PinLost,
}


def error_for(status: int, body: Any) -> BrokerError:
    """The error a response stands for, with the broker's reason (`{"detail": ...}`)."""
    detail = body.get("detail") if isinstance(body, dict) else None
    text = detail if isinstance(detail, str) else str(body)[:200] if body else "no reason given"
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else BrokerError)
    return cls(status, text)
