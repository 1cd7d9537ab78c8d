"""Redelivery after an ack wait: how long past the ack wait a fetched and unacknowledged
message takes to come back to a waiting fetch. Real JetStream is the reference; ours is the
bridge in hybrid mode (the lease lapses, the sweeper requeues it, the waiting pull is woken).
Each sample is one message: fetch it, leave it, fetch again and time the second delivery."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.loadgen import percentiles

ACK_WAIT = 2.0  # seconds; the bench's `redeliver` consumer is seeded with the same
SAMPLES = 6


async def past_ack_wait(
    url: str, stream: str, durable: str, refill: Callable[[], Awaitable[None]]
) -> tuple[dict[str, Any], list[str]]:
    """Milliseconds past the ack wait of each redelivery (percentiles), and what went wrong."""
    import nats

    late: list[float] = []
    problems: list[str] = []
    nc = await nats.connect(url)
    try:
        sub = await nc.jetstream().pull_subscribe_bind(durable, stream=stream)
        for _ in range(SAMPLES):
            await refill()
            [first] = await sub.fetch(1, timeout=10)
            handed = time.monotonic()
            [again] = await sub.fetch(1, timeout=ACK_WAIT + 10)
            came_back = time.monotonic()
            await again.ack_sync()
            seqs = (first.metadata.sequence.stream, again.metadata.sequence.stream)
            if seqs[0] != seqs[1] or again.metadata.num_delivered != 2:
                problems.append(f"expected the same message again, got stream seqs {seqs}")
                continue
            late.append((came_back - handed - ACK_WAIT) * 1000.0)
    finally:
        await nc.close()
    return percentiles(late), problems
