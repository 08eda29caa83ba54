"""check_env against envs written the way Gymnasium users write them.

Valid-but-minimal envs pass (with an :class:`EnvCheckWarning` where they leave ``success`` to
the ``reward > 0`` fallback); envs that break the contract fail with a line naming the problem.
The fallback the warning describes is what evaluation then does with a ChatAgent episode.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import gymnasium
import numpy as np
import pytest

from areal_agents import ChatAgent, Env, check_env, make_env
from areal_agents.env import GENERIC_PROBES, TextSpace
from areal_agents.gym.checker import EnvCheckError, EnvCheckWarning, probe_actions
from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.rollout.episode import episode_solved
from areal_agents.rollout.returns import settle_returns
from areal_agents.types import Trajectory

# -- valid, minimal ---------------------------------------------------------------------------


class NoInfo(Env):
    """One turn, empty info everywhere: the shortest env a Gymnasium user writes."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Say 42.", {}

    def step(self, action):
        return "", float(action.strip() == "42"), True, False, {}


class TerminatedOnly(Env):
    """Counts to 3 and terminates; never truncates; int rewards and NumPy flags, as Gymnasium allows."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(0, 3))
        return f"start at {self.n}", {}

    def step(self, action):
        self.n += 1
        done = np.bool_(self.n >= 3)
        return f"n={self.n}", 1 if done else 0, done, False, {"success": done}


class ChatMessages(Env):
    """Observations are chat-message lists (a system prompt, then the user turn)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}], {}

    def step(self, action):
        return [{"role": "user", "content": "Thanks."}], 0.5, False, True, {"success": False}


class AsyncOnly(Env):
    """Natively async: only areset/astep exist (the rollout calls nothing else)."""

    async def areset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        await asyncio.sleep(0)
        return "async start", {}

    async def astep(self, action):
        await asyncio.sleep(0)
        self.turn += 1
        return f"turn {self.turn}", 1.0, self.turn >= 2, False, {}


@pytest.mark.parametrize("env_cls", [TerminatedOnly, ChatMessages])
def test_minimal_gymnasium_style_envs_pass_silently(env_cls: type[Env]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a warning
        check_env(env_cls())


@pytest.mark.parametrize("env_cls", [NoInfo, AsyncOnly])
def test_envs_without_success_pass_with_a_warning_naming_the_fallback(env_cls: type[Env]) -> None:
    with pytest.warns(EnvCheckWarning, match=r"without info\['success'\].*success = reward > 0") as caught:
        check_env(env_cls())
    assert len(caught) == 1  # one warning per check, not one per probe episode


def test_async_only_env_is_still_checked_for_determinism_and_types() -> None:
    class AsyncRandom(AsyncOnly):
        async def astep(self, action):
            return str(np.random.random()), 1.0, True, False, {"success": True}

    class AsyncBadReward(AsyncOnly):
        async def astep(self, action):
            return "", None, True, False, {"success": True}

    with pytest.raises(EnvCheckError, match=r"not deterministic: step #0 differs"):
        check_env(AsyncRandom())
    with pytest.raises(EnvCheckError, match=r"astep\('42'\) #0 returned reward None"):
        check_env(AsyncBadReward())


def test_the_fallback_is_what_evaluation_does() -> None:
    """An env without 'success': a ChatAgent episode is solved iff its return is positive;
    one the agent cuts short is not solved, whatever its return (settled as evaluation settles it)."""
    def play(agent: ChatAgent, env: Any, replies: list[str]) -> Trajectory:
        return settle_returns(asyncio.run(agent.run(env, ScriptedLLM(replies))))

    right = play(ChatAgent(), NoInfo(), ["42"])
    wrong = play(ChatAgent(), NoInfo(), ["41"])
    assert "success" not in right.info and right.reward == 1.0 and episode_solved(right)
    assert "success" not in wrong.info and wrong.reward == 0.0 and not episode_solved(wrong)

    class Endless(NoInfo):
        def step(self, action):
            return "again", 1.0, False, False, {}

    cut = play(ChatAgent(max_turns=2), Endless(), ["42", "42"])
    assert cut.info["end_reason"] == "max_turns" and cut.reward == 2.0
    assert cut.info["success"] is False and not episode_solved(cut)
    told = play(ChatAgent(), TerminatedOnly(), ["a", "b", "c"])
    assert told.info["success"] is True and episode_solved(told)

    class NumpyFailure(NoInfo):  # a NumPy False must stay False in the trajectory, not become "False"
        def step(self, action):
            return "", np.float32(1.0), np.bool_(True), False, {"success": np.bool_(False)}

    check_env(NumpyFailure())
    failed = play(ChatAgent(), NumpyFailure(), ["42"])
    assert failed.info["success"] is False and failed.reward == 1.0 and not episode_solved(failed)


# -- invalid ----------------------------------------------------------------------------------


class _Ok(Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "q", {}

    def step(self, action):
        return "", 1.0, True, False, {"success": True}


def _with_step(result):
    class Bad(_Ok):
        def step(self, action):
            return result

    return Bad()


def _with_reset(result):
    class Bad(_Ok):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return result

    return Bad()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (_with_reset("q"), r"reset\(seed=0\) must return \(observation, info\)"),  # the pre-0.26 gym API
        (_with_reset(("q", None)), r"reset\(seed=0\) must return info as a dict"),
        (_with_reset(([{"role": "user"}], {})), "observation of type list"),  # a message without content
        (_with_step(("", 1.0, True, {})), "must return 5 values"),  # the old 4-tuple step
        (_with_step(("", 1.0, "yes", False, {})), "terminated='yes'"),
        (_with_step(("", np.float32("inf"), True, False, {})), "rewards must be finite"),
        (_with_step(("", True, True, False, {})), "reward True of type bool"),
        (_with_step(("", 1.0, True, False, {"success": "yes"})), r"info\['success'\]='yes' \(str\); return a bool"),
        (_with_step(("", 1.0, True, False, None)), "info as a dict"),
        (Env(), r"implement step\(action\) \(or async astep\(action\)\)"),
    ],
)
def test_contract_violations_fail_naming_the_problem(env: Env, message: str) -> None:
    with pytest.raises(EnvCheckError, match=message):
        check_env(env)


def test_async_methods_that_disagree_with_the_sync_ones_fail() -> None:
    class Disagrees(_Ok):
        async def astep(self, action):
            return "other", 1.0, True, False, {"success": True}

    with pytest.raises(EnvCheckError, match=r"areset/astep give different results.*step #0 differs"):
        check_env(Disagrees())


# -- probes: the action space's, not the checker's --------------------------------------------


class Recording(Env):
    """Records every reply it is stepped with; ends after 3 replies."""

    action_space = TextSpace(probes=("<move>a</move>", "", "b"))

    def __init__(self) -> None:
        self.played: list[str] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return "Move.", {}

    def step(self, action):
        self.played.append(action)
        self.turn += 1
        return "Again.", 0.0, self.turn == 3, False, {"success": False}


def test_check_env_plays_the_probes_of_the_envs_action_space() -> None:
    env = Recording()
    check_env(env)
    assert env.played == ["<move>a</move>", "", "b"] * 3  # two sync episodes and the async one
    assert probe_actions(env) == ["<move>a</move>", "", "b"]
    plain = Recording()
    plain.action_space = TextSpace()
    assert probe_actions(plain) == list(GENERIC_PROBES)
    assert check_env(plain, actions=["x"]) is None and plain.played == ["x"] * 9  # actions= still wins


def test_text_space_samples_its_probes_with_its_own_seeded_rng() -> None:
    space = TextSpace(probes=("a", "b", "c", "d"))
    space.seed(3)
    drawn = [space.sample() for _ in range(40)]
    space.seed(3)
    assert [space.sample() for _ in range(40)] == drawn
    assert set(drawn) == {"a", "b", "c", "d"} and all(space.contains(x) for x in drawn)
    assert TextSpace().sample() in GENERIC_PROBES
    for bad in ("abc", ["a", 1]):
        with pytest.raises(TypeError, match=r"^TextSpace: probes must be a sequence of strings"):
            TextSpace(probes=bad)


def test_a_space_that_is_not_text_is_sampled_and_must_give_text() -> None:
    class Discrete(Recording):
        action_space = gymnasium.spaces.Discrete(3)

    with pytest.raises(EnvCheckError, match=r"action_space Discrete\(3\) samples non-text actions"):
        probe_actions(Discrete())


@pytest.mark.parametrize("name", ["math", "math-multiturn", "countdown", "guess-number", "python-tool", "unit-convert"])
def test_every_builtin_env_gives_its_own_probes(name: str) -> None:
    """The formats an env parses come from the env, so the checker needs to know none of them."""
    env = make_env(name)
    try:
        probes = probe_actions(env)
        assert tuple(probes) != GENERIC_PROBES and "" in probes
        check_env(env)
    finally:
        env.close()
