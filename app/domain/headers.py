"""Which of a producer's headers a push may carry (X-Broker-Metadata-Headers).

A push request is the broker's: its framing (Host, Content-Length, Transfer-Encoding and the
other hop-by-hop headers) and every header it sets itself (its X-Broker-* ones, the consumer
token, the Standard Webhooks signature, User-Agent, Content-Type, X-Request-ID) are decided by
the broker alone, compared without case. A producer naming one of them as metadata is refused
at publish time (a 400 naming it), and so is a value that is not valid HTTP: a delivery must
never be the place where a producer's header turns out to be unsendable. The producer's own
credentials are the exception: they are dropped in silence, as before this rule, since a
producer that forwards "its headers" names them without meaning to send them anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# RFC 9110 token: what a field name may be.
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# RFC 9110 field value, narrowed to what every HTTP client sends: visible ASCII, space and
# HTAB (obs-text, bytes 0x80-0xFF, is refused: clients such as hyper reject it).
_FIELD_VALUE = re.compile(r"^[\t\x20-\x7e]*$")

# The producer's own credentials: never copied into a message, where every reader sees them.
CREDENTIALS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "x-broker-channel-token",
        "x-broker-producer-token",
    }
)
# Connection-level (hop-by-hop, RFC 9110 7.6.1) and framing headers: the HTTP client's alone.
FRAMING = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
    }
)
# What the dispatcher sets on every push besides the X-Broker-* family and the token header.
BROKER_SET = frozenset(
    {
        "user-agent",
        "content-type",
        "x-request-id",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)


def is_credential(name: str) -> bool:
    return name.lower() in CREDENTIALS


def name_refusal(name: str, token_header: str) -> str | None:
    """Why a producer may not send `name` with a push (None: it may). Credentials are not
    asked about here: they are dropped before (is_credential)."""
    if not _TOKEN.match(name):
        return f"{name!r} is not a valid header name"
    # CGI-style receivers (WSGI, Rack, PHP) read "_" and "-" as one: X_Broker_Consumer_Token
    # would reach them as the broker's own header.
    lower = name.lower().replace("_", "-")
    if lower in FRAMING or lower.startswith("proxy-"):
        return f"{name} is a connection header the broker's HTTP client sets"
    if (
        lower == token_header.lower().replace("_", "-")
        or lower in BROKER_SET
        or lower.startswith("x-broker-")
    ):
        return f"{name} is a header the broker sets on every push"
    return None


def value_refusal(name: str, value: str) -> str | None:
    """Why `value` cannot be sent as a header (None: it can)."""
    if not _FIELD_VALUE.match(value):
        return (
            f"the value of {name} is not a valid HTTP header value "
            "(printable ASCII, space and tab only)"
        )
    return None


def forwardable(headers: Mapping[str, str], token_header: str) -> dict[str, str]:
    """The stored metadata headers a push may carry: the first of each name (without case),
    neither refused nor a credential, with a sendable value. Publishing refuses the rest; this
    keeps messages stored before that rule (or by another path) from failing a delivery or
    sending a header beside the broker's own."""
    kept: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in headers.items():
        lower = name.lower()
        if lower in seen:
            continue
        seen.add(lower)
        if (
            lower in CREDENTIALS
            or not isinstance(value, str)
            or name_refusal(name, token_header) is not None
            or value_refusal(name, value) is not None
        ):
            continue
        kept[name] = value
    return kept
