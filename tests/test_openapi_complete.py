"""The OpenAPI document is at least as complete as it was when app/api/openapi.py described the
API by hand (issue 37): every operation it had, with each 2xx body's media types and fields, the
headers its answers carry, its parameters, its request body's media types and fields, and every
error status it could answer, in the default configuration and with [http] admin-token and the
HMAC gateway set. BEFORE was derived from that document once and is checked in: the document may
grow, never lose."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.api.app import create_app
from app.config import load_config_text

GUARDED = (
    "[http]\nadmin-token=secret\n"
    f"[gateway-auth]\nmode=hmac\nhmac-shared-secret={base64.b64encode(b'k' * 32).decode()}\n"
)


@dataclass(frozen=True)
class Operation:
    answers: dict[str, dict[str, str]]  # 2xx status -> media type -> its body's fields
    errors: str  # every 4xx/5xx status in the default configuration
    guarded: str = ""  # and the ones [http] admin-token or the gateway add
    headers: dict[str, str] = field(
        default_factory=dict
    )  # 2xx status -> headers besides X-Request-ID
    parameters: str = ""
    body: dict[str, str] = field(default_factory=dict)  # media type -> the request body's fields


BEFORE: dict[tuple[str, str], Operation] = {
    ("GET", "/_ready"): Operation(
        answers={"200": {"application/json": "ready reasons"}},
        errors="503",
        guarded="401 403",
    ),
    ("GET", "/_status"): Operation(
        answers={"200": {"application/json": "database status"}},
        errors="503",
    ),
    ("GET", "/channel/{channel_id}"): Operation(
        answers={"200": {"application/json": "ChangedAt ID Name Token"}},
        errors="400 404 503",
        guarded="401 403",
        headers={"200": "Last-Modified"},
        parameters="channel_id authorization X-Broker-Channel-Token",
    ),
    ("PUT", "/channel/{channel_id}"): Operation(
        answers={"200": {"application/json": "ChangedAt ID Name Token"}},
        errors="400 408 412 413 415 503",
        guarded="401 403",
        headers={"200": "Last-Modified"},
        parameters="channel_id If-Unmodified-Since authorization",
        body={"application/x-www-form-urlencoded": "name token"},
    ),
    ("POST", "/channel/{channel_id}/broadcast"): Operation(
        answers={"201": {}},
        errors="400 401 403 404 408 409 412 413 503",
        headers={"201": "Location"},
        parameters=(
            "channel_id X-Broker-Channel-Token X-Broker-Producer-ID "
            "X-Broker-Producer-Token X-Broker-Message-ID "
            "X-Broker-Message-Priority X-Broker-Metadata-Headers "
            "X-Broker-Scheduled-For"
        ),
        body={"*/*": ""},
    ),
    ("DELETE", "/channel/{channel_id}/consumer/{consumer_id}"): Operation(
        answers={"204": {}},
        errors="400 404 412 503",
        guarded="401 403",
        parameters="channel_id consumer_id If-Unmodified-Since authorization",
    ),
    ("GET", "/channel/{channel_id}/consumer/{consumer_id}"): Operation(
        answers={
            "200": {
                "application/json": (
                    "AckWait Breaker CallbackURL ChangedAt DeadLetterQueueURL "
                    "DisabledAt DisabledReason Enabled ID MaxAckPending "
                    "MaxInFlight Name PriorityGroups PriorityPolicy "
                    "PriorityTimeout RateLimit SigningSecret "
                    "SigningSecretRotatedUntil Token Type"
                )
            }
        },
        errors="400 404 503",
        guarded="401 403",
        headers={"200": "Last-Modified"},
        parameters="channel_id consumer_id authorization X-Broker-Channel-Token",
    ),
    ("PUT", "/channel/{channel_id}/consumer/{consumer_id}"): Operation(
        answers={
            "200": {
                "application/json": (
                    "AckWait Breaker CallbackURL ChangedAt DeadLetterQueueURL "
                    "DisabledAt DisabledReason Enabled ID MaxAckPending "
                    "MaxInFlight Name PriorityGroups PriorityPolicy "
                    "PriorityTimeout RateLimit SigningSecret "
                    "SigningSecretRotatedUntil Token Type"
                )
            }
        },
        errors="400 404 408 412 413 415 503",
        guarded="401 403",
        headers={"200": "Last-Modified"},
        parameters="channel_id consumer_id If-Unmodified-Since authorization",
        body={
            "application/x-www-form-urlencoded": (
                "ackWait callbackUrl enabled maxAckPending maxInFlight name "
                "priorityGroups priorityPolicy priorityTimeout rateLimit "
                "signingSecret signingSecretOverlap token type"
            )
        },
    ),
    ("PUT", "/channel/{channel_id}/consumer/{consumer_id}/pause"): Operation(
        answers={"200": {"application/json": "ID Paused PausedUntil Type"}},
        errors="400 404 408 413 415 503",
        guarded="401 403",
        headers={"200": "Last-Modified"},
        parameters="channel_id consumer_id authorization",
        body={"application/x-www-form-urlencoded": "until"},
    ),
    ("DELETE", "/channel/{channel_id}/consumer/{consumer_id}/pause"): Operation(
        answers={"200": {"application/json": "ID Paused PausedUntil Type"}},
        errors="400 404 503",
        guarded="401 403",
        headers={"200": "Last-Modified"},
        parameters="channel_id consumer_id authorization",
    ),
    ("POST", "/channel/{channel_id}/consumer/{consumer_id}/ack"): Operation(
        answers={"200": {"application/json": "Results"}},
        errors="400 401 403 404 408 412 413 503",
        parameters=(
            "channel_id consumer_id X-Broker-Channel-Token X-Broker-Consumer-Token authorization"
        ),
        body={"application/json": "acks"},
    ),
    ("DELETE", "/channel/{channel_id}/consumer/{consumer_id}/dlq"): Operation(
        answers={"200": {"application/json": "deletedCount"}},
        errors="400 401 403 404 503",
        parameters=(
            "channel_id consumer_id X-Broker-Channel-Token X-Broker-Consumer-Token authorization"
        ),
    ),
    ("GET", "/channel/{channel_id}/consumer/{consumer_id}/dlq"): Operation(
        answers={"200": {"application/json": "DeadJobs Pages"}},
        errors="400 401 403 404 503",
        parameters=(
            "channel_id consumer_id limit next previous "
            "X-Broker-Channel-Token X-Broker-Consumer-Token authorization"
        ),
    ),
    ("POST", "/channel/{channel_id}/consumer/{consumer_id}/dlq"): Operation(
        answers={"202": {"application/json": "Requeued"}},
        errors="400 401 403 404 408 413 503",
        parameters=(
            "channel_id consumer_id X-Broker-Channel-Token X-Broker-Consumer-Token authorization"
        ),
        body={"application/x-www-form-urlencoded": "requeue"},
    ),
    ("GET", "/channel/{channel_id}/consumer/{consumer_id}/info"): Operation(
        answers={
            "200": {
                "application/json": (
                    "AckPending Channel Consumer LastDeliveredAt NextDueAt "
                    "Pending PendingBytes PinId Redelivered Waiting"
                )
            }
        },
        errors="400 401 403 404 412 503",
        parameters=(
            "channel_id consumer_id X-Broker-Channel-Token X-Broker-Consumer-Token authorization"
        ),
    ),
    ("DELETE", "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}"): Operation(
        answers={"204": {}},
        errors="400 401 403 404 503",
        parameters=(
            "job_id channel_id consumer_id X-Broker-Channel-Token "
            "X-Broker-Consumer-Token authorization"
        ),
    ),
    ("GET", "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}"): Operation(
        answers={
            "200": {
                "application/json": (
                    "Attempt CreatedAt DeadReason EarliestNextAttemptAt ID "
                    "IncrementalTimeout LastError LeaseExpiresAt Links Message "
                    "Priority RetryCount Status StatusChangedAt"
                )
            }
        },
        errors="400 401 403 404 503",
        parameters=(
            "job_id channel_id consumer_id X-Broker-Channel-Token "
            "X-Broker-Consumer-Token authorization"
        ),
    ),
    ("POST", "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}"): Operation(
        answers={"202": {}},
        errors="400 401 403 404 408 409 412 413 503",
        parameters=(
            "job_id channel_id consumer_id X-Broker-Channel-Token "
            "X-Broker-Consumer-Token authorization"
        ),
        body={"application/json": "IncrementalTimeout NextState"},
    ),
    ("POST", "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}/ack"): Operation(
        answers={"200": {"application/json": "LeaseExpiresAt"}, "202": {}},
        errors="400 401 403 404 408 409 412 413 503",
        parameters=(
            "job_id channel_id consumer_id X-Broker-Channel-Token "
            "X-Broker-Consumer-Token authorization"
        ),
        body={"application/json": "attempt counted delay id reason type"},
    ),
    (
        "POST",
        "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}/requeue-dead-job",
    ): Operation(
        answers={"202": {}},
        errors="400 401 403 404 503",
        parameters=(
            "job_id channel_id consumer_id X-Broker-Channel-Token "
            "X-Broker-Consumer-Token authorization"
        ),
    ),
    ("POST", "/channel/{channel_id}/consumer/{consumer_id}/pull"): Operation(
        answers={"200": {"application/json": "Jobs Pending PinId", "application/x-ndjson": ""}},
        errors="400 401 403 404 408 409 412 413 423 503",
        parameters=(
            "channel_id consumer_id X-Broker-Channel-Token X-Broker-Consumer-Token authorization"
        ),
        body={
            "application/json": (
                "batch expires group id idle_heartbeat incremental_timeout "
                "max_bytes min_ack_pending min_pending no_wait priority "
                "stream"
            )
        },
    ),
    ("GET", "/channel/{channel_id}/consumer/{consumer_id}/queued-jobs"): Operation(
        answers={"200": {"application/json": "Pages Result"}},
        errors="400 401 403 404 412 503",
        parameters=(
            "channel_id consumer_id limit next previous "
            "X-Broker-Channel-Token X-Broker-Consumer-Token authorization"
        ),
    ),
    ("GET", "/channel/{channel_id}/consumer/{consumer_id}/redrives"): Operation(
        answers={"200": {"application/json": "Result"}},
        errors="400 401 403 404 503",
        parameters=(
            "channel_id consumer_id X-Broker-Channel-Token X-Broker-Consumer-Token authorization"
        ),
    ),
    ("POST", "/channel/{channel_id}/consumer/{consumer_id}/redrives"): Operation(
        answers={
            "202": {
                "application/json": (
                    "CreatedAt FinishedAt From ID Links Moved PerSecond Since Status Total Until"
                )
            }
        },
        errors="400 401 403 404 408 413 503",
        headers={"202": "Location"},
        parameters=(
            "channel_id consumer_id X-Broker-Channel-Token X-Broker-Consumer-Token authorization"
        ),
        body={"application/json": "from perSecond since until"},
    ),
    ("DELETE", "/channel/{channel_id}/consumer/{consumer_id}/redrives/{redrive_id}"): Operation(
        answers={
            "200": {
                "application/json": (
                    "CreatedAt FinishedAt From ID Links Moved PerSecond Since Status Total Until"
                )
            }
        },
        errors="400 401 403 404 409 503",
        parameters=(
            "redrive_id channel_id consumer_id X-Broker-Channel-Token "
            "X-Broker-Consumer-Token authorization"
        ),
    ),
    ("GET", "/channel/{channel_id}/consumer/{consumer_id}/redrives/{redrive_id}"): Operation(
        answers={
            "200": {
                "application/json": (
                    "CreatedAt FinishedAt From ID Links Moved PerSecond Since Status Total Until"
                )
            }
        },
        errors="400 401 403 404 503",
        parameters=(
            "redrive_id channel_id consumer_id X-Broker-Channel-Token "
            "X-Broker-Consumer-Token authorization"
        ),
    ),
    ("POST", "/channel/{channel_id}/consumer/{consumer_id}/unpin"): Operation(
        answers={"200": {"application/json": "Group Unpinned"}},
        errors="400 401 403 404 408 412 413 503",
        parameters=(
            "channel_id consumer_id X-Broker-Channel-Token X-Broker-Consumer-Token authorization"
        ),
        body={"application/json": "group"},
    ),
    ("GET", "/channel/{channel_id}/consumers"): Operation(
        answers={"200": {"application/json": "Links Pages Result"}},
        errors="400 404 503",
        guarded="401 403",
        parameters="channel_id next previous authorization X-Broker-Channel-Token",
    ),
    ("GET", "/channel/{channel_id}/message/{message_id}"): Operation(
        answers={
            "200": {
                "application/json": (
                    "ContentType Headers ID Jobs Payload PayloadEncoding Priority "
                    "ProducedBy ReceivedAt ScheduledFor"
                )
            }
        },
        errors="400 404 503",
        guarded="401 403",
        parameters="channel_id message_id authorization X-Broker-Channel-Token",
    ),
    ("GET", "/channel/{channel_id}/messages"): Operation(
        answers={"200": {"application/json": "Links Pages Result"}},
        errors="400 404 503",
        guarded="401 403",
        parameters="channel_id status next previous authorization X-Broker-Channel-Token",
    ),
    ("GET", "/channel/{channel_id}/messages-status"): Operation(
        answers={"200": {"application/json": "Counts"}},
        errors="400 404 503",
        guarded="401 403",
        parameters="channel_id authorization X-Broker-Channel-Token",
    ),
    ("DELETE", "/channel/{channel_id}/scheduled-message/{message_id}"): Operation(
        answers={"204": {}},
        errors="400 401 403 404 409 503",
        parameters=(
            "channel_id message_id X-Broker-Channel-Token "
            "X-Broker-Producer-ID X-Broker-Producer-Token"
        ),
    ),
    ("GET", "/channel/{channel_id}/scheduled-message/{message_id}"): Operation(
        answers={
            "200": {
                "application/json": (
                    "contentType dispatchSchedule dispatchedAt headers id "
                    "messageId payload payloadEncoding priority producedBy status"
                )
            }
        },
        errors="400 404 503",
        guarded="401 403",
        parameters="channel_id message_id authorization X-Broker-Channel-Token",
    ),
    ("GET", "/channel/{channel_id}/scheduled-messages"): Operation(
        answers={"200": {"application/json": "pages result"}},
        errors="400 404 503",
        guarded="401 403",
        parameters="channel_id status next previous authorization X-Broker-Channel-Token",
    ),
    ("GET", "/channels"): Operation(
        answers={"200": {"application/json": "Links Pages Result"}},
        errors="400 503",
        guarded="401 403",
        parameters="next previous authorization",
    ),
    ("GET", "/dlq-status"): Operation(
        answers={"200": {"application/json": "consumers"}},
        errors="503",
        guarded="401 403",
        parameters="authorization",
    ),
    ("GET", "/job-status"): Operation(
        answers={"200": {"application/json": ""}},
        errors="503",
        guarded="401 403",
        parameters="authorization",
    ),
    ("GET", "/metrics"): Operation(
        answers={"200": {"text/plain": ""}},
        errors="503",
    ),
    ("GET", "/producer/{producer_id}"): Operation(
        answers={"200": {"application/json": "ChangedAt ID Name Token"}},
        errors="400 404 503",
        guarded="401 403",
        headers={"200": "Last-Modified"},
        parameters="producer_id authorization",
    ),
    ("PUT", "/producer/{producer_id}"): Operation(
        answers={"200": {"application/json": "ChangedAt ID Name Token"}},
        errors="400 408 412 413 415 503",
        guarded="401 403",
        headers={"200": "Last-Modified"},
        parameters="producer_id If-Unmodified-Since authorization",
        body={"application/x-www-form-urlencoded": "name token"},
    ),
    ("GET", "/producers"): Operation(
        answers={"200": {"application/json": "Links Pages Result"}},
        errors="400 503",
        guarded="401 403",
        parameters="next previous authorization",
    ),
}


def document(extra: str = "") -> dict[str, Any]:
    return create_app(load_config_text(extra)).openapi()


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def fields(document: dict[str, Any], content: dict[str, Any]) -> dict[str, set[str]]:
    return {
        media: set(resolve(document, entry["schema"]).get("properties", {}))
        for media, entry in content.items()
    }


@pytest.fixture(scope="module")
def plain() -> dict[str, Any]:
    return document()


@pytest.fixture(scope="module")
def guarded() -> dict[str, Any]:
    return document(GUARDED)


@pytest.mark.parametrize(("method", "path"), sorted(BEFORE), ids=" ".join)
def test_every_operation_keeps_what_it_documented(
    plain: dict[str, Any], guarded: dict[str, Any], method: str, path: str
) -> None:
    before = BEFORE[(method, path)]
    operation = plain["paths"][path][method.lower()]
    responses = operation["responses"]
    for status, media in before.answers.items():
        assert status in responses, status
        now = fields(plain, responses[status].get("content", {}))
        for name, listed in media.items():
            assert name in now, (status, name)
            assert set(listed.split()) <= now[name], (status, name, now[name])
            assert resolve(plain, responses[status]["content"][name]["schema"]), (status, name)
    for status, names in before.headers.items():
        assert set(names.split()) <= set(responses[status]["headers"]), status
    for status, answer in responses.items():
        assert "X-Request-ID" in answer["headers"], status
    assert set(before.errors.split()) <= set(responses), set(before.errors.split()) - set(responses)
    more = set(guarded["paths"][path][method.lower()]["responses"])
    assert set(before.guarded.split()) <= more
    given = {p["name"] for p in operation.get("parameters", [])}
    assert set(before.parameters.split()) <= given, set(before.parameters.split()) - given
    if before.body:
        now = fields(plain, operation["requestBody"]["content"])
        for name, listed in before.body.items():
            assert set(listed.split()) <= now[name], (name, now[name])


def test_no_operation_is_lost_and_none_answers_fastapis_422(plain: dict[str, Any]) -> None:
    now = {(m.upper(), p) for p, ops in plain["paths"].items() for m in ops}
    assert set(BEFORE) <= now, set(BEFORE) - now
    assert "422" not in str(plain) and "HTTPValidationError" not in plain["components"]["schemas"]


def test_json_request_bodies_are_the_models_schemas(plain: dict[str, Any]) -> None:
    """The JSON bodies the routes read are documented from the pydantic models that validate
    them (app/api/schemas), as named components."""
    from app.api import schemas

    for (method, path), before in BEFORE.items():
        if "application/json" not in before.body:
            continue
        body = plain["paths"][path][method.lower()]["requestBody"]["content"]["application/json"]
        name = body["schema"]["$ref"].rsplit("/", 1)[1]
        model = getattr(schemas, name)
        assert plain["components"]["schemas"][name]["properties"].keys() == {
            info.alias or key for key, info in model.model_fields.items()
        }
