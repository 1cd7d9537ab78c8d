"""A minimal HTTP/1.1 keep-alive client on asyncio streams, for load generation.

httpx spends more CPU per request than the broker's own parser does; on a 2-core machine every
cycle the client burns is taken from the broker or PostgreSQL. This client does only what the
load generators need: one persistent connection, one request at a time, Content-Length or
chunked bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any


class HttpError(Exception):
    """The connection broke or the server answered something this client cannot parse."""


class Response:
    __slots__ = ("body", "status")

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One keep-alive connection to 127.0.0.1:port; reconnects after the server closes it."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> Response:
        if self._writer is None:
            await self._connect()
        assert self._reader is not None and self._writer is not None
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}")
        if body or method in ("POST", "PUT"):
            head.append(f"Content-Length: {len(body)}")
        self._writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        try:
            return await self._read_response()
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self.close()
            raise HttpError(f"{method} {path}: connection lost ({exc})") from exc

    async def post_json(
        self, path: str, payload: object, headers: dict[str, str] | None = None
    ) -> Response:
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        return await self.request("POST", path, all_headers, json.dumps(payload).encode())

    async def _read_response(self) -> Response:
        assert self._reader is not None
        raw = await self._reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            raise HttpError(f"bad status line {lines[0]!r}") from None
        length: int | None = None
        chunked = False
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            lowered = name.strip().lower()
            if lowered == "content-length":
                length = int(value.strip())
            elif lowered == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif lowered == "connection" and value.strip().lower() == "close":
                close = True
        if chunked:
            body = await self._read_chunked()
        elif length is not None:
            body = await self._reader.readexactly(length) if length else b""
        else:
            body = await self._reader.read()
            close = True
        if close:
            await self.close()
        return Response(status, body)

    async def _read_chunked(self) -> bytes:
        assert self._reader is not None
        parts: list[bytes] = []
        while True:
            size_line = await self._reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await self._reader.readexactly(size))
            await self._reader.readexactly(2)
