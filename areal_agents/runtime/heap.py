"""Keep the garbage collector off what a process set up: :func:`freeze_setup`."""

from __future__ import annotations

import gc

__all__ = ["freeze_setup"]


def freeze_setup() -> None:
    """Collect once, then freeze what is left alive (modules, a model, a tokenizer, a config).

    Call it when a process is done setting up and starts its steady work (a server serving, a
    trainer stepping, a rollout process taking calls): whatever setup left alive stays alive, so
    the full collections that the steady work's short-lived objects set off need not scan it
    again. In a trainer that has imported torch and transformers a full collection scans
    hundreds of thousands of objects: about 0.1 s, paid a few times per eval of 500 episodes.
    Objects created after the call are collected as usual.
    """
    gc.collect()
    gc.freeze()
