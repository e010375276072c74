"""What every JSON endpoint shares: the error shape, the handler wrapper, and size-limited body reading.

Every error is ``{"error": code, "message": text}`` with a 4xx status; a handler raises
:class:`ApiError` (or an exception its module translates into one) and never builds error responses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Translate = Callable[[Exception], "ApiError | None"]
T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status, headers=headers)


def json_errors(handler: Handler, translate: Translate | None = None) -> Handler:
    """Turn ApiError (and what ``translate`` maps to one) into the JSON error response."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e.status, e.code, e.message, e.headers)
        except Exception as e:
            api = translate(e) if translate is not None else None
            if api is None:
                raise
            return error_response(api.status, api.code, api.message, api.headers)

    wrapped.__name__ = handler.__name__
    return wrapped


async def read_json(
    request: web.Request,
    kind: type[T],
    limit: int,
    *,
    invalid_status: int = 400,
    empty_as: bytes | None = None,
) -> T:
    """The body as ``kind``, refusing more than ``limit`` bytes (413) even when chunked.

    ``empty_as``: what an empty body means (``b"{}"`` where every field is optional), else it is malformed.
    """
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, "too_large", f"request bodies are limited to {limit} bytes")
    body = bytearray()
    while True:
        chunk = await request.content.read(limit + 1 - len(body))
        if not chunk:
            break
        body += chunk
        if len(body) > limit:
            raise ApiError(413, "too_large", f"request bodies are limited to {limit} bytes")
    raw = bytes(body) or (empty_as if empty_as is not None else b"")
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as e:
        raise ApiError(invalid_status, "invalid_request", str(e)) from e
    except msgspec.DecodeError as e:
        raise ApiError(400, "malformed_json", f"the body is not JSON: {e}") from e
