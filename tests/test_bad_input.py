"""Bad input on every HTTP route, on SQLite and PostgreSQL: a NUL byte or an over-long value in
each path parameter, header and query parameter the route reads, numbers out of range, NUL inside
JSON strings and form fields, malformed JSON. Each must be a 4xx whose JSON body says why
(`detail`), never a 5xx and never a hang.

The routes are read from the app itself, so a new route is covered as soon as it exists: its path
parameters, headers and query parameters come from FastAPI's dependency tree. A route that reads
its body by hand (a `Request` parameter) must say here how (JSON_BODIES, RAW_BODIES or
HAND_FORMS), or the
classification test fails. Requests carry valid credentials for a channel, a producer and a pull
consumer with a job, so everything but the one bad value gets past authentication to the part
that touches the database.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from app.api.app import create_app
from app.api.deps import form_fields
from app.config import load_config_text
from app.runtime import Runtime
from app.store.pagination import encode_cursor
from tests.conftest import fresh_database

CHANNEL, CHANNEL_TOKEN = "c1", "channel-token"
PRODUCER, PRODUCER_TOKEN = "p1", "producer-token"
CONSUMER, CONSUMER_TOKEN = "k1", "consumer-token"
MESSAGE = "m1"
SCHEDULED = "s1"  # a message scheduled an hour ahead, for the scheduled-message routes
REDRIVE = "1"  # the fixture's redrive: the first of a fresh database
ADMIN_TOKEN = "admin-secret"
EXTRA_CONFIG = f"[http]\nadmin-token={ADMIN_TOKEN}\n"

NUL = "a\x00b"
LONG = "x" * 10_000
TIMEOUT = 10.0

JOB_ID = "{job}"  # stands for the fixture's job id in paths and bodies

# A valid value for each path parameter name, naming objects the fixture creates.
PATH_VALUES: dict[str, str] = {
    "channel_id": CHANNEL,
    "consumer_id": CONSUMER,
    "producer_id": PRODUCER,
    "message_id": MESSAGE,
    "job_id": JOB_ID,
    "redrive_id": REDRIVE,
}

# Routes about scheduled messages name the fixture's scheduled one.
ROUTE_PATH_VALUES: dict[str, dict[str, str]] = {
    "get_scheduled_message": {"message_id": SCHEDULED},
}

# Valid values for every header any route reads; each request carries all of them.
BASE_HEADERS: dict[str, str] = {
    "X-Broker-Channel-Token": CHANNEL_TOKEN,
    "X-Broker-Consumer-Token": CONSUMER_TOKEN,
    "X-Broker-Producer-ID": PRODUCER,
    "X-Broker-Producer-Token": PRODUCER_TOKEN,
    "Authorization": f"Bearer {ADMIN_TOKEN}",
}

# -- the bad values ---------------------------------------------------------------------------

TEXT_VALUES: list[tuple[str, str]] = [("nul", NUL), ("long", LONG)]
JOB_ID_VALUES: list[tuple[str, str]] = [
    ("nul", NUL),
    ("long", "9" * 10_000),
    ("past-int64", str(2**63)),
    ("huge", str(10**30)),
    ("negative", "-1"),
    ("float", "1e3"),
]
QUERY_VALUES: dict[str, list[tuple[str, str]]] = {
    "limit": [
        ("nul", NUL),
        ("long", "9" * 10_000),
        ("negative", "-5"),
        ("huge", str(10**30)),
        ("float", "1e3"),
    ],
    "next": [
        ("nul", NUL),
        ("long", LONG),
        ("not-base64", "!!!"),
        ("nul-cursor", encode_cursor("\x00")),
        ("huge-cursor", encode_cursor(10**30)),
        ("negative-cursor", encode_cursor(-(10**30))),
        ("long-cursor", encode_cursor("9" * 5_000)),
    ],
}
QUERY_VALUES["previous"] = QUERY_VALUES["next"]

# Header values the routes read by hand (broadcast), beyond the generic NUL / over-long.
HEADER_VALUES: dict[str, list[tuple[str, str]]] = {
    "X-Broker-Message-Priority": [
        ("int40", str(2**40)),
        ("negative-int40", str(-(2**40))),
        ("huge", str(10**30)),
        ("float", "1e3"),
    ],
    "X-Broker-Metadata-Headers": [("nul-name", "X-Order\x00")],
}


@dataclass(frozen=True)
class JsonBody:
    """How a route reads its JSON body: a valid body and the bad ones."""

    valid: dict[str, Any]
    bad: dict[str, Any]  # label -> the whole body
    empty_ok: bool = False


def _nak(**fields: Any) -> dict[str, Any]:
    return {"type": "nak", **fields}


JSON_BODIES: dict[str, JsonBody] = {
    "pull": JsonBody(
        valid={"no_wait": True},
        empty_ok=True,
        bad={
            "batch-huge": {"no_wait": True, "batch": 10**30},
            "batch-negative": {"no_wait": True, "batch": -1},
            "batch-string": {"no_wait": True, "batch": "x"},
            "batch-fraction": {"no_wait": True, "batch": 1.5},
            "expires-negative": {"no_wait": True, "expires": -1},
            "expires-huge": {"no_wait": True, "expires": 10**30},
            "expires-inf": {"no_wait": True, "expires": float("inf")},
            "expires-nan": {"no_wait": True, "expires": float("nan")},
            "max-bytes-negative": {"no_wait": True, "max_bytes": -1},
            "max-bytes-int70": {"no_wait": True, "max_bytes": 2**70},
            "incremental-timeout-int70": {"no_wait": True, "incremental_timeout": 2**70},
            "incremental-timeout-negative": {"no_wait": True, "incremental_timeout": -1},
            "no-wait-nul": {"no_wait": "\x00"},
            "nul-key": {"no_wait": True, "\x00": 1},
            # Priority group fields (the consumer has no policy).
            "group-nul": {"no_wait": True, "group": NUL},
            "group-number": {"no_wait": True, "group": 2**70},
            "pin-id-nul": {"no_wait": True, "id": NUL},
            "pin-id-on-plain": {"no_wait": True, "id": "pin"},
            "min-pending-negative": {"no_wait": True, "min_pending": -1},
            "min-pending-int70": {"no_wait": True, "min_pending": 2**70},
            "min-pending-on-plain": {"no_wait": True, "min_pending": 1},
            "min-ack-pending-string": {"no_wait": True, "min_ack_pending": "\x00"},
            "priority-int70": {"no_wait": True, "priority": 2**70},
            "priority-out-of-range": {"no_wait": True, "priority": 10},
        },
    ),
    "unpin": JsonBody(
        valid={"group": "jobs"},
        bad={
            "group-missing": {},
            "group-empty": {"group": ""},
            "group-nul": {"group": NUL},
            "group-number": {"group": 2**70},
            "group-long": {"group": "g" * 17},
            "group-unknown": {"group": "jobs"},  # the consumer has no group
            "unknown-key": {"group": "jobs", "other": 1},
        },
    ),
    "ack": JsonBody(
        valid={"type": "ack"},
        empty_ok=True,
        bad={
            "type-nul": {"type": "\x00"},
            "type-number": {"type": 2**70},
            "attempt-int70": {"attempt": 2**70},
            "attempt-past-int64": {"attempt": 2**63},
            "attempt-negative": {"attempt": -1},
            "attempt-nul": {"attempt": "\x00"},
            "delay-negative": _nak(delay=-1),
            "delay-huge": _nak(delay=10**30),
            "delay-inf": _nak(delay=float("inf")),
            "reason-nul": {"type": "term", "reason": NUL},
            "reason-number": {"type": "term", "reason": 2**70},
            "nul-key": {"type": "ack", "\x00": 1},
        },
    ),
    "start_redrive": JsonBody(
        valid={"perSecond": 10},
        empty_ok=True,
        bad={
            "from-nul": {"from": NUL},
            "from-queued": {"from": "QUEUED"},
            "rate-zero": {"perSecond": 0},
            "rate-huge": {"perSecond": 10**30},
            "rate-string": {"perSecond": "10"},
            "since-nul": {"since": NUL},
            "since-naive": {"since": "2026-01-01T00:00:00"},
            "since-number": {"since": 10**30},
            # before the first and after the last UTC time Python has
            "since-year-1": {"since": "0001-01-01T00:00:00+01:00"},
            "until-year-9999": {"until": "9999-12-31T23:59:59-01:00"},
            "since-after-until": {
                "since": "2026-01-02T00:00:00Z",
                "until": "2026-01-01T00:00:00Z",
            },
            "unknown-field": {"rate": 5},
        },
    ),
    "ack_many": JsonBody(
        valid={"acks": [{"id": JOB_ID, "type": "ack"}]},
        bad={
            "acks-string": {"acks": "\x00"},
            "acks-numbers": {"acks": [2**70]},
            "id-past-int64": {"acks": [{"id": 2**63}]},
            "id-huge": {"acks": [{"id": 10**30}]},
            "id-negative": {"acks": [{"id": -1}]},
            "id-nul": {"acks": [{"id": "\x00"}]},
            "attempt-int70": {"acks": [{"id": JOB_ID, "attempt": 2**70}]},
            "type-nul": {"acks": [{"id": JOB_ID, "type": "\x00"}]},
            "delay-negative": {"acks": [{"id": JOB_ID, **_nak(delay=-5)}]},
            "delay-huge": {"acks": [{"id": JOB_ID, **_nak(delay=10**30)}]},
            "reason-nul": {"acks": [{"id": JOB_ID, "type": "term", "reason": NUL}]},
            "too-many": {"acks": [{"id": JOB_ID}] * 100_000},
        },
    ),
    "set_job_state": JsonBody(
        valid={"NextState": "INFLIGHT"},
        bad={
            "next-state-nul": {"NextState": "\x00"},
            "next-state-number": {"NextState": 2**70},
            "timeout-int70": {"NextState": "INFLIGHT", "IncrementalTimeout": 2**70},
            "timeout-huge": {"NextState": "INFLIGHT", "IncrementalTimeout": 10**30},
            "timeout-negative": {"NextState": "INFLIGHT", "IncrementalTimeout": -1},
            "timeout-string": {"NextState": "INFLIGHT", "IncrementalTimeout": "\x00"},
        },
    ),
}
# Bodies that are not JSON objects at all, for every JSON route.
MALFORMED_JSON: dict[str, bytes] = {
    "malformed": b"{bad",
    "array": b"[]",
    "nul-string": b'"\\u0000"',
    "raw-nul-bytes": b"\x00\xff\x00",
    "bad-utf8": b'{"type": "\xff"}',
    "deep": b"[" * 100_000,
    "huge-literal": b'{"batch": ' + b"9" * 5_000 + b"}",
    "nan-literal": b'{"batch": NaN}',
}

# Routes whose Request parameter is the raw payload (no JSON): their bad bodies.
RAW_BODIES: dict[str, dict[str, bytes]] = {"broadcast": {"empty": b""}}
# Routes that read an optional form by hand (the Go original's `requeue=<consumer token>`):
# the valid request carries no form, each case sends one of these with the form content type.
HAND_FORMS: dict[str, dict[str, bytes]] = {
    "requeue_all_dead": {
        "requeue:nul": b"requeue=a%00b",
        "requeue:long": b"requeue=" + b"x" * 10_000,
        "requeue:wrong": b"requeue=not-the-token",
        "requeue:missing": b"",
        "malformed": b"requeue=%zz&&=&requeue",
    }
}
# Headers those routes read by hand.
RAW_HEADERS: dict[str, tuple[str, ...]] = {
    "broadcast": (
        "X-Broker-Channel-Token",
        "X-Broker-Producer-ID",
        "X-Broker-Producer-Token",
        "X-Broker-Message-ID",
        "X-Broker-Message-Priority",
        "X-Broker-Metadata-Headers",
        "Content-Type",
    )
}

# Form fields of the management PUTs: the valid form, then the fields' bad values.
FORMS: dict[str, dict[str, str]] = {
    "put_channel": {"token": CHANNEL_TOKEN, "name": "Channel"},
    "put_producer": {"token": PRODUCER_TOKEN, "name": "Producer"},
    "put_consumer": {"token": CONSUMER_TOKEN, "name": "Consumer", "type": "pull"},
}
FORM_VALUES: dict[str, list[tuple[str, str]]] = {
    "token": TEXT_VALUES,
    "name": TEXT_VALUES,
    "type": [("nul", "pu\x00ll"), ("long", LONG)],
    "callbackUrl": [
        ("nul", "http://127.0.0.1:9/\x00"),
        ("long", "http://h/" + LONG),
        ("metadata", "http://169.254.169.254/latest/meta-data/"),
        ("metadata-v6-mapped", "http://[::ffff:169.254.169.254]/"),
    ],
    "ackWait": [("nul", "1\x00"), ("huge", str(10**30)), ("negative", "-1"), ("int40", str(2**40))],
    "maxAckPending": [("nul", "1\x00"), ("negative", "-5"), ("int70", str(2**70))],
    # Alone on a consumer without them, each is refused too (a group needs a policy...).
    "priorityGroups": [("nul", "jobs\x00"), ("long", LONG), ("two", "a,b")],
    "priorityPolicy": [("nul", "over\x00"), ("unknown", "failover"), ("long", LONG)],
    "priorityTimeout": [("nul", "1\x00"), ("huge", str(10**30)), ("negative", "-1")],
    "maxInFlight": [("nul", "1\x00"), ("zero", "0"), ("int70", str(2**70))],
    "rateLimit": [("nan", "nan"), ("inf", "inf"), ("negative", "-1"), ("huge", "1e400")],
    "signingSecret": [
        ("nul", "whsec_\x00"),
        ("no-prefix", "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"),
        ("not-base64", "whsec_!!!!"),
        ("short", "whsec_c2hvcnQ="),
        ("long", "whsec_" + "A" * 10_000),
    ],
    "signingSecretOverlap": [("nul", "1\x00"), ("negative", "-1"), ("huge", str(10**30))],
    "enabled": [("nul", "tr\x00ue"), ("maybe", "maybe")],
}
FORM_FIELDS: dict[str, tuple[str, ...]] = {
    "put_channel": ("token", "name"),
    "put_producer": ("token", "name"),
    "put_consumer": tuple(FORM_VALUES),
}
# Whole form bodies (the other fields valid for every PUT): bad percent-escapes.
RAW_FORMS: dict[str, bytes] = {
    "bad-percent": b"token=%ff%00&name=n&type=pull",
}


# -- the routes -----------------------------------------------------------------------------------


def _walk(dependant: Dependant) -> Iterator[Dependant]:
    yield dependant
    for sub in dependant.dependencies:
        yield from _walk(sub)


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    name: str
    path_params: tuple[str, ...]
    headers: tuple[str, ...]
    query: tuple[str, ...]
    form: bool
    reads_request: bool

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def _api_routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
    """Every APIRoute, through included routers (newer FastAPI keeps them as wrappers that
    point at the original router) and mounts."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
            continue
        inner = getattr(route, "original_router", None) or route
        yield from _api_routes(getattr(inner, "routes", None) or [])


def app_routes() -> list[Route]:
    app = create_app(load_config_text(""))
    routes: list[Route] = []
    for route in _api_routes(app.routes):
        # The dependency tree by hand (FastAPI's own flattening helpers are private).
        tree = list(_walk(route.dependant))
        calls = [d.call for d in tree]
        for method in sorted(route.methods or ()):
            routes.append(
                Route(
                    method=method,
                    path=route.path,
                    name=route.name,
                    path_params=tuple(route.param_convertors),
                    headers=tuple(dict.fromkeys(f.alias for d in tree for f in d.header_params)),
                    query=tuple(dict.fromkeys(f.alias for d in tree for f in d.query_params)),
                    form=form_fields in calls,
                    reads_request=route.dependant.request_param_name is not None,
                )
            )
    return routes


ROUTES = app_routes()


@dataclass(frozen=True)
class Case:
    """One bad request: a valid request with one thing replaced."""

    route: Route
    label: str
    path: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None
    json_body: dict[str, Any] | None = None
    form: dict[str, str] | None = None
    # A value the route may accept (see TOLERATED): no 5xx, and a 4xx still says why.
    tolerated: bool = False

    @property
    def id(self) -> str:
        return f"{self.route.method} {self.route.path} {self.label}"


def _json_bytes(body: dict[str, Any]) -> bytes:
    # allow_nan: Infinity and NaN go out as the literals Python's json reads back.
    return json.dumps(body).encode()


# Odd values a route may accept as they are, with the reason; each must still never be a 5xx.
TOLERATED: dict[str, str] = {
    # Cursors are opaque positions: any decoded text is a place in a text key's order, a
    # route may ignore `previous` (queued-jobs and dlq page forward only), and one that cannot
    # be decoded is a 400.
    "query:next:*": "an opaque cursor",
    "query:previous:*": "an opaque cursor",
    "query:limit:huge": "limit is clamped to 100 (documented)",
    "header:X-Broker-Metadata-Headers:long": "names a header the request does not carry",
    "form:callbackUrl:long": "callback URLs are TEXT, with no documented limit",
    # Reads take the channel's or consumer's own token too: an Authorization that is no bearer
    # token (a proxy's own scheme) is left to them; changes still answer 401 to it.
    "header:authorization:*": "not a bearer token: the resource's own tokens decide",
}


def _tolerated(label: str) -> bool:
    head = label.rpartition(":")[0]
    return label in TOLERATED or f"{head}:*" in TOLERATED


def route_cases(route: Route) -> list[Case]:
    return [replace(c, tolerated=_tolerated(c.label)) for c in _route_cases(route)]


def _route_cases(route: Route) -> list[Case]:
    cases: list[Case] = []
    for name in route.path_params:
        values = JOB_ID_VALUES if name == "job_id" else TEXT_VALUES
        for label, value in values:
            cases.append(Case(route, f"path:{name}:{label}", path={name: value}))
    headers = list(route.headers) + list(RAW_HEADERS.get(route.name, ()))
    for header in headers:
        for label, value in TEXT_VALUES + HEADER_VALUES.get(header, []):
            cases.append(Case(route, f"header:{header}:{label}", headers={header: value}))
    for name in route.query:
        for label, value in QUERY_VALUES.get(name, TEXT_VALUES):
            cases.append(Case(route, f"query:{name}:{label}", query={name: value}))
    spec = JSON_BODIES.get(route.name)
    if spec is not None:
        for label, body in spec.bad.items():
            cases.append(Case(route, f"json:{label}", json_body=body))
        for label, raw in MALFORMED_JSON.items():
            cases.append(Case(route, f"json:{label}", content=raw))
        if not spec.empty_ok:
            cases.append(Case(route, "json:empty", content=b""))
    for label, raw in RAW_BODIES.get(route.name, {}).items():
        cases.append(Case(route, f"body:{label}", content=raw))
    for label, raw in HAND_FORMS.get(route.name, {}).items():
        form_type = {"Content-Type": "application/x-www-form-urlencoded"}
        cases.append(Case(route, f"form:{label}", content=raw, headers=form_type))
    if route.form:
        for name in FORM_FIELDS[route.name]:
            for label, value in FORM_VALUES[name]:
                cases.append(Case(route, f"form:{name}:{label}", form={name: value}))
        for label, raw in RAW_FORMS.items():
            cases.append(Case(route, f"form:{label}", content=raw))
    return cases


CASES = [case for route in ROUTES for case in route_cases(route)]

# -- the world the requests run against -------------------------------------------------------


@dataclass
class World:
    backend: str
    client: httpx.AsyncClient
    job_id: int


@pytest.fixture(scope="module")
async def world(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    backend = str(request.param)
    if backend == "postgresql":
        request.getfixturevalue("pg_template")
        base: str | None = request.getfixturevalue("pg_base_url")
        section = fresh_database(backend, base, None)
    else:
        base = None
        section = fresh_database(backend, None, request.getfixturevalue("sqlite_template"))
    config = load_config_text(section + EXTRA_CONFIG)
    runtime = Runtime(config)
    await runtime.start()
    try:
        app = create_app(config, runtime)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as client:
            yield World(backend, client, await _populate(client))
    finally:
        await runtime.stop()
        _drop(backend, section, base)


def _drop(backend: str, section: str, base: str | None) -> None:
    if backend == "postgresql":
        assert base is not None
        name = section.rstrip().rpartition("/")[2]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        return
    path = Path(section.rstrip().rpartition("connection-url=")[2])
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        leftover.unlink(missing_ok=True)


async def _populate(client: httpx.AsyncClient) -> int:
    """A channel, a producer, a pull consumer, one message, one scheduled message and a redrive;
    returns the consumer's job id."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for path, form in (
        (f"/channel/{CHANNEL}", FORMS["put_channel"]),
        (f"/producer/{PRODUCER}", FORMS["put_producer"]),
        (f"/channel/{CHANNEL}/consumer/{CONSUMER}", FORMS["put_consumer"]),
    ):
        r = await client.put(path, data=form, headers=admin)
        assert r.status_code == 200, r.text
    r = await client.post(
        f"/channel/{CHANNEL}/broadcast",
        content=b"hello",
        headers={**BASE_HEADERS, "Content-Type": "text/plain", "X-Broker-Message-ID": MESSAGE},
    )
    assert r.status_code == 201, r.text
    due = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    r = await client.post(
        f"/channel/{CHANNEL}/broadcast",
        content=b"later",
        headers={
            **BASE_HEADERS,
            "Content-Type": "text/plain",
            "X-Broker-Message-ID": SCHEDULED,
            "X-Broker-Scheduled-For": due,
        },
    )
    assert r.status_code == 201, r.text
    r = await client.post(
        f"/channel/{CHANNEL}/consumer/{CONSUMER}/redrives", json={}, headers=BASE_HEADERS
    )
    assert r.status_code == 202 and r.json()["ID"] == REDRIVE, r.text
    r = await client.get(f"/channel/{CHANNEL}/message/{MESSAGE}", headers=admin)
    assert r.status_code == 200, r.text
    jobs = r.json()["Jobs"]
    assert len(jobs) == 1, jobs
    return int(jobs[0]["ID"])


def _fill(value: Any, job_id: int) -> Any:
    """Replace the job placeholder inside a JSON body."""
    if value == JOB_ID:
        return job_id
    if isinstance(value, dict):
        return {k: _fill(v, job_id) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) > 100:
            return [_fill(value[0], job_id)] * len(value)
        return [_fill(v, job_id) for v in value]
    return value


def _url(route: Route, values: dict[str, str]) -> str:
    def segment(match_name: str) -> str:
        return quote(values[match_name], safe="")

    url = route.path
    for name in route.path_params:
        for template in (f"{{{name}}}", f"{{{name}:path}}"):
            url = url.replace(template, segment(name))
    return url


async def send(world: World, case: Case) -> httpx.Response:
    """The valid request of the case's route, with the case's one bad value in it."""
    route = case.route
    values = {name: PATH_VALUES.get(name, "x") for name in route.path_params}
    values.update(ROUTE_PATH_VALUES.get(route.name, {}))
    values = {k: str(world.job_id) if v == JOB_ID else v for k, v in values.items()}
    headers = httpx.Headers(BASE_HEADERS)
    if "If-Unmodified-Since" in route.headers:
        current = await world.client.get(_url(route, values), headers=BASE_HEADERS)
        assert current.status_code == 200, current.text
        headers["If-Unmodified-Since"] = current.headers["Last-Modified"]
    values.update(case.path)
    content: bytes | None = None
    spec = JSON_BODIES.get(route.name)
    if spec is not None:
        content = _json_bytes(_fill(spec.valid, world.job_id))
        headers["Content-Type"] = "application/json"
    if route.name in RAW_BODIES:
        content = b"hello"
        headers["Content-Type"] = "text/plain"
    if route.form:
        form = {**FORMS[route.name], **(case.form or {})}
        content = str(httpx.QueryParams(form)).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    if case.json_body is not None:
        content = _json_bytes(_fill(case.json_body, world.job_id))
    if case.content is not None:
        content = case.content
    for name, value in case.headers.items():
        headers[name] = value  # (case-insensitive: replaces the valid value)
    request = world.client.request(
        route.method,
        _url(route, values),
        params=case.query or None,
        headers=headers,
        content=content,
    )
    return await asyncio.wait_for(request, TIMEOUT)


def assert_refused(response: httpx.Response, *, tolerated: bool = False) -> None:
    if tolerated and response.status_code < 400:
        return
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    body = response.json()
    assert isinstance(body, dict), body
    detail = body.get("detail")
    assert isinstance(detail, str) and detail.strip(), body


# -- the tests --------------------------------------------------------------------------------


# (Two parametrize marks, not one list of pairs: pytest would then see a new `world` param
# in every pair and build the module's database once per case.)
@pytest.mark.parametrize("world", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
async def test_bad_input_is_a_4xx_with_a_reason(world: World, case: Case) -> None:
    assert_refused(await send(world, case), tolerated=case.tolerated)


def test_every_route_is_covered() -> None:
    """Each route that takes input has cases; each that reads its body by hand says how."""
    names = {route.name for route in ROUTES}
    assert {"pull", "ack", "ack_many", "broadcast", "put_consumer"} <= names
    for route in ROUTES:
        if route.reads_request:
            assert any(route.name in way for way in (JSON_BODIES, RAW_BODIES, HAND_FORMS)), (
                f"{route} reads its body by hand: add it to JSON_BODIES, RAW_BODIES or HAND_FORMS"
            )
        if route.form:
            assert route.name in FORMS, f"{route} takes a form: add it to FORMS"
        inputs = route.path_params or route.headers or route.query or route.reads_request
        assert bool(route_cases(route)) == bool(inputs), route
    assert len(CASES) > 300


VALID_STATUS: dict[str, int] = {"pull": 200}


@pytest.mark.parametrize("world", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.parametrize(
    "route", [r for r in ROUTES if r.method == "GET" or r.name in VALID_STATUS], ids=str
)
async def test_valid_request_gets_through(world: World, route: Route) -> None:
    """The base every bad request is made from passes authentication (so each bad value is
    what the route refuses, not the credentials)."""
    response = await send(world, Case(route, "valid"))
    assert response.status_code == VALID_STATUS.get(route.name, 200), response.text
