"""The hot routes matched first (app/api/hot.py, issue 40): publish, pull and both acks are
found before the routers are walked, by the very routes the routers hold, and the hot entry
takes no request any other route answered: no other route's path, and no other method."""

from __future__ import annotations

import re

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.routing import Match

from app.api import hot
from app.api.app import HOT, create_app
from app.api.routes import messages, pull
from app.config import load_config_text
from app.ui import install_console


def _scope(method: str, path: str) -> dict[str, object]:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}


def _sample(path_format: str) -> str:
    """A path the pattern matches: each parameter a plain word (a number for a job)."""
    return re.sub(r"\{[^}]+\}", "7", path_format)


def test_the_hot_entry_comes_first_and_answers_with_the_routers_own_routes() -> None:
    app = create_app(load_config_text(""))
    entry = app.routes[0]
    assert isinstance(entry, hot.HotRoutes)
    included = {
        context.original_route.endpoint: context.original_route
        for context in iter_route_contexts(app.routes[1:])
        if isinstance(context.original_route, APIRoute)
    }
    for endpoint in HOT:
        route = included[endpoint]
        match, child = entry.matches(_scope("POST", _sample(route.path_format)))
        assert match is Match.FULL
        assert child["route"] is route  # the same object: one implementation
        # Another method is the routers' business (their 405), as before.
        assert entry.matches(_scope("GET", _sample(route.path_format)))[0] is Match.NONE


def test_no_other_routes_request_is_taken() -> None:
    app = create_app(load_config_text(""))
    install_console(app, load_config_text(""))  # the console's routes too (a runtime adds them)
    entry = app.routes[0]
    assert isinstance(entry, hot.HotRoutes)
    for context in iter_route_contexts(app.routes[1:]):
        route = context.original_route
        if getattr(route, "endpoint", None) in HOT or context.path_format is None:
            continue
        for method in context.methods or ("GET",):
            match, _ = entry.matches(_scope(method, _sample(context.path_format)))
            assert match is Match.NONE, (method, context.path_format)


def test_a_route_that_could_take_a_hot_path_is_refused_at_start() -> None:
    app = FastAPI()
    app.include_router(messages.router)
    app.include_router(pull.router)
    greedy = APIRouter()

    @greedy.post("/channel/{channel_id}/{anything}")
    async def catch_all(channel_id: str, anything: str) -> None: ...

    app.include_router(greedy)
    with pytest.raises(ValueError, match="may match a path of /channel/"):
        hot.install(app, HOT)


def test_a_hot_route_included_with_a_prefix_is_refused() -> None:
    app = FastAPI()
    app.include_router(pull.router, prefix="/v2")
    with pytest.raises(ValueError, match="included with more than the route itself"):
        hot.install(app, (pull.ack,))
