"""The gateway of an online run: the HTTP routes agents outside the run use (aiohttp; no torch).

Routes (every error is OpenAI's ``{"error": {"message", "type", "param", "code"}}``):

* ``POST /rl/sessions`` — admin key (``Authorization: Bearer <admin key>`` or ``x-api-key``); body
  ``{"group": str?, "metadata": object?}`` (or none). 201 ``{"id", "key", "base_url", "group",
  "metadata", "ttl", "version"}``; 429 when ``online.max_open_sessions`` are open.
* ``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages``, ``GET /v1/models`` — the session's
  key as the API key (or ``/<key>/v1/...``), served and recorded as an episode's calls are
  (:mod:`areal_agents.openai_compat.http`); 401 for any other key, the admin key included.
* ``POST /rl/sessions/{key}/reward`` — ``{"reward": number}`` (earned at the last call) or
  ``{"rewards": [number, ...]}`` (one per call, in order); 200 ``{"id", "status": "waiting" |
  "dropped", "reason"}``; 404 unknown or gone, 409 already rewarded or a call still running, 400 a
  bad reward. ``POST /rl/sessions/{key}/end`` closes it without one. ``GET /rl/sessions/{key}``: its
  state. With the admin key, ``{key}`` may be the session's ``id`` instead.
* Any request once the run is ending: 503 ``run_ended``.
* ``GET /rl/ledger`` — admin key: the ledger (:class:`~areal_agents.online.sessions.SessionBook`),
  the weight version and the sessions ready to train. ``GET /rl/health`` — no key: ``{"status": "ok"}``.

A request body over ``online.max_request_bytes`` is refused with 413; metadata over 16 KiB and
group names over 256 characters with 400.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from areal_agents.config import ConfigError
from areal_agents.llm import Generation, Tokenizer
from areal_agents.online.sessions import Refused, Session, SessionBook
from areal_agents.openai_compat.http import add_routes, request_key
from areal_agents.openai_compat.routes import Handler, as_api_error, read_json
from areal_agents.openai_compat.schema import APIError
from areal_agents.openai_compat.session import ChatSession, GenerateFn

__all__ = ["MAX_GROUP_CHARS", "MAX_METADATA_BYTES", "gateway_app", "masked", "resolve_admin_key"]

MAX_METADATA_BYTES = 16 * 1024
MAX_GROUP_CHARS = 256


def resolve_admin_key(env_var: str, key_file: str | None, run_dir: Path) -> tuple[str, str]:
    """The admin key and where it comes from: the environment variable ``env_var``, else
    ``key_file``, else ``RUN_DIR/admin_key`` (written with a fresh key, mode 600, when missing)."""
    if os.environ.get(env_var, "").strip():
        return _long_enough(os.environ[env_var].strip(), "online.admin_key_env", f"${env_var}"), f"${env_var}"
    path = Path(key_file).expanduser() if key_file else run_dir / "admin_key"
    if path.is_file():
        return _long_enough(path.read_text().strip(), "online.admin_key_file", str(path)), str(path)
    if key_file:
        raise ConfigError("online.admin_key_file", f"no such file {key_file}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("sk-admin-" + secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip(), str(path)


def _long_enough(key: str, setting: str, where: str) -> str:
    if len(key) < 16:
        raise ConfigError(setting, f"the admin key in {where} is shorter than 16 characters: use a long random secret")
    return key


def masked(key: str) -> str:
    """``key`` as it may be shown: its first and last 4 characters."""
    return f"{key[:4]}…{key[-4:]}"


def _error(err: APIError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


def _refused(exc: Refused) -> APIError:
    return APIError(str(exc), status=exc.status, code=exc.code,
                    type="invalid_request_error" if exc.status < 500 else "server_error")


class _OpenChats(Mapping[str, ChatSession]):
    """The book's open sessions as ``key -> ChatSession``: what the OpenAI routes look keys up in."""

    def __init__(self, book: SessionBook) -> None:
        self.book = book

    def __getitem__(self, key: str) -> ChatSession:
        s = self.book.get(key)
        if s is None or s.state != "open" or s.chat is None:
            raise KeyError(key)
        return s.chat

    def __iter__(self) -> Iterator[str]:
        return iter(())  # never listed

    def __len__(self) -> int:
        return 0


class _SessionGenerate:
    """Generation of one session's calls, all on one server (the session id as ``rid``)."""

    __slots__ = ("client", "rid")

    def __init__(self, client: Any, rid: str) -> None:
        self.client, self.rid = client, rid

    async def __call__(self, ids: list[int], sampling: dict[str, Any], top: int) -> Generation:
        gen: Generation = await self.client.generate(ids, sampling, rid=self.rid, top_logprobs=top)
        return gen


class _Gateway:
    """The handlers of :func:`gateway_app` over one book (see the module docstring)."""

    def __init__(self, book: SessionBook, admin_key: str, client: Any, tokenizer: Tokenizer,
                 defaults: dict[str, Any], base_url: Callable[[], str],
                 make_generate: Callable[[Any, str], GenerateFn]) -> None:
        self.book, self.admin_key, self.client, self.tokenizer = book, admin_key, client, tokenizer
        self.defaults, self.base_url, self.make_generate = defaults, base_url, make_generate

    def is_admin(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "")
        given = given[len("Bearer "):].strip() if given.startswith("Bearer ") else request.headers.get("x-api-key", "")
        return bool(given) and hmac.compare_digest(given.encode(), self.admin_key.encode())

    def need_admin(self, request: web.Request, what: str) -> None:
        if not self.is_admin(request):
            raise APIError(f"{what} needs the admin key (Authorization: Bearer <admin key>)", status=401,
                           code="invalid_api_key", type="authentication_error")

    def session_of(self, request: web.Request) -> Session:
        """The session ``{key}`` names: its key, or (with the admin key) its id."""
        token = request.match_info["key"]
        s = self.book.get(token)
        if s is None and token.startswith("ses-") and self.is_admin(request):
            s = self.book.by_id(token)
        if s is None:
            raise Refused("no open session has this key (unknown, ended, or expired after online.session_ttl)",
                          404, "session_not_found")
        return s

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """OpenAI-shaped errors for everything; session keys for the OpenAI routes, and the
        session's running calls counted while one is answered."""
        book = self.book
        try:
            if book.closed and request.path != "/rl/health":
                raise Refused("the run is ending: the gateway takes no more requests", 503, "run_ended")
            if "/v1/" not in request.path:
                return await handler(request)
            key = request_key(request)
            s = book.get(key) if key else None
            if s is None or s.state != "open":
                raise APIError("invalid API key: not the key of an open session (unknown, rewarded, ended or "
                               "expired); open one with POST /rl/sessions", status=401, code="invalid_api_key",
                               type="authentication_error")
            book.call_started(s)
            try:
                return await handler(request)
            finally:
                book.call_finished(s)
        except Refused as exc:
            reply = _error(_refused(exc))
            if exc.status == 429:
                reply.headers["Retry-After"] = "1"
            return reply
        except (APIError, web.HTTPException) as exc:
            if isinstance(exc, web.HTTPException) and exc.status < 400:
                raise
            return _error(as_api_error(exc))

    @staticmethod
    async def body_of(request: web.Request, required: bool) -> dict[str, Any]:
        if not required and not request.can_read_body:
            return {}
        body = await read_json(request)
        if not isinstance(body, dict):
            raise APIError("the request body must be a JSON object")
        return body

    async def open_session(self, request: web.Request) -> web.Response:
        self.need_admin(request, "opening a session")
        body = await self.body_of(request, required=False)
        unknown = sorted(set(body) - {"group", "metadata"})
        if unknown:
            raise APIError(f"unknown field(s): {', '.join(unknown)} (a session takes group and metadata)",
                           param=unknown[0])
        group = body.get("group")
        if group is not None and (not isinstance(group, str) or not group or len(group) > MAX_GROUP_CHARS):
            raise APIError(f"group: must be a non-empty string of at most {MAX_GROUP_CHARS} characters", param="group")
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise APIError("metadata: must be a JSON object", param="metadata")
        if len(json.dumps(metadata)) > MAX_METADATA_BYTES:
            raise APIError(f"metadata: larger than {MAX_METADATA_BYTES} bytes as JSON", param="metadata")
        s = self.book.open(group, metadata)
        s.chat = ChatSession(self.tokenizer, self.make_generate(self.client, s.sid), self.defaults)
        return web.json_response({"id": s.sid, "key": s.key, "base_url": f"{self.base_url()}/v1", "group": s.group,
                                  "metadata": s.metadata, "ttl": self.book.ttl, "version": s.opened_version},
                                 status=201)

    async def reward(self, request: web.Request) -> web.Response:
        body = await self.body_of(request, required=True)
        if ("reward" in body) == ("rewards" in body) or set(body) - {"reward", "rewards"}:
            raise APIError('give either "reward": number or "rewards": [number, ...] (one per call)', param="reward")
        value = body["reward"] if "reward" in body else body["rewards"]
        numbers = value if isinstance(value, list) else [value]
        if not numbers or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
            raise APIError("reward: must be a number, rewards a non-empty list of numbers", param="reward")
        s = self.book.reward(self.session_of(request).key, value)
        return web.json_response({"id": s.sid, "status": s.state, "reason": s.reason or None})

    async def end(self, request: web.Request) -> web.Response:
        s = self.book.end(self.session_of(request).key)
        return web.json_response({"id": s.sid, "status": s.state, "reason": s.reason})

    async def show(self, request: web.Request) -> web.Response:
        s = self.session_of(request)
        return web.json_response({"id": s.sid, "status": s.state, "group": s.group, "metadata": s.metadata,
                                  "calls": len(s.chat.records) if s.chat is not None else None,
                                  "calls_running": s.calls_running})

    async def ledger(self, request: web.Request) -> web.Response:
        self.need_admin(request, "the ledger")
        book = self.book
        return web.json_response({**book.counts(), "dropped_by_reason": dict(book.dropped), "version": book.version,
                                  "ready": book.ready(), "batch_sessions": book.batch_sessions})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": self.book.version})


def gateway_app(book: SessionBook, *, admin_key: str, client: Any, tokenizer: Tokenizer,
                defaults: dict[str, Any], base_url: Callable[[], str], max_request_bytes: int,
                make_generate: Callable[[Any, str], GenerateFn] = _SessionGenerate) -> web.Application:
    """The gateway's aiohttp application (see the module docstring): sessions generate with
    ``client`` (an :class:`~areal_agents.inference.client.InferenceClient`) at the sampling
    ``defaults``; ``base_url()`` is the address clients reach it at."""
    gw = _Gateway(book, admin_key, client, tokenizer, defaults, base_url, make_generate)
    app = web.Application(client_max_size=max_request_bytes, middlewares=[gw.guard])
    app.router.add_post("/rl/sessions", gw.open_session)
    app.router.add_post("/rl/sessions/{key}/reward", gw.reward)
    app.router.add_post("/rl/sessions/{key}/end", gw.end)
    app.router.add_get("/rl/sessions/{key}", gw.show)
    app.router.add_get("/rl/ledger", gw.ledger)
    app.router.add_get("/rl/health", gw.health)
    add_routes(app, _OpenChats(book))
    return app
