"""An asyncio event loop on its own thread (uvloop when installed), stopped without leaks."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["LoopThread", "new_event_loop"]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop event loop if ``uvloop`` is importable, else the default asyncio one."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """Runs ``loop.run_forever()`` on a daemon thread named ``name``.

    :meth:`stop` ends the loop, shuts down its async generators and default thread pool
    (the threads ``asyncio.to_thread`` used) and closes it, then joins the thread.
    """

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop from any thread (a no-op once the loop is closed)."""
        with contextlib.suppress(RuntimeError):  # closed
            self.loop.call_soon_threadsafe(fn, *args)

    def run(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait for its result from another thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def stop(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self.call_soon(self.loop.stop)
            self._thread.join(timeout)
        elif not self.loop.is_closed():  # never started
            self.loop.close()
