"""Schemathesis hooks for tests/test_openapi_fuzz.py (loaded by its `schemathesis run` through
SCHEMATHESIS_HOOKS): about half of the generated requests name the objects the test set up,
the channel, its producer, consumers, messages, jobs and a redrive, with their tokens, so that
they get past the credential checks into the work of each route. Which requests do, and which
objects they name, follows from the request itself: a deterministic run stays the same run.
And one check of ours: the lines of a streaming pull."""

from __future__ import annotations

import json
import zlib
from typing import Any

import jsonschema_rs
import schemathesis
from requests.structures import CaseInsensitiveDict
from schemathesis import Case, CheckContext, HookContext, Response

from tests.helpers.pull import CHANNEL, CHANNEL_TOKEN, PRODUCER, PRODUCER_TOKEN

# Set up by the test: a plain pull consumer, a pinned_client one and a push one.
CONSUMERS = ("k1", "kg", "push1")
MESSAGES = ("m0", "m1", "m2", "s1")
JOBS = 20  # job ids 1..JOBS are likely to exist
PRIORITY_TERMS = ("group", "min_pending", "min_ack_pending", "id", "priority")


def token(consumer_id: str) -> str:
    return f"{consumer_id}-token"


@schemathesis.hook
def map_case(context: HookContext, case: Case[Any]) -> Case[Any]:
    # (not the repr of every body: some hold objects whose repr is their address)
    plain = case.body if isinstance(case.body, str | bytes | dict | list) else None
    drawn = (case.method, case.path, case.path_parameters, case.headers, case.query, plain)
    pick = zlib.crc32(repr(drawn).encode())
    if pick % 2:
        return case  # as generated
    pick //= 2
    params = case.path_parameters
    consumer = CONSUMERS[pick % len(CONSUMERS)]
    known = {
        "channel_id": CHANNEL,
        "producer_id": PRODUCER,
        "consumer_id": consumer,
        "message_id": MESSAGES[pick % len(MESSAGES)],
        "job_id": str(1 + pick % JOBS),
        "redrive_id": "1",
    }
    if case.method == "PUT":
        # A new consumer of the real channel: a PUT of an object that exists is refused
        # without its If-Unmodified-Since.
        known = {"channel_id": CHANNEL} if "consumer_id" in params else {}
    case.path_parameters = {name: known.get(name, value) for name, value in params.items()}
    headers = dict(case.headers or {})
    if "consumer_id" in params:
        headers["X-Broker-Channel-Token"] = CHANNEL_TOKEN
        headers["X-Broker-Consumer-Token"] = token(consumer)
    elif case.path.endswith(("/broadcast", "/scheduled-message/{message_id}")):
        headers["X-Broker-Channel-Token"] = CHANNEL_TOKEN
        headers["X-Broker-Producer-ID"] = PRODUCER
        headers["X-Broker-Producer-Token"] = PRODUCER_TOKEN
    case.headers = CaseInsensitiveDict(headers)
    if case.path.endswith("/pull") and isinstance(case.body, dict):
        # The priority terms the consumer takes: kg's group, none for the others.
        body: dict[str, Any] = {k: v for k, v in case.body.items() if k not in PRIORITY_TERMS}
        if consumer == "kg":
            body["group"] = "g1"
        case.body = body
    return case


@schemathesis.check
def stream_lines_conformance(ctx: CheckContext, response: Response, case: Case[Any]) -> None:
    """A streaming pull's application/x-ndjson body, which schemathesis does not read: each line
    a JSON object of the document's StreamLine schema, the last one the status line."""
    content_type = next(iter(response.headers.get("content-type", [])), "")
    if not content_type.startswith("application/x-ndjson") or response.stream_cut_short:
        return
    schemas = case.operation.schema.raw_schema["components"]["schemas"]
    # Its parts are components of their own: they resolve within a root that holds them.
    validator = jsonschema_rs.validator_for(
        {**schemas["StreamLine"], "components": {"schemas": schemas}}
    )
    lines = [json.loads(line) for line in response.content.splitlines()]
    for number, line in enumerate(lines, 1):
        errors = [error.message for error in validator.iter_errors(line)]
        assert not errors, f"line {number} of the stream, {line}, does not conform: {errors}"
    assert lines and "Status" in lines[-1], f"the stream does not end with a status line: {lines}"
