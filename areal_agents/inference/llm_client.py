"""Former home of :class:`~areal_agents.llm.ClientLLM`, kept so that its old import path works.

``ClientLLM`` is an :class:`~areal_agents.llm.LLM`, so it lives beside it in :mod:`areal_agents.llm`;
nothing in :mod:`areal_agents.inference` imports that agent-facing module, so this alias resolves
the name only when it is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ClientLLM"]  # noqa: F822 - resolved by __getattr__ below


def __getattr__(name: str) -> Any:
    if name == "ClientLLM":
        return importlib.import_module("areal_agents.llm").ClientLLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
