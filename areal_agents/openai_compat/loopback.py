"""One loopback endpoint per event loop, shared by every episode on it (no torch).

Starting an HTTP server per episode cost more than the episode's own work; instead the
episodes of a rollout (one event loop per process: the executor's, or the one an eval runs
on) share :func:`loop_endpoint`, each under its own key (the API key; also accepted in the URL
path). Its base URL is the same for all of them, so a framework that keeps one HTTP client per
base URL (LangChain's ``ChatOpenAI`` does) keeps one for the loop, not one per episode.
The server starts when an agent first asks for its URL and stops when its loop shuts down
(``asyncio.run`` and :class:`~areal_agents.runtime.loop_thread.LoopThread` finalize async generators
on the way out, and this module keeps one open for that) or when :func:`close_loop_endpoint`
is awaited. On the way out it closes, on that loop, the connections the agents' HTTP clients
still have open to it (clients kept in a framework's cache or an agent's own, and clients
dropped unclosed), then lets the dropped clients close themselves there. An HTTP connection
belongs to the loop it was opened on, and one left open fails when its client later closes or
reuses it on another loop (``Event loop is closed``); so no client is left holding anything
bound to a finished loop, and a kept one serves the next loop's episodes as it served these.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncGenerator

from areal_agents.openai_compat.http import Endpoint

__all__ = ["close_loop_endpoint", "loop_endpoint"]

_CLOSE_WAIT = 2.0  # seconds the unclosed clients' own closing may take at loop shutdown
_ENDPOINTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Shared] = weakref.WeakKeyDictionary()


class _Shared(Endpoint):
    """The loop's endpoint; serving starts a guard generator that closes it at loop shutdown."""

    def __init__(self) -> None:
        super().__init__()
        self._guard: AsyncGenerator[None, None] | None = None

    async def _start(self) -> str:
        url = await super()._start()
        self._guard = _guard(self)
        await self._guard.__anext__()  # suspended at its yield: finalized by loop.shutdown_asyncgens()
        return url


async def _guard(endpoint: Endpoint) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await _close_client_connections(endpoint.address)
        await _drain_unclosed_clients()
        await endpoint.close()
        _ENDPOINTS.pop(asyncio.get_running_loop(), None)


async def _drain_unclosed_clients() -> None:
    """Collect garbage now, so that HTTP clients dropped unclosed schedule their closing on this
    (still running) loop, and give those closings a moment to finish."""
    before = asyncio.all_tasks()
    gc.collect()
    closing = asyncio.all_tasks() - before
    if closing:
        await asyncio.wait(closing, timeout=_CLOSE_WAIT)
        for task in closing:  # read, so that a failed close is not reported as never retrieved
            if task.done() and not task.cancelled():
                task.exception()


async def _close_client_connections(address: tuple[str, int] | None) -> None:
    """Close this loop's client connections still open to ``address`` (the endpoint's host and port).

    Idle connections in a client's pool are not read from, so they do not notice the server
    closing them: closed here, on their own loop, the client later finds them closed, on any
    loop, and drops them without touching this one. A transport has no registry to ask, so they
    are found among the live objects (once per loop, at its end)."""
    if address is None:
        return
    loop, closed = asyncio.get_running_loop(), False
    for obj in gc.get_objects():
        if (issubclass(type(obj), asyncio.BaseTransport) and getattr(obj, "_loop", None) is loop
                and not obj.is_closing() and _peer(obj) == address):
            obj.close()
            closed = True
    if closed:
        await asyncio.sleep(0)  # their close callbacks run: the sockets are released on this loop


def _peer(transport: asyncio.BaseTransport) -> tuple[str, int] | None:
    peer = transport.get_extra_info("peername")
    return (peer[0], peer[1]) if isinstance(peer, tuple) and len(peer) >= 2 else None


def loop_endpoint() -> Endpoint:
    """The running loop's shared endpoint (created on first use; it serves once asked for a URL)."""
    loop = asyncio.get_running_loop()
    endpoint = _ENDPOINTS.get(loop)
    if endpoint is None:
        endpoint = _ENDPOINTS[loop] = _Shared()
    return endpoint


async def close_loop_endpoint() -> None:
    """Stop the running loop's shared endpoint now (the next episode starts a new one)."""
    endpoint = _ENDPOINTS.pop(asyncio.get_running_loop(), None)
    if endpoint is None:
        return
    guard, endpoint._guard = endpoint._guard, None
    if guard is not None:
        await guard.aclose()  # its finally closes the endpoint
    else:
        await endpoint.close()
