"""The console's pure rules, as tables: the job page's payload view stays bounded whatever the
payload, a filter's times and a field search refuse or miss without raising, and the pages say
only the fixed texts an action's redirect names."""

from __future__ import annotations

import pytest

from app.domain.console import parse_job_filter, parse_payload_query
from app.domain.errors import InvalidInput
from app.ui.routes import SHOWN_MAX, _payload_view, done_text

NESTED = b"[" * 600 + b"0," * 1000 + b"0" + b"]" * 600


@pytest.mark.parametrize(
    ("payload", "kind", "starts", "ends"),
    [
        (b'{"a": [1, 2]}', "json", '{\n  "a": [\n    1,', "]\n}"),
        # ~3 KiB that would indent to ~2 MB: shown as sent.
        (NESTED, "text", "[[[", "]]]"),
        # Deeper than the parser goes: shown as text, not a 500.
        (b"[" * 100_000, "text", "[[[", "[[["),
        (b'{"a":"x","b":' + b"[" * 100_000, "text", '{"a"', "[[["),
        # JSON over 64 KiB is not indented; text is cut with what is left.
        (b'["' + b"x" * 300_000 + b'"]', "text", '["xxx', f"… {300_004 - SHOWN_MAX} more bytes"),
        (b"y" * 1_000_000, "text", "yyy", f"… {1_000_000 - SHOWN_MAX} more bytes"),
        (b"\x00\x01" * 40_000, "hex", "00000000  00 01", f"… {80_000 - 49_152} more bytes"),
    ],
)
def test_the_payload_view_is_bounded(payload: bytes, kind: str, starts: str, ends: str) -> None:
    shown_kind, shown = _payload_view(payload, "application/json")
    assert (shown_kind, shown[: len(starts)], shown[-len(ends) :]) == (kind, starts, ends)
    assert len(shown) <= SHOWN_MAX + 100


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"since": "0001-01-01T00:00:00+01:00"}, "since is outside the years 1 to 9999"),
        ({"until": "9999-12-31T23:59:59-01:00"}, "until is outside the years 1 to 9999"),
        ({"until": "0001-01-01T00:00", "payload": "x"}, "until is too early"),
        ({"since": "yesterday"}, "since must be a date and time"),
    ],
)
def test_times_out_of_range_are_refused(fields: dict[str, str], reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason):
        parse_job_filter(
            since=fields.get("since"), until=fields.get("until"), payload=fields.get("payload")
        )


@pytest.mark.parametrize(
    ("search", "payload", "matches"),
    [
        ("a=x", b'{"a":"x"}', True),
        ("a=x", b'{"a":"x","b":' + b"[" * 100_000, False),
        ("a=x", b"[" * 100_000 + b'"a=x"', False),
        ("a=x", b'{"a":"x", "b": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", False),
    ],
)
def test_a_field_search_on_deep_nesting_misses(search: str, payload: bytes, matches: bool) -> None:
    query = parse_payload_query(search)
    assert query is not None and query.matches(payload) is matches


@pytest.mark.parametrize(
    ("params", "shown"),
    [
        ({"done": "requeued", "n": "12"}, "12 jobs requeued"),
        ({"done": "job-deleted", "n": "7"}, "job 7 deleted"),
        ({"done": "paused"}, "paused until resumed"),
        ({"done": "Your session ended: call +1 555 0100"}, None),
        ({"done": "<b>x</b>"}, None),
        ({"done": "requeued", "n": "twelve"}, None),
        ({"done": "requeued"}, None),
        ({}, None),
    ],
)
def test_done_shows_fixed_texts_only(params: dict[str, str], shown: str | None) -> None:
    assert done_text(params) == shown
