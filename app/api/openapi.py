"""The OpenAPI document, saying what the API really answers.

FastAPI derives the paths and their parameters from the routes, but it cannot see what they
answer: the routes read forms, raw bodies and JSON by hand, and raise domain errors that
app/api/errors.py turns into statuses. So each operation's answers (statuses, bodies, headers),
the errors it can give and its request body are declared here, in one table keyed by method and
path; `install_openapi` puts them into FastAPI's document. A route without a declaration, or a
declaration without a route, fails the document's build (and so the tests that fetch it).

The declarations follow the code: the credential checks in app/services/auth.py (404 channel,
403 token, 401 unknown consumer or producer, 412 push consumer), the parsing in app/api/body.py
and the services, and app/store/db.py's driver boundary (400 for a value the database cannot
store, 503 while it cannot be reached).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from app.api.deps import FORM_CONTENT_TYPE
from app.config import Config

JSON = dict[str, Any]

MAX_INT32 = 2**31 - 1
MAX_ID = 2**63 - 1

# ---------------------------------------------------------------------------------------------
# Schemas. A response object names the fields it always has and the `optional` ones it has
# at times, and may carry more (additionalProperties stays open); a request body is `closed`
# where the route refuses fields it does not know.

STRING: JSON = {"type": "string"}
INTEGER: JSON = {"type": "integer"}
NUMBER: JSON = {"type": "number"}
BOOLEAN: JSON = {"type": "boolean"}
TIME: JSON = {"type": "string", "format": "date-time"}
JOB_STATUSES = ("QUEUED", "INFLIGHT", "DELIVERED", "DEAD")


def nullable(schema: JSON) -> JSON:
    return {**schema, "type": [schema["type"], "null"]}


def array(items: JSON) -> JSON:
    return {"type": "array", "items": items}


def enum(*values: str) -> JSON:
    return {"type": "string", "enum": list(values)}


def record(fields: Mapping[str, JSON], optional: str = "") -> JSON:
    """A response object: every field is there but the `optional` ones (space-separated)."""
    maybe = optional.split()
    assert set(maybe) <= set(fields), maybe
    required = [name for name in fields if name not in maybe]
    return {"type": "object", "properties": dict(fields), "required": required}


def request(
    fields: Mapping[str, JSON],
    required: str = "",
    *,
    closed: bool = True,
    rules: tuple[JSON, ...] = (),
) -> JSON:
    """A request body's object: the `required` fields (space-separated), the others, and the
    `rules` tying fields together (see `when`)."""
    schema: JSON = {"type": "object", "properties": dict(fields)}
    if required:
        schema["required"] = required.split()
    if closed:
        schema["additionalProperties"] = False
    if rules:
        schema["allOf"] = list(rules)
    return schema


def has(name: str, value: object = None) -> JSON:
    """The condition: the object has the field `name` (equal to `value`, when one is given)."""
    condition: JSON = {"required": [name]}
    if value is not None:
        condition["properties"] = {name: {"const": value}}
    return condition


def when(condition: JSON, then: JSON) -> JSON:
    return {"if": condition, "then": then}


def ref(name: str) -> JSON:
    assert name in SCHEMAS, name
    return {"$ref": f"#/components/schemas/{name}"}


PAGES = record({"next": STRING, "previous": STRING}, optional="next previous")
HEADERS: JSON = {"type": "object", "additionalProperties": STRING}
JOB_MESSAGE = record(
    {
        "MessageID": STRING,
        "Payload": {**STRING, "description": "the body as text, or base64 (PayloadEncoding)"},
        "PayloadEncoding": enum("base64"),
        "ContentType": STRING,
        "Headers": HEADERS,
    },
    optional="PayloadEncoding",
)
JOB_STATE: dict[str, JSON] = {
    "ID": STRING,
    "Status": enum(*JOB_STATUSES),
    "Attempt": INTEGER,
    "RetryCount": INTEGER,
    "Priority": INTEGER,
    "IncrementalTimeout": INTEGER,
    "LeaseExpiresAt": nullable(TIME),
    "EarliestNextAttemptAt": nullable(TIME),
    "StatusChangedAt": TIME,
    "CreatedAt": TIME,
    "DeadReason": nullable(STRING),
    "LastError": nullable(STRING),
}
PULLED_JOB = record(
    {
        "ID": STRING,
        "Attempt": INTEGER,
        "Priority": INTEGER,
        "LeaseExpiresAt": nullable(TIME),
        "Message": JOB_MESSAGE,
    }
)
STAKEHOLDER: dict[str, JSON] = {
    "ID": STRING,
    "Name": STRING,
    "ChangedAt": TIME,
    "Token": {**STRING, "description": "only in the answer to a PUT"},
}
PUSH_ONLY = "MaxInFlight RateLimit SigningSecretRotatedUntil Enabled DisabledAt DisabledReason"

SCHEMAS: dict[str, JSON] = {
    "Error": record({"error": INTEGER, "detail": STRING}),
    "Status": record(
        {
            "status": enum("ok", "degraded"),
            "database": record({"dialect": STRING, "status": STRING, "schema": STRING}),
        }
    ),
    "Ready": record({"ready": BOOLEAN, "reasons": array(STRING)}),
    "JobStatus": {
        "type": "object",
        "description": "channel id -> consumer id -> one entry per job status",
        "additionalProperties": {
            "type": "object",
            "additionalProperties": array(
                record(
                    {
                        "status": enum(*JOB_STATUSES),
                        "statusCode": nullable(INTEGER),
                        "count": INTEGER,
                        "oldestItemTimestamp": nullable(TIME),
                        "newestItemTimestamp": nullable(TIME),
                    }
                )
            ),
        },
    },
    "DlqStatus": record(
        {
            "consumers": array(
                record(
                    {
                        "channelId": STRING,
                        "channelName": STRING,
                        "consumerId": STRING,
                        "consumerName": STRING,
                        "deadCount": INTEGER,
                    }
                )
            )
        }
    ),
    "Stakeholder": record(STAKEHOLDER, optional="Token"),
    "Consumer": record(
        {
            **STAKEHOLDER,
            "CallbackURL": STRING,
            "DeadLetterQueueURL": STRING,
            "Type": enum("push", "pull"),
            "AckWait": INTEGER,
            "MaxAckPending": nullable(INTEGER),
            "PriorityGroups": array(STRING),
            "PriorityPolicy": enum("none", "overflow", "pinned_client", "prioritized"),
            "PriorityTimeout": nullable(INTEGER),
            # push consumers only
            "SigningSecret": {**nullable(STRING), "description": "only in the answer to a PUT"},
            "MaxInFlight": INTEGER,
            "RateLimit": nullable(NUMBER),
            "SigningSecretRotatedUntil": nullable(TIME),
            "Enabled": BOOLEAN,
            "DisabledAt": nullable(TIME),
            "DisabledReason": nullable(STRING),
            "Breaker": record(
                {
                    "State": enum("closed", "open", "half_open"),
                    "ConsecutiveFailures": INTEGER,
                    "OpenUntil": nullable(TIME),
                }
            ),
        },
        optional=f"Token SigningSecret Breaker {PUSH_ONLY}",
    ),
    "Links": record({"Result": array(STRING), "Pages": PAGES, "Links": record({"self": STRING})}),
    "ScheduledLinks": record({"result": array(STRING), "pages": PAGES}),
    "Message": record(
        {
            "ID": STRING,
            "Payload": STRING,
            "PayloadEncoding": enum("base64"),
            "ContentType": STRING,
            "Priority": INTEGER,
            "ProducedBy": STRING,
            "ReceivedAt": TIME,
            "ScheduledFor": nullable(TIME),
            "Headers": HEADERS,
            "Jobs": array(
                record(
                    {
                        "ID": STRING,
                        "ListenerName": STRING,
                        "ConsumerURL": STRING,
                        "Status": enum(*JOB_STATUSES),
                        "StatusChangedAt": TIME,
                        "Attempt": INTEGER,
                        "RetryCount": INTEGER,
                    }
                )
            ),
        },
        optional="PayloadEncoding",
    ),
    "ScheduledMessage": record(
        {
            "id": STRING,
            "messageId": STRING,
            "contentType": STRING,
            "priority": INTEGER,
            "producedBy": STRING,
            "dispatchSchedule": TIME,
            "dispatchedAt": nullable(TIME),
            "status": enum("SCHEDULED", "DISPATCHED"),
            "payload": STRING,
            "payloadEncoding": enum("base64"),
            "headers": HEADERS,
        },
        optional="payloadEncoding",
    ),
    "MessagesStatus": record(
        {"Counts": record({s: record({"Count": INTEGER}) for s in [*JOB_STATUSES, "SCHEDULED"]})}
    ),
    "QueuedJobs": record(
        {
            "Result": array(
                record(
                    {
                        "ID": STRING,
                        "Priority": INTEGER,
                        "IncrementalTimeout": INTEGER,
                        "Message": JOB_MESSAGE,
                    }
                )
            ),
            "Pages": PAGES,
        }
    ),
    "Job": record(
        {
            **JOB_STATE,
            "Message": JOB_MESSAGE,
            "Links": record(
                {"self": STRING, "message": STRING, "consumer": STRING, "requeue": STRING}
            ),
        }
    ),
    "DeadJobs": record(
        {
            "DeadJobs": array(record({**JOB_STATE, "JobURL": STRING, "JobRequeueURL": STRING})),
            "Pages": PAGES,
        }
    ),
    "Pulled": record(
        {
            "Jobs": array(PULLED_JOB),
            "Pending": {**INTEGER, "description": "due jobs left, counted up to 1,000"},
            "PinId": STRING,
        },
        optional="PinId",
    ),
    "StreamLine": {
        "description": "one line of a streaming pull: a job, a heartbeat, or the last line",
        "oneOf": [
            record({"Job": PULLED_JOB, "Pending": INTEGER, "PinId": STRING}, optional="PinId"),
            record({"Heartbeat": {"const": True}}),
            record(
                {
                    "Status": {"type": "integer", "enum": [200, 404, 408, 409, 410, 423, 503]},
                    "Reason": STRING,
                    "PendingMessages": INTEGER,
                    "PendingBytes": INTEGER,
                }
            ),
        ],
    },
    "ConsumerInfo": record(
        {
            "Channel": STRING,
            "Consumer": STRING,
            "Pending": INTEGER,
            "PendingBytes": INTEGER,
            "AckPending": INTEGER,
            "Waiting": INTEGER,
            "Redelivered": INTEGER,
            "LastDeliveredAt": nullable(TIME),
            "NextDueAt": nullable(TIME),
            "PinId": nullable(STRING),
        }
    ),
    "Unpinned": record({"Group": STRING, "Unpinned": BOOLEAN}),
    "Lease": record({"LeaseExpiresAt": nullable(TIME)}),
    "AckResults": record(
        {
            "Results": array(
                record(
                    {
                        "id": STRING,
                        "status": {
                            "type": "integer",
                            "enum": [200, 202, 404, 409],
                            "description": "what a single ack of the job would have answered",
                        },
                        "detail": STRING,
                        "LeaseExpiresAt": nullable(TIME),
                    },
                    optional="LeaseExpiresAt",
                )
            )
        }
    ),
    "Redrive": record(
        {
            "ID": STRING,
            "Status": enum("RUNNING", "COMPLETED", "CANCELLED"),
            "From": enum("DEAD", "DELIVERED"),
            "Since": nullable(TIME),
            "Until": nullable(TIME),
            "PerSecond": INTEGER,
            "Total": INTEGER,
            "Moved": INTEGER,
            "CreatedAt": TIME,
            "FinishedAt": nullable(TIME),
            "Links": record({"self": STRING}),
        }
    ),
    "Deleted": record({"deletedCount": INTEGER}),
    "Requeued": record({"Requeued": INTEGER}),
}
SCHEMAS["Redrives"] = record({"Result": array(ref("Redrive"))})

HEADER_DEFINITIONS: dict[str, JSON] = {
    "X-Request-ID": {
        "description": "the request's own X-Request-ID (1-128 of [A-Za-z0-9._:/+=-]) or a new one",
        "required": True,
        "schema": STRING,
    },
    "Location": {"description": "where the new object is read", "required": True, "schema": STRING},
    "Last-Modified": {
        "description": "send it back as If-Unmodified-Since to change or delete the object",
        "required": True,
        "schema": STRING,
    },
    "Retry-After": {"description": "seconds", "required": True, "schema": STRING},
}

# ---------------------------------------------------------------------------------------------
# Declarations


@dataclass(frozen=True, slots=True)
class Answer:
    """A documented answer other than an error: its body's schema by media type."""

    description: str
    content: Mapping[str, JSON] = field(default_factory=dict)
    headers: tuple[str, ...] = ()


def json_answer(description: str, schema: str, *headers: str) -> Answer:
    return Answer(description, {"application/json": ref(schema)}, headers)


def empty(description: str, *headers: str) -> Answer:
    return Answer(description, {}, headers)


@dataclass(frozen=True, slots=True)
class Operation:
    answers: Mapping[int, Answer]
    errors: Mapping[int, str]
    body: JSON | None = None  # the requestBody object
    headers: tuple[JSON, ...] = ()  # header parameters the route reads by hand
    admin: bool = False  # a change [http] admin-token guards


def errors(*groups: Mapping[int, str]) -> dict[int, str]:
    """Error statuses with why each is answered; a status in several groups joins the whys."""
    merged: dict[int, list[str]] = {}
    for group in groups:
        for status, why in group.items():
            merged.setdefault(status, []).append(why)
    return {status: "; ".join(merged[status]) for status in sorted(merged)}


UNAVAILABLE = {503: "the database is unavailable; retry"}
UNSTORABLE = {400: "a value the database cannot store or compare (a NUL in an id)"}
DATABASE = {**UNSTORABLE, **UNAVAILABLE}
CHANNEL = {404: "no such channel"}
CONSUMER = {
    404: "no such channel",
    403: "the channel or consumer token does not match",
    401: "no such consumer in the channel",
}
PULL_ONLY = {412: "the consumer is a push consumer"}
PRODUCER = {
    404: "no such channel",
    403: "the channel or producer token does not match",
    401: "no such producer (or no X-Broker-Producer-ID)",
}
ADMIN = {
    401: "[http] admin-token is set and Authorization: Bearer is missing",
    403: "the admin token does not match",
}
# Reads guarded once [http] admin-token or reader-token is set (app/domain/access.py): those of
# every channel's data need the reader or admin token; a channel's own reads also take its token.
GUARDED_READS = {
    ("GET", "/channels"): False,
    ("GET", "/producers"): False,
    ("GET", "/producer/{producer_id}"): False,
    ("GET", "/job-status"): False,
    ("GET", "/dlq-status"): False,
    ("GET", "/channel/{channel_id}"): True,
    ("GET", "/channel/{channel_id}/consumers"): True,
    ("GET", "/channel/{channel_id}/consumer/{consumer_id}"): True,
    ("GET", "/channel/{channel_id}/messages"): True,
    ("GET", "/channel/{channel_id}/message/{message_id}"): True,
    ("GET", "/channel/{channel_id}/messages-status"): True,
    ("GET", "/channel/{channel_id}/scheduled-messages"): True,
    ("GET", "/channel/{channel_id}/scheduled-message/{message_id}"): True,
}
READER = {
    401: "reads need Authorization: Bearer <reader-token> or <admin-token>",
    403: "the bearer token matches neither the reader nor the admin token",
}
CHANNEL_READER = {
    401: "reads need Authorization: Bearer <reader-token> or <admin-token>, or the channel's "
    "X-Broker-Channel-Token",
    403: "the bearer token matches no configured token, or the channel token does not match",
}
GATEWAY = {
    401: "([gateway-auth] hmac) no X-Broker-Signature, or a malformed one: text/plain",
    403: "([gateway-auth] hmac) a stale or wrong signature: text/plain",
}
CHANGE = {
    400: "updating an existing object needs If-Unmodified-Since",
    412: "the object changed since If-Unmodified-Since (or was created meanwhile)",
}
FORM = {400: "a field is malformed or too long", 415: f"the body is not {FORM_CONTENT_TYPE}"}
CURSOR = {400: "a malformed pagination cursor"}
LIMIT = {400: "limit is not a non-negative integer (above 100 is 100)"}
JOB_PATH = {404: "no such job of this consumer (the id is not a number)"}
JSON_BODY = {400: "the body is not a JSON object, or a field is unknown or malformed"}


def form_body(properties: Mapping[str, JSON], rules: tuple[JSON, ...] = ()) -> JSON:
    schema = request(properties, closed=False, rules=rules)  # other fields are ignored
    return {"required": True, "content": {FORM_CONTENT_TYPE: {"schema": schema}}}


def json_body(schema: JSON, *, required: bool) -> JSON:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def header(name: str, description: str, schema: JSON = STRING) -> JSON:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "schema": schema,
        "description": description,
    }


BASE64_24_TO_64_BYTES = "([A-Za-z0-9+/]{4}){8,20}([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
POSITIVE_INT32: JSON = {"type": "integer", "minimum": 1, "maximum": MAX_INT32}
FIELD: JSON = {"type": "string", "maxLength": 255}
STAKEHOLDER_FORM = form_body(
    {"token": {**FIELD, "description": "made by the broker when left out"}, "name": FIELD}
)
CONSUMER_FORM = form_body(
    {
        "token": {**FIELD, "description": "made by the broker when left out"},
        "name": FIELD,
        "callbackUrl": {
            **STRING,
            "pattern": "^https?://[^/?#]+",
            "description": "an absolute http(s) URL, not a link-local address; push consumers",
        },
        "type": {**enum("push", "pull"), "description": "push when left out"},
        "ackWait": {**POSITIVE_INT32, "description": "lease seconds"},
        "maxAckPending": POSITIVE_INT32,
        "priorityGroups": {
            **STRING,
            "pattern": "^[a-zA-Z0-9/_=-]{1,16}$",
            "description": "a pull consumer's one group, with a priorityPolicy other than none",
        },
        "priorityPolicy": enum("none", "overflow", "pinned_client", "prioritized"),
        "priorityTimeout": {**POSITIVE_INT32, "description": "pinned_client: seconds"},
        "maxInFlight": POSITIVE_INT32,
        "rateLimit": {"type": "number", "exclusiveMinimum": 0, "maximum": 1_000_000},
        "signingSecret": {
            **STRING,
            "pattern": f"^(rotate|whsec_{BASE64_24_TO_64_BYTES})$",
            "description": "whsec_ and the base64 of 24 to 64 bytes, or rotate (a new one)",
        },
        "signingSecretOverlap": {**POSITIVE_INT32, "description": "seconds"},
        "enabled": BOOLEAN,
    },
    # a push consumer (the default) needs its callback URL
    rules=(when({"not": has("type", "pull")}, {"required": ["callbackUrl"]}),),
)
ACK_FIELDS: dict[str, JSON] = {
    "type": enum("ack", "nak", "term", "progress"),
    "attempt": {**POSITIVE_INT32, "description": "the pull's Attempt: a stale one is a 409"},
    "delay": {**NUMBER, "minimum": 0, "description": "nak only: seconds"},
    "reason": {**nullable(STRING), "description": "term: why"},
    "counted": {**BOOLEAN, "description": "nak only: false hands the job back unprocessed"},
}
# what only a nak may carry: a delay, and counted false
ACK_RULES = (
    when(has("delay"), has("type", "nak")),
    when(has("counted", False), has("type", "nak")),
)
JOB_ID: JSON = {
    "oneOf": [
        {"type": "string", "pattern": "^[0-9]{1,19}$"},
        {"type": "integer", "minimum": 1, "maximum": MAX_ID},
    ],
    "description": "a job id: a string of digits or an integer",
}
CONSUMER_TOKENS = "the consumer's X-Broker-Channel-Token and X-Broker-Consumer-Token"


def pull_body(config: Config) -> JSON:
    limits = config.pull
    return request(
        {
            "batch": {
                "type": "integer",
                "minimum": 1,
                "maximum": limits.max_stream_batch,
                "description": f"up to {limits.max_batch}, or {limits.max_stream_batch} streaming",
            },
            "max_bytes": {**nullable(INTEGER), "minimum": 1, "maximum": MAX_ID},
            "expires": {
                "type": "number",
                "minimum": 0,
                "maximum": limits.max_expires_seconds,
                "description": "seconds to wait when nothing is due",
            },
            "no_wait": BOOLEAN,
            "incremental_timeout": {"type": "integer", "minimum": 0, "maximum": MAX_INT32},
            "stream": {**BOOLEAN, "description": "answer application/x-ndjson as jobs come"},
            "idle_heartbeat": {
                **NUMBER,
                "minimum": 0.1,
                "maximum": limits.max_expires_seconds / 2,
                "description": "stream only: seconds, at most half of expires",
            },
            "group": nullable(STRING),
            "min_pending": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
            "min_ack_pending": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
            "id": {**nullable(STRING), "description": "the pin id (pinned_client)"},
            "priority": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        rules=(
            when(has("idle_heartbeat"), has("stream", True)),
            when(
                {"not": has("stream", True)},
                {"properties": {"batch": {"maximum": limits.max_batch}}},
            ),
        ),
    )


def operations(config: Config) -> dict[tuple[str, str], Operation]:
    """Every operation of the API, by method and path (as FastAPI writes them)."""
    c = "/channel/{channel_id}"
    k = c + "/consumer/{consumer_id}"
    job = k + "/job/{job_id}"
    redrives = k + "/redrives"
    status = Answer("the broker is up", {"application/json": ref("Status")})
    ready = Answer("ready for work", {"application/json": ref("Ready")})
    return {
        ("GET", "/_status"): Operation(
            {200: status, 503: Answer("the database does not answer", status.content)}, {}
        ),
        ("GET", "/_ready"): Operation(
            {200: ready, 503: Answer("not ready (reasons)", ready.content)}, {}
        ),
        ("GET", "/metrics"): Operation(
            {200: Answer("Prometheus text format", {"text/plain": STRING})}, UNAVAILABLE
        ),
        ("GET", "/job-status"): Operation(
            {200: json_answer("jobs by channel, consumer and status", "JobStatus")}, UNAVAILABLE
        ),
        ("GET", "/dlq-status"): Operation(
            {200: json_answer("dead jobs per consumer", "DlqStatus")}, UNAVAILABLE
        ),
        # management
        ("PUT", "/producer/{producer_id}"): Operation(
            {200: json_answer("created or changed", "Stakeholder", "Last-Modified")},
            errors(FORM, CHANGE, DATABASE),
            STAKEHOLDER_FORM,
            admin=True,
        ),
        ("GET", "/producer/{producer_id}"): Operation(
            {200: json_answer("the producer", "Stakeholder", "Last-Modified")},
            errors({404: "no such producer"}, DATABASE),
        ),
        ("GET", "/producers"): Operation(
            {200: json_answer("a page of producer links", "Links")}, errors(CURSOR, DATABASE)
        ),
        ("PUT", c): Operation(
            {200: json_answer("created or changed", "Stakeholder", "Last-Modified")},
            errors(FORM, CHANGE, DATABASE),
            STAKEHOLDER_FORM,
            admin=True,
        ),
        ("GET", c): Operation(
            {200: json_answer("the channel", "Stakeholder", "Last-Modified")},
            errors(CHANNEL, DATABASE),
        ),
        ("GET", "/channels"): Operation(
            {200: json_answer("a page of channel links", "Links")}, errors(CURSOR, DATABASE)
        ),
        ("PUT", k): Operation(
            {200: json_answer("created or changed", "Consumer", "Last-Modified")},
            errors(FORM, CHANGE, CHANNEL, DATABASE),
            CONSUMER_FORM,
            admin=True,
        ),
        ("GET", k): Operation(
            {200: json_answer("the consumer", "Consumer", "Last-Modified")},
            errors({404: "no such channel or consumer"}, DATABASE),
        ),
        ("DELETE", k): Operation(
            {204: empty("deleted, with its jobs")},
            errors(CHANGE, {404: "no such channel or consumer"}, DATABASE),
            admin=True,
        ),
        ("GET", c + "/consumers"): Operation(
            {200: json_answer("a page of consumer links", "Links")},
            errors(CURSOR, CHANNEL, DATABASE),
        ),
        # publishing and messages
        ("POST", c + "/broadcast"): Operation(
            {201: empty("stored with its jobs", "Location")},
            errors(
                PRODUCER,
                {
                    400: "an empty body, a bad priority, message id, content type,"
                    " metadata header name or X-Broker-Scheduled-For",
                    409: "the message id was published before",
                    412: "X-Broker-Scheduled-For is less than the minimum delay ahead",
                    413: "the body is over [broker] max-message-size-bytes"
                    f" ({config.broker.max_message_size_bytes})",
                },
                DATABASE,
            ),
            {
                "required": True,
                "description": "the payload, kept as it is with its Content-Type",
                "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
            },
            headers=(
                header("X-Broker-Channel-Token", "the channel's token"),
                header("X-Broker-Producer-ID", "the publishing producer"),
                header("X-Broker-Producer-Token", "the producer's token"),
                header(
                    "X-Broker-Message-ID",
                    "an idempotency key per channel",
                    {**STRING, "maxLength": 255},
                ),
                header(
                    "X-Broker-Message-Priority",
                    "higher is delivered first; its absolute value is kept",
                    {**STRING, "pattern": "^-?[0-9]{1,10}$"},
                ),
                header("X-Broker-Metadata-Headers", "comma-separated request headers to keep"),
                header("X-Broker-Scheduled-For", "RFC 3339 with an offset: due then", TIME),
            ),
        ),
        ("GET", c + "/scheduled-messages"): Operation(
            {200: json_answer("a page of scheduled message links", "ScheduledLinks")},
            errors(
                CURSOR,
                {400: "status is not SCHEDULED, DISPATCHED, 101 or 102"},
                CHANNEL,
                DATABASE,
            ),
        ),
        ("DELETE", c + "/scheduled-message/{message_id}"): Operation(
            {204: empty("cancelled, with its jobs")},
            errors(
                PRODUCER,
                {404: "no such scheduled message", 409: "its time has come: it is dispatched"},
                DATABASE,
            ),
        ),
        ("GET", c + "/scheduled-message/{message_id}"): Operation(
            {200: json_answer("the scheduled message", "ScheduledMessage")},
            errors({404: "no such message, or it was not scheduled"}, DATABASE),
        ),
        ("GET", c + "/messages"): Operation(
            {200: json_answer("a page of message links, newest first", "Links")},
            errors(
                CURSOR,
                {400: "status is not ACKNOWLEDGED, DISPATCHED, 101 or 102"},
                CHANNEL,
                DATABASE,
            ),
        ),
        ("GET", c + "/message/{message_id}"): Operation(
            {200: json_answer("the message and its jobs", "Message")},
            errors({404: "no such message in the channel"}, DATABASE),
        ),
        ("GET", c + "/messages-status"): Operation(
            {200: json_answer("job counts by status", "MessagesStatus")},
            errors(CHANNEL, DATABASE),
        ),
        # the Go original's pull API
        ("GET", k + "/queued-jobs"): Operation(
            {200: json_answer("due QUEUED jobs, highest priority first", "QueuedJobs")},
            errors(LIMIT, CURSOR, CONSUMER, PULL_ONLY, DATABASE),
        ),
        ("POST", job): Operation(
            {202: empty("moved, or already in that state")},
            errors(
                JSON_BODY,
                {400: "a move the state machine does not allow, or another worker moved the job"},
                JOB_PATH,
                CONSUMER,
                PULL_ONLY,
                {409: "INFLIGHT past maxAckPending, or on a consumer with a priority policy"},
                DATABASE,
            ),
            json_body(
                request(
                    {
                        "NextState": enum(*JOB_STATUSES),
                        "IncrementalTimeout": {
                            **nullable(INTEGER),
                            "minimum": 0,
                            "maximum": MAX_INT32,
                        },
                    },
                    "NextState",
                    closed=False,
                ),
                required=True,
            ),
        ),
        ("GET", job): Operation(
            {200: json_answer("the job and its message", "Job")},
            errors(JOB_PATH, CONSUMER, DATABASE),
        ),
        ("POST", job + "/requeue-dead-job"): Operation(
            {202: empty("queued again")},
            errors({400: "the job is not DEAD"}, JOB_PATH, CONSUMER, DATABASE),
        ),
        ("DELETE", job): Operation(
            {204: empty("deleted")},
            errors({400: "the job is not DEAD"}, JOB_PATH, CONSUMER, DATABASE),
        ),
        ("GET", k + "/dlq"): Operation(
            {200: json_answer("a page of dead jobs", "DeadJobs")},
            errors(LIMIT, CURSOR, CONSUMER, DATABASE),
        ),
        ("DELETE", k + "/dlq"): Operation(
            {200: json_answer("every dead job deleted", "Deleted")}, errors(CONSUMER, DATABASE)
        ),
        ("POST", k + "/dlq"): Operation(
            {202: json_answer("every dead job queued again", "Requeued")},
            errors(
                CONSUMER,
                {400: "`requeue` form param must match consumer token"},
                {404: "(the form) no such channel or consumer"},
                DATABASE,
            ),
            {
                "required": False,
                "description": f"the Go original's form, in place of {CONSUMER_TOKENS}",
                "content": {
                    FORM_CONTENT_TYPE: {"schema": request({"requeue": STRING}, closed=False)}
                },
            },
        ),
        # our pull API
        ("POST", k + "/pull"): Operation(
            {
                200: Answer(
                    "the jobs claimed (none when expires passed); a stream's lines as they come",
                    {
                        "application/json": ref("Pulled"),
                        "application/x-ndjson": ref("StreamLine"),
                    },
                )
            },
            errors(
                JSON_BODY,
                {400: "limits ([pull] max-batch ...) or priority terms the consumer refuses"},
                CONSUMER,
                PULL_ONLY,
                {
                    409: "[pull] max-waiting pulls already wait on the consumer",
                    423: "the pin id is not (or no longer) the group's pin",
                },
                DATABASE,
            ),
            json_body(pull_body(config), required=False),
        ),
        ("GET", k + "/info"): Operation(
            {200: json_answer("the consumer's figures", "ConsumerInfo")},
            errors(CONSUMER, PULL_ONLY, DATABASE),
        ),
        ("POST", k + "/unpin"): Operation(
            {200: json_answer("the pin is cleared (Unpinned: whether one was held)", "Unpinned")},
            errors(
                JSON_BODY,
                {400: "no group, or not the consumer's group"},
                CONSUMER,
                PULL_ONLY,
                DATABASE,
            ),
            json_body(request({"group": {**STRING, "minLength": 1}}, "group"), required=True),
        ),
        ("POST", job + "/ack"): Operation(
            {
                200: json_answer("progress: the lease is extended", "Lease"),
                202: empty("acked, naked or termed"),
            },
            errors(
                JSON_BODY,
                JOB_PATH,
                CONSUMER,
                PULL_ONLY,
                {409: "the job is not in flight, or the attempt is stale"},
                DATABASE,
            ),
            json_body(
                request(
                    {**ACK_FIELDS, "id": {**JOB_ID, "description": "ignored: the path names it"}},
                    rules=ACK_RULES,
                ),
                required=False,
            ),
        ),
        ("POST", k + "/ack"): Operation(
            {200: json_answer("one result per item, in order", "AckResults")},
            errors(
                JSON_BODY,
                {400: f"more than [pull] max-batch ({config.pull.max_batch}) acks"},
                CONSUMER,
                PULL_ONLY,
                DATABASE,
            ),
            json_body(
                request(
                    {
                        "acks": {
                            **array(request({"id": JOB_ID, **ACK_FIELDS}, "id", rules=ACK_RULES)),
                            "maxItems": config.pull.max_batch,
                        }
                    },
                    "acks",
                    closed=False,
                ),
                required=True,
            ),
        ),
        # redrives
        ("POST", redrives): Operation(
            {202: json_answer("started", "Redrive", "Location")},
            errors(JSON_BODY, CONSUMER, DATABASE),
            json_body(
                request(
                    {
                        "from": enum("DEAD", "DELIVERED"),
                        "since": {**nullable(TIME), "description": "inclusive"},
                        "until": {**nullable(TIME), "description": "exclusive, after since"},
                        "perSecond": {"type": "integer", "minimum": 1, "maximum": 100_000},
                    }
                ),
                required=False,
            ),
        ),
        ("GET", redrives): Operation(
            {200: json_answer("the newest redrives, newest first", "Redrives")},
            errors(CONSUMER, DATABASE),
        ),
        ("GET", redrives + "/{redrive_id}"): Operation(
            {200: json_answer("the redrive", "Redrive")},
            errors(
                {400: "the redrive id is not a number", 404: "no such redrive"}, CONSUMER, DATABASE
            ),
        ),
        ("DELETE", redrives + "/{redrive_id}"): Operation(
            {200: json_answer("stopped where it was", "Redrive")},
            errors(
                {
                    400: "the redrive id is not a number",
                    404: "no such redrive",
                    409: "the redrive has finished",
                },
                CONSUMER,
                DATABASE,
            ),
        ),
    }


# ---------------------------------------------------------------------------------------------
# The document


def _headers(names: tuple[str, ...]) -> JSON:
    return {name: {"$ref": f"#/components/headers/{name}"} for name in ("X-Request-ID", *names)}


def _content(content: Mapping[str, JSON]) -> JSON:
    return {media: {"schema": schema} for media, schema in content.items()}


def _responses(op: Operation, config: Config, gateway: bool, key: tuple[str, str]) -> JSON:
    responses: JSON = {}
    for status, answer in op.answers.items():
        responses[str(status)] = {
            "description": answer.description,
            "headers": _headers(answer.headers),
        }
        if answer.content:
            responses[str(status)]["content"] = _content(answer.content)
    admin = ADMIN if op.admin and config.http.admin_token else {}
    read: Mapping[int, str] = {}
    if key in GUARDED_READS and config.http.guarded_reads:
        read = CHANNEL_READER if GUARDED_READS[key] else READER
    limits: dict[int, str] = {}
    if op.body is not None:  # every body is read through app/api/limits.py
        limits[408] = "the body did not arrive within [http] read-timeout"
        if 413 not in op.errors:
            limits[413] = f"the body is over [http] max-body-bytes ({config.http.max_body_bytes})"
    for status, why in errors(op.errors, admin, read, limits).items():
        responses[str(status)] = {
            "description": why,
            "headers": _headers(("Retry-After",) if status == 503 else ()),
            "content": {"application/json": {"schema": ref("Error")}},
        }
    if gateway:  # the HMAC gateway's refusals, in plain text, before any route runs
        for status, why in GATEWAY.items():
            entry = responses.get(str(status))
            if entry is None:
                entry = responses[str(status)] = {"description": why, "headers": _headers(())}
                entry["content"] = {}
            else:
                entry["description"] += f"; {why}"
            entry["content"]["text/plain"] = {"schema": STRING}
    return dict(sorted(responses.items()))


def build(app: FastAPI, config: Config) -> JSON:
    document = get_openapi(
        title=app.title,
        version=app.version,
        openapi_version=app.openapi_version,
        description=(
            'Errors answer `{"error": <status>, "detail": <why>}`; every response carries'
            " X-Request-ID."
        ),
        routes=app.routes,
    )
    declared = operations(config)
    gateway_exempt = config.gateway_auth.auth_exempt_paths if config.gateway_auth.enabled else None
    seen = set()
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            key = (method.upper(), path)
            if key not in declared:
                raise LookupError(f"app/api/openapi.py does not declare {method.upper()} {path}")
            seen.add(key)
            op = declared[key]
            gateway = gateway_exempt is not None and not path.startswith(gateway_exempt)
            operation["responses"] = _responses(op, config, gateway, key)
            if op.body is not None:
                operation["requestBody"] = op.body
            if op.headers:
                operation["parameters"] = [*operation.get("parameters", []), *op.headers]
    unknown = (set(declared) | set(GUARDED_READS)) - seen
    if unknown:
        raise LookupError(
            f"app/api/openapi.py declares operations with no route: {sorted(unknown)}"
        )
    document["components"] = {"schemas": SCHEMAS, "headers": HEADER_DEFINITIONS}
    return document


def operation_id(route: APIRoute) -> str:
    """Operation ids are the routes' function names (unique: the build checks each path)."""
    return route.name


def install_openapi(app: FastAPI, config: Config) -> None:
    """Serve `build`'s document as the app's OpenAPI (made once, on its first request)."""

    def openapi() -> JSON:
        if app.openapi_schema is None:
            app.openapi_schema = build(app, config)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
