"""Errors in the OpenAI shape ``{"error": {"message", "type", "param", "code"}}`` for every failure."""

from __future__ import annotations

import json
import logging
from typing import Any

from flask import Flask, Response
from werkzeug.exceptions import HTTPException, MethodNotAllowed

logger = logging.getLogger(__name__)

# OpenAI's error types by HTTP status; anything else is a server error.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error a handler raises to answer with ``status`` and an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or ERROR_TYPES.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.param, self.code)


def error_body(message: str, error_type: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(error: APIError) -> Response:
    response = Response(json.dumps(error.body()), status=error.status, mimetype="application/json")
    for name, value in error.headers.items():
        response.headers[name] = value
    return response


# Werkzeug's own exceptions (routing, body size, ...) with the codes clients can branch on.
HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(APIError)
    def handle_api_error(error: APIError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    def handle_http_exception(error: HTTPException) -> Response:
        status = error.code or 500
        headers = {}
        if isinstance(error, MethodNotAllowed) and error.valid_methods:  # werkzeug's 405
            headers["Allow"] = ", ".join(error.valid_methods)
        message = error.description or error.name
        if status == 404:
            message = "no such route; the API lives under /v1 (see /openapi.json)"
        return error_response(
            APIError(status, message, code=HTTP_CODES.get(status, error.name.lower()), headers=headers)
        )

    @app.errorhandler(Exception)
    def handle_unexpected(error: Exception) -> Response:
        logger.exception("unhandled error in a request")
        return error_response(APIError(500, "internal server error", code="internal_error"))
