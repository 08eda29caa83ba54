"""Ids of completions and tool calls, and episode keys, without a system call each (no torch).

Reading the OS's random source for every id costs a system call, which on a busy event loop
also hands the GIL to other threads. Here the OS is read once per process (and again in a
forked child): an id is a random process prefix and a counter, unique within the process and
unlikely to repeat across processes, as OpenAI's ids (not secret); an episode key is a keyed
hash (BLAKE2b under the process's random secret) of the counter, so one key tells nothing of
another episode's.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets

__all__ = ["new_id", "new_key"]

_PREFIX = ""
_SECRET = b""
_COUNTER = itertools.count()


def _reseed() -> None:
    global _PREFIX, _SECRET, _COUNTER
    _PREFIX, _SECRET, _COUNTER = secrets.token_hex(6), secrets.token_bytes(32), itertools.count()


_reseed()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed)


def new_id(head: str = "", width: int = 24) -> str:
    """``head`` + ``width`` hex digits (``width`` > 12): the process prefix, then a counter."""
    return f"{head}{_PREFIX}{next(_COUNTER):0{width - len(_PREFIX)}x}"


def new_key() -> str:
    """An unguessable 32-hex-digit key (a keyed hash of the counter)."""
    return hashlib.blake2b(next(_COUNTER).to_bytes(8, "little"), key=_SECRET, digest_size=16).hexdigest()
