"""What a model's reply does beyond text (no torch).

* :mod:`.calls` — tool calls in replies (``<tool_call>{...}</tool_call>``) parsed into OpenAI ``tool_calls``;
* :mod:`.sandbox` — model-written Python run in a child interpreter with no network and resource limits.
"""

from __future__ import annotations

from areal_agents.tools.calls import parse_tool_calls
from areal_agents.tools.sandbox import VISIBLE_ROOTS, SandboxResult, run_python

__all__ = ["VISIBLE_ROOTS", "SandboxResult", "parse_tool_calls", "run_python"]
