"""Domain errors. They carry meaning only; each entry point maps them to its own status codes."""

from __future__ import annotations


class BrokerError(Exception):
    """Base of every error the broker reports to a client."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(BrokerError):
    """The named channel, producer, consumer, message or job does not exist."""


class Unauthenticated(BrokerError):
    """The caller named a principal that does not exist, or gave no credentials."""


class Forbidden(BrokerError):
    """The caller's token does not match."""


class InvalidInput(BrokerError):
    """The request is malformed or breaks a documented rule."""


class UnstorableValue(InvalidInput):
    """The database refused a value from the request (a NUL byte, a number out of range)."""


class InvalidTransition(InvalidInput):
    """The job state machine does not allow the requested move."""


class Conflict(BrokerError):
    """The request collides with existing state (duplicate id, lost race, stale attempt)."""


class PreconditionFailed(BrokerError):
    """A conditional request's precondition (If-Unmodified-Since, consumer type) does not hold."""


class PayloadTooLarge(BrokerError):
    """The message body is larger than the configured limit."""


class UnsupportedMediaType(BrokerError):
    """The request body has a content type this endpoint does not read."""


class PinLost(BrokerError):
    """A pull names a pin (pinned_client priority group) that another client holds, or that
    is held no more: drop the pin id and pull again without it (HTTP 423, NATS 423)."""


class Unavailable(BrokerError):
    """The database could not be reached, or dropped the connection mid-statement (a restart,
    an outage, a full pool). Every request is safe to send again (publishes carry message
    ids, acks are fenced by attempt), so clients retry after a moment (HTTP 503)."""


class Contended(Unavailable):
    """The database broke a lock cycle (a deadlock) or a serialization conflict by rolling
    back this transaction. Nothing it did stands, so it is run again (app/store/db.py); this
    reaches a client only when every attempt met one (HTTP 503, as Unavailable)."""


class TooManyWaiting(Conflict):
    """More pull requests are waiting on a consumer than max-waiting allows."""
