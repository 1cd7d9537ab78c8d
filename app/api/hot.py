"""The hot routes (publish, pull, single and batch ack) matched before every other route.

FastAPI keeps each included router as one entry of the app's routes, and a request is matched
twice through every router in front of the one holding its route (once to find it, once to
handle it): an ack passed six routers and some thirty route patterns, a tenth of its CPU.
`HotRoutes` is one entry put first: it tries only the hot routes' own patterns and hands a
full match to the route itself, the same object the included router holds (one
implementation; the handler BoundRoute bound when the route was made).

A request's path picks the routes worth trying: by its number of segments and its last one
(every hot route ends in a literal, and its parameters hold no "/"), so an ack tries one
pattern, not the publish's and the pull's first (a failed FastAPI match cost about 2.5 µs).

Nothing else changes: `install` refuses (at start) a hot route whose pattern could match a
path some other route matches, so no request is taken from the route that answered it before;
a request of another method (a 405) or any other path falls through to the routers as before.
The entry is no APIRoute and no included router, so the OpenAPI document, which is built from
the included routers in their order, does not see it."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, routing
from fastapi.routing import APIRoute, iter_route_contexts
from starlette._utils import get_route_path
from starlette.convertors import Convertor, PathConvertor
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Receive, Scope, Send

# FastAPI's hook telling its telemetry which route a request took (private, so optional).
_selected: Callable[..., None] | None = getattr(routing, "_route_selected", None)


# A path's number of segments and its last segment.
Tail = tuple[int, str]


class HotRoutes(BaseRoute):
    def __init__(self, routes: Sequence[APIRoute]) -> None:
        self._methods = frozenset(m for route in routes for m in route.methods or ())
        self._by_tail: dict[Tail, tuple[APIRoute, ...]] = {}
        for route in routes:
            tail = _tail_of(route)
            self._by_tail[tail] = (*self._by_tail.get(tail, ()), route)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and scope["method"] in self._methods:
            path = get_route_path(scope)
            tail = (path.count("/"), path[path.rfind("/") + 1 :])
            for route in self._by_tail.get(tail, ()):
                match, child_scope = route.matches(scope)
                if match is Match.FULL:  # its child scope names the route
                    return match, child_scope
        # A partial match (another method) is left to the routers: their 405 as before.
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        route: APIRoute = scope["route"]
        if _selected is not None:
            _selected(scope=scope, path=route.path_format)
        await route.handle(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        # The included routers name these routes' paths (the router asks every entry).
        raise NoMatchFound(name, path_params)


def install(app: FastAPI, endpoints: Sequence[Callable[..., Any]]) -> None:
    """Put the routes of `endpoints` (already included in `app`) first; ValueError when one
    could take a request from another route, or is included with something of its own (a
    prefix, a dependency, a body limit) that it would lose outside its router."""
    contexts = list(iter_route_contexts(app.routes))
    hot: list[APIRoute] = []
    for endpoint in endpoints:
        found = [c for c in contexts if getattr(c.original_route, "endpoint", None) is endpoint]
        if len(found) != 1 or not isinstance(found[0].original_route, APIRoute):
            raise ValueError(f"{endpoint.__name__}: not one route of the app")
        context, route = found[0], found[0].original_route
        if (
            context.path_format != route.path_format
            or _calls(context) != _calls(route)
            or getattr(context, "max_body_size", None) != route.max_body_size
        ):
            raise ValueError(f"{route.path}: included with more than the route itself")
        hot.append(route)
    for route in hot:
        for other in contexts:
            if other.original_route is route:
                continue
            pattern = _pattern(other)
            if pattern is None or _overlap(_pattern_of(route), pattern):
                raise ValueError(
                    f"{route.path} may match a path of {other.path or other.original_route}"
                )
    app.router.routes.insert(0, HotRoutes(hot))


def _tail_of(route: APIRoute) -> Tail:
    """The number of segments and the last one of every path `route` matches; ValueError for
    a route without them (a parameter last, or one that may hold "/")."""
    segments = _pattern_of(route)
    if not segments or not isinstance(segments[-1], str) or None in segments:
        raise ValueError(f"{route.path}: a hot route's path must end in a literal segment")
    return len(segments), segments[-1]


def _calls(route: Any) -> list[Any]:
    return [sub.call for sub in route.dependant.dependencies]


# A pattern's segments: a literal, a parameter's convertor, or None for "anything from here
# on" (a path parameter, a mount's rest, a segment mixing text and a parameter).
Segment = str | Convertor[Any] | None


def _pattern_of(route: APIRoute) -> list[Segment]:
    return _segments(route.path_format, route.param_convertors)


def _pattern(context: Any) -> list[Segment] | None:
    try:
        return _segments(context.path_format, context.param_convertors)
    except AttributeError:
        return None  # a route without a path pattern (a host): may match anything


def _segments(path_format: str | None, convertors: dict[str, Convertor[Any]]) -> list[Segment]:
    if path_format is None:
        raise AttributeError("path_format")
    segments: list[Segment] = []
    for part in path_format.split("/")[1:]:
        if "{" not in part:
            segments.append(part)
            continue
        name = part[1:-1]
        if not (part.startswith("{") and part.endswith("}")) or name not in convertors:
            segments.append(None)
            break
        convertor = convertors[name]
        if isinstance(convertor, PathConvertor):
            segments.append(None)
            break
        segments.append(convertor)
    return segments


def _overlap(a: list[Segment], b: list[Segment]) -> bool:
    """Whether some path could match both patterns (True when in doubt)."""
    for x, y in zip(a, b, strict=False):
        if x is None or y is None:
            return True
        if isinstance(x, str) and isinstance(y, str):
            if x != y:
                return False
        elif isinstance(x, str) or isinstance(y, str):
            literal, convertor = (x, y) if isinstance(x, str) else (y, x)
            assert isinstance(literal, str) and not isinstance(convertor, str)
            if not _accepts(convertor, literal):
                return False
    if len(a) == len(b):
        return True
    # Different lengths meet only where the longer goes on with "anything from here on".
    longer = a if len(a) > len(b) else b
    return longer[min(len(a), len(b))] is None


def _accepts(convertor: Convertor[Any], literal: str) -> bool:
    return bool(literal) and re.fullmatch(convertor.regex, literal) is not None
