"""The composition roots: each process kind builds only what it runs, every attribute declared,
and the API has one life cycle, its app's lifespan, wherever it is started."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.api.app import create_app
from app.cli import build_parser
from app.config import Config, load_config_text
from app.roots.api import ApiRoot
from app.roots.bridge import BridgeRoot
from app.roots.dispatcher import DispatcherRoot
from app.roots.process import Process
from app.roots.serve import ServeRoot
from app.roots.sweeper import SweeperRoot
from app.runtime import Runtime

# What each process kind has (True) and must not build (False).
PARTS = ("scheduler", "pulls", "admin", "sweeps", "push")
EXPECTED: dict[str, tuple[bool, ...]] = {
    "api": (True, True, True, False, False),
    "serve": (True, True, True, True, True),
    "sweeper": (False, False, False, True, False),
    "dispatcher": (False, False, False, False, True),
    "bridge": (True, False, False, False, False),
}


def build(kind: str, config: Config) -> Process:
    if kind == "api":
        return ApiRoot(config)
    if kind == "serve":
        return ServeRoot(config, run_sweeper=True, run_dispatcher=True)
    if kind == "sweeper":
        return SweeperRoot(config)
    if kind == "dispatcher":
        return DispatcherRoot(config)
    return BridgeRoot(config)


@pytest.fixture
def plain_config(tmp_path: Path) -> Config:
    # Building a root opens no connection: an unmigrated file is enough.
    return load_config_text(f"[rdbms]\ndialect=sqlite\nconnection-url={tmp_path / 'x.sqlite3'}\n")


@pytest.mark.parametrize("kind", sorted(EXPECTED))
async def test_each_process_builds_only_what_it_runs(kind: str, plain_config: Config) -> None:
    root = build(kind, plain_config)
    try:
        assert tuple(hasattr(root, part) for part in PARTS) == EXPECTED[kind]
    finally:
        await root.db.dispose()


@pytest.mark.parametrize("kind", sorted(EXPECTED))
async def test_every_attribute_is_declared(kind: str, plain_config: Config) -> None:
    root = build(kind, plain_config)
    try:
        declared = {
            name for cls in type(root).__mro__ for name in vars(cls).get("__annotations__", {})
        }
        public = {name for name in vars(root) if not name.startswith("_")}
        assert public - declared == set()
    finally:
        await root.db.dispose()


def test_runtime_is_the_serve_root() -> None:
    assert Runtime is ServeRoot


def test_serve_help_names_everything_it_runs() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "serve API + sweeper + push dispatcher in one process" in text


async def test_an_owned_api_is_started_and_stopped_by_its_lifespan(config: Config) -> None:
    root = ApiRoot(config)
    started: list[bool] = []
    app = create_app(config, root, owned=True, on_started=lambda: started.append(True))
    async with app.router.lifespan_context(app):
        assert started == [True]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/_ready")).status_code == 200
        assert not root.draining
    assert root.draining  # stopped: readiness fails from here on


async def test_a_given_api_is_left_to_its_caller(config: Config, runtime: Runtime) -> None:
    app = create_app(config, runtime)
    async with app.router.lifespan_context(app):
        pass
    assert not runtime.draining  # the fixture stops it, not the app
