"""The pure wire grammar: pull bodies, status blocks, ack subjects and payloads, Go durations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from app.bridge import protocol as p
from app.domain.priority import PullPriority


def json_spec(**fields: Any) -> p.PullSpec:
    """What a JSON body reads as: priority terms (none given here but the JSON flag)."""
    return p.PullSpec(is_json=True, terms=fields.pop("terms", PullPriority()), **fields)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", p.PullSpec()),
        (b"  \r\n", p.PullSpec()),
        (b"3", p.PullSpec(batch=3)),
        (b"0", p.PullSpec(batch=1)),
        (b"abc", p.PullSpec()),
        (
            b'{"batch": 5, "expires": 1999900000, "no_wait": true}',
            json_spec(batch=5, expires=1_999_900_000, no_wait=True),
        ),
        # Without a batch (or 0) one job is served, and pending headers count from 0.
        (b"{}", json_spec(batch_unset=True)),
        (b'{"batch": 0}', json_spec(batch=1, batch_unset=True)),
        (b'{"Batch": 7, "NO_WAIT": true}', json_spec(batch=7, no_wait=True)),
        (
            b'{"batch": 2, "expires": 2000000000, "idle_heartbeat": 1000000000, "max_bytes": 9}',
            json_spec(batch=2, expires=2_000_000_000, heartbeat=1_000_000_000, max_bytes=9),
        ),
        (b'{"batch": 1, "expires": null, "unknown": [1, 2]}', json_spec()),
        (
            b'{"batch": 1, "group": "jobs", "min_pending": 5, "min_ack_pending": -1, '
            b'"id": "pin", "priority": 3}',
            json_spec(
                terms=PullPriority(
                    group="jobs", min_pending=5, min_ack_pending=-1, pin_id="pin", priority=3
                )
            ),
        ),
    ],
)
def test_pull_request_bodies(body: bytes, expected: p.PullSpec) -> None:
    assert p.parse_pull_request(body) == expected


@pytest.mark.parametrize(
    ("body", "description"),
    [
        # The exact texts nats-server 2.15.1 sends (protocol doc section 4).
        (b"{bad", "Bad Request - invalid character 'b' looking for beginning of object key string"),
        (
            b'{"batch": 1, "expires": 1000000000, "idle_heartbeat": 500000001}',
            "Bad Request - heartbeat value too large",
        ),
        (b'{"batch": 1, "idle_heartbeat": 1}', "Bad Request - heartbeat value too large"),
        (b'{"batch" 1}', "Bad Request - invalid character '1' after object key"),
        (
            b'{"batch": 1 "x": 2}',
            "Bad Request - invalid character '\"' after object key:value pair",
        ),
        (b'{"batch": }', "Bad Request - invalid character '}' looking for beginning of value"),
        (b'{"batch": 1', "Bad Request - unexpected end of JSON input"),
        (b'{"batch": 1} x', "Bad Request - invalid character 'x' after top-level value"),
        (
            b'{"batch": "3"}',
            "Bad Request - json: cannot unmarshal string into Go struct field .batch of type int",
        ),
        (
            b'{"batch": 1.5}',
            "Bad Request - json: cannot unmarshal number 1.5 into Go struct field "
            ".batch of type int",
        ),
        (
            b'{"no_wait": 1}',
            "Bad Request - json: cannot unmarshal number into Go struct field "
            ".no_wait of type bool",
        ),
        (
            b'{"expires": "1s"}',
            "Bad Request - json: cannot unmarshal string into Go struct field "
            ".expires of type time.Duration",
        ),
    ],
)
def test_bad_pull_requests(body: bytes, description: str) -> None:
    with pytest.raises(p.BadRequest) as caught:
        p.parse_pull_request(body)
    assert caught.value.description == description


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("0", 0),
        ("300ms", 300_000_000),
        ("1.5s", 1_500_000_000),
        ("1h2m3.5s", 3_723_500_000_000),
        ("-1.5us", -1_500),
        ("2\u00b5s", 2_000),
        ("2\u03bcs", 2_000),
        ("10ns", 10),
        ("+5m", 300_000_000_000),
        (".5s", 500_000_000),
        ("1.s", 1_000_000_000),
    ],
)
def test_go_durations_parse(text: str, nanos: int) -> None:
    assert p.parse_go_duration(text) == nanos


@pytest.mark.parametrize("text", ["", "1", "s", "1x", "1.5", "-", ".s", "1s2", "1 s"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(ValueError):
        p.parse_go_duration(text)


@pytest.mark.parametrize(
    ("nanos", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (1_500, "1.5\u00b5s"),
        (1_500_000, "1.5ms"),
        (1_000_000_000, "1s"),
        (300 * 10**9, "5m0s"),
        (3600 * 10**9 + 30 * 10**9, "1h0m30s"),
        (90_500_000_000, "1m30.5s"),
        (-2 * 10**9, "-2s"),
    ],
)
def test_go_durations_format(nanos: int, text: str) -> None:
    assert p.format_go_duration(nanos) == text
    assert p.parse_go_duration(text) == nanos


def test_status_blocks_are_the_servers_bytes() -> None:
    assert p.status_block(*p.NO_MESSAGES) == b"NATS/1.0 404 No Messages\r\n\r\n"
    assert (
        p.status_block(*p.REQUEST_TIMEOUT, p.pending_headers(5, 0))
        == b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 5\r\nNats-Pending-Bytes: 0"
        b"\r\n\r\n"
    )
    assert (
        p.heartbeat_block(7, 5)
        == b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 7\r\nNats-Last-Stream: 5\r\n\r\n"
    )
    status, headers = p.parse_header_block(p.status_block(*p.PUSH_BASED))
    assert status == p.Status(409, "Consumer is push based", {})
    assert headers == {}


def test_message_header_block_drops_invalid_names_and_newlines() -> None:
    block = p.message_header_block(
        [("X-Job", "1"), ("bad name", "x"), ("Nats-Subject", "jobs"), ("X-Evil", "a\r\nb")]
    )
    assert block == b"NATS/1.0\r\nX-Job: 1\r\nNats-Subject: jobs\r\nX-Evil: a  b\r\n\r\n"
    status, headers = p.parse_header_block(block)
    assert status is None
    assert headers["Nats-Subject"] == "jobs"


def test_ack_subject_round_trip() -> None:
    token = p.AckToken("JOBS", "worker", 2, 5, 6, 1795257496892922056, 0, 77)
    subject = p.ack_subject("$JS.ACK", token)
    assert subject == "$JS.ACK._.77.JOBS.worker.2.5.6.1795257496892922056.0"
    assert p.parse_ack_subject("$JS.ACK", subject) == token
    # nats-server's form (push and AckNone deliveries; pull deliveries made before an
    # upgrade): the job is the stream sequence's, found by the message for push consumers.
    server = p.server_ack_subject("$WB.ACK", token)
    assert server == "$WB.ACK.JOBS.worker.2.5.6.1795257496892922056.0"
    assert p.parse_ack_subject("$WB.ACK", "$WB.ACK.c.k.1.2.3.4.5") == p.AckToken(
        "c", "k", 1, 2, 3, 4, 5, 2, server_form=True
    )


@pytest.mark.parametrize(
    "subject",
    [
        "$JS.ACK.JOBS.worker.1.1.1.1",  # too few tokens
        "$JS.ACK.hub.acct.JOBS.worker.1.1.1.1.0",  # a domain: not ours
        "$JS.ACK._.acct.JOBS.worker.1.1.1.1.0",  # an account hash: not ours
        "$JS.ACK._.0.JOBS.worker.1.1.1.1.0",  # job ids start at 1
        "$JS.ACK.JOBS.worker.x.1.1.1.0",
        "$JS.ACK.JOBS.worker.0.1.1.1.0",  # attempts start at 1
        "$JS.ACK.JOBS.worker.1.0.1.1.0",  # job ids start at 1
        "$JS.ACK.JOBS.worker.1.-1.1.1.0",
        "$JS.ACKX.JOBS.worker.1.1.1.1.0",
        "$WB.ACK.JOBS.worker.1.1.1.1.0",
    ],
)
def test_foreign_ack_subjects_are_refused(subject: str) -> None:
    assert p.parse_ack_subject("$JS.ACK", subject) is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", p.AckCommand(p.AckKind.ACK)),
        (b"+ACK", p.AckCommand(p.AckKind.ACK)),
        (b"+OK", p.AckCommand(p.AckKind.ACK)),
        (b"-NAK", p.AckCommand(p.AckKind.NAK)),
        (b'-NAK {"delay": 500000000}', p.AckCommand(p.AckKind.NAK, delay=0.5)),
        (b'-NAK {"delay":300000000}', p.AckCommand(p.AckKind.NAK, delay=0.3)),
        (b"-NAK 300ms", p.AckCommand(p.AckKind.NAK, delay=0.3)),
        (b"-NAK 1m", p.AckCommand(p.AckKind.NAK, delay=60.0)),
        (b"-NAK bogus", p.AckCommand(p.AckKind.NAK)),  # an invalid delay is a plain NAK
        (b'-NAK {"delay": "1s"}', p.AckCommand(p.AckKind.NAK)),
        (b'-NAK {"delay": 0}', p.AckCommand(p.AckKind.NAK)),
        (b"+WPI", p.AckCommand(p.AckKind.PROGRESS)),
        (b"+TERM", p.AckCommand(p.AckKind.TERM)),
        (
            b"+TERM bad payload, giving up",
            p.AckCommand(p.AckKind.TERM, reason="bad payload, giving up"),
        ),
        (b"+NXT", p.AckCommand(p.AckKind.NEXT)),
        (
            b'+NXT {"batch":2,"no_wait":true}',
            p.AckCommand(p.AckKind.NEXT, next_request=b'{"batch":2,"no_wait":true}'),
        ),
        (b"+NXT 3", p.AckCommand(p.AckKind.NEXT, next_request=b"3")),
        (b"hello", p.AckCommand(p.AckKind.UNKNOWN)),
        (b"+WPIX", p.AckCommand(p.AckKind.UNKNOWN)),
    ],
)
def test_ack_payloads(body: bytes, expected: p.AckCommand) -> None:
    assert p.parse_ack(body) == expected


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("jobs", "jobs", True),
        ("jobs.*", "jobs.email", True),
        ("jobs.*", "jobs", False),
        ("jobs.>", "jobs.a.b", True),
        ("jobs.>", "jobs", False),
        (">", "anything", True),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.b.d", False),
    ],
)
def test_subject_matching(pattern: str, subject: str, matches: bool) -> None:
    assert p.subject_matches(pattern, subject) is matches


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("orders", "orders", True),
        ("orders", ">", True),
        ("orders", "*", True),
        ("orders", "orders.>", False),
        ("orders", "other", False),
        ("a.*", "a.b", True),
        ("a.>", "*.b.c", True),
    ],
)
def test_subject_overlap(a: str, b: str, overlap: bool) -> None:
    assert p.subjects_overlap(a, b) is overlap
    assert p.subjects_overlap(b, a) is overlap


def test_rfc3339_is_what_nats_py_parses() -> None:
    assert p.rfc3339(datetime(2026, 11, 21, 10, 38, 16, 946278, tzinfo=UTC)) == (
        "2026-11-21T10:38:16.946278Z"
    )
    assert p.rfc3339(datetime(2026, 11, 21, 10, 38, 16, 500000, tzinfo=UTC)) == (
        "2026-11-21T10:38:16.5Z"
    )
    assert p.rfc3339(datetime(2026, 11, 21, 10, 38, 16)) == "2026-11-21T10:38:16Z"


def test_api_error_has_only_what_nats_py_accepts() -> None:
    import json

    from nats.js.errors import NotFoundError

    document = json.loads(p.consumer_not_found(p.INFO_TYPE))
    assert document == {
        "type": "io.nats.jetstream.api.v1.consumer_info_response",
        "error": {"code": 404, "err_code": 10014, "description": "consumer not found"},
    }
    with pytest.raises(NotFoundError):
        NotFoundError.from_error(document["error"])
