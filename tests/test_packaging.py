"""The two distributions as a user gets them: both wheels built with `python -m build`, checked
by twine, holding what they should; the client wheel installed alone into a fresh venv, in a
worker's folder that has its own `app` package, consuming jobs from a live broker."""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from webhook_broker_client import Broker

from tests.conftest import fresh_database
from tests.helpers.processes import BrokerProcess

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "clients" / "python"
VERSION = "0.1.0"
SERVER_DEPENDENCIES = {"fastapi", "sqlalchemy", "uvicorn", "alembic", "psycopg", "nats-py"}


@dataclass(frozen=True)
class Wheels:
    server: Path
    client: Path


def _build(files: list[Path], base: Path, work: Path) -> Path:
    """A wheel of a copy of `files` (paths under `base`): builds write build/ and *.egg-info
    into their source tree, and test workers running at once must not share one."""
    source = work / "source"
    for path in files:
        target = source / path.relative_to(base)
        if path.is_dir():
            shutil.copytree(
                path, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    outdir = work / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = outdir.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Wheels:
    server_files = [ROOT / name for name in ("pyproject.toml", "README.md", "LICENSE", "app")]
    return Wheels(
        server=_build(server_files, ROOT, tmp_path_factory.mktemp("server")),
        client=_build(
            [CLIENT / name for name in ("pyproject.toml", "README.md", "LICENSE", "src")],
            CLIENT,
            tmp_path_factory.mktemp("client"),
        ),
    )


def _metadata(wheel: Path) -> tuple[list[str], dict[str, list[str]]]:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (meta,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(meta).decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    return names, fields


def _top_level(names: list[str]) -> set[str]:
    return {name.split("/", 1)[0] for name in names}


def _requirement_names(fields: dict[str, list[str]]) -> set[str]:
    return {
        req.split(";")[0].split("[")[0].split("=")[0].split(">")[0].strip().lower()
        for req in fields.get("Requires-Dist", [])
        if "extra ==" not in req
    }


def _common_metadata(fields: dict[str, list[str]]) -> None:
    assert fields["License-Expression"] == ["MIT"]
    assert fields["Version"] == [VERSION]
    assert "Typing :: Typed" in fields["Classifier"]
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in fields["Classifier"])
    urls = dict(url.split(", ", 1) for url in fields["Project-URL"])
    assert {"Homepage", "Source", "Documentation", "Issues"} <= set(urls)


def test_the_server_wheel_installs_app_and_nothing_else(wheels: Wheels) -> None:
    names, fields = _metadata(wheels.server)
    assert _top_level(names) == {"app", f"webhook_broker-{VERSION}.dist-info"}
    # The migrations travel inside the package, as data Alembic finds beside app/store.
    assert "app/migrations/env.py" in names and "app/migrations/script.py.mako" in names
    assert sum(n.startswith("app/migrations/versions/") for n in names) >= 11
    assert "app/py.typed" in names
    # The console's templates and static files (vendored htmx and uPlot with their licences
    # and VENDORED.md): a console that works offline needs every one of them in the wheel.
    ui = ROOT / "app" / "ui"
    shipped = [
        path.relative_to(ROOT).as_posix()
        for folder in ("templates", "static")
        for path in sorted((ui / folder).rglob("*"))
        if path.is_file()
    ]
    assert "app/ui/static/VENDORED.md" in shipped and "app/ui/templates/base.html" in shipped
    assert any(n.startswith("app/ui/static/vendor/uPlot") for n in shipped)
    assert [n for n in shipped if n not in names] == []
    assert f"webhook_broker-{VERSION}.dist-info/licenses/LICENSE" in names
    _common_metadata(fields)
    assert f"webhook-broker-client=={VERSION}" in fields["Requires-Dist"]


def test_the_client_wheel_needs_httpx_and_orjson_only(wheels: Wheels) -> None:
    names, fields = _metadata(wheels.client)
    assert _top_level(names) == {
        "webhook_broker_client",
        f"webhook_broker_client-{VERSION}.dist-info",
    }
    assert "webhook_broker_client/py.typed" in names
    assert f"webhook_broker_client-{VERSION}.dist-info/licenses/LICENSE" in names
    _common_metadata(fields)
    assert _requirement_names(fields) == {"httpx", "orjson"}
    with zipfile.ZipFile(wheels.client) as archive:
        entry_points = archive.read(
            f"webhook_broker_client-{VERSION}.dist-info/entry_points.txt"
        ).decode()
    assert "webhook-broker-client = webhook_broker_client.cli:main" in entry_points


def test_twine_passes_both_wheels(wheels: Wheels) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "twine",
            "check",
            "--strict",
            str(wheels.server),
            str(wheels.client),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2


def test_the_client_sources_import_nothing_of_the_server() -> None:
    # The client must work where the server is not installed, and beside a worker's own `app`.
    for source in (CLIENT / "src" / "webhook_broker_client").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            assert not any(m == "app" or m.startswith("app.") for m in modules), (source, modules)


def test_app_client_is_a_deprecated_alias_of_the_client() -> None:
    for name in [m for m in sys.modules if m == "app.client" or m.startswith("app.client.")]:
        del sys.modules[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alias = importlib.import_module("app.client")
        # the old submodule paths too (the alias registers them as the new modules)
        old_sync = importlib.import_module("app.client.sync")
    assert [w.category for w in caught] == [DeprecationWarning]
    assert "webhook_broker_client" in str(caught[0].message)
    import webhook_broker_client
    import webhook_broker_client.sync

    assert alias.Broker is webhook_broker_client.Broker
    assert old_sync is webhook_broker_client.sync
    assert sorted(alias.__all__) == sorted(webhook_broker_client.__all__)


@pytest.fixture
def broker_process(sqlite_template: Path, tmp_path: Path) -> Iterator[BrokerProcess]:
    config = tmp_path / "broker" / "broker.cfg"
    config.parent.mkdir()
    config.write_text(fresh_database("sqlite", None, sqlite_template))
    process = BrokerProcess(config)
    process.start()
    try:
        yield process
    finally:
        process.stop()


# Run by the fresh venv's python from the worker's folder: its own `app` comes first on sys.path.
CONSUMER_SCRIPT = """
import asyncio, json, sys
import app
import webhook_broker_client
from webhook_broker_client import Broker

assert app.NAME == "the worker's own app", app.__file__
url, channel = sys.argv[1], sys.argv[2]

async def main():
    got = []
    done = asyncio.Event()

    async def handle(job):
        got.append(job.text)
        if len(got) == 3:
            done.set()

    async with Broker(url) as broker:
        consumer = broker.consumer(
            channel, "billing", channel_token="orders-token", consumer_token="billing-token"
        )
        context = consumer.consume(handle, expires=5)
        await asyncio.wait_for(done.wait(), 30)
        await context.drain()
        info = await consumer.info()
    print(json.dumps({
        "jobs": sorted(got),
        "client": webhook_broker_client.__file__,
        "ack_pending": info.ack_pending,
        "pending": info.pending,
        "server_modules": sorted(m for m in sys.modules if m.startswith("app.")),
    }))

asyncio.run(main())
"""


def _pip_show_requires(python: Path) -> set[str]:
    shown = subprocess.run(
        [str(python), "-m", "pip", "show", "webhook-broker-client"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (requires,) = (line for line in shown.splitlines() if line.startswith("Requires:"))
    return {name.strip().lower() for name in requires.split(":", 1)[1].split(",") if name.strip()}


@pytest.mark.timeout(600)
def test_a_worker_with_its_own_app_installs_the_client_wheel_alone_and_consumes(
    wheels: Wheels, broker_process: BrokerProcess, tmp_path: Path
) -> None:
    worker = tmp_path / "worker"
    (worker / "app").mkdir(parents=True)
    (worker / "app" / "__init__.py").write_text('NAME = "the worker\'s own app"\n')
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    # A real install: the wheel's dependencies come from the package index, as a user's do.
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", str(wheels.client)],
        capture_output=True,
        text=True,
        cwd=worker,
        env=env,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert _pip_show_requires(python) == {"httpx", "orjson"}
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.lower()
    assert not any(f"{name}==" in listed for name in SERVER_DEPENDENCIES | {"webhook-broker"})

    channel = "orders"

    async def set_up() -> str:
        async with Broker(broker_process.url, producer_id="shop") as broker:
            await broker.put_channel(channel, token="orders-token")
            producer = await broker.put_producer("shop", token="shop-token")
            await broker.put_consumer(channel, "billing", token="billing-token")
            return str(producer["Token"])

    producer_token = asyncio.run(set_up())
    # The client's own console script publishes the three jobs.
    for n in range(3):
        published = subprocess.run(
            [
                str(env_dir / "bin" / "webhook-broker-client"),
                "publish",
                channel,
                "--url",
                broker_process.url,
                "--data",
                f"job-{n}",
                "--channel-token",
                "orders-token",
                "--producer-id",
                "shop",
                "--producer-token",
                producer_token,
            ],
            capture_output=True,
            text=True,
            cwd=worker,
            env=env,
            timeout=60,
        )
        assert published.returncode == 0, published.stderr
        assert published.stdout.startswith(f"/channel/{channel}/message/")

    consumed = subprocess.run(
        [str(python), "-c", CONSUMER_SCRIPT, broker_process.url, channel],
        capture_output=True,
        text=True,
        cwd=worker,
        env=env,
        timeout=120,
    )
    assert consumed.returncode == 0, consumed.stdout + consumed.stderr
    report = json.loads(consumed.stdout)
    assert report["jobs"] == ["job-0", "job-1", "job-2"]
    assert Path(report["client"]).is_relative_to(env_dir)
    assert (report["ack_pending"], report["pending"]) == (0, 0)
    assert report["server_modules"] == []


def _pins(lock: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#") and "==" in line:
            name, version = line.split(" ")[0].split("==")
            pins[canonicalize_name(name)] = version
    return pins


LOCKS = {
    "requirements.lock": (),
    "requirements-pipeline.lock": ("pipeline",),
    "requirements-dev.lock": ("dev", "pipeline"),
}


@pytest.mark.parametrize("lock_name", sorted(LOCKS))
def test_each_lock_pins_what_pyproject_asks_for_with_hashes(lock_name: str) -> None:
    lock = ROOT / lock_name
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in LOCKS[lock_name]:
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    pins = _pins(lock)
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        if name == "webhook-broker-client":
            # the repository's own: installed from clients/python, never from the lock
            assert name not in pins
            continue
        assert name in pins, f"{name} is not in {lock_name}: run scripts/lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name])
    text = lock.read_text()
    # Every pin carries its hashes; nothing of this machine's pip settings leaks in.
    assert text.count("==") <= text.count("--hash=sha256:")
    for leak in ("--index-url", "--extra-index-url", "--find-links", "file:", "/opt/", "/tmp/"):
        assert leak not in text, leak
    # The three locks agree wherever they pin the same package.
    dev = _pins(ROOT / "requirements-dev.lock")
    assert {name: dev.get(name) for name in pins} == pins
