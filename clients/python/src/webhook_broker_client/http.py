"""The one place HTTP answers become results or errors."""

from __future__ import annotations

import json
from typing import Any

import httpx

from webhook_broker_client.errors import ServerError, error_for


async def call(http: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """The response, when its status is below 400; the error it stands for otherwise. A
    connection that fails is a ServerError (status 0): worth trying again."""
    try:
        response = await http.request(method, url, **kwargs)
    except httpx.TransportError as exc:
        raise ServerError(0, f"{type(exc).__name__}: {exc}") from exc
    if response.status_code >= 400:
        raise error_for(response.status_code, _body(response))
    return response


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def raise_for(response: httpx.Response, body: bytes) -> None:
    """For a streamed response: its status, once its (error) body has been read."""
    if response.status_code >= 400:
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        raise error_for(response.status_code, parsed)
