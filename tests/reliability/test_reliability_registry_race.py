"""Found by the malformed-output test: the first concurrent lookups in a registry (reward calls
from many env threads at the start of a run) saw an empty registry ("registered: none") while
another thread was still loading the entry points."""

from __future__ import annotations

import threading

from areal_agents.registry import Registry


def first_lookups(n_threads: int) -> list[BaseException]:
    """``n_threads`` threads look up ``math`` in a fresh rewards registry at the same moment."""
    reg = Registry("rewards")  # fresh: entry points not loaded yet
    barrier = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def lookup() -> None:
        barrier.wait()
        try:
            reg.get("math")
        except Exception as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    threads = [threading.Thread(target=lookup) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_concurrent_first_lookups_all_see_the_entry_points() -> None:
    errors = [exc for _ in range(20) for exc in first_lookups(16)]
    assert errors == []
