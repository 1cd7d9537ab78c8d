"""NOTIFY payloads stay under PostgreSQL's 8000-byte limit however many consumers a channel has."""

from __future__ import annotations

from app.store.db import MAX_NOTIFY_PAYLOAD, _payload


def test_small_sets_name_each_consumer() -> None:
    assert _payload({3, 1, 2}) == "1,2,3"


def test_huge_sets_wake_everyone() -> None:
    payload = _payload(set(range(1, 5000)))
    assert payload == "*"
    assert len(_payload(set(range(1, 1000)))) <= MAX_NOTIFY_PAYLOAD
