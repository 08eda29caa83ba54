"""A custom agent that runs the model's Python itself, in the sandbox, before answering the env.

    python examples/tool_agent/sandbox_agent.py --config examples/tool_agent/config.yaml [key=value ...]

registers the agent as ``sandbox-tool`` and then runs ``areal-agents run`` with the same
arguments (``agent.name=sandbox-tool`` selects it). ``SandboxToolAgent`` plays any text env:
a reply with ``<python>code</python>`` is executed by the agent with
:func:`areal_agents.sandbox.run_python` (no network, memory/CPU/process limits, a fresh temp
dir) and the output goes back to the model as ``<output>...</output>``; a reply without a
tool call is the answer and goes to ``env.step``. Tool turns get reward 0; the env's reward
lands on the answer turn, so with ``credit=turn`` and ``turn_discount < 1`` every tool call
costs a factor γ.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any

from areal_agents import Agent
from areal_agents.agent import checked_step, jsonable
from areal_agents.env import run_in_thread
from areal_agents.sandbox import run_python

if TYPE_CHECKING:
    from areal_agents import Env, Trajectory
    from areal_agents.llm import LLM

__all__ = ["SandboxToolAgent", "main", "register"]

_CALL = re.compile(r"<python>(.*?)</python>", re.DOTALL)


class SandboxToolAgent(Agent):
    """Chat with ``env``; run ``<python>`` blocks in the sandbox (at most ``max_tool_calls``).

    The first five arguments are the ones ``areal-agents run`` passes to every agent
    (``agent.*`` and ``env.turn_discount``); ``agent.kwargs`` may set the others.
    """

    def __init__(self, max_turns: int = 4, max_tokens: int = 256, system_prompt: str | None = None,
                 turn_discount: float = 1.0, sampling: dict[str, Any] | None = None, *,
                 max_tool_calls: int = 2, timeout_s: float = 5.0, memory_mb: int = 256,
                 max_output_chars: int = 200) -> None:
        if max_turns < 1 or max_tokens < 1 or max_tool_calls < 0:
            raise ValueError("SandboxToolAgent: max_turns and max_tokens must be >= 1, max_tool_calls >= 0")
        if not 0.0 < turn_discount <= 1.0:
            raise ValueError(f"SandboxToolAgent: turn_discount must be in (0, 1] (got {turn_discount})")
        self.max_turns, self.max_tokens, self.system_prompt = max_turns, max_tokens, system_prompt
        self.turn_discount, self.sampling = turn_discount, dict(sampling or {})
        self.max_tool_calls, self.timeout_s, self.memory_mb = max_tool_calls, timeout_s, memory_mb
        self.max_output_chars = max_output_chars

    def run_tool(self, code: str) -> str:
        """Run ``code`` in the sandbox; stdout (or the last stderr line) as ``<output>...</output>``."""
        # keep the whole traceback from the sandbox; only what the model sees is cut short
        res = run_python(code, timeout_s=self.timeout_s, memory_mb=self.memory_mb, max_output_chars=16_000)
        text = res.stdout.strip()
        if res.exit_code != 0 and res.stderr.strip():
            text = (text + "\n" + res.stderr.strip().splitlines()[-1]).strip()
        if res.timed_out:
            text += "\nTimed out."
        return f"<output>{text[: self.max_output_chars]}</output>"

    async def run(self, env: Env, llm: LLM, row: dict[str, Any] | None = None, *,
                  seed: int | None = None) -> Trajectory:
        from areal_agents import Trajectory

        try:
            obs, _ = await env.areset(seed=seed, options=row)
        except Exception as exc:  # noqa: BLE001 - env failures are recorded, never raised
            return Trajectory(status="env_error", info={"error": f"reset: {type(exc).__name__}: {exc}"})
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages += [{"role": "user", "content": obs}] if isinstance(obs, str) else [dict(m) for m in obs]
        rewards: list[float] = []
        info: dict[str, Any] = {"agent_tool_calls": 0}
        status, end_reason = "ok", "max_turns"
        for _ in range(self.max_turns):
            budget = self.max_tokens - llm.num_generated
            if budget <= 0:
                end_reason = "max_tokens"
                break
            per_turn = int(self.sampling.get("max_new_tokens", budget))
            text = await llm.chat(messages, **{**self.sampling, "max_new_tokens": max(1, min(per_turn, budget))})
            messages.append({"role": "assistant", "content": text})
            if llm.last_generation is not None and llm.last_generation.finish_reason == "abort":
                rewards.append(0.0)
                status = end_reason = "aborted"
                break
            call = _CALL.search(text)
            if call is not None and info["agent_tool_calls"] < self.max_tool_calls:
                info["agent_tool_calls"] += 1
                output = await run_in_thread(self.run_tool, call.group(1))  # the sandbox blocks: off the loop
                rewards.append(0.0)
                messages.append({"role": "user", "content": output})
                continue
            # an answer (or a tool call over the budget, which the env handles its own way)
            step = await checked_step(env, text)  # never raises: a broken env gives step.error
            status = step.record(rewards, info, status)
            if step.end_reason is not None:
                end_reason = step.end_reason
                break
            obs = step.obs
            messages += [{"role": "user", "content": obs}] if isinstance(obs, str) else [dict(m) for m in obs]
        info.update(end_reason=end_reason, num_turns=len(rewards), turn_finish_reasons=llm.finish_reasons)
        info.setdefault("success", False)
        traj = llm.to_trajectory(status=status, info=jsonable(info))
        traj.set_rewards(rewards, self.turn_discount)
        return traj


def register() -> None:
    """Register :class:`SandboxToolAgent` as ``sandbox-tool`` (``agent.name=sandbox-tool``)."""
    from areal_agents import register_agent

    register_agent("sandbox-tool")(SandboxToolAgent)


def main(argv: list[str] | None = None) -> int:
    """Register the agent, then ``areal-agents run`` with ``argv`` (default: the command line)."""
    from areal_agents.cli import main as cli_main

    register()
    return cli_main(["run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
