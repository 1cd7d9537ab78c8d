"""A receiver cannot make the dispatcher hold more than [push] max-response-bytes of its answer:
a 1 GiB gzip bomb is neither inflated nor read (the RSS of the process that delivers stays
within 50 MiB), an endless body does not hold the delivery until its timeout, and what a job's
last error keeps of an answer is short and printable."""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.config import Config
from app.dispatch.http import Poster
from tests.helpers.push import broker, publish, setup_push, wait_for_status

GIB = 1 << 30
MIB = 1 << 20


def gzip_bomb(size: int = GIB) -> bytes:
    """One gzip member that inflates to ``size`` zero bytes (about 1 MiB for 1 GiB): a deflate
    stream flushed whole after each MiB repeats the same block, so it is made in a moment."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    zeros = bytes(MIB)
    block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size // MIB):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = struct.pack("<II", crc, size & 0xFFFFFFFF)
    return header + block * (size // MIB) + deflate.flush() + trailer


@dataclass
class Answering:
    """A raw HTTP/1.1 server on loopback whose answer's body comes from ``body()``, chunked."""

    url: str = ""
    head: bytes = b""  # the answer's status line and headers
    body: Callable[[], Iterator[bytes]] = lambda: iter(())
    requests: list[dict[str, str]] = field(default_factory=list)


@contextmanager
def answering(head: bytes, body: Callable[[], Iterator[bytes]]) -> Iterator[Answering]:
    server = Answering(head=head, body=body)
    sock = socket.create_server(("127.0.0.1", 0))
    server.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            raw_head, _, rest = data.partition(b"\r\n\r\n")
            lines = raw_head.decode("latin-1").split("\r\n")[1:]
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)
            }
            server.requests.append(headers)
            length = int(headers.get("content-length", "0"))
            while len(rest) < length:
                rest += conn.recv(65536)
            try:
                conn.sendall(server.head + b"Transfer-Encoding: chunked\r\n\r\n")
                for chunk in server.body():
                    if stop.is_set():
                        return
                    conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                conn.sendall(b"0\r\n\r\n")
            except OSError:
                return  # the client went away: what it should do

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, name="answering", daemon=True).start()
    try:
        yield server
    finally:
        stop.set()
        sock.close()


def rss() -> int:
    """This process's resident set, in bytes."""
    status = Path("/proc/self/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match is not None
    return int(match.group(1)) * 1024


@contextmanager
def peak_rss() -> Iterator[list[int]]:
    """The highest RSS seen (every 5 ms) while the block runs: peak[0]."""
    peak = [rss()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], rss())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()
        peak[0] = max(peak[0], rss())


def in_pieces(data: bytes, size: int = 64 * 1024) -> Callable[[], Iterator[bytes]]:
    return lambda: (data[i : i + size] for i in range(0, len(data), size))


async def test_a_gzip_bomb_is_neither_inflated_nor_read() -> None:
    bomb = gzip_bomb()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Encoding: gzip\r\n"
    plain = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
    with answering(head, in_pieces(bomb)) as receiver, answering(plain, in_pieces(b"ok")) as ok:
        # The timeout leaves time to inflate all of it, as the dispatcher used to.
        poster = Poster(30, 4)  # [push] max-response-bytes at its default, 64 KiB
        try:
            # A first delivery, so that what any delivery needs (threads, buffers) is there.
            assert (await poster.post(ok.url + "/warm", b"x", {})).status == 200
            before = rss()
            with peak_rss() as peak:
                answer = await poster.post(receiver.url + "/bomb", b"x", {})
        finally:
            await poster.close()
    assert answer.status == 200, answer
    grew = peak[0] - before
    assert grew < 50 * MIB, f"the delivery's process grew by {grew / MIB:.0f} MiB"
    # Nothing asked for a compressed answer either.
    assert all("accept-encoding" not in headers for headers in receiver.requests)


async def test_an_endless_body_does_not_hold_the_delivery() -> None:
    def endless() -> Iterator[bytes]:
        while True:
            yield b"z" * 65536

    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
    with answering(head, endless) as receiver:
        poster = Poster(20, 4)
        try:
            started = time.monotonic()
            answer = await poster.post(receiver.url + "/endless", b"x", {})
            took = time.monotonic() - started
        finally:
            await poster.close()
    assert answer.status == 200, answer
    # Far inside the 20 s timeout: read up to the cap, then hung up on.
    assert took < 5, took


async def test_a_header_the_client_cannot_send_is_a_refused_delivery_not_an_exception() -> None:
    """Ids and tokens stored before they were checked as header values (a line break in a
    token): the delivery is recorded as failed, where the exception used to escape the task
    and leave the job in flight until its lease lapsed, over and over."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"
    with answering(head, lambda: iter(())) as receiver:
        poster = Poster(5, 4)
        try:
            answer = await poster.post(receiver.url + "/x", b"x", {"X-Token": "a\nb"})
        finally:
            await poster.close()
    assert answer.refused and answer.status is None
    assert answer.error is not None and "\n" not in answer.error
    assert receiver.requests == []


@pytest.fixture
def extra_config() -> str:
    return (
        "[broker]\nmax-retry=0\nretry-backoff-delays-in-seconds=1\n"
        "rational-delay-in-seconds=1\nmax-workers=4\n"
        "[consumer-connection]\nconnection-timeout-in-seconds=5\n"
    )


async def test_a_failed_answer_is_kept_short_and_printable(config: Config) -> None:
    """A 500 whose body carries terminal escapes, control characters, invalid UTF-8 and a
    megabyte more: the job's last error keeps its printable start only."""
    nasty = b"\x1b[31mdenied\x1b[0m\r\n\x00\x07\xff\xfe\xe2\x9c\x93 ok " + b"y" * MIB
    head = b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
    with answering(head, in_pieces(nasty)) as receiver:
        async with broker(config, sweeper=True, dispatcher=True) as http:
            await setup_push(http, receiver.url + "/hook")
            await publish(http, b"x", "m-1")
            job = await wait_for_status(http, "m-1", "DEAD")
    error = str(job["LastError"])
    assert error.startswith("HTTP 500: "), error
    assert len(error) < 300, len(error)
    assert error.isprintable(), error
    assert "\\x1b[31mdenied\\x1b[0m\\r\\n\\x00\\x07\\xff\\xfe✓ ok yyy" in error, error
