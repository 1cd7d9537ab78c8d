"""`webhook-broker` as a real process: serve with env-only config, SIGTERM drain, bad configs."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from devtools.pg import free_port
from tests.helpers.cli import Broker, clean_env, run
from tests.helpers.metrics import pulls_waiting
from tests.helpers.waiting import eventually

SEED_ENV = {
    "WEBHOOK_BROKER__INITIAL_CHANNELS__orders": "Orders",
    "WEBHOOK_BROKER__INITIAL_CHANNEL_TOKENS__orders": "cli-chan-secret",
    "WEBHOOK_BROKER__INITIAL_PRODUCERS__shop": "Shop",
    "WEBHOOK_BROKER__INITIAL_PRODUCER_TOKENS__shop": "cli-prod-secret",
}
PUBLISH = {
    "X-Broker-Channel-Token": "cli-chan-secret",
    "X-Broker-Producer-ID": "shop",
    "X-Broker-Producer-Token": "cli-prod-secret",
}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    return work


@pytest.fixture
def serve(workdir: Path) -> Iterator[tuple[Broker, str]]:
    port = free_port()
    env = clean_env(
        workdir.parent / "home", WEBHOOK_BROKER__HTTP__LISTENER=f"127.0.0.1:{port}", **SEED_ENV
    )
    broker = Broker(["serve"], workdir, env)
    try:
        yield broker, f"http://127.0.0.1:{port}"
    finally:
        broker.stop()


async def test_serve_with_env_only_then_sigterm_drains(serve: tuple[Broker, str]) -> None:
    broker, base_url = serve
    status = broker.wait_ready(base_url)
    assert status.json()["status"] == "ok"
    assert status.json()["database"]["status"] == "ok"
    # No config file anywhere: the SQLite database was created in the working directory.
    database = broker.cwd / "webhook-broker.sqlite3"
    assert database.is_file()

    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        # Seeded from the environment, migrated and working over real HTTP.
        r = await http.put(
            "/channel/orders/consumer/puller", data={"token": "cli-cons-secret", "type": "pull"}
        )
        assert r.status_code == 200, r.text
        r = await http.post("/channel/orders/broadcast", content=b"before", headers=PUBLISH)
        assert r.status_code == 201, r.text
        r = await http.post(
            "/channel/orders/consumer/puller/pull",
            json={"batch": 5, "no_wait": True},
            headers={
                "X-Broker-Channel-Token": "cli-chan-secret",
                "X-Broker-Consumer-Token": "cli-cons-secret",
            },
        )
        assert r.status_code == 200, r.text
        assert len(r.json()["Jobs"]) == 1

        # An upload in flight when SIGTERM arrives still completes and is stored.
        sent_first_half = asyncio.Event()
        signalled = asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            yield b"first half, "
            sent_first_half.set()
            await signalled.wait()
            await asyncio.sleep(0.5)
            yield b"second half"

        in_flight = asyncio.create_task(
            http.post(
                "/channel/orders/broadcast",
                content=slow_body(),
                headers={**PUBLISH, "X-Broker-Message-ID": "in-flight"},
            )
        )
        await asyncio.wait_for(sent_first_half.wait(), timeout=10)
        await asyncio.sleep(1.0)  # the server has read the headers: the request is in flight
        broker.process.send_signal(signal.SIGTERM)
        signalled.set()
        response = await asyncio.wait_for(in_flight, timeout=20)
        assert response.status_code == 201, response.text

    code = await asyncio.to_thread(broker.process.wait, 30)
    assert code == 0, broker.stderr
    with sqlite3.connect(database) as conn:
        payloads = {row[0] for row in conn.execute("SELECT payload FROM message")}
    assert payloads == {b"before", b"first half, second half"}
    # Tokens given in the environment and over HTTP never reach the logs.
    for secret in ("cli-chan-secret", "cli-prod-secret", "cli-cons-secret"):
        assert secret not in broker.stderr


async def test_sigterm_ends_a_waiting_long_poll(serve: tuple[Broker, str]) -> None:
    broker, base_url = serve
    broker.wait_ready(base_url)
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        r = await http.put("/channel/orders/consumer/w", data={"token": "wt", "type": "pull"})
        assert r.status_code == 200
        started = time.monotonic()
        waiting = asyncio.create_task(
            http.post(
                "/channel/orders/consumer/w/pull",
                json={"batch": 1, "expires": 25},
                headers={
                    "X-Broker-Channel-Token": "cli-chan-secret",
                    "X-Broker-Consumer-Token": "wt",
                },
            )
        )

        async def waits() -> bool:
            return await pulls_waiting(http) == 1

        await eventually(waits, what="the long poll waiting in the broker")
        assert not waiting.done()
        broker.process.send_signal(signal.SIGTERM)
        response = await asyncio.wait_for(waiting, timeout=20)
    assert response.status_code == 200, response.text
    assert response.json()["Jobs"] == []
    assert time.monotonic() - started < 15
    assert await asyncio.to_thread(broker.process.wait, 30) == 0, broker.stderr


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("WEBHOOK_BROKER__BROKER__MAX_RETRY", "many", ["[broker] max-retry", "many"]),
        ("WEBHOOK_BROKER__HTTP__LISTENER", "8080", ["[http] listener"]),
        ("WEBHOOK_BROKER__RDBMS__DIALECT", "oracle", ["[rdbms] dialect"]),
    ],
)
def test_bad_config_value_fails_start(
    workdir: Path, variable: str, value: str, words: list[str]
) -> None:
    result = run(["serve"], workdir, clean_env(workdir.parent / "home", **{variable: value}))
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, result.stderr
    assert not (workdir / "webhook-broker.sqlite3").exists()


def test_bad_config_file_fails_start(workdir: Path) -> None:
    (workdir / "webhook-broker.cfg").write_text("[log]\nlog-level=loud\n")
    result = run(["serve"], workdir, clean_env(workdir.parent / "home"))
    assert result.returncode != 0
    assert "[log] log-level" in result.stderr
    missing = run(["--config", "nowhere.cfg", "api"], workdir, clean_env(workdir.parent / "home"))
    assert missing.returncode != 0
    assert "nowhere.cfg" in missing.stderr


@pytest.mark.parametrize(
    ("seed", "words"),
    [
        ("lonely=\n[lonely]\ntype=pull\nchannel=missing-channel\n", ["lonely", "missing-channel"]),
        ("lonely=/hook\n[lonely]\nchannel=c\n", ["[initial-consumers] lonely", "absolute"]),
    ],
    ids=["unknown channel", "relative callback URL"],
)
def test_invalid_seed_entry_fails_start(workdir: Path, seed: str, words: list[str]) -> None:
    config = workdir / "seed.cfg"
    config.write_text(
        "[initial-channels]\nc=C\n[initial-channel-tokens]\nc=secret-of-c\n"
        f"[initial-consumers]\n{seed}token=secret-of-lonely\n"
    )
    env = clean_env(
        workdir.parent / "home", WEBHOOK_BROKER__HTTP__LISTENER=f"127.0.0.1:{free_port()}"
    )
    result = run(["--config", str(config), "serve"], workdir, env)
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, result.stderr
    assert "secret-of-lonely" not in result.stderr and "secret-of-c" not in result.stderr


def test_a_seed_consumer_of_an_invalid_type_is_skipped_and_the_start_goes_on(
    workdir: Path,
) -> None:
    # The pull consumer spec: "If any other invalid type is specified, that seed consumer
    # won't be created" (that one only: the broker starts, with an error line naming it).
    config = workdir / "seed.cfg"
    config.write_text(
        "[initial-channels]\nc=C\n[initial-channel-tokens]\nc=secret-of-c\n"
        "[initial-consumers]\nlonely=\ngood=\n"
        "[lonely]\ntype=queue\nchannel=c\ntoken=secret-of-lonely\n"
        "[good]\ntype=pull\nchannel=c\ntoken=secret-of-good\n"
    )
    port = free_port()
    env = clean_env(workdir.parent / "home", WEBHOOK_BROKER__HTTP__LISTENER=f"127.0.0.1:{port}")
    broker = Broker(["--config", str(config), "serve"], workdir, env)
    try:
        base = f"http://127.0.0.1:{port}"
        broker.wait_ready(base)
        assert httpx.get(f"{base}/channel/c/consumer/good").status_code == 200
        assert httpx.get(f"{base}/channel/c/consumer/lonely").status_code == 404
        errors = [line for line in broker.stderr.splitlines() if "[lonely] type" in line]
        assert errors and "ERROR" in errors[0] and "not created" in errors[0], broker.stderr
        assert "secret-of-lonely" not in broker.stderr
    finally:
        broker.stop()


def test_migrate_then_api(workdir: Path) -> None:
    database = workdir / "broker.sqlite3"
    port = free_port()
    env = clean_env(
        workdir.parent / "home",
        WEBHOOK_BROKER__RDBMS__CONNECTION_URL=str(database),
        WEBHOOK_BROKER__HTTP__LISTENER=f"127.0.0.1:{port}",
    )
    result = run(["migrate"], workdir, env)
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(database) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert {"channel", "producer", "consumer", "message", "job", "alembic_version"} <= tables
    broker = Broker(["api"], workdir, env)
    try:
        broker.wait_ready(f"http://127.0.0.1:{port}")
        r = httpx.put(f"http://127.0.0.1:{port}/channel/c1", data={"token": "t"})
        assert r.status_code == 200
        broker.process.send_signal(signal.SIGTERM)
        assert broker.process.wait(timeout=30) == 0, broker.stderr
    finally:
        broker.stop()


def test_config_is_taken_after_the_command_as_well(workdir: Path) -> None:
    env = clean_env(workdir.parent / "home")
    for n, args in enumerate(
        (
            ["migrate", "--config", "{cfg}"],
            ["--config", "nowhere.cfg", "migrate", "--config", "{cfg}"],
        )
    ):
        database = workdir / f"after-{n}.sqlite3"
        config = workdir / f"after-{n}.cfg"
        config.write_text(f"[rdbms]\nconnection-url={database}\n")
        result = run([a.format(cfg=config) for a in args], workdir, env)
        assert result.returncode == 0, result.stderr
        assert database.exists()  # the file named after the command was read, and it won
    missing = run(["migrate", "--config", "nowhere.cfg"], workdir, env)
    assert missing.returncode != 0 and "nowhere.cfg" in missing.stderr
