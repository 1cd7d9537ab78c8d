"""The floor (issue 40): what an API process cannot go below on this server stack.

`python -m bench.floor --config FILE` serves the same paths as the broker's hot routes (publish,
pull, single ack, batch ack) as one bare ASGI callable on the API's own uvicorn settings
(app/cli.server_options: the same protocol class, limits, no access log, uvloop), each request
running one statement of the same shape as the broker's (the texts of app/store/queue.py, the
consumer named by primary key, as the pgbench ceiling names it) on the same connection pool
(app/store/db.Database.run_alone) and answering: no credential check, no validation, no
framework, no logging, no metrics. The bench drives it with the same load generator as the
HTTP scenarios; the API CPU per request of both is compared in the report.

Credentials are read once at start (the stored tokens the publish statement compares, the
consumers' primary keys), so a request names what the statement needs by its path alone.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import orjson
import uvicorn
from starlette.types import Message, Receive, Scope, Send

from app.cli import server_options
from app.config import Config, load_config
from app.store.db import Database
from app.store.queue import ACK, PUBLISH, claim_sql, int_array

JSON = [(b"content-type", b"application/json")]
STATUS_BODY = b'{"status":"ok"}'


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(send: Send, status: int, body: bytes = b"", headers: Any = None) -> None:
    start: Message = {"type": "http.response.start", "status": status, "headers": headers or []}
    await send(start)
    await send({"type": "http.response.body", "body": body})


class Floor:
    """The bare routes over one Database; `load()` reads the stakeholders once."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.db = Database.from_config(config.database)
        self.consumers: dict[tuple[str, str], int] = {}
        self.channel_tokens: dict[str, str] = {}
        self.producer_tokens: dict[str, str] = {}
        self.claim = claim_sql("pk", numbered=False, by_bytes=False, capped=False)

    async def load(self) -> None:
        rows = await self.db.run_alone("SELECT channel_id, consumer_id, pk FROM consumer", {})
        self.consumers = {(str(c), str(k)): int(pk) for c, k, pk in rows}
        rows = await self.db.run_alone("SELECT id, token FROM channel", {})
        self.channel_tokens = {str(c): str(t) for c, t in rows}
        rows = await self.db.run_alone("SELECT id, token FROM producer", {})
        self.producer_tokens = {str(p): str(t) for p, t in rows}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        parts = scope["path"].split("/")
        # /channel/{c}/broadcast, /channel/{c}/consumer/{k}/pull|ack, .../job/{id}/ack
        if scope["path"] == "/_status":
            await _answer(send, 200, STATUS_BODY, JSON)
        elif len(parts) == 4 and parts[3] == "broadcast":
            await self.publish(scope, parts[2], await _body(receive), send)
        elif len(parts) == 6 and parts[5] == "pull":
            await self.pull(self.consumers[parts[2], parts[4]], await _body(receive), send)
        elif len(parts) == 6 and parts[5] == "ack":
            await self.ack_many(self.consumers[parts[2], parts[4]], await _body(receive), send)
        elif len(parts) == 8 and parts[7] == "ack":
            await _body(receive)
            await self.ack(self.consumers[parts[2], parts[4]], int(parts[6]), send)
        else:
            await _answer(send, 404)

    async def publish(self, scope: Scope, channel_id: str, payload: bytes, send: Send) -> None:
        headers = dict(scope["headers"])
        producer_id = headers[b"x-broker-producer-id"].decode()
        rows = await self.db.run_alone(
            PUBLISH,
            {
                "channel_id": channel_id,
                "channel_token": self.channel_tokens[channel_id],
                "producer_id": producer_id,
                "producer_token": self.producer_tokens[producer_id],
                "message_id": uuid.uuid4().hex,
                "payload": payload,
                "payload_size": len(payload),
                "content_type": headers.get(b"content-type", b"").decode(),
                "priority": 0,
                "headers": "{}",
                "scheduled_for": None,
            },
        )
        await _answer(send, 201 if rows else 409)

    async def pull(self, consumer_pk: int, body: bytes, send: Send) -> None:
        batch = int(orjson.loads(body or b"{}").get("batch", 1))
        rows = await self.db.run_alone(
            self.claim,
            {
                "limit": batch,
                "consumer_pk": consumer_pk,
                "consumer_type": "pull",
                "default_ack_wait": self.config.default_ack_wait_seconds,
                "incremental_timeout": 0,
                "max_bytes": None,
            },
        )
        jobs = [
            {
                "ID": str(row[0]),
                "Attempt": row[1],
                "Priority": row[2],
                "LeaseExpiresAt": row[3],
                "Message": {
                    "MessageID": row[5],
                    "Payload": bytes(row[6]).decode(errors="replace"),
                    "ContentType": row[7],
                    "Headers": {},
                },
            }
            for row in rows
        ]
        pending = int(rows[0][-1]) if rows else 0
        await _answer(send, 200, orjson.dumps({"Jobs": jobs, "Pending": pending}), JSON)

    async def ack(self, consumer_pk: int, job_id: int, send: Send) -> None:
        rows = await self.db.run_alone(
            ACK["pk", True],
            {"consumer_pk": consumer_pk, "consumer_type": "pull", "id": job_id, "attempt": None},
        )
        await _answer(send, 202 if rows else 409)

    async def ack_many(self, consumer_pk: int, body: bytes, send: Send) -> None:
        acks = orjson.loads(body)["acks"]
        rows = await self.db.run_alone(
            ACK["pk", False],
            {
                "consumer_pk": consumer_pk,
                "consumer_type": "pull",
                "ids": int_array([int(a["id"]) for a in acks]),
                "attempts": int_array([a.get("attempt") for a in acks]),
            },
        )
        done = {row[0] for row in rows}
        results = [
            {"id": str(a["id"]), "status": 202 if int(a["id"]) in done else 409, "detail": ""}
            for a in acks
        ]
        await _answer(send, 200, orjson.dumps({"Results": results}), JSON)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.load()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.db.dispose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--config", required=True, help="the broker's config file")
    config = load_config(parser.parse_args().config)
    uvicorn.Server(uvicorn.Config(Floor(config), **server_options(config))).run()


if __name__ == "__main__":
    main()
