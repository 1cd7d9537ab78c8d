"""A Python client of webhook-broker: publish, administer, and pull jobs (fetch, next, consume)
over HTTP. Async first (`Broker`); `webhook_broker_client.sync.SyncBroker` for scripts.

It imports nothing else of the broker's: it talks to it over HTTP only.
"""

from webhook_broker_client.broker import Broker, Published
from webhook_broker_client.consume import ConsumeContext
from webhook_broker_client.consumer import ConsumerInfo, PullConsumer
from webhook_broker_client.errors import (
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
from webhook_broker_client.jobs import Job

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
