"""The in-process ``openai.AsyncOpenAI`` stand-in bound to one episode (no torch).

``await client.chat.completions.create(model=..., messages=..., ...)`` takes the keyword
arguments of the official client and returns its types (``ChatCompletion``, or an async
iterator of ``ChatCompletionChunk`` with ``stream=True``) when the ``openai`` package is
installed (the ``[openai]`` extra), else objects with the same attributes. A bad request
raises ``openai.BadRequestError`` (or :class:`~areal_agents.openai_compat.schema.APIError`).
``await client.http_endpoint()`` returns the base URL of the loopback HTTP endpoint (one server
shared by the episodes of a rollout, started on first use), for agents that speak HTTP; the
URL is the same for every episode of the loop, and ``client.api_key``, the episode's key, sent
as the API key, says whose call it is.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from areal_agents.openai_compat.schema import APIError, parse_request
from areal_agents.openai_compat.session import ChatSession, completion_chunks

__all__ = ["EpisodeClient", "Reply"]

# keywords that are not fields of the request body: the official client's transport options, extra_body
_DROP = {"extra_headers", "extra_query", "timeout", "extra_body"}


class Reply(dict[str, Any]):
    """A reply without the ``openai`` package: a dict whose keys read as attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return _wrap(self[name])
        except KeyError:
            raise AttributeError(name) from None

    def model_dump(self) -> dict[str, Any]:
        return dict(self)


def _wrap(value: Any) -> Any:
    if isinstance(value, dict):
        return Reply(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


@functools.cache
def _sdk_types() -> dict[str, Any] | None:
    """The official reply types by kind (None without the ``openai`` package), imported once."""
    try:
        from openai.types.chat import ChatCompletion, ChatCompletionChunk
    except ImportError:
        return None
    return {"completion": ChatCompletion, "chunk": ChatCompletionChunk}


def _typed(obj: dict[str, Any], kind: str) -> Any:
    types = _sdk_types()
    return Reply(obj) if types is None else types[kind].model_validate(obj)


def _sdk_error(err: APIError) -> Exception:
    """``err`` as the official client raises a 4xx (``openai.BadRequestError``), where installed."""
    try:
        import openai
    except ImportError:
        return err
    try:  # the HTTP library the installed client is built on
        import httpx2 as httpx  # type: ignore[import-not-found]
    except ImportError:
        import httpx  # type: ignore[no-redef]
    request = httpx.Request("POST", "http://localhost/v1/chat/completions")
    response = httpx.Response(err.status, request=request, json=err.body())
    cls = openai.BadRequestError if err.status == 400 else openai.APIStatusError
    return cls(err.message, response=response, body=err.body()["error"])


def _given(value: object) -> bool:
    return value is not None and type(value).__name__ not in ("NotGiven", "Omit")


class _Completions:
    def __init__(self, session: ChatSession) -> None:
        self._session = session

    async def create(self, **kwargs: Any) -> Any:
        """``chat.completions.create`` with the official client's keyword arguments."""
        body = {k: v for k, v in kwargs.items() if k not in _DROP and _given(v)}
        extra = kwargs.get("extra_body")
        if isinstance(extra, dict):
            body.update(extra)
        try:
            req = parse_request(body)
            completion = await self._session.create(req)
        except APIError as err:
            raise _sdk_error(err) from None
        if not req.stream:
            return _typed(completion, "completion")
        return _stream([_typed(c, "chunk") for c in completion_chunks(completion, req.include_usage)])


async def _stream(chunks: list[Any]) -> AsyncIterator[Any]:
    for chunk in chunks:
        yield chunk


class EpisodeClient:
    """What an OpenAI-style agent gets as ``client`` (see the module docstring)."""

    def __init__(self, session: ChatSession, *, api_key: str = "",
                 endpoint: Callable[[], Awaitable[str]] | None = None) -> None:
        self.session = session
        self.chat = SimpleNamespace(completions=_Completions(session))  # client.chat.completions.create
        self.api_key = api_key
        self._endpoint = endpoint

    async def http_endpoint(self) -> str:
        """The base URL (``http://127.0.0.1:PORT/v1``) of the HTTP endpoint; send ``api_key`` with it."""
        if self._endpoint is None:
            raise RuntimeError("this client has no HTTP endpoint")
        return await self._endpoint()
