"""The JetStream pull wire grammar the bridge speaks, free of I/O.

Pull request bodies (`$JS.API.CONSUMER.MSG.NEXT`), status header blocks, the ack reply subject,
ack payloads, Go durations, and the JSON documents of the JetStream API, exactly as nats-server
2.15 writes them (see shared/protocol/nats-jetstream-pull.md, sections 4 to 9).
"""

from __future__ import annotations

import enum
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from app.domain.models import StreamState
from app.domain.nats_consumers import go_json_kind
from app.domain.nats_consumers import subject_matches as subject_matches
from app.domain.priority import (
    NO_PRIORITY,
    NO_TERMS,
    PriorityPolicy,
    PrioritySettings,
    PullPriority,
)
from app.domain.pulls import MIN_HEARTBEAT_SECONDS

NANOS = 1_000_000_000
MIN_HEARTBEAT_NANOS = round(MIN_HEARTBEAT_SECONDS * NANOS)
HEADER_LINE = b"NATS/1.0"
CRLF = b"\r\n"

# -- status codes and their exact descriptions --------------------------------------------------

HEARTBEAT = (100, "Idle Heartbeat")
NO_MESSAGES = (404, "No Messages")
REQUEST_TIMEOUT = (408, "Request Timeout")
EXCEEDED_MAX_WAITING = (409, "Exceeded MaxWaiting")
MESSAGE_SIZE_EXCEEDS = (409, "Message Size Exceeds MaxBytes")
BATCH_COMPLETED = (409, "Batch Completed")
CONSUMER_DELETED = (409, "Consumer Deleted")
PUSH_BASED = (409, "Consumer is push based")
PIN_ID_MISMATCH = (423, "Nats-Pin-Id mismatch")
WRONG_PIN_ID = (423, "Nats-Wrong-Pin-Id")


class BadRequest(ValueError):
    """A pull request the server answers with `400 Bad Request - <detail>`."""

    @property
    def description(self) -> str:
        return f"Bad Request - {self}"


# -- Go durations -------------------------------------------------------------------------------

_UNITS: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": NANOS,
    "m": 60 * NANOS,
    "h": 3600 * NANOS,
}
_MAX_INT64 = 2**63 - 1
_DURATION_PART = re.compile(r"(\d*)(?:\.(\d*))?([^\d.]+)")


def parse_go_duration(text: str) -> int:
    """Nanoseconds of a Go duration string such as `300ms`, `1h2m3.5s` or `-1.5us`."""
    raw = text
    if not text:
        raise ValueError(f"time: invalid duration {raw!r}")
    sign = 1
    if text[0] in "+-":
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    if text == "0":
        return 0
    if not text:
        raise ValueError(f"time: invalid duration {raw!r}")
    total = 0
    pos = 0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise ValueError(f"time: invalid duration {raw!r}")
        whole, fraction, unit = match.group(1), match.group(2), match.group(3)
        if not whole and not fraction:
            raise ValueError(f"time: invalid duration {raw!r}")
        scale = _UNITS.get(unit)
        if scale is None:
            if not unit:
                raise ValueError(f"time: missing unit in duration {raw!r}")
            raise ValueError(f"time: unknown unit {unit!r} in duration {raw!r}")
        total += int(whole or "0") * scale
        if fraction:
            total += int(fraction) * scale // 10 ** len(fraction)
        pos = match.end()
    if total > _MAX_INT64 + (sign < 0):
        raise ValueError(f"time: invalid duration {raw!r}")  # Go: overflow is an error
    return sign * total


def _fraction(value: int, unit: int) -> str:
    whole, rest = divmod(value, unit)
    if rest == 0:
        return str(whole)
    digits = str(rest).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def format_go_duration(nanos: int) -> str:
    """Go's time.Duration.String(): `0s`, `1.5ms`, `5m0s`, `1h0m30s`."""
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    value = abs(nanos)
    if value < 1_000:
        return f"{sign}{value}ns"
    if value < 1_000_000:
        return f"{sign}{_fraction(value, 1_000)}\u00b5s"
    if value < NANOS:
        return f"{sign}{_fraction(value, 1_000_000)}ms"
    seconds, rest = divmod(value, NANOS)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    text = f"{_fraction(seconds * NANOS + rest, NANOS)}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    if minutes:
        return f"{sign}{minutes}m{text}"
    return f"{sign}{text}"


# -- pull request bodies ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PullSpec:
    """One parsed MSG.NEXT body; durations in nanoseconds, 0 meaning "not set"."""

    batch: int = 1
    expires: int = 0
    no_wait: bool = False
    max_bytes: int = 0
    heartbeat: int = 0
    is_json: bool = False
    # A JSON request without a batch (or with 0) is served one job, but its pending headers
    # count from 0, as nats-server's do.
    batch_unset: bool = False
    terms: PullPriority = NO_TERMS  # priority group fields (none unless the body is JSON)


# Field name -> Go type, as in nats-server's JSApiConsumerGetNextRequest.
_NEXT_FIELDS: dict[str, str] = {
    "expires": "time.Duration",
    "batch": "int",
    "max_bytes": "int",
    "no_wait": "bool",
    "idle_heartbeat": "time.Duration",
    "group": "string",
    "min_pending": "int64",
    "min_ack_pending": "int64",
    "id": "string",
    "priority": "int",
}
# nats-server 2.15.1 reports type errors as "Go struct field .batch of type int": the request
# is decoded into an anonymous wrapper, so the struct name before the dot is empty (observed).
_NEXT_STRUCT = ""
_INT_RE = re.compile(r"^[+-]?\d+$")


def parse_pull_request(body: bytes) -> PullSpec:
    """Read a MSG.NEXT body as the server does: empty, an integer, or a JSON object."""
    text = body.strip()
    if not text:
        return PullSpec()
    if text[:1] != b"{":
        try:
            decoded = text.decode("ascii")
        except UnicodeDecodeError:
            return PullSpec()
        if _INT_RE.match(decoded) and len(decoded) <= 20:  # (int() refuses 4,300 digits)
            number = int(decoded)
            if -_MAX_INT64 - 1 <= number <= _MAX_INT64:
                return PullSpec(batch=max(number, 1))
        return PullSpec()  # not an integer strconv.Atoi reads (past int64 too): a batch of one
    values = _decode_go_object(text, _NEXT_STRUCT, _NEXT_FIELDS)
    batch = int(values.get("batch") or 0)
    expires = int(values.get("expires") or 0)
    heartbeat = int(values.get("idle_heartbeat") or 0)
    if heartbeat > 0 and heartbeat * 2 > expires:
        raise BadRequest("heartbeat value too large")
    if 0 < heartbeat < MIN_HEARTBEAT_NANOS:
        # The HTTP streaming pull's minimum: nats-server has none, but a heartbeat every few
        # nanoseconds would have the bridge publish nothing else.
        raise BadRequest(f"heartbeat value too small (minimum {MIN_HEARTBEAT_SECONDS:g}s)")
    # The server sets an expiry for any non-zero duration: a negative one has already passed
    # (a no_wait request then ends with 408, not 404). 1 ns is the nearest "set" value.
    expires = max(expires, 1) if expires else 0
    return PullSpec(
        batch=max(batch, 1),
        expires=expires,
        no_wait=bool(values.get("no_wait") or False),
        max_bytes=max(int(values.get("max_bytes") or 0), 0),
        heartbeat=max(heartbeat, 0),
        is_json=True,
        batch_unset=batch <= 0,
        terms=PullPriority(
            group=str(values.get("group") or "") or None,
            min_pending=int(values.get("min_pending") or 0),
            min_ack_pending=int(values.get("min_ack_pending") or 0),
            pin_id=str(values.get("id") or "") or None,
            priority=int(values.get("priority") or 0),
        ),
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


class _FloatLiteral(float):
    """A JSON number with a fraction or an exponent, with its text (Go quotes the text)."""

    text: str


def _float_literal(text: str) -> float:
    value = _FloatLiteral(text)
    value.text = text
    return value


def _go_json_error(exc: json.JSONDecodeError) -> str:
    """The message Go's encoding/json gives for the same syntax error."""
    doc, pos = exc.doc, exc.pos
    if pos >= len(doc) or exc.msg.startswith("Unterminated string"):
        return "unexpected end of JSON input"
    char = doc[pos]
    quoted = _go_quote_char(char)
    if exc.msg.startswith("Invalid control character"):
        return f"invalid character {quoted} in string"
    context = {
        "Expecting property name enclosed in double quotes": (
            "looking for beginning of object key string"
        ),
        "Expecting ':' delimiter": "after object key",
        "Expecting ',' delimiter": "after object key:value pair",
        "Expecting value": "looking for beginning of value",
        "Extra data": "after top-level value",
    }.get(exc.msg, "looking for beginning of value")
    if context == "after object key:value pair" and _inside_array(doc, pos):
        context = "after array element"
    return f"invalid character {quoted} {context}"


_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
}


def _go_quote_char(char: str) -> str:
    """encoding/json's quoteChar: `'x'`, with control characters escaped as strconv.Quote
    writes them (`'\\x00'`, `'\\n'`)."""
    if char == "'":
        return "'\\''"
    if char == '"':
        return "'\"'"
    if char in _GO_ESCAPES:
        return f"'{_GO_ESCAPES[char]}'"
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"'\\x{ord(char):02x}'"
    return f"'{char}'"


def _inside_array(doc: str, pos: int) -> bool:
    depth: list[str] = []
    in_string = escaped = False
    for char in doc[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth.append(char)
        elif char in "]}" and depth:
            depth.pop()
    return bool(depth) and depth[-1] == "["


def _decode_go_object(
    text: bytes, struct: str, fields: Mapping[str, str]
) -> dict[str, int | bool | str]:
    """json.Unmarshal into a Go struct: field names match case-insensitively, types are checked."""
    try:
        # Go keeps invalid UTF-8 inside strings as U+FFFD instead of refusing the document.
        raw = json.loads(
            text.decode("utf-8", "replace"),
            parse_constant=_reject_constant,
            parse_float=_float_literal,
        )
    except json.JSONDecodeError as exc:
        raise BadRequest(_go_json_error(exc)) from None
    except RecursionError:
        raise BadRequest("exceeded max depth") from None  # Go's limit is 10,000 levels
    except ValueError:
        raise BadRequest("invalid character looking for beginning of value") from None
    if not isinstance(raw, dict):
        raise BadRequest(f"json: cannot unmarshal {go_json_kind(raw)} into Go value")
    values: dict[str, int | bool | str] = {}
    for key, value in raw.items():
        name = key if key in fields else next((f for f in fields if f.lower() == key.lower()), None)
        if name is None or value is None:
            continue
        go_type = fields[name]
        where = f"Go struct field {struct}.{name} of type {go_type}"
        if go_type == "bool":
            if not isinstance(value, bool):
                raise BadRequest(f"json: cannot unmarshal {go_json_kind(value)} into {where}")
        elif go_type == "string":
            if not isinstance(value, str):
                raise BadRequest(f"json: cannot unmarshal {go_json_kind(value)} into {where}")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRequest(f"json: cannot unmarshal {go_json_kind(value)} into {where}")
        elif isinstance(value, float) or not -(2**63) <= value < 2**63:
            literal = value.text if isinstance(value, _FloatLiteral) else json.dumps(value)
            raise BadRequest(f"json: cannot unmarshal number {literal} into {where}")
        values[name] = value
    return values


_NAMES_STRUCT = "JSApiStreamNamesRequest"
_NAMES_FIELDS = {"offset": "int", "subject": "string"}


def parse_stream_names_request(body: bytes, struct: str = _NAMES_STRUCT) -> tuple[str | None, int]:
    """STREAM.NAMES's (or STREAM.LIST's) request: (the subject filter, or None; the offset).
    Read as the server reads it, into its Go struct: a field of the wrong type is a BadRequest
    in Go's words."""
    if not body.strip():
        return None, 0
    values = _decode_go_object(body, struct, _NAMES_FIELDS)
    subject = values.get("subject")
    offset = int(values.get("offset") or 0)
    return (subject if isinstance(subject, str) and subject else None), max(offset, 0)


def parse_page_request(body: bytes) -> int:
    """CONSUMER.NAMES / LIST: the offset, read only from a JSON object or array as nats-server
    reads it (isJSONObjectOrArray); anything else asks for the first page."""
    text = body.strip()
    if text[:1] not in (b"{", b"["):
        return 0
    values = _decode_go_object(text, "JSApiConsumersRequest", {"offset": "int"})
    return max(int(values.get("offset") or 0), 0)


# -- header blocks ------------------------------------------------------------------------------


def _clean(value: str) -> str:
    if "\r" in value or "\n" in value:
        value = value.replace("\r", " ").replace("\n", " ")
    return value.strip()


def status_block(code: int, description: str, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """`NATS/1.0 <code> <description>` plus headers: a header-only status message."""
    lines = [f"NATS/1.0 {code} {description}"]
    lines.extend(f"{name}: {_clean(value)}" for name, value in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def pending_headers(messages: int, byte_count: int) -> list[tuple[str, str]]:
    return [("Nats-Pending-Messages", str(messages)), ("Nats-Pending-Bytes", str(byte_count))]


def heartbeat_block(last_consumer_seq: int, last_stream_seq: int) -> bytes:
    code, description = HEARTBEAT
    return status_block(
        code,
        description,
        [
            ("Nats-Last-Consumer", str(last_consumer_seq)),
            ("Nats-Last-Stream", str(last_stream_seq)),
        ],
    )


_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


@functools.lru_cache(maxsize=1024)
def _token_name(name: str) -> bool:
    # Cached: every message carries the same few names, checked once per delivery otherwise.
    return _HEADER_NAME.match(name) is not None


def message_header_block(headers: Iterable[tuple[str, str]]) -> bytes:
    """`NATS/1.0` and the message's headers (names that are not valid tokens are dropped)."""
    lines = ["NATS/1.0\r\n"]
    for name, value in headers:
        if _token_name(name):
            lines.append(f"{name}: {_clean(value)}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode()


@dataclass(frozen=True, slots=True)
class Status:
    """A status read back from a header block (for tests and tools)."""

    code: int
    description: str
    headers: dict[str, str]


def parse_header_block(block: bytes) -> tuple[Status | None, dict[str, str]]:
    text = block.decode("utf-8", "replace")
    lines = text.split("\r\n")
    first = lines[0]
    if not first.startswith("NATS/1.0"):
        raise ValueError("not a NATS header block")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        headers[name.strip()] = value.strip()
    rest = first[len("NATS/1.0") :].strip()
    if not rest:
        return None, headers
    code_text, _, description = rest.partition(" ")
    return Status(int(code_text), description, headers), headers


# -- ack reply subjects ------------------------------------------------------------------------

DEFAULT_ACK_PREFIX = "$JS.ACK"


class AckToken(NamedTuple):
    """A delivery's ack subject: `<prefix>._.<job id>.<stream>.<consumer>.<delivered>.<sseq>.
    <dseq>.<ts ns>.<pending>`, the form with domain and account-hash tokens (ADR-15) that
    nats-py, @nats-io/jetstream and nats-jetstream all read: no domain (`_`), and the job id
    where nats-server would put an account's hash, which the clients do not use (nats.js
    shows it as `info.account_hash`).

    The stream sequence is the message's position in its channel (its pk); the job travels
    apart, so an ack finds its job by primary key as before, with no index on (consumer,
    message) to keep up on every publish and no look-up before the ack statement. Push and
    AckNone deliveries carry nats-server's form without the two tokens instead
    (server_ack_subject); that form is also how pull deliveries made before an upgrade named
    their job (as the stream sequence)."""

    stream: str
    consumer: str
    delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp: int
    pending: int
    job_id: int
    # Parsed from nats-server's own form (no domain and hash tokens): a push consumer's
    # delivery, whose job is found by its message (job_id is then the stream sequence), or
    # a pull delivery made before an upgrade, whose stream sequence was the job id.
    server_form: bool = False


# No JetStream domain.
NO_DOMAIN = "_"


def ack_subject(prefix: str, token: AckToken) -> str:
    return (
        f"{prefix}.{NO_DOMAIN}.{token.job_id}.{token.stream}.{token.consumer}.{token.delivered}."
        f"{token.stream_seq}.{token.consumer_seq}.{token.timestamp}.{token.pending}"
    )


def server_ack_subject(prefix: str, token: AckToken) -> str:
    """nats-server's own reply form, `<prefix>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.
    <ts ns>.<pending>`, without the job id: for AckNone deliveries (nothing is acknowledged;
    the bridge settles each as it sends it) and push deliveries (an ack finds its job by the
    consumer and the message). nats-py reads a push delivery's sequences from fixed tokens of
    this form (tokens 5 and 6: its ordered consumer, and its check of each idle heartbeat),
    which the form with domain and hash tokens would shift."""
    return (
        f"{prefix}.{token.stream}.{token.consumer}.{token.delivered}.{token.stream_seq}."
        f"{token.consumer_seq}.{token.timestamp}.{token.pending}"
    )


_MAX_INT32 = 2**31 - 1
# Channel and consumer ids are at most 255 characters without NUL (the management API refuses
# others), so an ack naming anything else is for no delivery of ours; it is dropped here rather
# than compared in the database, which refuses a NUL.
_MAX_NAME = 255


def _possible_name(name: str) -> bool:
    return len(name) <= _MAX_NAME and "\x00" not in name


# What nats-server answers a request nobody subscribes to (the client's "no responders").
NO_RESPONDERS = b"NATS/1.0 503\r\n\r\n"


def ack_subject_shaped(prefix: str, subject: str) -> bool:
    """Has the subject the shape of an ack subject under `prefix` (either form: nats-server's
    seven tokens, or the bridge's nine that start with the no-domain token)? Only those reach
    a consumer's ack subscription; others meet nobody, as on nats-server."""
    if not subject.startswith(prefix + "."):
        return False
    rest = subject[len(prefix) + 1 :]
    dots = rest.count(".")
    return dots == 6 or (dots == 8 and rest.startswith(NO_DOMAIN + "."))


def parse_ack_subject(prefix: str, subject: str) -> AckToken | None:
    """The token of an ack subject under `prefix` (see AckToken); None for anything else."""
    if not subject.startswith(prefix + "."):
        return None
    parts = subject[len(prefix) + 1 :].split(".")
    server_form = len(parts) == 7
    if len(parts) == 9 and parts[0] == NO_DOMAIN:
        names, texts = parts[2:4], [*parts[4:], parts[1]]
    elif server_form:
        # nats-server's form: the job is the stream sequence's (see AckToken.server_form).
        names, texts = parts[:2], [*parts[2:], parts[3]]
    else:
        return None
    if not names[0] or not names[1]:
        return None
    try:
        numbers = [int(part) for part in texts]
    except ValueError:
        return None
    if min(numbers) < 0 or numbers[0] < 1 or numbers[1] < 1 or max(numbers) > _MAX_INT64:
        return None
    if numbers[-1] < 1 or numbers[0] > _MAX_INT32:
        return None  # no delivery has this attempt or job
    if not _possible_name(names[0]) or not _possible_name(names[1]):
        return None  # no delivery has these names (see _possible_name)
    delivered, stream_seq, consumer_seq, timestamp, pending, job_id = numbers
    return AckToken(
        names[0],
        names[1],
        delivered,
        stream_seq,
        consumer_seq,
        timestamp,
        pending,
        job_id,
        server_form,
    )


# -- ack payloads -------------------------------------------------------------------------------


class AckKind(enum.StrEnum):
    ACK = "ack"
    NAK = "nak"
    PROGRESS = "progress"
    TERM = "term"
    NEXT = "next"
    UNKNOWN = "unknown"


class AckCommand(NamedTuple):
    kind: AckKind
    delay: float | None = None  # seconds, NAK only
    reason: str | None = None  # TERM only
    next_request: bytes = b""  # NEXT only: the pull request that follows the ack


_PLAIN_ACK = AckCommand(AckKind.ACK)


def parse_ack(body: bytes) -> AckCommand:
    """Ack payload as processAck reads it; an unreadable NAK delay is a plain NAK."""
    if body in (b"", b"+ACK", b"+OK"):
        return _PLAIN_ACK
    if body.startswith(b"+NXT"):
        return AckCommand(AckKind.NEXT, next_request=body[4:].strip())
    if body.startswith(b"-NAK"):
        return AckCommand(AckKind.NAK, delay=_nak_delay(body[4:].strip()))
    if body == b"+WPI":
        return AckCommand(AckKind.PROGRESS)
    if body.startswith(b"+TERM"):
        # Free text kept for people: undecodable bytes and NUL (which PostgreSQL cannot store)
        # become U+FFFD.
        reason = body[5:].strip().decode("utf-8", "replace").replace("\x00", "\ufffd")
        return AckCommand(AckKind.TERM, reason=reason or None)
    return AckCommand(AckKind.UNKNOWN)


def _nak_delay(rest: bytes) -> float | None:
    if not rest:
        return None
    nanos = 0
    if rest[:1] == b"{":
        try:
            decoded = json.loads(rest)
        except (ValueError, RecursionError):
            return None
        delay = decoded.get("delay") if isinstance(decoded, dict) else None
        # Go reads it into an int64 time.Duration: anything else is a bad delay, a plain NAK.
        if isinstance(delay, int) and not isinstance(delay, bool):
            if not -_MAX_INT64 - 1 <= delay <= _MAX_INT64:
                return None
            nanos = delay
    else:
        try:
            nanos = parse_go_duration(rest.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None
    return nanos / NANOS if nanos > 0 else None


# -- subjects -----------------------------------------------------------------------------------

# subject_matches (imported above) lives in the domain, whose consumer management matches
# subjects too.


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some subject matches both patterns (STREAM.NAMES with a wildcard filter)."""
    left, right = a.split("."), b.split(".")
    for index in range(max(len(left), len(right))):
        x = left[index] if index < len(left) else None
        y = right[index] if index < len(right) else None
        if x == ">" or y == ">":
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != y and "*" not in (x, y):
            return False
    return True


# -- JSON documents -----------------------------------------------------------------------------

INFO_TYPE = "io.nats.jetstream.api.v1.consumer_info_response"
CREATE_TYPE = "io.nats.jetstream.api.v1.consumer_create_response"
UNPIN_TYPE = "io.nats.jetstream.api.v1.consumer_unpin_response"
NAMES_TYPE = "io.nats.jetstream.api.v1.stream_names_response"
ACCOUNT_TYPE = "io.nats.jetstream.api.v1.account_info_response"
STREAM_INFO_TYPE = "io.nats.jetstream.api.v1.stream_info_response"
CONSUMER_NAMES_TYPE = "io.nats.jetstream.api.v1.consumer_names_response"
CONSUMER_LIST_TYPE = "io.nats.jetstream.api.v1.consumer_list_response"
DELETE_TYPE = "io.nats.jetstream.api.v1.consumer_delete_response"
STREAM_LIST_TYPE = "io.nats.jetstream.api.v1.stream_list_response"
PAGED_TYPES = frozenset(
    {STREAM_INFO_TYPE, NAMES_TYPE, CONSUMER_NAMES_TYPE, CONSUMER_LIST_TYPE, STREAM_LIST_TYPE}
)
# Page sizes (JSApiNamesLimit, JSApiListLimit).
CONSUMER_NAMES_LIMIT = 1024
CONSUMER_LIST_LIMIT = 256
# The server version the bridge answers as, in a consumer's `_nats.ver` metadata (nats-server
# adds its own to every consumer config it returns).
SERVER_VERSION = "2.15.1"
REQUIRED_LEVEL_KEY = "_nats.req.level"
SERVER_VERSION_KEY = "_nats.ver"
SERVER_LEVEL_KEY = "_nats.level"
# The JetStream API level nats-server 2.15 reports; clients read it to pick the requests they
# may send (2.15.1 answers 5).
API_LEVEL = 5


def rfc3339(moment: datetime) -> str:
    """UTC with a `Z`, as Go prints it (fraction only when non-zero)."""
    utc = moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


def api_error(kind: str, code: int, err_code: int | None, description: str) -> bytes:
    """A JetStream API error; `err_code` is left out for errors JetStream itself has no code for
    (nats-py reads `code` and `description`)."""
    error: dict[str, object] = {"code": code}
    if err_code is not None:
        error["err_code"] = err_code
    error["description"] = description
    document: dict[str, object] = {"type": kind, "error": error}
    if kind in PAGED_TYPES:
        # Responses that embed the server's paging fields carry them beside an error too, and
        # the empty list a paged answer starts from.
        document.update(total=0, offset=0, limit=0)
        if kind in (CONSUMER_NAMES_TYPE, CONSUMER_LIST_TYPE):
            document["consumers"] = []
        elif kind == STREAM_LIST_TYPE:
            document["streams"] = []
    return json.dumps(document, separators=(",", ":")).encode()


def unpin_group(body: bytes) -> str:
    """The group of an UNPIN request (`{"group": ...}`), read as nats-server reads it;
    BadRequest carries the description of its 10025 error."""
    try:
        decoded = json.loads(body.decode("utf-8", "replace"))
    except json.JSONDecodeError as exc:
        raise BadRequest(f"invalid JSON: {_go_json_error(exc)}") from None
    except RecursionError:
        raise BadRequest("invalid JSON: exceeded max depth") from None  # json.Unmarshal's text
    group = decoded.get("group") if isinstance(decoded, dict) else None
    if not isinstance(group, str) or not group:
        raise BadRequest("invalid JSON: consumer group not specified")
    return group


def stream_not_found(kind: str) -> bytes:
    return api_error(kind, 404, 10059, "stream not found")


def consumer_not_found(kind: str) -> bytes:
    return api_error(kind, 404, 10014, "consumer not found")


def account_info(streams: int, consumers: int, api_total: int, api_errors: int) -> bytes:
    """`$JS.API.INFO`, shaped as nats-server 2.15 writes it. Jobs live in the database, not in
    JetStream's memory or files, so those are 0; no limit is set (-1, the server's "none")."""
    document = {
        "type": ACCOUNT_TYPE,
        "memory": 0,
        "storage": 0,
        "reserved_memory": 0,
        "reserved_storage": 0,
        "streams": streams,
        "consumers": consumers,
        "limits": {
            "max_memory": -1,
            "max_storage": -1,
            "max_streams": -1,
            "max_consumers": -1,
            "max_ack_pending": -1,
            "memory_max_stream_bytes": -1,
            "storage_max_stream_bytes": -1,
            "max_bytes_required": False,
        },
        "api": {"level": API_LEVEL, "total": api_total, "errors": api_errors},
    }
    return json.dumps(document, separators=(",", ":")).encode()


# Go's zero time.Time, which the server writes for the timestamps of an empty stream.
GO_ZERO_TIME = "0001-01-01T00:00:00Z"


def stream_info(name: str, view: StreamState, now: datetime) -> bytes:
    """`$JS.API.STREAM.INFO.<stream>`, shaped as nats-server 2.15 writes it: the limits of a
    stream nothing limits (-1, 0: none), file storage, one replica."""
    document: dict[str, object] = {"type": STREAM_INFO_TYPE, "total": 0, "offset": 0, "limit": 0}
    document |= stream_info_document(name, view, now)
    return json.dumps(document, separators=(",", ":")).encode()


def stream_info_document(name: str, view: StreamState, now: datetime) -> dict[str, object]:
    """A StreamInfo (inside STREAM.INFO's answer, or one of STREAM.LIST's streams)."""
    state: dict[str, object] = {
        "messages": view.messages,
        "bytes": view.bytes,
        "first_seq": view.first_seq,
        "first_ts": rfc3339(view.first_at) if view.first_at else GO_ZERO_TIME,
        "last_seq": view.last_seq,
        "last_ts": rfc3339(view.last_at) if view.last_at else GO_ZERO_TIME,
        "consumer_count": view.consumers,
    }
    if view.messages:
        state["num_subjects"] = 1
    return {
        "config": {
            "name": name,
            "subjects": [name],
            "retention": "limits",
            "max_consumers": -1,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "max_msgs_per_subject": -1,
            "max_msg_size": -1,
            "discard": "old",
            "storage": "file",
            "num_replicas": 1,
            "duplicate_window": 120 * NANOS,
            "compression": "none",
            "allow_direct": False,
            "mirror_direct": False,
            "sealed": False,
            "deny_delete": False,
            "deny_purge": False,
            "allow_rollup_hdrs": False,
            "consumer_limits": {},
        },
        "created": rfc3339(view.created),
        "state": state,
        "ts": rfc3339(now),
    }


def stream_names(names: Sequence[str], offset: int = 0, limit: int = 1024) -> bytes:
    page = list(names[offset : offset + limit])
    document = {
        "type": NAMES_TYPE,
        "total": len(names),
        "offset": offset,
        "limit": limit,
        "streams": page or None,  # null when nothing matches, as nats-server writes it
    }
    return json.dumps(document, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class SequenceInfo:
    consumer_seq: int
    stream_seq: int
    last_active: datetime | None = None

    def document(self) -> dict[str, object]:
        out: dict[str, object] = {"consumer_seq": self.consumer_seq, "stream_seq": self.stream_seq}
        if self.last_active is not None:
            out["last_active"] = rfc3339(self.last_active)
        return out


@dataclass(frozen=True, slots=True)
class ConsumerView:
    """What CONSUMER.INFO reports about one pull consumer."""

    stream: str
    name: str
    created: datetime
    ack_wait: int  # ns
    max_deliver: int
    max_waiting: int
    max_ack_pending: int
    max_batch: int
    max_expires: int  # ns
    delivered: SequenceInfo
    ack_floor: SequenceInfo
    num_ack_pending: int
    num_redelivered: int
    num_waiting: int
    num_pending: int
    backoff: tuple[int, ...] = ()
    priority: PrioritySettings = NO_PRIORITY
    pinned_id: str | None = None
    pinned_at: datetime | None = None
    description: str = ""
    deliver_policy: str = "all"
    metadata: Mapping[str, str] | None = None
    required_level: int = 0
    durable: bool = True
    ack_policy: str = "explicit"
    inactive_threshold: int = 0  # ns
    deliver_subject: str = ""  # a push consumer's (its config then has no pull limits)
    deliver_group: str = ""
    idle_heartbeat: int = 0  # ns
    flow_control: bool = False
    push_bound: bool = False
    opt_start_seq: int = 0
    opt_start_time: datetime | None = None
    mem_storage: bool = False
    pause_until: datetime | None = None  # CONSUMER.PAUSE's, kept after it passes


# Go's zero time.Time, which INFO shows as a group's pinned_ts while nothing is pinned.
GO_ZERO_TIME = "0001-01-01T00:00:00Z"


def consumer_info(view: ConsumerView, now: datetime, kind: str = INFO_TYPE) -> bytes:
    return json.dumps(consumer_info_document(view, now, kind), separators=(",", ":")).encode()


def consumer_info_document(
    view: ConsumerView, now: datetime, kind: str | None = INFO_TYPE
) -> dict[str, object]:
    """A ConsumerInfo; `kind` None for one inside CONSUMER.LIST (no `type` of its own)."""
    config: dict[str, object] = (
        {"durable_name": view.name, "name": view.name} if view.durable else {"name": view.name}
    )
    if view.description:
        config["description"] = view.description
    config["deliver_policy"] = view.deliver_policy
    if view.opt_start_seq:
        config["opt_start_seq"] = view.opt_start_seq
    if view.opt_start_time is not None:
        config["opt_start_time"] = rfc3339(view.opt_start_time)
    config["ack_policy"] = view.ack_policy
    if view.ack_wait:  # omitempty, as Go writes it
        config["ack_wait"] = view.ack_wait
    config |= {
        "max_deliver": view.max_deliver,
        "filter_subject": view.stream,
        "replay_policy": "instant",
    }
    if not view.deliver_subject:
        config["max_waiting"] = view.max_waiting
    if view.max_ack_pending:
        config["max_ack_pending"] = view.max_ack_pending
    if view.flow_control:
        config["flow_control"] = True
    if view.deliver_subject:
        config["deliver_subject"] = view.deliver_subject
        if view.deliver_group:
            config["deliver_group"] = view.deliver_group
        if view.idle_heartbeat:
            config["idle_heartbeat"] = view.idle_heartbeat
    else:
        config |= {"max_batch": view.max_batch, "max_expires": view.max_expires}
    if view.inactive_threshold:
        config["inactive_threshold"] = view.inactive_threshold
    config["num_replicas"] = 0
    if view.mem_storage:
        config["mem_storage"] = True
    if view.backoff:
        config["backoff"] = list(view.backoff)
    # nats-server's own keys beside the consumer's (server/jetstream_versioning.go): the API
    # level the config needs, stored with it; and, in an answer about one consumer (not in
    # CONSUMER.LIST's), the server's version and level.
    metadata = {**(view.metadata or {}), REQUIRED_LEVEL_KEY: str(view.required_level)}
    if kind is not None:
        metadata |= {SERVER_VERSION_KEY: SERVER_VERSION, SERVER_LEVEL_KEY: str(API_LEVEL)}
    config["metadata"] = metadata
    if view.pause_until is not None:
        config["pause_until"] = rfc3339(view.pause_until)
    priority = view.priority
    if priority.active:
        config["priority_groups"] = priority.groups
        config["priority_policy"] = priority.policy.value
        if priority.policy is PriorityPolicy.PINNED_CLIENT:
            config["priority_timeout"] = priority.timeout() * NANOS
    document: dict[str, object] = {} if kind is None else {"type": kind}
    document |= {
        "stream_name": view.stream,
        "name": view.name,
        "created": rfc3339(view.created),
        "config": config,
        "delivered": view.delivered.document(),
        "ack_floor": view.ack_floor.document(),
        "num_ack_pending": view.num_ack_pending,
        "num_redelivered": view.num_redelivered,
        "num_waiting": view.num_waiting,
        "num_pending": view.num_pending,
    }
    if view.push_bound:
        document["push_bound"] = True
    if view.pause_until is not None and view.pause_until > now:
        document["paused"] = True
        document["pause_remaining"] = int((view.pause_until - now).total_seconds() * NANOS)
    if priority.active:
        group: dict[str, object] = {"group": priority.group}
        if view.pinned_id:
            group["pinned_client_id"] = view.pinned_id
        group["pinned_ts"] = rfc3339(view.pinned_at) if view.pinned_at else GO_ZERO_TIME
        document["priority_groups"] = [group]
    document["ts"] = rfc3339(now)
    return document


def consumer_names(names: Sequence[str], total: int, offset: int) -> bytes:
    document = {
        "type": CONSUMER_NAMES_TYPE,
        "total": total,
        "offset": offset,
        "limit": CONSUMER_NAMES_LIMIT,
        "consumers": list(names),
    }
    return json.dumps(document, separators=(",", ":")).encode()


def consumer_list(infos: Sequence[dict[str, object]], total: int, offset: int) -> bytes:
    document = {
        "type": CONSUMER_LIST_TYPE,
        "total": total,
        "offset": offset,
        "limit": CONSUMER_LIST_LIMIT,
        "consumers": list(infos),
    }
    return json.dumps(document, separators=(",", ":")).encode()


def consumer_deleted() -> bytes:
    return json.dumps({"type": DELETE_TYPE, "success": True}, separators=(",", ":")).encode()


def stream_list(infos: Sequence[dict[str, object]], total: int, offset: int) -> bytes:
    document = {
        "type": STREAM_LIST_TYPE,
        "total": total,
        "offset": offset,
        "limit": CONSUMER_LIST_LIMIT,
        "streams": list(infos),
    }
    return json.dumps(document, separators=(",", ":")).encode()


def advisory(kind: str, advisory_id: str, now: datetime, fields: Mapping[str, object]) -> bytes:
    """A `$JS.EVENT.ADVISORY.CONSUMER.*` document: type, id, timestamp, then the fields."""
    document: dict[str, object] = {"type": kind, "id": advisory_id, "timestamp": rfc3339(now)}
    document.update(fields)
    return json.dumps(document, separators=(",", ":")).encode()


NAK_ADVISORY = "io.nats.jetstream.advisory.v1.nak"
TERMINATED_ADVISORY = "io.nats.jetstream.advisory.v1.terminated"
MAX_DELIVER_ADVISORY = "io.nats.jetstream.advisory.v1.max_deliver"
ADVISORY_PREFIX = "$JS.EVENT.ADVISORY.CONSUMER"


def encode_message(
    op: str, subject: str, reply: str | None, header: bytes | None, payload: bytes
) -> bytes:
    """`PUB`/`HPUB` (client) or `LMSG`/`HMSG` (leafnode) with its payload, ready to write."""
    target = f"{subject} {reply}" if reply else subject
    if header is None:
        return f"{op} {target} {len(payload)}\r\n".encode() + payload + CRLF
    head_op = "HPUB" if op == "PUB" else "HMSG"
    sizes = f"{len(header)} {len(header) + len(payload)}"
    return f"{head_op} {target} {sizes}\r\n".encode() + header + payload + CRLF
