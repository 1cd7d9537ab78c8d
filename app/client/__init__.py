"""A Python client of webhook-broker: publish, administer, and pull jobs (fetch, next, consume)
over HTTP. Async first (`Broker`); `app.client.sync.SyncBroker` for scripts.

It imports nothing else of the broker's: it talks to it over HTTP only.
"""

from app.client.broker import Broker, Published
from app.client.consume import ConsumeContext
from app.client.consumer import ConsumerInfo, PullConsumer
from app.client.errors import (
    BrokerError,
    Conflict,
    ConsumerGone,
    HeartbeatError,
    InvalidRequest,
    JobNotFound,
    NotFound,
    PinLost,
    ServerError,
    StaleAck,
    Unauthorized,
)
from app.client.jobs import Job

__all__ = [
    "Broker",
    "BrokerError",
    "Conflict",
    "ConsumeContext",
    "ConsumerGone",
    "ConsumerInfo",
    "HeartbeatError",
    "InvalidRequest",
    "Job",
    "JobNotFound",
    "NotFound",
    "PinLost",
    "PullConsumer",
    "Published",
    "ServerError",
    "StaleAck",
    "Unauthorized",
]
