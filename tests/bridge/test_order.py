"""Claims that ran side by side are handed out in queue order, numbered in that order."""

from __future__ import annotations

from datetime import UTC, datetime

from app.domain.models import PulledJob
from app.domain.pulls import Delivery
from app.services.scheduler import _in_stream_order

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def delivery(job_id: int, seq: int, priority: int = 0) -> Delivery:
    job = PulledJob(
        id=job_id,
        attempt=1,
        priority=priority,
        lease_expires_at=NOW,
        created_at=NOW,
        message_id=f"m{job_id}",
        payload=b"x",
        content_type="text/plain",
        headers={},
    )
    return Delivery(job, seq, 0)


def test_side_by_side_claims_merge_into_queue_order_with_ascending_sequences() -> None:
    # The second claim overtook the first: it holds the older jobs and the lower sequences.
    first = [delivery(3, 10), delivery(4, 11)]
    second = [delivery(1, 8), delivery(2, 9), delivery(5, 12, priority=7)]
    merged = _in_stream_order([first, second])
    assert [d.job.id for d in merged] == [5, 1, 2, 3, 4]
    assert [d.seq for d in merged] == [8, 9, 10, 11, 12]


def test_one_claim_is_handed_out_as_it_came() -> None:
    only = [delivery(2, 5), delivery(1, 6)]
    assert _in_stream_order([only]) is only
