"""Serving another API's requests through a chat session (aiohttp; no torch).

An :class:`API` is a translation: its request body to a chat-completions body
(:func:`~areal_agents.openai_compat.schema.parse_request` checks it), the finished
``chat.completion`` back to its own response JSON, that response as its own server-sent events
(with ``stream: true``), and an :class:`~areal_agents.openai_compat.schema.APIError` in its own
error shape. :func:`translated` makes the aiohttp handler of one API: the request is answered by
:meth:`ChatSession.create <areal_agents.openai_compat.session.ChatSession.create>`, so it is
recorded exactly as a chat completion is.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from areal_agents.inference.protocol import InferenceError
from areal_agents.openai_compat.schema import APIError, parse_request
from areal_agents.openai_compat.session import ChatSession

__all__ = ["API", "Event", "Handler", "as_api_error", "bad", "joined_text", "raw_reply_text", "read_json", "translated"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Event = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class API:
    """One API's translation (see the module docstring).

    ``reply(body, completion, raw)`` gets the request body, the ``chat.completion`` and the
    decoded text of the first choice's sampled tokens (stop strings included); ``renamed`` maps
    chat-completions parameter names in errors to this API's names.
    """

    name: str
    to_chat: Callable[[dict[str, Any]], dict[str, Any]]
    reply: Callable[[dict[str, Any], dict[str, Any], str], dict[str, Any]]
    events: Callable[[dict[str, Any]], list[Event]]
    error: Callable[[APIError], dict[str, Any]]
    renamed: dict[str, str] = field(default_factory=dict)


def bad(param: str, message: str) -> APIError:
    """A 400 naming ``param``: ``"<param>: <message>"``."""
    return APIError(f"{param}: {message}", param=param)


def joined_text(content: object, param: str, fields: dict[str, str]) -> str:
    """A string, or the joined text of a list of parts: a part of type ``t`` in ``fields`` holds
    its text under ``fields[t]``; any other part is a 400 naming it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(param, f"must be a string or a list of {', '.join(fields)} parts")
    texts = []
    for i, part in enumerate(content):
        key = fields.get(str(part.get("type"))) if isinstance(part, dict) else None
        if key is None or not isinstance(part.get(key), str):
            raise bad(f"{param}[{i}]", f"must be a text part ({', '.join(fields)}) with its {key or 'text'}")
        texts.append(part[key])
    return "".join(texts)


def raw_reply_text(session: ChatSession, completion: dict[str, Any]) -> str:
    """The decoded sampled tokens of ``completion``'s first choice ("" if not recorded)."""
    first = next((r for r in session.records if r.request_id == completion["id"]), None)
    if first is None:
        return ""
    return str(session.tokenizer.decode(first.completion_ids, skip_special_tokens=True))


def _renamed(err: APIError, names: dict[str, str]) -> APIError:
    if err.param is None or err.param.split(".")[0].split("[")[0] not in names:
        return err
    head = err.param.split(".")[0].split("[")[0]
    new = names[head] + err.param[len(head):]
    return APIError(err.message.replace(head, names[head], 1), status=err.status, param=new, type=err.type,
                    code=err.code)


def _sse(events: list[Event]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


async def read_json(request: web.Request) -> Any:
    """The request's body parsed as JSON; a 400 :class:`APIError` when it is not JSON."""
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(f"the request body is not valid JSON: {exc}") from None


def as_api_error(exc: Exception) -> APIError:
    """What an endpoint answers for ``exc``: an :class:`APIError` as it is, aiohttp's HTTP errors
    with their status, a failed generation as a 502, anything else as a 500 (the endpoint keeps serving)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, web.HTTPException):  # aiohttp's own refusals (413: a body over the size limit)
        return APIError(exc.reason or exc.text or "", status=exc.status,
                        type="invalid_request_error" if exc.status < 500 else "server_error")
    if isinstance(exc, InferenceError):
        return APIError(f"generation failed: {exc}", status=502, type="server_error")
    return APIError(f"{type(exc).__name__}: {exc}", status=500, type="server_error")


def translated(api: API, lookup: Callable[[web.Request], ChatSession]) -> Handler:
    """The aiohttp handler serving ``api`` on the session ``lookup(request)`` finds."""

    def failure(err: APIError) -> web.Response:
        return web.json_response(api.error(err), status=err.status)

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            session = lookup(request)
            body = await read_json(request)
            if not isinstance(body, dict):
                raise APIError("the request body must be a JSON object")
            try:
                req = parse_request(api.to_chat(body))
            except APIError as err:
                raise _renamed(err, api.renamed) from None
            completion = await session.create(req)
            reply = api.reply(body, completion, raw_reply_text(session, completion))
        except Exception as exc:  # noqa: BLE001 - the endpoint keeps serving, and answers in the API's shape
            return failure(as_api_error(exc))
        if not body.get("stream"):
            return web.json_response(reply)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(_sse(api.events(reply)))
        await resp.write_eof()
        return resp

    return handle
