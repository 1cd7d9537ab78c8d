"""A hot request tries only the hot routes its path could be (app/api/hot.py, issue 40): by
its number of segments and its last one, so an ack is matched against the ack's pattern
alone, not the publish's and the pull's first."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Scope

from app.api import hot
from app.api.app import HOT, create_app
from app.api.routes import pull
from app.config import load_config_text

ACK = "/channel/c1/consumer/k1/job/7/ack"
ACK_MANY = "/channel/c1/consumer/k1/ack"


def _scope(path: str, root_path: str = "") -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": root_path + path,
        "root_path": root_path,
        "headers": [],
    }


class Tried:
    """Which hot routes' patterns a request was matched against."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        original = APIRoute.matches

        def matches(route: APIRoute, scope: Scope) -> tuple[Match, Scope]:
            self.names.append(route.name)
            return original(route, scope)

        monkeypatch.setattr(APIRoute, "matches", matches)


@pytest.mark.parametrize(
    ("path", "root_path", "route"),
    [
        (ACK, "", "ack"),
        (ACK_MANY, "", "ack_many"),
        ("/channel/c1/consumer/k1/pull", "", "pull"),
        ("/channel/c1/broadcast", "", "broadcast"),
        (ACK, "/broker", "ack"),  # behind a proxy's prefix: the path is the route's own
    ],
)
def test_a_hot_request_tries_only_its_own_pattern(
    path: str, root_path: str, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = create_app(load_config_text("")).routes[0]
    assert isinstance(entry, hot.HotRoutes)
    tried = Tried(monkeypatch)
    match, child = entry.matches(_scope(path, root_path))
    assert match is Match.FULL and child["route"].name == route
    assert tried.names == [route]


def test_other_paths_try_no_hot_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = create_app(load_config_text("")).routes[0]
    assert isinstance(entry, hot.HotRoutes)
    tried = Tried(monkeypatch)
    for path in ("/channel/c1", "/channel/c1/consumer/k1/info", f"{ACK}/", "/ack"):
        assert entry.matches(_scope(path))[0] is Match.NONE
    assert tried.names == []


def test_a_hot_route_ending_in_a_parameter_is_refused() -> None:
    router = APIRouter()

    @router.post("/acks/{job_id}")
    async def ack_by_id(job_id: str) -> None: ...

    app = FastAPI()
    app.include_router(router)
    app.include_router(pull.router)
    with pytest.raises(ValueError, match="must end in a literal segment"):
        hot.install(app, (*HOT[1:], ack_by_id))
