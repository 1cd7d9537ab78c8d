"""A minimal leafnode connection to a NATS server, over asyncio streams.

Why: a client connection may not publish with a `$JS.ACK.` reply subject (nats-server refuses
it since 2.8), but a leafnode connection may. Over this link the bridge delivers jobs to the
requesters' inboxes with JetStream ack subjects, receives the acks, and hears which inboxes
have subscribers (the hub announces every subscription with `LS+` and its end with `LS-`).

The protocol, as nats-server 2.15 speaks it (protocol doc section 11):
    hub    -> INFO {...}
    bridge -> CONNECT {...}, PING; hub -> PONG (or -ERR)
    either -> PING / PONG
    bridge -> LS+ <subject> [<queue> <weight>]
    hub    -> LS+ <subject> [<queue> <weight>] / LS- <subject> [<queue>]
    either -> LMSG <subject> [<reply> | + <reply> <queues...> | | <queues...>] <size>
              HMSG <subject> [...same...] <header size> <total size>
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import ParseResult, unquote, urlparse

from app.bridge.protocol import encode_message

log = logging.getLogger(__name__)

# An inbound message: subject, reply (or None), header block (or None), payload.
MessageHandler = Callable[[str, str | None, bytes | None, bytes], None]
InterestHandler = Callable[[str, bool], None]
StateHandler = Callable[[bool], None]

MAX_LINE = 64 * 1024
# Inboxes whose subscriber went away, remembered so late deliveries to them are not sent.
GONE_MEMORY = 50_000


@dataclass(frozen=True, slots=True)
class LeafCredentials:
    user: str = ""
    password: str = ""
    token: str = ""


class LeafError(Exception):
    """The hub refused the connection or sent something unreadable."""


def parse_message_args(args: Sequence[str], with_header: bool) -> tuple[str, str | None, int, int]:
    """(subject, reply, header size, total size) of the arguments of an LMSG/HMSG line."""
    sizes = 2 if with_header else 1
    if len(args) < 1 + sizes:
        raise LeafError(f"bad message arguments {' '.join(args)!r}")
    subject = args[0]
    middle = args[1 : len(args) - sizes]
    reply: str | None = None
    if len(middle) == 1:
        reply = middle[0]
    elif len(middle) > 1:
        if middle[0] == "+":
            reply = middle[1]
        elif middle[0] != "|":
            raise LeafError(f"bad reply indicator in {' '.join(args)!r}")
    try:
        total = int(args[-1])
        header = int(args[-2]) if with_header else 0
    except ValueError:
        raise LeafError(f"bad sizes in {' '.join(args)!r}") from None
    if total < 0 or header < 0 or header > total:
        raise LeafError(f"bad sizes in {' '.join(args)!r}")
    return subject, reply, header, total


class LeafLink:
    """Keeps one leafnode connection up (reconnecting with backoff) and multiplexes it."""

    def __init__(
        self,
        url: str,
        *,
        name: str,
        credentials: LeafCredentials,
        subscriptions: Sequence[tuple[str, str | None]],
        on_message: MessageHandler,
        on_interest: InterestHandler,
        on_state: StateHandler,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._urls = [u.strip() for u in url.split(",") if u.strip()]
        self._name = name
        self._credentials = credentials
        self._subscriptions = list(subscriptions)
        self._on_message = on_message
        self._on_interest = on_interest
        self._on_state = on_state
        # None: the system's CAs, if the URL or the hub asks for TLS.
        self._tls = tls
        self._writer: asyncio.StreamWriter | None = None
        # Messages sent since the last write: written together once the caller yields (a
        # write each cost a system call per delivery, a fifth of the bridge's time).
        self._pending: list[bytes] = []
        self._write_soon: asyncio.Handle | None = None
        self._interest: set[str] = set()
        self._gone: OrderedDict[str, None] = OrderedDict()
        # Queue groups subscribed on the hub, by subject (a push consumer's deliver group): a
        # message from a leafnode reaches a queue group only if its LMSG names it.
        self._queues: dict[str, set[str]] = {}
        self.connected = asyncio.Event()
        self.connects = 0

    # -- outbound ---------------------------------------------------------------------------

    def ready(self) -> bool:
        return self._writer is not None and self.connected.is_set()

    def send(self, subject: str, reply: str | None, header: bytes | None, payload: bytes) -> None:
        if self._writer is None or not self.connected.is_set():
            return
        queues = self._queues.get(subject)
        if queues:
            names = " ".join(sorted(queues))
            subject = f"{subject} + {reply} {names}" if reply else f"{subject} | {names}"
            reply = None
        self._pending.append(encode_message("LMSG", subject, reply, header, payload))
        if self._write_soon is None:
            self._write_soon = asyncio.get_running_loop().call_soon(self._write_pending)

    def _write_pending(self) -> None:
        if self._write_soon is not None:
            self._write_soon.cancel()
            self._write_soon = None
        pending, self._pending = self._pending, []
        writer = self._writer
        if pending and writer is not None and not writer.is_closing():
            writer.writelines(pending)

    async def flush(self) -> None:
        self._write_pending()
        writer = self._writer
        if writer is not None:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()

    def interest(self, subject: str) -> bool | None:
        if subject in self._interest or subject in self._queues:
            return True
        if subject in self._gone:
            return False
        return None

    # -- connection life cycle ----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        delay = 0.05
        attempt = 0
        while not stop.is_set():
            url = self._urls[attempt % len(self._urls)]
            attempt += 1
            try:
                await self._session(url, stop)
                delay = 0.05
            except (OSError, LeafError, asyncio.IncompleteReadError) as exc:
                log.warning("leafnode link to %s lost (%s); reconnecting", _redact(url), exc)
            finally:
                self._drop_session()
            if stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
            delay = min(delay * 2, 2.0)

    def _drop_session(self) -> None:
        was_up = self.connected.is_set()
        self.connected.clear()
        writer, self._writer = self._writer, None
        self._write_pending()  # drops what the closed session had not written
        if writer is not None:
            writer.close()
        self._interest.clear()
        self._queues.clear()
        if was_up:
            self._on_state(False)

    async def _session(self, url: str, stop: asyncio.Event) -> None:
        parsed = urlparse(url if "://" in url else f"nats://{url}")
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 7422
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=MAX_LINE * 16), timeout=5
        )
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout=5)
            if not line.startswith(b"INFO "):
                raise LeafError(f"expected INFO, got {line[:60]!r}")
            info = json.loads(line[5:])
            if parsed.scheme == "tls" or info.get("tls_required"):
                await self._start_tls(writer, host, bool(info.get("tls_required")))
            writer.write(self._connect_line(parsed).encode() + b"PING\r\n")
            await writer.drain()
            await self._await_pong(reader, writer)
            for subject, queue in self._subscriptions:
                suffix = f" {queue} 1" if queue else ""
                writer.write(f"LS+ {subject}{suffix}\r\n".encode())
            writer.write(b"PING\r\n")
            await writer.drain()
            self._writer = writer
            self.connects += 1
            self.connected.set()
            self._on_state(True)
            log.info("leafnode link up to %s:%s", host, port)
            reading = asyncio.ensure_future(self._read_loop(reader, writer))
            stopping = asyncio.ensure_future(stop.wait())
            try:
                done, _ = await asyncio.wait(
                    {reading, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                if reading in done:
                    reading.result()
            finally:
                for task in (reading, stopping):
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reading
        finally:
            self._write_pending()
            writer.close()

    async def _start_tls(self, writer: asyncio.StreamWriter, host: str, offered: bool) -> None:
        # The hub sends its INFO in the clear and then waits for the handshake; a tls:// URL
        # whose hub does not offer TLS is refused rather than spoken to in the clear.
        if not offered:
            raise LeafError("leaf-url says tls:// but the hub's leafnode port does not offer TLS")
        context = self._tls or ssl.create_default_context()
        await asyncio.wait_for(writer.start_tls(context, server_hostname=host), timeout=5)

    def _connect_line(self, parsed: ParseResult) -> str:
        options: dict[str, object] = {
            "name": self._name,
            "headers": True,
            "protocol": 1,
            "compress_mode": "off",
            "verbose": False,
            "pedantic": False,
        }
        user = unquote(parsed.username or "")
        password = unquote(parsed.password or "")
        creds = self._credentials
        if user and password:
            options["user"], options["pass"] = user, password
        elif user:  # nats://<token>@host
            options["auth_token"] = user
        elif creds.user:
            options["user"], options["pass"] = creds.user, creds.password
        elif creds.token:
            options["auth_token"] = creds.token
        return "CONNECT " + json.dumps(options, separators=(",", ":")) + "\r\n"

    async def _await_pong(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout=5)
            if line.startswith(b"PONG"):
                return
            if line.startswith(b"-ERR"):
                raise LeafError(line.decode(errors="replace").strip())
            if line.startswith(b"PING"):
                writer.write(b"PONG\r\n")
            # INFO updates and interest arriving early are handled by the read loop's rules.
            elif line.startswith((b"LS+", b"LS-")):
                self._interest_line(line.decode(errors="replace").strip())

    async def _read_loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            line = await reader.readuntil(b"\r\n")
            op, _, rest = line.rstrip(b"\r\n").partition(b" ")
            if op in (b"LMSG", b"HMSG"):
                args = rest.decode(errors="replace").split()
                subject, reply, header_size, total = parse_message_args(args, op == b"HMSG")
                data = await reader.readexactly(total + 2)
                header = data[:header_size] if op == b"HMSG" else None
                payload = data[header_size:total]
                try:
                    self._on_message(subject, reply, header, payload)
                except Exception:
                    log.exception("leafnode message handler failed for %s", subject)
            elif op == b"PING":
                writer.write(b"PONG\r\n")
            elif op in (b"LS+", b"LS-"):
                self._interest_line(line.decode(errors="replace").strip())
            elif op == b"-ERR":
                text = line.decode(errors="replace").strip()
                log.warning("leafnode hub says %s", text)
                if "Permissions Violation" not in text:
                    raise LeafError(text)
            # INFO updates, PONG and +OK need nothing.

    def _interest_line(self, line: str) -> None:
        # Inboxes are plain subscriptions: queue interest (`LS+ subj queue weight`) is not ours
        # to track. The hub announces a plain subject once and withdraws it once.
        parts = line.split()
        if len(parts) in (3, 4) and not parts[1].startswith(("$LDS.", "$SYS.")):
            self._queue_line(parts)
            return
        if len(parts) != 2 or parts[1].startswith(("$LDS.", "$SYS.")):
            return
        subject = parts[1]
        if parts[0] == "LS+":
            self._interest.add(subject)
            self._gone.pop(subject, None)
            return
        self._interest.discard(subject)
        self._gone[subject] = None
        if len(self._gone) > GONE_MEMORY:
            self._gone.popitem(last=False)
        self._on_interest(subject, False)

    def _queue_line(self, parts: list[str]) -> None:
        """`LS+ <subject> <queue> <weight>` / `LS- <subject> <queue>`: the hub's weight is how
        many members it has; the group is named while it has any."""
        subject, queue = parts[1], parts[2]
        members = int(parts[3]) if parts[0] == "LS+" and len(parts) == 4 else 0
        groups = self._queues.setdefault(subject, set())
        if members > 0:
            groups.add(queue)
        else:
            groups.discard(queue)
        if not groups:
            del self._queues[subject]


def _redact(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url
