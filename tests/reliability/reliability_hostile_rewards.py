"""Fault injection: hostile reward functions, in a light module reward workers import fast.

Each is selected by the row field ``kind``; ``ok`` rows score normally (exact match).
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

__all__ = ["hostile_reward"]


def hostile_reward(completion: str, answer: str = "", kind: str = "ok", **row: Any) -> float:
    """Exact-match reward that misbehaves as ``kind`` says (fault injection)."""
    if kind == "hang":
        time.sleep(3600)
    elif kind == "exit":
        os._exit(3)
    elif kind == "segfault":
        ctypes.string_at(0)  # reads address 0: SIGSEGV in the worker
    elif kind == "alloc":
        hoard = []
        while True:  # grows without bound until the worker's memory limit stops it
            hoard.append(bytearray(64 * 2**20))
    elif kind == "nan":
        return float("nan")
    elif kind == "inf":
        return float("inf")
    elif kind == "string":
        return "1.0"  # type: ignore[return-value]
    elif kind == "raise":
        raise RuntimeError("fault injection: reward crashed")
    return float(completion.strip() == answer)
