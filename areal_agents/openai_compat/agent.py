"""Agents written against the OpenAI client, as rollout agents (no torch).

An *OpenAI-style agent* is ``async def agent(client, row) -> float | None`` (or a class whose
instances are such callables, built with ``agent.kwargs``), registered with
``@register_agent("name")`` and run with ``agent.name=name``. ``client`` behaves as
``openai.AsyncOpenAI`` for ``chat.completions.create`` (:class:`~.client.EpisodeClient`), and
``await client.http_endpoint()`` gives the base URL for agents that speak HTTP (in this process
or another): the loop's one loopback server, the same for all its episodes, with
``client.api_key`` (the episode's key) as the API key.
The env is reset with the row first; the agent's return value is the episode's reward, or,
when it returns None, the env scores the last reply (``env.step(content)``). The calls become
trajectories as :mod:`~areal_agents.openai_compat.trajectories` says, in the agent's trajectory
mode: ``agent.trajectory_mode`` in the config when set, else the agent's own ``trajectory_mode``
attribute (``my_agent.trajectory_mode = "individual"``, or a class attribute), else ``concat``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from areal_agents.agent import Agent, checked_step, jsonable
from areal_agents.openai_compat.client import EpisodeClient
from areal_agents.openai_compat.loopback import loop_endpoint
from areal_agents.openai_compat.session import ChatSession
from areal_agents.openai_compat.trajectories import assemble, check_mode
from areal_agents.types import Trajectory

if TYPE_CHECKING:
    from areal_agents.env import Env
    from areal_agents.llm import LLM, Generation

__all__ = ["OpenAIAgent", "is_openai_agent"]

AgentFn = Callable[[EpisodeClient, dict[str, Any]], Awaitable[Any]]


def is_openai_agent(obj: object) -> bool:
    """Whether a registered agent is OpenAI-style: a coroutine function, or a class that is
    not an :class:`~areal_agents.agent.Agent` and whose instances are async callables."""
    if inspect.isclass(obj):
        return not issubclass(obj, Agent) and inspect.iscoroutinefunction(obj.__call__)
    return inspect.iscoroutinefunction(obj)


class _EpisodeGenerate:
    """Token-level generation of the episode's ``llm``: its inference client (with the episode's
    ``rid``, so every call goes to the same server) or, for other backends, the llm's own.

    A plain object that returns the client's coroutine (no closure, no coroutine of its own):
    what an episode keeps alive while it waits for the server is kept small."""

    __slots__ = ("client", "llm", "rid")

    def __init__(self, llm: LLM) -> None:
        client = getattr(llm, "client", None)
        self.client = client if client is not None and hasattr(client, "generate") else None
        self.llm, self.rid = llm, getattr(llm, "rid", None)

    def __call__(self, ids: list[int], sampling: dict[str, Any], top: int) -> Awaitable[Generation]:
        if self.client is not None:
            return self.client.generate(ids, sampling, rid=self.rid, top_logprobs=top)  # type: ignore[no-any-return]
        return self.llm._generate(ids, sampling)


class OpenAIAgent(Agent):
    """Plays an episode with an OpenAI-style agent function (see the module docstring)."""

    def __init__(self, fn: AgentFn, *, sampling: dict[str, Any] | None = None,
                 trajectory_mode: str | None = None) -> None:
        self.fn = fn
        self.sampling = dict(sampling or {})
        self.trajectory_mode = check_mode(trajectory_mode or getattr(fn, "trajectory_mode", None) or "concat")

    async def run(self, env: Env, llm: LLM, row: dict[str, Any] | None = None, *, seed: int | None = None) -> Trajectory:
        try:
            await env.areset(seed=seed, options=row)
        except Exception as exc:  # noqa: BLE001 - an env failure is recorded, not raised
            return Trajectory(status="env_error", info={"error": f"reset: {type(exc).__name__}: {exc}"})
        session = ChatSession(llm.tokenizer, _EpisodeGenerate(llm), self.sampling or llm.default_sampling)
        endpoint = loop_endpoint()  # shared by the loop's episodes; serves once an agent asks for its URL
        key = endpoint.add(session)
        client = EpisodeClient(session, api_key=key, endpoint=endpoint.base_url)
        try:
            result = await self.fn(client, dict(row or {}))
        finally:
            endpoint.remove(key)  # and cancels the episode's requests still being answered
        info: dict[str, Any] = {}
        status, reward = "ok", 0.0
        if result is None and session.records:
            rewards: list[float] = []
            status = (await checked_step(env, session.last_text)).record(rewards, info, status)
            reward = rewards[0]
        elif isinstance(result, (int, float)) and math.isfinite(result):
            reward = float(result)
        elif result is not None:
            return Trajectory(status="agent_error", info={"error": f"the agent returned {result!r}, not a finite "
                                                                   "number (the reward) or None"})
        trajs = assemble(session.records, reward, self.trajectory_mode)
        if not trajs:
            return Trajectory(status="agent_error", info={"error": "the agent made no chat.completions calls"})
        main = trajs[-1]
        main.segments = trajs[:-1]
        if any(r.finish_reason == "abort" for r in session.records) and status == "ok":
            status = "aborted"
        main.status = status
        info.update(num_calls=len(session.records), num_trajectories=len(trajs), trajectory_mode=self.trajectory_mode,
                    turn_finish_reasons=[r.finish_reason for r in session.records])
        main.info.update(jsonable(info))
        for traj in trajs:  # the texts the run's samples log shows
            cut = traj.turn_spans[0][0]
            traj.prompt_text = llm.tokenizer.decode(traj.input_ids[:cut], skip_special_tokens=False)
            traj.completion_text = llm.tokenizer.decode(traj.input_ids[cut:], skip_special_tokens=False)
        return main
