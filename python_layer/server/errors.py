"""Errors in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, for every route."""

from __future__ import annotations

from typing import Optional

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_response(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                   headers: Optional[dict] = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


async def _api_error(_: Request, e: ApiError) -> JSONResponse:
    headers = None
    if e.status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    elif e.status == 503:  # overloaded, shutting down or loading: loading takes longest
        headers = {"Retry-After": "5" if e.code == "model_not_ready" else "1"}
    return error_response(e.status, e.message, e.param, e.code, headers)


async def _validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
    first = e.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return error_response(400, f"the request body is not valid JSON: {first.get('msg')}", code="invalid_json")
    where = f"field '{param}'" if param else "the request body"
    return error_response(400, f"{where}: {first.get('msg')}", param=param, code=first.get("type"))


async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
    return error_response(e.status_code, str(e.detail), headers=getattr(e, "headers", None))


async def _value_error(_: Request, e: ValueError) -> JSONResponse:
    return error_response(400, str(e))


async def _internal_error(_: Request, e: Exception) -> JSONResponse:
    return error_response(500, f"internal error: {type(e).__name__}: {e}")


HANDLERS = {
    Exception: _internal_error,
    ApiError: _api_error,
    RequestValidationError: _validation_error,
    StarletteHTTPException: _http_error,
    ValueError: _value_error,
}
