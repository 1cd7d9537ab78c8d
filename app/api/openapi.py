"""The OpenAPI document: what the routes cannot say themselves.

Each route declares its own answers on its decorator: the 2xx body (`response_model`, a
TypedDict of app/api/schemas), its headers (`answer`), the errors it can give (`errors`, from
the tables below: the credential checks in app/services/auth.py, the parsing in
app/api/schemas and the services, app/store/db.py's driver boundary), and the body it reads
itself (`json_body`, `form_body`: the model's schema, put where FastAPI's own reading would).
`build` adds what depends on the configuration or on the layers around the routes: the admin
and reader tokens' refusals (from the route's dependencies), the body reader's 408 and 413, the
HMAC gateway's refusals, X-Request-ID on every answer, and the [pull] limits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema

from app.api.deps import FORM_CONTENT_TYPE, require_admin, require_channel_reader, require_reader
from app.api.schemas import Error
from app.config import Config
from app.domain.pulls import MIN_HEARTBEAT_SECONDS

JSON = dict[str, Any]
REF = "#/components/schemas/{model}"

# ---------------------------------------------------------------------------------------------
# Error tables: why each status is answered.

UNAVAILABLE = {503: "the database is unavailable; retry"}
UNSTORABLE = {400: "a value the database cannot store or compare (a NUL in an id)"}
DATABASE = {**UNSTORABLE, **UNAVAILABLE}
CHANNEL = {404: "no such channel"}
CONSUMER = {
    404: "no such channel",
    403: "the channel or consumer token does not match",
    401: "no such consumer in the channel",
}
PULL_ONLY = {412: "the consumer is a push consumer"}
PRODUCER = {
    404: "no such channel",
    403: "the channel or producer token does not match",
    401: "no such producer (or no X-Broker-Producer-ID)",
}
CHANGE = {
    400: "updating an existing object needs If-Unmodified-Since",
    412: "the object changed since If-Unmodified-Since (or was created meanwhile)",
}
FORM = {400: "a field is malformed or too long", 415: f"the body is not {FORM_CONTENT_TYPE}"}
CURSOR = {400: "a malformed pagination cursor"}
LIMIT = {400: "limit is not a non-negative integer (above 100 is 100)"}
JOB_PATH = {404: "no such job of this consumer (the id is not a number)"}
JSON_BODY = {400: "the body is not a JSON object, or a field is unknown or malformed"}
# Added by `build` where the configuration and the route's dependencies call for them.
ADMIN = {
    401: "[http] admin-token is set and Authorization: Bearer is missing",
    403: "the admin token does not match",
}
READER = {
    401: "reads need Authorization: Bearer <reader-token> or <admin-token>",
    403: "the bearer token matches neither the reader nor the admin token",
}
CHANNEL_READER = {
    401: "reads need Authorization: Bearer <reader-token> or <admin-token>, or the channel's "
    "X-Broker-Channel-Token",
    403: "the bearer token matches no configured token, or the channel token does not match",
}
GATEWAY = {
    401: "([gateway-auth] hmac) no X-Broker-Signature, or a malformed one: text/plain",
    403: "([gateway-auth] hmac) a stale or wrong signature: text/plain",
}
BODY_READ = {408: "the body did not arrive within [http] read-timeout"}
BODY_SIZE = {413: "the body is over [http] max-body-bytes"}
# Configured values, shown beside the keys the descriptions name.
CONFIGURED: dict[str, Callable[[Config], object]] = {
    "[pull] max-batch": lambda c: c.pull.max_batch,
    "[http] max-body-bytes": lambda c: c.http.max_body_bytes,
    "[broker] max-message-size-bytes": lambda c: c.broker.max_message_size_bytes,
}

HEADERS: dict[str, JSON] = {
    "X-Request-ID": {
        "description": "the request's own X-Request-ID (1-128 of [A-Za-z0-9._:/+=-]) or a new one",
        "required": True,
        "schema": {"type": "string"},
    },
    "Location": {"description": "where the new object is read", "required": True},
    "Last-Modified": {
        "description": "send it back as If-Unmodified-Since to change or delete the object",
        "required": True,
    },
    "Retry-After": {"description": "seconds", "required": True},
    "X-Broker-Read-From": {
        "description": "which database answered: replica (within [rdbms] replica-max-lag of "
        "the primary) or primary (no replica, or it lags or is down)",
        "required": True,
        "schema": {"type": "string", "enum": ["replica", "primary"]},
    },
}
for _header in HEADERS.values():
    _header.setdefault("schema", {"type": "string"})

# ---------------------------------------------------------------------------------------------
# What routes use on their decorators


def merge(*groups: Mapping[int, str]) -> dict[int, str]:
    """Error statuses with why each is answered; a status in several groups joins the whys."""
    merged: dict[int, list[str]] = {}
    for group in groups:
        for status, why in group.items():
            merged.setdefault(status, []).append(why)
    return {status: "; ".join(merged[status]) for status in sorted(merged)}


def errors(*groups: Mapping[int, str]) -> dict[int | str, JSON]:
    """A route's `responses=` for the errors it gives, each in the error body."""
    return {status: {"model": Error, "description": why} for status, why in merge(*groups).items()}


def answer(description: str, *headers: str) -> JSON:
    """A 2xx answer's description and headers (its body is the route's response_model)."""
    return {"description": description, "headers": {name: _header_ref(name) for name in headers}}


# Models whose schemas the routes reference: `build` puts them into the document's components.
_COMPONENTS: dict[str, tuple[Any, str]] = {}


def component(name: str, shape: Any, mode: str = "validation") -> JSON:
    _COMPONENTS[name] = (shape, mode)
    return {"$ref": REF.format(model=name)}


def json_body(model: type[BaseModel], *, required: bool) -> JSON:
    """`openapi_extra` for a JSON body the route reads itself (after the credential check)."""
    return _body("application/json", model, required)


def form_body(model: type[BaseModel], *, required: bool = True) -> JSON:
    return _body(FORM_CONTENT_TYPE, model, required)


def _body(media: str, model: type[BaseModel], required: bool) -> JSON:
    schema = component(model.__name__, model)
    description = (model.__doc__ or "").strip()
    body = {
        "required": required,
        "description": description,
        "content": {media: {"schema": schema}},
    }
    return {"requestBody": body}


def header(name: str, description: str, schema: JSON | None = None) -> JSON:
    """A header parameter a route reads by hand (for `openapi_extra`'s parameters)."""
    schema = schema or {"type": "string"}
    return {
        "name": name,
        "in": "header",
        "required": False,
        "schema": schema,
        "description": description,
    }


def _header_ref(name: str) -> JSON:
    assert name in HEADERS, name
    return {"$ref": f"#/components/headers/{name}"}


# ---------------------------------------------------------------------------------------------
# The document


def _calls(dependant: Dependant) -> set[Callable[..., Any]]:
    found = {dependant.call} if dependant.call is not None else set()
    for sub in dependant.dependencies:
        found |= _calls(sub)
    return found


def _guards(dependant: Dependant, config: Config) -> dict[int, str]:
    """The refusals of the admin and reader tokens, where they are set and the route checks."""
    calls, http = _calls(dependant), config.http
    admin = ADMIN if require_admin in calls and http.admin_token else {}
    read: Mapping[int, str] = {}
    if http.guarded_reads:
        read = CHANNEL_READER if require_channel_reader in calls else read
        read = READER if require_reader in calls else read
    return merge(admin, read)


ERROR = {"$ref": REF.format(model="Error")}


def _error(why: str) -> JSON:
    return {"description": why, "content": {"application/json": {"schema": ERROR}}}


def _responses(operation: JSON, added: Mapping[int, str], gateway: bool, config: Config) -> JSON:
    responses: JSON = operation["responses"]
    responses.pop("422", None)
    for status, why in added.items():
        entry = responses.get(str(status))
        if entry is None:
            responses[str(status)] = _error(why)
        else:
            entry["description"] += f"; {why}"
    for code, entry in responses.items():
        entry.setdefault("headers", {})["X-Request-ID"] = _header_ref("X-Request-ID")
        if code == "503" and entry.get("content", {}).get("application/json") == {"schema": ERROR}:
            entry["headers"]["Retry-After"] = _header_ref("Retry-After")
        for key, value in CONFIGURED.items():
            entry["description"] = entry["description"].replace(key, f"{key} ({value(config)})")
    if gateway:  # the HMAC gateway's refusals, in plain text, before any route runs
        for status, why in GATEWAY.items():
            entry = responses.setdefault(
                str(status), {"description": why, "headers": {}, "content": {}}
            )
            if entry["description"] != why:
                entry["description"] += f"; {why}"
            entry["headers"]["X-Request-ID"] = _header_ref("X-Request-ID")
            entry.setdefault("content", {})["text/plain"] = {"schema": {"type": "string"}}
    return dict(sorted(responses.items()))


def _components() -> JSON:
    models = [
        (shape, mode)
        for shape, mode in _COMPONENTS.values()
        if isinstance(shape, type) and issubclass(shape, BaseModel)
    ]
    _, defs = models_json_schema(models, ref_template=REF)  # type: ignore[arg-type]
    schemas: JSON = dict(defs.get("$defs", {}))
    for name, (shape, mode) in _COMPONENTS.items():
        if name not in schemas:
            generated = TypeAdapter(shape).json_schema(ref_template=REF, mode=mode)  # type: ignore[arg-type]
            schemas.update(generated.pop("$defs", {}))
            schemas[name] = generated
    return schemas


def _limits(schemas: JSON, config: Config) -> None:
    """The [pull] limits in the pull and batched-ack bodies (the pull service checks them)."""
    limits = config.pull
    pull = schemas["PullBody"]
    _narrow(
        pull["properties"]["batch"],
        maximum=limits.max_stream_batch,
        description=f"up to {limits.max_batch}, or {limits.max_stream_batch} streaming",
    )
    _narrow(pull["properties"]["expires"], maximum=limits.max_expires_seconds)
    _narrow(
        pull["properties"]["idle_heartbeat"],
        minimum=MIN_HEARTBEAT_SECONDS,
        maximum=limits.max_expires_seconds / 2,
    )
    streaming = {"required": ["stream"], "properties": {"stream": {"const": True}}}
    pull.setdefault("allOf", []).append(
        {"if": {"not": streaming}, "then": {"properties": {"batch": {"maximum": limits.max_batch}}}}
    )
    _narrow(schemas["AcksBody"]["properties"]["acks"], maxItems=limits.max_batch)


def _narrow(schema: JSON, **limits: object) -> None:
    """Set `limits` on a property's schema (on its non-null branch, when it may be null)."""
    branches = [b for b in schema.get("anyOf", [schema]) if b.get("type") != "null"]
    branches[0].update(limits)


def build(app: FastAPI, config: Config) -> JSON:
    document = get_openapi(
        title=app.title,
        version=app.version,
        openapi_version=app.openapi_version,
        description=(
            'Errors answer `{"error": <status>, "detail": <why>}`; every response carries'
            " X-Request-ID."
        ),
        routes=app.routes,
    )
    gateway_exempt = config.gateway_auth.auth_exempt_paths if config.gateway_auth.enabled else None
    routes = {
        (method, context.path_format): context.dependant
        for context in iter_route_contexts(app.routes)
        if isinstance(context.original_route, APIRoute)
        for method in context.methods or ()
    }
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            added = _guards(routes[(method.upper(), path)], config)
            if "requestBody" in operation:  # every body is read through app/api/limits.py
                added = merge(
                    added, BODY_READ, {} if "413" in operation["responses"] else BODY_SIZE
                )
            gateway = gateway_exempt is not None and not path.startswith(gateway_exempt)
            operation["responses"] = _responses(operation, added, gateway, config)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for name, schema in _components().items():
        if schemas.setdefault(name, schema) != schema:
            raise LookupError(f"two schemas are named {name}")
    _limits(schemas, config)
    document["components"] = {"schemas": dict(sorted(schemas.items())), "headers": HEADERS}
    return document


def operation_id(route: APIRoute) -> str:
    """Operation ids are the routes' function names (unique: FastAPI warns of duplicates)."""
    return route.name


def install_openapi(app: FastAPI, config: Config) -> None:
    """Serve `build`'s document as the app's OpenAPI (made once, on its first request)."""

    def openapi() -> JSON:
        if app.openapi_schema is None:
            app.openapi_schema = build(app, config)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
