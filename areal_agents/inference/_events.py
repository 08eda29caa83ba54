"""Server-sent events of the embedded server's ``/generate`` with ``"stream": true``: one
request's reply token by token, or a batch's replies one event each as each request finishes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from areal_agents.inference.protocol import GenerateSpec, response_body

if TYPE_CHECKING:
    from areal_agents.inference._engine import Engine, GenRequest

__all__ = ["stream_each", "stream_one"]


def _event(body: object) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _reply(engine: Engine, spec: GenerateSpec, req: GenRequest, n: int, finish: dict[str, Any] | None,
           start: float) -> dict[str, Any]:
    """The reply of ``req`` after its first ``n`` tokens, or its error."""
    if req.error:
        return {"error": {"message": f"generation failed: {req.error}"}}
    return {**response_body(spec, req, n, finish, engine.weight_version, time.monotonic() - start, engine.tokenizer)}


async def _open(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


async def stream_one(request: web.Request, engine: Engine, spec: GenerateSpec, req: GenRequest,
                     fut: asyncio.Future[GenRequest], progress: asyncio.Queue[None], start: float) -> web.StreamResponse:
    """Server-sent events as SGLang sends them: ``data: {reply so far}`` per new token (text,
    ids and logprobs cumulative, ``finish_reason`` null until the last), then ``data: [DONE]``."""
    resp = await _open(request)
    sent = 0
    try:
        while not fut.done():
            waiter: asyncio.Future[Any] = asyncio.ensure_future(progress.get())
            await asyncio.wait([waiter, fut], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            n = len(req.output_ids)
            if not fut.done() and n > sent:
                await resp.write(_event(_reply(engine, spec, req, n, None, start)))
                sent = n
        await resp.write(_event(_reply(engine, spec, req, len(req.output_ids), req.finish, start)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionResetError:  # the client went away mid-stream: free its batch slot
        engine.call(lambda: engine.abort_where(lambda r: r is req, "client disconnected"))
    return resp


async def stream_each(request: web.Request, engine: Engine, specs: list[GenerateSpec], reqs: list[GenRequest],
                      futures: list[asyncio.Future[GenRequest]], start: float) -> web.StreamResponse:
    """A streamed batch: one event per request, its whole reply with its ``index`` in the batch,
    sent as it finishes (a failed one: ``{"error": ..., "index": i}``), then ``data: [DONE]``.
    Requests that finish early are not held back by the batch's longest; unlike SGLang, nothing
    is sent for a request before it finishes."""
    resp = await _open(request)
    index = {fut: i for i, fut in enumerate(futures)}
    pending: set[asyncio.Future[GenRequest]] = set(futures)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            events = []
            for fut in sorted(done, key=index.__getitem__):
                i, req = index[fut], fut.result()
                body = _reply(engine, specs[i], req, len(req.output_ids), req.finish, start)
                events.append(_event({**body, "index": i}))
            await resp.write(b"".join(events))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionResetError:  # the client went away mid-stream: free the batch's slots
        ids = {id(r) for r in reqs}
        engine.call(lambda: engine.abort_where(lambda r: id(r) in ids, "client disconnected"))
    return resp
