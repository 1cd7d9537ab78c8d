from __future__ import annotations

import httpx

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


async def test_publish_and_pull_round_trip(client: httpx.AsyncClient) -> None:
    assert (await client.put("/channel/c1", data={"token": "ct"})).status_code == 200
    assert (await client.put("/producer/p1", data={"token": "pt"})).status_code == 200
    r = await client.put("/channel/c1/consumer/k1", data={"token": "kt", "type": "pull"})
    assert r.status_code == 200, r.text
    r = await client.post(
        "/channel/c1/broadcast",
        content=b"hello",
        headers={
            "X-Broker-Channel-Token": "ct",
            "X-Broker-Producer-ID": "p1",
            "X-Broker-Producer-Token": "pt",
            "Content-Type": "text/plain",
        },
    )
    assert r.status_code == 201, r.text
    auth = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}
    r = await client.get("/channel/c1/consumer/k1/queued-jobs", headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["Result"][0]["Message"]["Payload"] == "hello"
    r = await client.post("/channel/c1/consumer/k1/pull", json={"batch": 5}, headers=auth)
    assert r.status_code == 200, r.text
    jobs = r.json()["Jobs"]
    assert len(jobs) == 1 and jobs[0]["Attempt"] == 1
    r = await client.post(
        f"/channel/c1/consumer/k1/job/{jobs[0]['ID']}/ack",
        json={"type": "ack", "attempt": 1},
        headers=auth,
    )
    assert r.status_code == 202, r.text
    r = await client.get(f"/channel/c1/consumer/k1/job/{jobs[0]['ID']}", headers=auth)
    assert r.json()["Status"] == "DELIVERED"
