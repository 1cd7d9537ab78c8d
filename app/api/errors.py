"""The one place domain errors become HTTP statuses."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from app.api.responses import JSONResponse
from app.domain import errors

STATUS: dict[type[errors.BrokerError], int] = {
    errors.NotFound: 404,
    errors.Unauthenticated: 401,
    errors.Forbidden: 403,
    errors.InvalidInput: 400,
    errors.TooManyWaiting: 409,
    errors.Conflict: 409,
    errors.PreconditionFailed: 412,
    errors.PinLost: 423,
    errors.PayloadTooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.Unavailable: 503,
}


def status_for(exc: errors.BrokerError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def error_body(status: int, detail: str) -> dict[str, object]:
    return {"error": status, "detail": detail}


async def _broker_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.BrokerError)
    status = status_for(exc)
    # A database outage is short (a restart, a failover): a second is a fair first wait.
    headers = {"Retry-After": "1"} if isinstance(exc, errors.Unavailable) else None
    return JSONResponse(error_body(status, exc.detail), status_code=status, headers=headers)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    reasons = []
    for problem in exc.errors():
        where = ".".join(str(part) for part in problem.get("loc", ()) if part != "body")
        reasons.append(f"{where}: {problem.get('msg', 'invalid')}" if where else problem.get("msg"))
    return JSONResponse(error_body(400, "; ".join(map(str, reasons))), status_code=400)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own refusals (no route: 404, another method: 405, a form it cannot parse:
    400) in the same body as every other error."""
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    return JSONResponse(error_body(status, exc.detail), status_code=status, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(errors.BrokerError, _broker_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
