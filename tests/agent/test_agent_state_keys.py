"""Per-turn state keys (GiGPO's anchor states): recorded by the real ChatAgent and LLM, overridable
by the env, kept through JSONL, absent from old files."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from areal_agents import ChatAgent, Env, Trajectory, check_env
from areal_agents.gym.checker import EnvCheckError
from areal_agents.llm import observation_key, tokens_key
from areal_agents.llm.scripted import CharTokenizer, ScriptedLLM


class RetryEnv(Env):
    """Answer "yes" to win; anything else gets ``feedback`` (the same text every time).

    With ``keyed``, the info of reset/step names the state: ``attempt-<n>`` (n = turns so far).
    """

    def __init__(self, feedback: str = "Wrong, try again.", keyed: bool = False, max_turns: int = 3) -> None:
        self.feedback, self.keyed, self.max_turns = feedback, keyed, max_turns

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {**extra, "state_key": f"attempt-{self.t}"} if self.keyed else dict(extra)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return str((options or {}).get("prompt", "Say yes.")), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.t += 1
        won = action == "yes"
        truncated = not won and self.t >= self.max_turns
        return ("" if won or truncated else self.feedback), float(won), won, truncated, self._info(success=won)


def play(replies: list[str], env: Env | None = None, **agent_kw: Any) -> Trajectory:
    return asyncio.run(ChatAgent(max_turns=3, **agent_kw).run(env or RetryEnv(), ScriptedLLM(replies)))


def test_default_keys_hash_the_observation_each_turn_answers() -> None:
    traj = play(["no", "no", "yes"])
    assert traj.num_turns == 3 and len(traj.state_keys) == 3
    first, second, third = traj.state_keys
    assert first == observation_key([{"role": "user", "content": "Say yes."}])
    assert second == third == observation_key([{"role": "user", "content": "Wrong, try again."}]) != first
    # another episode of the same prompt meets the same keys; another prompt does not
    assert play(["yes"]).state_keys == [first]
    assert play(["yes"], RetryEnv(), system_prompt="sys").state_keys != [first]  # the prompt includes the system
    other = asyncio.run(ChatAgent(max_turns=1).run(RetryEnv(), ScriptedLLM(["yes"]), {"prompt": "Say no."}))
    assert other.state_keys != [first]


def test_the_key_is_stable_across_processes() -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "Wrong, try again."},
                {"role": "assistant", "content": "x"}, {"role": "user", "content": "Wrong, try again."}]
    code = ("import json, sys; from areal_agents.llm import observation_key; "
            "print(observation_key(json.loads(sys.argv[1])))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(messages)], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123"}).stdout.strip()
    assert out == observation_key(messages) == observation_key(messages[-1:])  # only what follows the last reply
    assert out.startswith("obs:") and out != observation_key([{"role": "tool", "content": "Wrong, try again."}])


def test_an_env_names_its_states_through_info() -> None:
    traj = play(["no", "no", "no"], RetryEnv(keyed=True))
    assert traj.state_keys == ["attempt-0", "attempt-1", "attempt-2"]  # the key of a step names the next turn's state
    check_env(RetryEnv(keyed=True), actions=["no"])


def test_check_env_rejects_a_key_that_is_not_text() -> None:
    class BadKey(RetryEnv):
        def _info(self, **extra: Any) -> dict[str, Any]:
            return {**extra, "state_key": ("attempt", self.t)}

    with pytest.raises(EnvCheckError, match=r"info\['state_key'\] of type tuple; return a str"):
        check_env(BadKey(), actions=["no"])


def test_token_level_turns_get_a_key_of_the_tokens_they_added() -> None:
    llm = ScriptedLLM(["ab", "cd", "ef"], CharTokenizer(), append_eos=False)

    async def main() -> None:
        await llm.generate([5, 6, 7])
        await llm.generate(llm.input_ids + [9])
        await llm.generate(llm.input_ids + [9], state_key="mine")

    asyncio.run(main())
    assert llm.to_trajectory().state_keys == [tokens_key([5, 6, 7]), tokens_key([9]), "mine"]


def test_keys_survive_jsonl_and_old_files_load_without_them() -> None:
    traj = play(["no", "yes"], RetryEnv(keyed=True))
    back = Trajectory.from_json(traj.to_json())
    assert back == traj and back.state_keys == ["attempt-0", "attempt-1"]
    old = json.loads(traj.to_json())
    del old["state_keys"]
    legacy = Trajectory.from_dict(old)
    legacy.validate()
    assert legacy.state_keys == [] and legacy.turn_spans == traj.turn_spans
    assert Trajectory.from_dict({**old, "state_keys": [None, "k"]}).state_keys == ["", "k"]
