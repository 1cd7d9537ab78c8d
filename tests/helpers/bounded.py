"""A real `serve` process on SQLite with the channel `orders` and the pull consumer `workers`,
and raw-socket senders that count what a server reads of a body: the bounded-input tests and
the gateway HMAC tests both measure with them."""

from __future__ import annotations

import selectors
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import fresh_database
from tests.helpers.processes import BrokerProcess

GIB = 1 << 30
MESSAGE_CAP = 262_144  # [broker] max-message-size-bytes of the process
FRAME = 65_536
# What the kernels hold between the client's send() and the server's read(): the client's
# send buffer (set small below) and the server's receive buffer (autotuned; it grows with what
# the server reads, so barely for a body it leaves unread). Data the server never read.
KERNEL_SLACK = 4 << 20
# The server process's own reads besides the body (what uvicorn buffers before the route asks
# for the body, the request head, its database file).
READ_SLACK = 512 << 10

SEED = """
[broker]
max-message-size-bytes={message_cap}
[initial-channels]
orders=Orders
[initial-channel-tokens]
orders=orders-token
[initial-producers]
shop=Shop
[initial-producer-tokens]
shop=shop-token
[initial-consumers]
workers=
[workers]
token=workers-token
channel=orders
type=pull
"""


def start_process(sqlite_template: Path, workdir: Path, http: str) -> BrokerProcess:
    config = workdir / "broker.cfg"
    section = fresh_database("sqlite", None, sqlite_template)
    config.write_text(section + SEED.format(message_cap=MESSAGE_CAP))
    process = BrokerProcess(config)  # appends [http] listener=...
    config.write_text(config.read_text() + http)
    process.start()
    return process


def server_reads(process: BrokerProcess) -> int:
    """Bytes the process has read by read()/recv() so far (/proc/<pid>/io rchar)."""
    assert process.process is not None
    for line in Path(f"/proc/{process.process.pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@dataclass
class Outcome:
    sent: int  # body bytes the client's kernel accepted before the answer or the close
    status: int | None
    text: str


def send_endless(port: int, head: str, *, chunked: bool, give_up: int) -> Outcome:
    """Send `head` and then a 1 GiB body made as it goes (chunked, or with Content-Length),
    until the server answers or closes, or `give_up` bytes were sent."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {GIB}"
    payload = b"x" * FRAME
    frame = b"%x\r\n%s\r\n" % (FRAME, payload) if chunked else payload
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, FRAME)
    sock.sendall(f"{head}\r\n{framing}\r\n\r\n".encode())
    sock.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    sent, received, pending = 0, bytearray(), memoryview(b"")
    sending, closed = True, False
    deadline = time.monotonic() + 60
    try:
        while not closed and time.monotonic() < deadline and not _complete(received):
            for _, mask in selector.select(timeout=0.5):
                if mask & selectors.EVENT_READ:
                    try:
                        data = sock.recv(FRAME)
                    except ConnectionResetError:
                        data = b""
                    closed = not data
                    received += data
                if sending and mask & selectors.EVENT_WRITE:
                    if not pending:
                        pending = memoryview(frame)
                    try:
                        taken = sock.send(pending)
                    except (BrokenPipeError, ConnectionResetError):
                        taken, sending = 0, False
                    sent += taken
                    pending = pending[taken:]
                    if sent >= give_up:
                        sending = False
                    if not sending:
                        selector.modify(sock, selectors.EVENT_READ)
                        # An answer comes soon after the body stops, or never.
                        deadline = min(deadline, time.monotonic() + 5)
    finally:
        selector.close()
        sock.close()
    status, text = _parse(bytes(received))
    return Outcome(sent, status, text)


def _complete(received: bytearray) -> bool:
    head, sep, body = bytes(received).partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def _parse(received: bytes) -> tuple[int | None, str]:
    head, sep, body = received.partition(b"\r\n\r\n")
    if not sep:
        return None, ""
    return int(head.split(b" ", 2)[1]), body.decode(errors="replace")
