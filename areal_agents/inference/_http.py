"""What every embedded server answers alike: errors in one JSON shape, request bodies read one way."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from areal_agents.inference.protocol import BadRequest, require

__all__ = ["error", "error_middleware", "read_json"]


def error(status: int, message: str) -> web.Response:
    """``{"error": {"message": ...}}`` with ``status``."""
    return web.json_response({"error": {"message": message}}, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A :class:`BadRequest` answers 400, an unexpected exception 500: the server keeps serving."""
    try:
        return await handler(request)
    except BadRequest as exc:
        return error(400, str(exc))
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error(exc.status, exc.reason)
        raise
    except Exception as exc:  # keep serving: one broken request must not take the server down
        return error(500, f"{type(exc).__name__}: {exc}")


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request's JSON object (``{}`` for an empty body); :class:`BadRequest` otherwise."""
    raw = await request.read()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    require(isinstance(body, dict), "the request body must be a JSON object")
    return body
