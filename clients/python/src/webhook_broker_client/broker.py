"""The broker as a producer and an administrator see it: channels, producers, consumers, and
publishing. `Broker.consumer()` gives a pull consumer's side (consumer.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from webhook_broker_client.consumer import PullConsumer
from webhook_broker_client.errors import BrokerError, Conflict, NotFound
from webhook_broker_client.http import call

Payload = bytes | str | Mapping[str, Any] | list[Any]
# Connections publish_many() spreads its publishes over, each one request at a time.
PUBLISH_CONNECTIONS = 4


@dataclass(frozen=True, slots=True)
class Published:
    location: str  # /channel/{c}/message/{message id}
    created: bool  # False: a message with this id was published before (nothing changed)

    @property
    def message_id(self) -> str:
        return self.location.rsplit("/", 1)[-1]


def _segment(value: str) -> str:
    return quote(value, safe="")


def _body(payload: Payload, content_type: str | None) -> tuple[bytes, str]:
    if isinstance(payload, bytes):
        return payload, content_type or "application/octet-stream"
    if isinstance(payload, str):
        return payload.encode("utf-8"), content_type or "text/plain; charset=utf-8"
    return json.dumps(payload).encode("utf-8"), content_type or "application/json"


class Broker:
    """`async with Broker("http://localhost:8080", ...) as broker:`. Tokens given here are
    used by default: the admin token for changes, the producer's id and token and the
    channels' tokens for publishing."""

    def __init__(
        self,
        base_url: str,
        *,
        admin_token: str | None = None,
        producer_id: str | None = None,
        producer_token: str | None = None,
        channel_tokens: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.http = http or httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
        )
        self._own_http = http is None
        self._admin = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.producer_id = producer_id
        self.producer_token = producer_token
        self.channel_tokens = dict(channel_tokens or {})

    async def __aenter__(self) -> Broker:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own_http:
            await self.http.aclose()

    # -- management -------------------------------------------------------------------------------

    async def put_channel(
        self, channel: str, *, token: str | None = None, name: str | None = None
    ) -> dict[str, Any]:
        """Create or change a channel; the answer carries its token (kept for publishing)."""
        body = await self._put(f"/channel/{_segment(channel)}", {"token": token, "name": name})
        self.channel_tokens[channel] = body["Token"]
        return body

    async def put_producer(
        self, producer: str, *, token: str | None = None, name: str | None = None
    ) -> dict[str, Any]:
        return await self._put(f"/producer/{_segment(producer)}", {"token": token, "name": name})

    async def put_consumer(
        self,
        channel: str,
        consumer: str,
        *,
        token: str | None = None,
        name: str | None = None,
        type: str = "pull",
        callback_url: str | None = None,
        **settings: str | int | None,
    ) -> dict[str, Any]:
        """Create or change a consumer. `settings` are the form's other fields by their names:
        ackWait, maxAckPending, priorityGroups, priorityPolicy, priorityTimeout."""
        fields: dict[str, Any] = {
            "token": token,
            "name": name,
            "type": type,
            "callbackUrl": callback_url,
            **settings,
        }
        return await self._put(
            f"/channel/{_segment(channel)}/consumer/{_segment(consumer)}", fields
        )

    async def get_channel(self, channel: str) -> dict[str, Any]:
        return await self._get(f"/channel/{_segment(channel)}")

    async def get_producer(self, producer: str) -> dict[str, Any]:
        return await self._get(f"/producer/{_segment(producer)}")

    async def get_consumer(self, channel: str, consumer: str) -> dict[str, Any]:
        return await self._get(f"/channel/{_segment(channel)}/consumer/{_segment(consumer)}")

    async def delete_consumer(self, channel: str, consumer: str) -> None:
        path = f"/channel/{_segment(channel)}/consumer/{_segment(consumer)}"
        current = await call(self.http, "GET", path)
        headers = {**self._admin, "If-Unmodified-Since": current.headers["Last-Modified"]}
        await call(self.http, "DELETE", path, headers=headers)

    async def _get(self, path: str) -> dict[str, Any]:
        body: dict[str, Any] = (await call(self.http, "GET", path)).json()
        return body

    async def _put(self, path: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        # A change to an object that exists must say which version it changes.
        headers = dict(self._admin)
        try:
            current = await call(self.http, "GET", path)
            headers["If-Unmodified-Since"] = current.headers["Last-Modified"]
        except NotFound:
            pass
        form = {key: str(value) for key, value in fields.items() if value is not None}
        # Always a form, even an empty one (the broker generates the token): httpx would send
        # an empty body without its content type.
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        content = urlencode(form).encode()
        body: dict[str, Any] = (
            await call(self.http, "PUT", path, content=content, headers=headers)
        ).json()
        return body

    # -- publishing -------------------------------------------------------------------------------

    async def publish(
        self,
        channel: str,
        payload: Payload,
        *,
        priority: int | None = None,
        message_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        channel_token: str | None = None,
    ) -> Published:
        """Broadcast one message to every consumer of the channel. A dict or list goes as
        JSON, a str as UTF-8 text. A `message_id` already published is not an error: the
        answer says it was not created. `headers` are stored and passed on with the jobs."""
        data, kind = _body(payload, content_type)
        request = self._publish_headers(channel, channel_token)
        request["Content-Type"] = kind
        if priority is not None:
            request["X-Broker-Message-Priority"] = str(priority)
        if message_id is not None:
            request["X-Broker-Message-ID"] = message_id
        if headers:
            request.update(headers)
            request["X-Broker-Metadata-Headers"] = ",".join(headers)
        path = f"/channel/{_segment(channel)}/broadcast"
        try:
            response = await call(self.http, "POST", path, content=data, headers=request)
        except Conflict:
            if message_id is None:
                raise
            # 409: a message with this id was published before; this one changed nothing.
            location = f"/channel/{_segment(channel)}/message/{_segment(message_id)}"
            return Published(location, created=False)
        return Published(response.headers["Location"], created=True)

    async def publish_many(
        self,
        channel: str,
        payloads: Iterable[Payload],
        *,
        connections: int = PUBLISH_CONNECTIONS,
        **options: Any,
    ) -> list[Published | BrokerError]:
        """Publish each payload (same options for all), over `connections` requests at a time;
        results in the payloads' order, an error in place of a publish that failed."""
        items = list(enumerate(payloads))
        results: list[Published | BrokerError | None] = [None] * len(items)
        feed = iter(items)

        async def sender() -> None:
            for index, payload in feed:
                try:
                    results[index] = await self.publish(channel, payload, **options)
                except BrokerError as exc:
                    results[index] = exc

        await asyncio.gather(*(sender() for _ in range(max(1, connections))))
        return [r for r in results if r is not None]

    def _publish_headers(self, channel: str, channel_token: str | None) -> dict[str, str]:
        token = channel_token or self.channel_tokens.get(channel)
        if token is None or self.producer_id is None or self.producer_token is None:
            raise ValueError(
                "publishing needs the channel's token and a producer id and token"
                " (given to Broker(...) or to publish)"
            )
        return {
            "X-Broker-Channel-Token": token,
            "X-Broker-Producer-ID": self.producer_id,
            "X-Broker-Producer-Token": self.producer_token,
        }

    # -- consumers --------------------------------------------------------------------------------

    def consumer(
        self,
        channel: str,
        consumer: str,
        *,
        consumer_token: str,
        channel_token: str | None = None,
    ) -> PullConsumer:
        token = channel_token or self.channel_tokens.get(channel)
        if token is None:
            raise ValueError(f"no token for channel {channel!r}: give channel_token")
        return PullConsumer(
            self.http, channel, consumer, channel_token=token, consumer_token=consumer_token
        )
