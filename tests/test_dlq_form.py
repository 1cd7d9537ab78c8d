"""The Go original's dead-letter requeue form: POST .../dlq with `requeue=<consumer token>`."""

from __future__ import annotations

import httpx

from tests.helpers.pull import CHANNEL, job_status, publish, pull_jobs, setup_channel

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


async def test_the_requeue_form_takes_the_consumer_token(client: httpx.AsyncClient) -> None:
    (k1,) = await setup_channel(client)
    await publish(client, "poison")
    (job,) = await pull_jobs(client, k1)
    r = await client.post(k1.job(job["ID"]) + "/ack", json={"type": "term"}, headers=k1.auth)
    assert r.status_code == 202
    dlq = f"{k1.base}/dlq"
    wrong = await client.post(dlq, content=b"requeue=nope", headers=FORM)
    assert wrong.status_code == 400
    assert wrong.json()["detail"] == "`requeue` form param must match consumer token"
    assert (await client.post(dlq, content=b"", headers=FORM)).status_code == 400
    missing = await client.post(
        f"/channel/{CHANNEL}/consumer/nobody/dlq", content=b"requeue=x", headers=FORM
    )
    assert missing.status_code == 404
    assert await job_status(client, k1, job["ID"]) == "DEAD"
    done = await client.post(dlq, content=f"requeue={k1.token}".encode(), headers=FORM)
    assert (done.status_code, done.json()) == (202, {"Requeued": 1})
    assert await job_status(client, k1, job["ID"]) == "QUEUED"
    # the header form still works, and still needs the headers
    assert (await client.post(dlq)).status_code in (401, 403)
    assert (await client.post(dlq, headers=k1.auth)).json() == {"Requeued": 0}


async def test_purging_the_dead_letter_queue(client: httpx.AsyncClient) -> None:
    (k1,) = await setup_channel(client)
    for n in range(3):
        await publish(client, f"m{n}")
    jobs = await pull_jobs(client, k1, batch=3)
    for job in jobs[:2]:
        r = await client.post(k1.job(job["ID"]) + "/ack", json={"type": "term"}, headers=k1.auth)
        assert r.status_code == 202
    dlq = f"{k1.base}/dlq"
    assert (await client.delete(dlq)).status_code in (401, 403)
    purged = await client.delete(dlq, headers=k1.auth)
    assert (purged.status_code, purged.json()) == (200, {"deletedCount": 2})
    assert (await client.get(k1.job(jobs[0]["ID"]), headers=k1.auth)).status_code == 404
    assert await job_status(client, k1, jobs[2]["ID"]) == "INFLIGHT"  # only the dead ones
    assert (await client.delete(dlq, headers=k1.auth)).json() == {"deletedCount": 0}
