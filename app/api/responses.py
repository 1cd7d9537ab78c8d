"""The responses routes return: JSON (Starlette's, encoded by orjson: a pull of 100 jobs spent
a twentieth of the API's time in the standard library's encoder), and a streaming pull's
NDJSON body."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.responses import JSONResponse as StarletteJSONResponse
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.api import views
from app.services.streaming import PullStream, StreamEnd


class JSONResponse(StarletteJSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class NdjsonStream(Response):
    """A streaming pull's body: one JSON line per event, written as the scheduler hands them
    out, ending with the status line. The client's going away is noticed from `receive`
    (an `http.disconnect`) even while nothing is being written, so its jobs go back at once."""

    media_type = "application/x-ndjson"

    def __init__(self, stream: PullStream) -> None:
        # Not Response.__init__: that gives the (empty) body a content-length.
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-store"})
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = self._stream
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        watcher = asyncio.create_task(_disconnected(receive))
        try:
            while True:
                taking = asyncio.ensure_future(stream.events())
                await asyncio.wait({taking, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not taking.done():
                    taking.cancel()
                    return
                events = taking.result()
                body = b"".join(views.stream_line(event) for event in events)
                await send({"type": "http.response.body", "body": body, "more_body": True})
                if isinstance(events[-1], StreamEnd):
                    await send({"type": "http.response.body", "body": b""})
                    stream.finished()
                    return
        except OSError:  # the server's way of saying the client went away while writing
            return
        finally:
            watcher.cancel()
            await asyncio.shield(stream.close())


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
