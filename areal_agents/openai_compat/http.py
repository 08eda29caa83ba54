"""The loopback ``/v1/chat/completions`` endpoint (aiohttp; no torch).

Routes: ``POST /v1/chat/completions`` (JSON, or ``chat.completion.chunk`` server-sent events
ending in ``data: [DONE]`` with ``stream: true``), the :data:`ROUTES` of other APIs translated to
chat completions (``POST /v1/responses``, ``POST /v1/messages``) and ``GET /v1/models``, also under
``/<key>/v1/...``. A request reaches the :class:`~areal_agents.openai_compat.session.ChatSession`
registered under its key, given as the API key (``Authorization: Bearer <key>`` or ``x-api-key: <key>``)
or in the path (which wins when both are given); with a ``fallback`` (``areal-agents serve``) a request without a known key gets a fresh,
unrecorded session. Errors are OpenAI's ``{"error": {...}}`` with a 4xx status for bad input.
The routes are the table :data:`ROUTES`; :class:`Endpoint` serves them for many episodes at
once (one per event loop: :mod:`~areal_agents.openai_compat.loopback`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from areal_agents.inference.client import InferenceClient
from areal_agents.llm import Generation, Tokenizer
from areal_agents.openai_compat.messages import MESSAGES
from areal_agents.openai_compat.responses import RESPONSES
from areal_agents.openai_compat.routes import as_api_error, read_json, translated
from areal_agents.openai_compat.schema import APIError, parse_request
from areal_agents.openai_compat.session import ChatSession, completion_chunks
from areal_agents.runtime.ids import new_key

__all__ = ["Endpoint", "MODEL_NAME", "ROUTES", "add_routes", "add_serve_routes", "request_key"]

MODEL_NAME = "policy"
"""The model id ``/v1/models`` lists (any ``model`` string is accepted)."""

Fallback = Callable[[web.Request], ChatSession]
_SESSIONS: web.AppKey[Mapping[str, ChatSession]] = web.AppKey("openai_sessions")
_FALLBACK: web.AppKey[Fallback] = web.AppKey("openai_fallback")


def _error(err: APIError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


def request_key(request: web.Request) -> str | None:
    """The episode key of ``request``: in its path, else its API key."""
    key = request.match_info.get("key")
    auth = request.headers.get("Authorization", "")
    if key is None and auth.startswith("Bearer "):
        key = auth[len("Bearer "):].strip()
    if key is None and "x-api-key" in request.headers:  # how Anthropic's clients send the API key
        key = request.headers["x-api-key"].strip()
    return key


def _session(request: web.Request) -> ChatSession:
    sessions = request.app[_SESSIONS]
    key = request_key(request)
    if key is not None and key in sessions:
        return sessions[key]
    fallback = request.app.get(_FALLBACK)
    if fallback is not None and request.match_info.get("key") is None:
        return fallback(request)
    raise APIError("unknown episode key (in the path or as the API key)", status=401, code="invalid_api_key")


async def _chat(request: web.Request) -> web.StreamResponse:
    try:
        session = _session(request)
        req = parse_request(await read_json(request))
        completion = await session.create(req)
    except Exception as exc:  # noqa: BLE001 - the endpoint keeps serving, and answers in OpenAI's shape
        return _error(as_api_error(exc))
    if not req.stream:
        return web.json_response(completion)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for chunk in completion_chunks(completion, req.include_usage):
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [
        {"id": MODEL_NAME, "object": "model", "created": int(time.time()), "owned_by": "areal-agents"}]})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ROUTES: list[tuple[str, str, Handler]] = [
    ("POST", "/v1/chat/completions", _chat),
    ("POST", "/v1/responses", translated(RESPONSES, _session)),  # :mod:`.responses`, translated to chat
    ("POST", "/v1/messages", translated(MESSAGES, _session)),  # :mod:`.messages`, translated to chat
    ("GET", "/v1/models", _models),
]
"""``(method, path, handler)`` of every route; each is also served under ``/<key>``."""


def add_routes(app: web.Application, sessions: Mapping[str, ChatSession] | None = None,
               fallback: Fallback | None = None) -> None:
    """Serve :data:`ROUTES` on ``app`` for ``sessions`` (and ``fallback``)."""
    app[_SESSIONS] = sessions if sessions is not None else {}
    if fallback is not None:
        app[_FALLBACK] = fallback
    for prefix in ("", "/{key}"):
        for method, path, handler in ROUTES:
            app.router.add_route(method, prefix + path, handler)


def add_serve_routes(app: web.Application, tokenizer: Tokenizer, max_new_tokens: int = 256) -> None:
    """The routes on the embedded server's own ``app`` (``areal-agents serve``): each request
    gets a fresh session generating through the server's ``/generate`` on the same address."""
    clients: dict[str, InferenceClient] = {}

    def fallback(request: web.Request) -> ChatSession:
        url = f"http://{request.host}"
        client = clients.get(url) or clients.setdefault(url, InferenceClient([url], stream_batches=True))

        async def generate(ids: list[int], sampling: dict[str, Any], top: int) -> Generation:
            return await client.generate(ids, sampling, top_logprobs=top)

        return ChatSession(tokenizer, generate, {"max_new_tokens": max_new_tokens}, remember=False)

    async def close_clients(app: web.Application) -> None:
        for client in clients.values():
            await client.aclose()

    add_routes(app, fallback=fallback)
    app.on_cleanup.append(close_clients)


class Endpoint:
    """A loopback HTTP server for many episodes' sessions, on the running event loop.

    :meth:`add` registers a session under a key, :meth:`remove` drops it and cancels the
    requests of that key still being answered (the episode is over: nobody reads their
    replies, and their generations free the server's batch slots). A request whose client
    hangs up is cancelled as well. :meth:`base_url` is one URL for every session: the key
    travels as the API key, so clients kept per base URL are shared by the episodes.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.sessions: dict[str, ChatSession] = {}
        self._running: dict[str, set[asyncio.Task[Any]]] = {}  # key -> its requests being answered
        self._runner: web.AppRunner | None = None
        self._starting: asyncio.Future[str] | None = None
        self.url = ""
        self.address: tuple[str, int] | None = None  # (host, port) once serving

    async def start(self) -> str:
        """Start serving (once; concurrent callers wait for the same start); returns ``http://HOST:PORT``."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        return await asyncio.shield(self._starting)

    async def _start(self) -> str:
        app = web.Application(client_max_size=64 * 1024**2, middlewares=[self._track])
        add_routes(app, self.sessions)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True,
                               shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0, backlog=1024)
        await site.start()
        self._runner = runner
        self.address = (self.host, int(runner.addresses[0][1]))
        self.url = f"http://{self.host}:{self.address[1]}"
        return self.url

    @web.middleware
    async def _track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key, task = request_key(request), asyncio.current_task()
        running = self._running.get(key) if key is not None else None
        if running is None or task is None:
            return await handler(request)
        running.add(task)
        try:
            return await handler(request)
        finally:
            running.discard(task)

    async def base_url(self) -> str:
        """The OpenAI base URL (``http://HOST:PORT/v1``) of every session (each one's key is the
        API key); starts serving."""
        url = self.url if self._runner is not None else await self.start()  # serving: no future per episode
        return f"{url}/v1"

    def add(self, session: ChatSession, key: str | None = None) -> str:
        """Register ``session`` under ``key`` (default: a new one); returns the key."""
        key = new_key() if key is None else key
        self.sessions[key] = session
        self._running[key] = set()
        return key

    def remove(self, key: str) -> None:
        """Drop the session under ``key``; its requests still being answered are cancelled."""
        self.sessions.pop(key, None)
        for task in self._running.pop(key, ()):
            task.cancel()

    async def close(self) -> None:
        for key in list(self.sessions):
            self.remove(key)
        starting, self._starting = self._starting, None
        if starting is not None and not starting.done():
            starting.cancel()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
