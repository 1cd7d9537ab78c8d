"""The management API (producers, channels, consumers) on PostgreSQL and SQLite."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.api import FORM_TYPE, all_pages, an_earlier_date, create, put_form

STAKEHOLDERS = ["producer", "channel"]


@pytest.mark.parametrize("kind", STAKEHOLDERS)
async def test_create_then_get_without_token(client: httpx.AsyncClient, kind: str) -> None:
    r = await put_form(client, f"/{kind}/s1", {"token": "tok-1", "name": "First"})
    assert r.status_code == 200, r.text
    created = r.json()
    assert (created["ID"], created["Name"], created["Token"]) == ("s1", "First", "tok-1")
    last_modified = r.headers["Last-Modified"]
    assert last_modified.endswith(" GMT")

    r = await client.get(f"/{kind}/s1")
    assert r.status_code == 200
    assert r.headers["Last-Modified"] == last_modified
    body = r.json()
    assert (body["ID"], body["Name"]) == ("s1", "First")
    assert "Token" not in body and "tok-1" not in r.text


@pytest.mark.parametrize("kind", STAKEHOLDERS)
async def test_defaults_for_name_and_token(client: httpx.AsyncClient, kind: str) -> None:
    r = await put_form(client, f"/{kind}/plain")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["Name"] == "plain"
    assert len(body["Token"]) >= 16
    other = (await put_form(client, f"/{kind}/other")).json()
    assert other["Token"] != body["Token"]


@pytest.mark.parametrize("kind", STAKEHOLDERS)
async def test_get_unknown_is_404(client: httpx.AsyncClient, kind: str) -> None:
    r = await client.get(f"/{kind}/missing")
    assert r.status_code == 404
    assert r.json()["error"] == 404


@pytest.mark.parametrize("kind", STAKEHOLDERS)
async def test_put_needs_a_form(client: httpx.AsyncClient, kind: str) -> None:
    r = await client.put(f"/{kind}/s1", json={"token": "t"})
    assert r.status_code == 415
    r = await client.put(f"/{kind}/s1", content=b"token=t")
    assert r.status_code == 415
    r = await client.put(f"/{kind}/s1", content=b"token=t", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    # Nothing was created by the refused requests.
    assert (await client.get(f"/{kind}/s1")).status_code == 404
    # A charset parameter is still a form.
    r = await client.put(
        f"/{kind}/s1", content=b"token=t", headers={"Content-Type": f"{FORM_TYPE}; charset=utf-8"}
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("kind", STAKEHOLDERS)
async def test_update_is_conditional(client: httpx.AsyncClient, kind: str) -> None:
    created = await create(client, f"/{kind}/s1", {"token": "old", "name": "Old"})
    last_modified = created.headers["Last-Modified"]

    r = await put_form(client, f"/{kind}/s1", {"token": "new", "name": "New"})
    assert r.status_code == 400
    r = await put_form(
        client, f"/{kind}/s1", {"token": "new"}, since=an_earlier_date(last_modified)
    )
    assert r.status_code == 412
    r = await put_form(client, f"/{kind}/s1", {"token": "new"}, since="not a date")
    assert r.status_code == 412
    # Refused updates changed nothing.
    assert (await client.get(f"/{kind}/s1")).json()["Name"] == "Old"

    r = await put_form(client, f"/{kind}/s1", {"token": "new", "name": "New"}, since=last_modified)
    assert r.status_code == 200, r.text
    assert (r.json()["Name"], r.json()["Token"]) == ("New", "new")
    assert (await client.get(f"/{kind}/s1")).json()["Name"] == "New"


@pytest.mark.parametrize("kind", STAKEHOLDERS)
async def test_list_pages_forward_and_back(client: httpx.AsyncClient, kind: str) -> None:
    ids = [f"s{n:02d}" for n in range(30)]
    for id_ in reversed(ids):
        await create(client, f"/{kind}/{id_}")
    r = await client.get(f"/{kind}s")
    assert r.status_code == 200
    first = r.json()
    assert first["Result"] == [f"/{kind}/{id_}" for id_ in ids[:25]]
    assert "previous" not in first["Pages"]
    r = await client.get(first["Pages"]["next"])
    second = r.json()
    assert second["Result"] == [f"/{kind}/{id_}" for id_ in ids[25:]]
    assert "next" not in second["Pages"]
    r = await client.get(second["Pages"]["previous"])
    assert r.json()["Result"] == first["Result"]
    assert await all_pages(client, f"/{kind}s") == [f"/{kind}/{id_}" for id_ in ids]


@pytest.mark.parametrize("kind", STAKEHOLDERS)
async def test_list_empty_and_bad_cursor(client: httpx.AsyncClient, kind: str) -> None:
    r = await client.get(f"/{kind}s")
    assert r.status_code == 200
    assert r.json()["Result"] == [] and r.json()["Pages"] == {}
    r = await client.get(f"/{kind}s", params={"next": "%%%not-base64"})
    assert r.status_code == 400


async def test_channel_ids_with_separators_list_correctly(client: httpx.AsyncClient) -> None:
    # Cursors are opaque: ids with characters that need escaping page just the same.
    ids = [f"team.{n:02d}-x_y" for n in range(27)]
    for id_ in ids:
        await create(client, f"/channel/{id_}")
    assert await all_pages(client, "/channels") == [f"/channel/{id_}" for id_ in ids]


# Consumers


@pytest.fixture
async def channel(client: httpx.AsyncClient) -> str:
    await create(client, "/channel/c1", {"token": "ct"})
    return "/channel/c1"


async def test_push_consumer_round_trip(client: httpx.AsyncClient, channel: str) -> None:
    r = await put_form(
        client,
        f"{channel}/consumer/k1",
        {"token": "kt", "name": "Mailer", "callbackUrl": "https://mail.example/hook"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["Type"] == "push"
    assert body["Token"] == "kt"
    assert body["CallbackURL"] == "https://mail.example/hook"
    r = await client.get(f"{channel}/consumer/k1")
    assert r.status_code == 200
    got = r.json()
    assert (got["ID"], got["Name"], got["Type"]) == ("k1", "Mailer", "push")
    assert got["CallbackURL"] == "https://mail.example/hook"
    assert "Token" not in got and "kt" not in r.text.replace("k1", "")
    assert r.headers["Last-Modified"]


@pytest.mark.parametrize("type_", ["pull", "PULL", "Pull"])
async def test_pull_consumer_needs_no_callback(
    client: httpx.AsyncClient, channel: str, type_: str
) -> None:
    r = await put_form(client, f"{channel}/consumer/k1", {"token": "kt", "type": type_})
    assert r.status_code == 200, r.text
    assert r.json()["Type"] == "pull"
    assert r.json()["CallbackURL"] == ""


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "webhook", "callbackUrl": "https://x.example/"},
        {"type": "queue"},
        {"callbackUrl": "/relative/hook"},
        {"callbackUrl": "x.example/hook"},
        {"callbackUrl": "ftp://x.example/hook"},
        {"type": "push", "callbackUrl": ""},
        {},
        {"type": "pull", "callbackUrl": "relative"},
        {"type": "pull", "ackWait": "soon"},
        {"type": "pull", "maxAckPending": "0"},
    ],
)
async def test_invalid_consumer_is_400(
    client: httpx.AsyncClient, channel: str, fields: dict[str, str]
) -> None:
    r = await put_form(client, f"{channel}/consumer/k1", {"token": "kt", **fields})
    assert r.status_code == 400, r.text
    assert (await client.get(f"{channel}/consumer/k1")).status_code == 404


async def test_empty_type_means_push(client: httpx.AsyncClient, channel: str) -> None:
    r = await put_form(
        client, f"{channel}/consumer/k1", {"type": "", "callbackUrl": "http://h:81/x"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["Type"] == "push"


async def test_consumer_of_unknown_channel_is_404(client: httpx.AsyncClient) -> None:
    r = await put_form(client, "/channel/nope/consumer/k1", {"type": "pull"})
    assert r.status_code == 404
    assert (await client.get("/channel/nope/consumer/k1")).status_code == 404
    assert (await client.get("/channel/nope/consumers")).status_code == 404


async def test_consumer_put_needs_a_form(client: httpx.AsyncClient, channel: str) -> None:
    r = await client.put(f"{channel}/consumer/k1", json={"type": "pull"})
    assert r.status_code == 415
    assert (await client.get(f"{channel}/consumer/k1")).status_code == 404


async def test_consumer_update_is_conditional(client: httpx.AsyncClient, channel: str) -> None:
    created = await create(client, f"{channel}/consumer/k1", {"token": "kt", "type": "pull"})
    last_modified = created.headers["Last-Modified"]
    changes = {"token": "kt2", "type": "push", "callbackUrl": "https://h.example/in"}
    assert (await put_form(client, f"{channel}/consumer/k1", changes)).status_code == 400
    r = await put_form(
        client, f"{channel}/consumer/k1", changes, since=an_earlier_date(last_modified)
    )
    assert r.status_code == 412
    assert (await client.get(f"{channel}/consumer/k1")).json()["Type"] == "pull"
    r = await put_form(client, f"{channel}/consumer/k1", changes, since=last_modified)
    assert r.status_code == 200, r.text
    got = (await client.get(f"{channel}/consumer/k1")).json()
    assert (got["Type"], got["CallbackURL"]) == ("push", "https://h.example/in")


async def test_consumer_delete(client: httpx.AsyncClient, channel: str) -> None:
    created = await create(client, f"{channel}/consumer/k1", {"type": "pull"})
    last_modified = created.headers["Last-Modified"]
    assert (await client.delete(f"{channel}/consumer/k1")).status_code == 400
    r = await client.delete(
        f"{channel}/consumer/k1", headers={"If-Unmodified-Since": an_earlier_date(last_modified)}
    )
    assert r.status_code == 412
    assert (await client.get(f"{channel}/consumer/k1")).status_code == 200
    r = await client.delete(
        f"{channel}/consumer/k1", headers={"If-Unmodified-Since": last_modified}
    )
    assert r.status_code == 204
    assert (await client.get(f"{channel}/consumer/k1")).status_code == 404
    r = await client.delete(
        f"{channel}/consumer/k1", headers={"If-Unmodified-Since": last_modified}
    )
    assert r.status_code == 404


async def test_consumers_are_scoped_to_their_channel(
    client: httpx.AsyncClient, channel: str
) -> None:
    await create(client, "/channel/c2")
    await create(client, f"{channel}/consumer/shared", {"type": "pull", "name": "in c1"})
    await create(client, "/channel/c2/consumer/shared", {"type": "pull", "name": "in c2"})
    assert (await client.get(f"{channel}/consumer/shared")).json()["Name"] == "in c1"
    assert (await client.get("/channel/c2/consumer/shared")).json()["Name"] == "in c2"
    assert (await client.get("/channel/c2/consumer/k9")).status_code == 404


async def test_consumer_list_pages(client: httpx.AsyncClient, channel: str) -> None:
    await create(client, "/channel/other")
    await create(client, "/channel/other/consumer/elsewhere", {"type": "pull"})
    ids = [f"k{n:02d}" for n in range(28)]
    for id_ in ids:
        await create(client, f"{channel}/consumer/{id_}", {"type": "pull"})
    r = await client.get(f"{channel}/consumers")
    assert r.status_code == 200
    first = r.json()
    assert len(first["Result"]) == 25
    assert first["Pages"]["next"].startswith(f"{channel}/consumers?next=")
    assert await all_pages(client, f"{channel}/consumers") == [
        f"{channel}/consumer/{id_}" for id_ in ids
    ]
    second = (await client.get(first["Pages"]["next"])).json()
    back = (await client.get(second["Pages"]["previous"])).json()
    assert back["Result"] == first["Result"]


@pytest.mark.parametrize("kind", STAKEHOLDERS)
async def test_over_long_fields_are_400(client: httpx.AsyncClient, kind: str) -> None:
    # The columns are VARCHAR(255): PostgreSQL would refuse longer values with a 500.
    long = "x" * 256
    assert (await put_form(client, f"/{kind}/{long}")).status_code == 400
    assert (await put_form(client, f"/{kind}/s1", {"name": long})).status_code == 400
    assert (await put_form(client, f"/{kind}/s1", {"token": long})).status_code == 400
    assert (await client.get(f"/{kind}/s1")).status_code == 404
    edge = "y" * 255
    r = await put_form(client, f"/{kind}/{edge}", {"name": edge, "token": edge})
    assert r.status_code == 200, r.text
    assert (await client.get(f"/{kind}/{edge}")).json()["Name"] == edge


async def test_over_long_consumer_fields_are_400(client: httpx.AsyncClient, channel: str) -> None:
    long = "x" * 256
    pull = {"type": "pull"}
    assert (await put_form(client, f"{channel}/consumer/{long}", pull)).status_code == 400
    r = await put_form(client, f"{channel}/consumer/k1", {**pull, "name": long})
    assert r.status_code == 400
    r = await put_form(client, f"{channel}/consumer/k1", {**pull, "token": long})
    assert r.status_code == 400
    assert (await client.get(f"{channel}/consumer/k1")).status_code == 404


async def test_list_links_escape_ids(client: httpx.AsyncClient) -> None:
    # An id may hold characters that are special in a URL; links must lead back to it.
    r = await client.put(
        "/channel/a%3Fb%20c", content=b"token=t", headers={"Content-Type": FORM_TYPE}
    )
    assert r.status_code == 200, r.text
    assert r.json()["ID"] == "a?b c"
    [link] = (await client.get("/channels")).json()["Result"]
    assert link == "/channel/a%3Fb%20c"
    assert (await client.get(link)).json()["ID"] == "a?b c"
    await create(client, f"{link}/consumer/k%231", {"type": "pull"})
    [consumer_link] = (await client.get(f"{link}/consumers")).json()["Result"]
    assert consumer_link == "/channel/a%3Fb%20c/consumer/k%231"
    assert (await client.get(consumer_link)).json()["ID"] == "k#1"


@pytest.mark.parametrize("field", ["token", "name"])
async def test_nul_characters_are_400(client: httpx.AsyncClient, field: str) -> None:
    # PostgreSQL text cannot hold NUL; SQLite could, but both backends answer alike.
    r = await client.put(
        "/channel/c1", content=f"{field}=a%00b".encode(), headers={"Content-Type": FORM_TYPE}
    )
    assert r.status_code == 400, r.text
    assert (await client.get("/channel/c1")).status_code == 404
    await create(client, "/channel/c1")
    r = await client.put(
        "/channel/c1/consumer/k1",
        content=f"type=pull&{field}=a%00b".encode(),
        headers={"Content-Type": FORM_TYPE},
    )
    assert r.status_code == 400, r.text
    r = await put_form(client, "/channel/c1/consumer/k1", {"callbackUrl": "http://h/\x00x"})
    assert r.status_code == 400, r.text


@pytest.mark.parametrize("kind", STAKEHOLDERS)
async def test_nul_in_path_ids_is_never_a_500(client: httpx.AsyncClient, kind: str) -> None:
    r = await client.put(f"/{kind}/a%00b", content=b"", headers={"Content-Type": FORM_TYPE})
    assert r.status_code == 400, r.text
    assert (await client.get(f"/{kind}/a%00b")).status_code in (400, 404)
    assert (await client.get("/channel/a%00b/consumers")).status_code in (400, 404)
    assert (await client.get("/channel/a%00b/messages")).status_code in (400, 404)


@pytest.mark.parametrize("field", ["ackWait", "maxAckPending"])
async def test_consumer_numbers_fit_their_columns(
    client: httpx.AsyncClient, channel: str, field: str
) -> None:
    r = await put_form(client, f"{channel}/consumer/k1", {"type": "pull", field: str(2**31)})
    assert r.status_code == 400, r.text
    r = await put_form(client, f"{channel}/consumer/k1", {"type": "pull", field: str(2**31 - 1)})
    assert r.status_code == 200, r.text
