"""The process's plumbing (no torch): threads, event-loop threads, lifelines to a parent, stop signals, ids.

* :mod:`.threads` — :func:`run_in_thread`, sync calls on reusable daemon threads (env calls);
* :mod:`.loop_thread` — an asyncio event loop on a thread of its own;
* :mod:`.lifeline` — a child that dies with its parent;
* :mod:`.stopping` — SIGINT/SIGTERM as a clean stop;
* :mod:`.ids` — completion and tool-call ids and episode keys without a system call each;
* :mod:`.hosts` — whether an address to listen on stays on this machine;
* :mod:`.heap` — :func:`quiet_setup` and :func:`freeze_setup`, the garbage collector kept off what setup leaves alive;
  :func:`keep_freed_memory`, freed memory kept for the next allocation.
"""

from __future__ import annotations

__all__: list[str] = []
