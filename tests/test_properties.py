"""Property tests (Hypothesis) of the parsers and pure functions every request goes through:
the backoff, the pagination cursor, the bridge's pull-request and ack-subject parsers, Go
durations, and the config loader. Each holds for any input, not only the ones written down."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bridge.protocol import (
    AckToken,
    BadRequest,
    ack_subject,
    format_go_duration,
    parse_ack_subject,
    parse_go_duration,
    parse_pull_request,
)
from app.config import ConfigError, load_config_text
from app.domain.errors import InvalidInput
from app.domain.jobs import backoff_seconds
from app.store.pagination import decode_cursor, encode_cursor

INT32 = 2**31 - 1
INT64 = 2**63 - 1
names = st.text(
    alphabet=st.characters(exclude_characters=".\x00 *>", exclude_categories=["Cs"]),
    min_size=1,
    max_size=40,
)


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=6), st.integers(1, 200))
def test_backoff_follows_the_table_then_grows_by_the_last_delay(
    delays: list[int], retry: int
) -> None:
    delays.sort()
    wait = backoff_seconds(delays, retry)
    if retry < len(delays):
        assert wait == delays[retry - 1]
    else:
        assert wait == (retry - len(delays) + 1) * delays[-1]
    assert backoff_seconds(delays, retry + 1) >= wait  # never shorter for a later retry


@given(st.text())
def test_a_cursor_decodes_to_what_was_encoded(value: str) -> None:
    assert decode_cursor(encode_cursor(value)) == value


@given(st.text(max_size=200))
def test_any_cursor_text_decodes_or_is_a_400(cursor: str) -> None:
    with contextlib.suppress(InvalidInput):
        decode_cursor(cursor)


@given(st.binary(max_size=400))
@settings(max_examples=300)
def test_any_pull_request_body_is_a_request_or_a_bad_request(body: bytes) -> None:
    try:
        spec = parse_pull_request(body)
    except BadRequest:
        return
    assert spec.batch >= 1 and spec.expires >= 0 and spec.max_bytes >= 0


@given(
    st.integers(-(2**40), 2**40),
    st.integers(0, 10**12),
    st.booleans(),
    st.integers(-(2**40), 2**40),
)
def test_a_json_pull_request_keeps_its_fields(
    batch: int, expires: int, no_wait: bool, max_bytes: int
) -> None:
    body = (
        f'{{"batch": {batch}, "expires": {expires}, "no_wait": {str(no_wait).lower()},'
        f' "max_bytes": {max_bytes}}}'
    ).encode()
    spec = parse_pull_request(body)
    assert spec.batch == max(batch, 1)
    assert spec.expires == expires
    assert spec.no_wait is no_wait
    assert spec.max_bytes == max(max_bytes, 0)


@given(
    names,
    names,
    st.integers(1, INT32),
    st.integers(1, INT64),
    st.integers(0, INT64),
    st.integers(0, INT64),
    st.integers(0, INT64),
    st.integers(1, INT64),
)
def test_an_ack_subject_round_trips(
    stream: str,
    consumer: str,
    delivered: int,
    sseq: int,
    dseq: int,
    ts: int,
    pending: int,
    job_id: int,
) -> None:
    token = AckToken(stream, consumer, delivered, sseq, dseq, ts, pending, job_id)
    assert parse_ack_subject("$WB.ACK", ack_subject("$WB.ACK", token)) == token


@given(st.text(max_size=300))
def test_any_subject_is_an_ack_token_or_none(subject: str) -> None:
    token = parse_ack_subject("$JS.ACK", "$JS.ACK." + subject)
    if token is not None:
        assert 1 <= token.delivered <= INT32 and 0 <= token.pending <= INT64


@given(st.integers(-INT64, INT64))
def test_go_durations_round_trip(nanos: int) -> None:
    assert parse_go_duration(format_go_duration(nanos)) == nanos


@given(st.text(max_size=40))
def test_any_duration_text_parses_or_is_refused(text: str) -> None:
    with contextlib.suppress(ValueError):
        parse_go_duration(text)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("broker", "max-retry"),
        ("broker", "retry-backoff-delays-in-seconds"),
        ("pull", "max-batch"),
        ("push", "breaker-cooldown"),
        ("log", "log-level"),
        ("http", "listener"),
    ],
)
@given(value=st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30))
@settings(max_examples=60, deadline=None)
def test_any_value_loads_or_is_refused_naming_section_and_key(
    section: str, key: str, value: str
) -> None:
    if "\n" in value or "\r" in value or value.strip() != value or "%" in value:
        return  # an INI line cannot carry these as a value
    try:
        load_config_text(f"[{section}]\n{key}={value}\n")
    except ConfigError as exc:
        assert f"[{section}] {key}" in str(exc), str(exc)
