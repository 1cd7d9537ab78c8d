"""Push receiver process: `python -m bench.receiver PORT [SECONDS]`.

A minimal HTTP/1.1 keep-alive server on 127.0.0.1 that answers every request 200 with an
empty body and counts what it got. It exits after SECONDS (a bound, default one hour) or on
SIGTERM, printing its counts as one JSON line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class Counts:
    requests = 0
    connections = 0


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    Counts.connections += 1
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:].strip())
            if length:
                await reader.readexactly(length)
            Counts.requests += 1
            writer.write(OK)
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def serve(port: int, seconds: float) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    server.close()
    print(json.dumps({"requests": Counts.requests, "connections": Counts.connections}))


def main() -> None:
    port = int(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3600.0
    try:
        import uvloop

        uvloop.run(serve(port, seconds))
    except ImportError:
        asyncio.run(serve(port, seconds))


if __name__ == "__main__":
    main()
