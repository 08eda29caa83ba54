"""Who failed and why: the component behind a failed episode, and where in the user's code.

A failed :class:`~areal_agents.types.Trajectory` has a status naming the component that
failed (``env_error``, ``agent_error``, ``reward_error``, ``server_error``, ``timeout``,
``aborted``) and the cause in its info. The helpers here turn that into one line for the user,
and find the line of user code an exception came from.
"""

from __future__ import annotations

import inspect
import linecache
import os
import sysconfig
import traceback
from typing import Any

from areal_agents.types import Trajectory

__all__ = ["EpisodesFailed", "UserError", "blame", "code_location", "describe", "failure_cause", "failure_message", "function_location",
           "message_line"]

COMPONENTS = {"env_error": "env", "agent_error": "agent", "reward_error": "reward", "server_error": "server",
              "timeout": "timeout", "aborted": "aborted"}

HINTS = {
    "env": "check the env's reset/step",
    "agent": "check the agent's __init__/run",
    "reward": "check the reward function",
    "server": "check the inference servers (their logs are in the run dir's logs/)",
    "timeout": "an episode or a reward hung: check for hangs, or raise rollout.episode_timeout / rollout.reward_timeout",
    "aborted": "episodes were cancelled",
}


class UserError(Exception):
    """Bad input or a broken setup, not a bug in this package: the command line prints the
    message in one line and exits 1, with no traceback (``AREAL_AGENTS_TRACEBACK=1`` shows it).

    The errors of the rooms below the command line derive from it (with the built-in class they
    always were), so the command line knows them without importing them. A subclass whose
    message already says what failed sets ``names_its_cause = True``: its type name is left out.
    """

    names_its_cause = False


class EpisodesFailed(UserError, RuntimeError):
    """Every episode of a stretch (rollout groups, an evaluation) failed; the message names the cause."""

    names_its_cause = True  # the CLI prints the message alone


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
_SITE = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib")})


def code_location(exc: BaseException) -> str | None:
    """``file.py:line`` of the innermost frame of ``exc`` in the user's code (not this package,
    the standard library or an installed library; an installed package of the user's counts when
    nothing else does), or None."""
    frames = traceback.extract_tb(exc.__traceback__)
    for strict in (True, False):
        for frame in reversed(frames):
            full = os.path.abspath(frame.filename)
            if frame.filename.startswith("<") or full.startswith((_PACKAGE, *_STDLIB, *(_SITE if strict else ()))):
                continue
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return None


def function_location(fn: Any) -> str | None:
    """``file.py:line`` where ``fn`` (a function or a class) is defined, or None."""
    code = getattr(fn, "__code__", None)
    if code is not None:  # the ``def`` line, after any decorators
        first = code.co_firstlineno
        line = next((n for n in range(first, first + 32)
                     if linecache.getline(code.co_filename, n).lstrip().startswith(("def ", "async def "))), first)
        return f"{os.path.basename(code.co_filename)}:{line}"
    try:
        return f"{os.path.basename(inspect.getsourcefile(fn) or '?')}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return None


def message_line(exc: BaseException, text: str | None = None, *, last: bool = False) -> str:
    """The first (``last``: the last) non-empty line of ``text`` (default: ``exc``'s message),
    stripped; the exception's type name when there is none."""
    lines = [line.strip() for line in (str(exc) if text is None else text).splitlines() if line.strip()]
    return (lines[-1] if last else lines[0]) if lines else type(exc).__name__


def describe(exc: BaseException, fallback: str | None = None) -> str:
    """``Type: message (file.py:line)`` for an exception from user code (``fallback`` is the
    location when no frame of the traceback is the user's)."""
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    where = code_location(exc) or fallback
    return f"{text} ({where})" if where else text


def blame(exc: BaseException, env: Any, agent: Any) -> str:
    """``env_error`` when the innermost frame of ``exc`` that belongs to ``env`` or ``agent`` (a
    method of either) is the env's, else ``agent_error``: an exception escaping the agent's
    ``run`` is the agent's unless it came from the env."""
    owner = "agent_error"
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        this = frame.f_locals.get("self")
        if this is env or this is agent:
            owner = "env_error" if this is env else "agent_error"
    return owner


def failure_cause(traj: Trajectory) -> str:
    """``component: cause`` of a failed trajectory, e.g. ``reward: reward 'x' returned str ...``."""
    info = traj.info or {}
    first, second = ("reward_error", "error") if traj.status in ("reward_error", "timeout") else ("error", "reward_error")
    return f"{COMPONENTS.get(traj.status, traj.status)}: {info.get(first) or info.get(second) or traj.status}"


def failure_message(what: str, traj: Trajectory) -> str:
    """``{what}; last cause: {component: cause}; {what to check}``, cut to a readable length."""
    cause = failure_cause(traj)
    cause = cause[:400] + "..." if len(cause) > 400 else cause
    hint = HINTS.get(COMPONENTS.get(traj.status, ""), "")
    return f"{what}; last cause: {cause}" + (f"; {hint}" if hint else "")
