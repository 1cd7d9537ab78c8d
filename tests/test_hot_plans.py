"""The hot claim and batch ack settle on PostgreSQL's generic plans once prepared.

A statement PostgreSQL keeps planning anew costs it a third of a millisecond per call (more
than running a small ack). It happens when the generic plan looks dearer than the custom ones,
as it does for LIMIT $n (priced for a tenth of the table), and it does not show in any result,
so it is checked here on the one connection that served every request.
"""

from __future__ import annotations

import httpx
import pytest

from app.runtime import Runtime
from tests.helpers_pull import bulk_publish, setup_channel

ROUNDS = 14  # psycopg prepares on the 6th call; PostgreSQL tries 5 custom plans first
BATCH = 12  # batch acks above ten elements were once left unprepared
QUEUED = 20_000  # a generic LIMIT $n only looks dear on a table the statistics call big


@pytest.fixture
def extra_config(rdbms: str) -> str:
    if "dialect=postgresql" not in rdbms:
        pytest.skip("plans are PostgreSQL's")
    return "max-idle-connxns=1\nmax-open-connxns=1\n"


async def test_claim_and_batch_ack_use_generic_plans(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client)
    await bulk_publish(runtime, QUEUED)
    await runtime.db.run_alone("ANALYZE job", {})
    for _ in range(ROUNDS):
        r = await client.post(
            f"{k1.base}/pull", json={"batch": BATCH, "no_wait": True}, headers=k1.auth
        )
        assert r.status_code == 200, r.text
        jobs = r.json()["Jobs"]
        assert len(jobs) == BATCH
        acks = [{"id": j["ID"], "attempt": j["Attempt"]} for j in jobs]
        r = await client.post(f"{k1.base}/ack", json={"acks": acks}, headers=k1.auth)
        assert [o["status"] for o in r.json()["Results"]] == [202] * BATCH, r.text

    rows = await runtime.db.run_alone(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements", {}
    )
    plans = {
        kind: [(generic, custom) for statement, generic, custom in rows if marker in statement]
        for kind, marker in (("claim", "SKIP LOCKED"), ("ack", "unnest("))
    }
    for kind, found in plans.items():
        assert len(found) == 1, f"the {kind} was not prepared once: {found}"
        generic, custom = found[0]
        assert generic > 0 and custom <= 5, f"the {kind} is planned per call: {found[0]}"
