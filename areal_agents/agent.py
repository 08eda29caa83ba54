"""Agents: asyncio loops that play an :class:`~areal_agents.env.Env` with an ``llm``.

An agent's ``run(env, llm, row, seed=...)`` resets the env for ``row``, talks to the
token-recording :class:`~areal_agents.llm.LLM`, and returns the episode as a
:class:`~areal_agents.types.Trajectory`. :class:`ChatAgent` plays any env turn by turn.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_agents.tools.calls import parse_tool_calls
from areal_agents.types import Trajectory

if TYPE_CHECKING:
    from areal_agents.env import Env, Observation
    from areal_agents.llm import LLM

__all__ = ["Agent", "ChatAgent", "EnvStep", "checked_step", "env_state_key", "jsonable"]


def jsonable(value: Any) -> Any:
    """``value`` with anything JSON cannot hold turned into its ``repr`` (for ``Trajectory.info``)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():  # np.bool_, np.float32, ...
        return jsonable(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return repr(value)  # json.dumps takes only the types above


class Agent(ABC):
    """Plays one episode. Implementations must not raise for env failures: they return a
    trajectory with ``status="env_error"`` instead (the rollout executor counts it).

    An agent reports what each turn earned in ``Trajectory.turn_rewards``, undiscounted
    (:meth:`~areal_agents.types.Trajectory.set_rewards`), and never hears of a discount: the
    episode's ``reward`` and ``turn_returns`` are settled where the episode ends, with the run's
    ``env.turn_discount`` and failure policy (:func:`~areal_agents.rollout.returns.settle_returns`),
    whatever the agent put there."""

    @abstractmethod
    async def run(self, env: Env, llm: LLM, row: dict[str, Any] | None = None, *, seed: int | None = None) -> Trajectory:
        """Reset ``env`` with ``options=row`` (and ``seed``), play it with ``llm``, return the episode."""


@dataclass
class EnvStep:
    """One ``env.astep`` as an agent needs it: its five values, or ``error`` (reward 0) when
    the env raised, returned the wrong shape, a non-finite reward or (mid-episode) an
    observation that is not text. ``reward_status`` is the env's report of a failed reward
    (``reward_error`` / ``timeout``), if any."""

    obs: Any = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def reward_status(self) -> str | None:
        status = self.info.get("reward_status")
        return status if status in ("reward_error", "timeout") else None

    @property
    def end_reason(self) -> str | None:
        """Why the episode ends here (``env_error``, ``terminated``, ``truncated``), or None."""
        if self.error is not None:
            return "env_error"
        return "terminated" if self.terminated else "truncated" if self.truncated else None

    def record(self, rewards: list[float], info: dict[str, Any], status: str) -> str:
        """Append this turn's reward and merge its info (or the error) into an episode's
        ``rewards`` / ``info``; return the episode status after it."""
        rewards.append(self.reward)
        if self.error is not None:
            info["error"] = self.error
            return "env_error"
        info.update(self.info)
        return self.reward_status or status


async def checked_step(env: Env, action: str) -> EnvStep:
    """``env.astep(action)``, never raising: a misbehaving env gives ``EnvStep(error=...)``."""
    try:
        obs, reward, terminated, truncated, info = await env.astep(action)
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"env returned a non-finite reward {reward}")
        if not isinstance(info, dict):
            raise TypeError(f"env returned info of type {type(info).__name__}, not dict")
        going_on = not (terminated or truncated)
        if going_on and not (isinstance(obs, str) or isinstance(obs, list) and all(isinstance(m, dict) for m in obs)):
            raise TypeError(f"env returned an observation of type {type(obs).__name__}, not str or chat messages")
    except Exception as exc:  # noqa: BLE001 - an env failure is recorded, not raised
        return EnvStep(error=f"step: {type(exc).__name__}: {exc}")
    return EnvStep(obs, reward, bool(terminated), bool(truncated), info)


def env_state_key(info: object) -> str | None:
    """The env's name for the state the next turn acts in: ``info["state_key"]`` of its ``reset``
    or ``step`` as a str, or None (then the llm hashes the observation, :func:`~areal_agents.llm.observation_key`)."""
    key = info.get("state_key") if isinstance(info, dict) else None
    return None if key is None else str(key)


def _as_messages(obs: Observation) -> list[dict[str, Any]]:
    if isinstance(obs, str):
        return [{"role": "user", "content": obs}]
    return [dict(m) for m in obs]


class ChatAgent(Agent):
    """Chat with the env: its observations are user messages, the model's replies are actions.

    Each turn calls ``llm.chat`` (``max_new_tokens`` capped by what is left of
    ``max_tokens``), steps the env with the reply and appends the env's observation, until
    the env terminates or truncates, ``max_turns`` replies were made, or ``max_tokens``
    generated tokens are used. The trajectory holds the env's per-turn rewards (``turn_rewards``);
    the rollout discounts them by ``env.turn_discount`` where the episode ends
    (:func:`~areal_agents.rollout.returns.settle_returns`).
    ``tools`` (OpenAI function specs; default: the env's ``tools``, or ``info["tools"]`` from its
    ``reset``) are rendered into the prompt by the chat template; the env sees the raw reply,
    tool-call markup (``<tool_call>{...}</tool_call>``) included, and the reply's parsed calls go
    into the history's assistant message (``tool_calls``) and ``info["num_tool_calls"]``; an env
    answers a call with an observation of ``tool`` messages (``{"role": "tool", "content": ...}``).
    Each turn's state key (``Trajectory.state_keys``) is the env's ``info["state_key"]`` from the
    ``reset`` or ``step`` before it, else a hash of the observation it responds to.
    An exception from the env ends the episode with ``status="env_error"``; a reward failure
    reported by the env (``info["reward_status"]``) sets ``reward_error``/``timeout``; a
    generation aborted by the server sets ``aborted``. The env's ``info["success"]`` is kept;
    when the env ends the episode without one it stays unset (evaluation then counts a positive
    return as solved, :func:`~areal_agents.rollout.episode.episode_solved`), and an episode the agent
    cuts short (turn or token budget, abort, env error) gets ``success=False`` unless the env
    reported one. ``info["messages"]`` keeps the conversation by role (system, user, assistant
    with its tool calls, tool outputs), which the episode record shows.
    """

    def __init__(
        self,
        max_turns: int = 4,
        max_tokens: int = 1024,
        system_prompt: str | None = None,
        sampling: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"ChatAgent: max_turns must be >= 1 (got {max_turns})")
        if max_tokens < 1:
            raise ValueError(f"ChatAgent: max_tokens must be >= 1 (got {max_tokens})")
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.system_prompt = system_prompt
        self.sampling = dict(sampling or {})
        self.tools = [dict(t) for t in tools] if tools else None

    async def run(self, env: Env, llm: LLM, row: dict[str, Any] | None = None, *, seed: int | None = None) -> Trajectory:
        info: dict[str, Any] = {}
        status = "ok"
        try:
            obs, reset_info = await env.areset(seed=seed, options=row)
        except Exception as exc:  # noqa: BLE001 - an env failure is recorded, not raised
            return Trajectory(status="env_error", info={"error": f"reset: {type(exc).__name__}: {exc}"})
        tools = self.tools or (reset_info.get("tools") if isinstance(reset_info, dict) else None) or \
            getattr(env, "tools", None) or None
        names = {t.get("function", t).get("name") for t in tools} if tools else set()
        num_calls = 0
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages: list[dict[str, Any]] = [*system, *_as_messages(obs)]
        rewards: list[float] = []
        budget = self.max_tokens
        end_reason = "max_turns"
        state_key = env_state_key(reset_info)
        for _ in range(self.max_turns):
            per_turn = int(self.sampling.get("max_new_tokens", budget))
            sampling = {**self.sampling, "max_new_tokens": max(1, min(per_turn, budget))}
            before = llm.num_generated
            text = await llm.chat(messages, tools=tools, state_key=state_key, **sampling)
            budget -= llm.num_generated - before
            content, calls = parse_tool_calls(text, names) if tools else (text, [])
            messages.append({"role": "assistant", "content": content or "", **({"tool_calls": calls} if calls else {})})
            num_calls += len(calls)
            gen = llm.last_generation
            if gen is not None and gen.finish_reason == "abort":
                rewards.append(0.0)
                status, end_reason = "aborted", "aborted"
                break
            step = await checked_step(env, text)
            status = step.record(rewards, info, status)
            if step.end_reason is not None:
                end_reason = step.end_reason
                break
            if budget <= 0:
                end_reason = "max_tokens"
                break
            messages += _as_messages(step.obs)
            state_key = env_state_key(step.info)
        info["end_reason"] = end_reason
        if tools:
            info["num_tool_calls"] = num_calls
        info["num_turns"] = len(rewards)
        if end_reason not in ("terminated", "truncated"):  # cut short by the agent: not solved unless the env said so
            info.setdefault("success", False)
        info["turn_finish_reasons"] = llm.finish_reasons
        info["messages"] = messages  # the conversation by role, tool calls included: what the record shows
        traj = llm.to_trajectory(status=status, info=jsonable(info))
        traj.set_rewards(rewards)  # undiscounted: the rollout settles the return (settle_returns)
        return traj
