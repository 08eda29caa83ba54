"""Every registered env passes check_env; built-in env behaviour; check_env catches mistakes."""

from __future__ import annotations

import asyncio

import pytest

from areal_agents import ChatAgent, Env, check_env, make_env
from areal_agents.gym.checker import EnvCheckError
from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.registry import RegistryError, envs
from areal_agents.rollout.returns import settle_returns

BUILTINS = {"math", "math-multiturn", "guess-number", "python-tool", "countdown", "unit-convert"}


def test_builtins_are_registered() -> None:
    assert BUILTINS <= set(envs.names())


@pytest.mark.parametrize("name", envs.names())
def test_check_env_passes_on_every_registered_env(name: str) -> None:
    env = make_env(name)
    try:
        check_env(env, seed=3)
    finally:
        env.close()


@pytest.mark.parametrize("name", sorted(BUILTINS - {"guess-number"}))
def test_reference_completion_solves_or_starts_the_episode(name: str) -> None:
    env = make_env(name)
    obs, _ = env.reset(seed=1)
    assert isinstance(obs, str) and len(obs) < 80  # prompts stay short for the tiny model
    ref = env.reference_completion(env.row)
    assert isinstance(ref, str) and ref
    out, reward, terminated, _, info = env.step(ref)
    if name == "python-tool":  # the reference is the tool call: its output holds the answer
        assert not terminated and out == f"<output>{env.row['answer']}</output>"
    elif name == "unit-convert":  # the reference is the tool call: its result comes back as a tool message
        assert not terminated and out == [{"role": "tool", "tool_call_id": "call_0", "content": env.row["answer"]}]
    else:
        assert terminated and info["success"] is True and reward == 1.0


def test_math_env_rows_and_wrong_answers() -> None:
    env = make_env("math")
    obs, _ = env.reset(options={"prompt": "7+5=", "answer": "12"})
    assert obs == "7+5="
    _, reward, terminated, truncated, info = env.step("13")
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("12")
    env.reset(options={"prompt": "q", "answer": "#### 12"})
    assert env.step("so \\boxed{12}")[1] == 1.0
    with pytest.raises(ValueError, match="'answer'"):
        env.reset(options={"prompt": "q"})


def test_math_env_plays_on_the_event_loop_with_the_sync_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """``math``'s ``areset``/``astep`` need no worker thread (its reward is awaited in the event
    loop) and give what ``reset``/``step`` give; an env whose turn is its own code (a
    subclass's ``play_turn``, ``math-multiturn``) still runs it, on a thread."""
    from areal_agents.runtime import threads as env_module
    from envs.math import MathEnv

    hops: list[str] = []
    submit = env_module._THREADS.submit
    monkeypatch.setattr(env_module._THREADS, "submit", lambda job: (hops.append("thread"), submit(job)))
    rows = [{"prompt": "7+5=", "answer": "12"}, {"prompt": "q", "answer": "#### 12"}, {"prompt": "1+1=", "answer": "2"}]
    replies = ["13", "so \\boxed{12}", "2"]

    async def play(env: Env) -> list[tuple]:
        out = []
        for row, reply in zip(rows, replies, strict=True):
            out.append((await env.areset(options=row), await env.astep(reply)))
        with pytest.raises(RuntimeError, match="after the episode ended"):
            await env.astep("12")
        return out

    sync_env = make_env("math")
    want = [(sync_env.reset(options=r), sync_env.step(a)) for r, a in zip(rows, replies, strict=True)]
    assert asyncio.run(play(make_env("math"))) == want and hops == []
    assert [w[1][1] for w in want] == [0.0, 1.0, 1.0]

    class Halved(MathEnv):
        def play_turn(self, action, row):
            obs, reward, terminated, info = super().play_turn(action, row)
            return obs, reward / 2, terminated, info

    assert [o[1][1] for o in asyncio.run(play(Halved()))] == [0.0, 0.5, 0.5] and hops == ["thread"] * 3
    hops.clear()
    multi = make_env("math-multiturn", max_turns=2)

    async def retry() -> tuple:
        await multi.areset(options=rows[0])
        return await multi.astep("13")

    assert asyncio.run(retry())[:4] == ("Wrong, try again.", 0.0, False, False) and hops == ["thread"]


def test_math_multiturn_retries_with_feedback_and_discount() -> None:
    env = make_env("math-multiturn", max_turns=3)
    row = {"prompt": "2+2=", "answer": "4"}
    traj = settle_returns(asyncio.run(ChatAgent(max_turns=5).run(env, ScriptedLLM(["5", "3", "4"]), row)), 0.5)
    assert traj.turn_rewards == [0.0, 0.0, 1.0] and traj.reward == pytest.approx(0.25)
    assert "Wrong, try again." in traj.completion_text and traj.info["success"] is True
    env.reset(options=row)
    outs = [env.step("1") for _ in range(3)]
    assert [o[3] for o in outs] == [False, False, True]  # out of tries: truncated


def test_guess_number_feedback() -> None:
    env = make_env("guess-number", max_turns=4)
    env.reset(options={"target": 30, "low": 1, "high": 100})
    assert env.step("50")[0] == "Lower."
    assert env.step("I guess 20")[0] == "Higher."
    assert env.step("hmm")[0] == "Reply with one number."
    obs, reward, terminated, _, info = env.step("30")
    assert terminated and info["success"] and reward == pytest.approx(1 - 0.5 * 3 / 4)


@pytest.mark.parametrize("high", [30, 100])
def test_guess_number_reference_games_are_bisections_the_env_accepts(high: int) -> None:
    """Every target's reference game, played through the real ChatAgent and env, succeeds within
    the bisection bound, and the replayed assistant turns are the game's guesses."""
    from envs.guess_number import guess_number_dataset

    env = make_env("guess-number", max_turns=7)
    bound = (high).bit_length()  # ceil(log2(high + 1)) guesses
    for row in guess_number_dataset("test", high=high):
        conv = env.reference_conversation(row)
        guesses = [m["content"] for m in conv if m["role"] == "assistant"]
        assert 1 <= len(guesses) <= bound and guesses[-1] == str(row["target"])
        traj = asyncio.run(ChatAgent(max_turns=7).run(env, ScriptedLLM(guesses), row))
        assert traj.info["success"] is True and traj.num_turns == len(guesses)
        users = [m["content"] for m in conv[1:] if m["role"] == "user"]
        assert all(u in ("Higher.", "Lower.") for u in users) and len(users) == len(guesses) - 1


def test_python_tool_reference_episode_is_what_the_sandbox_and_reward_give() -> None:
    from areal_agents.data import arithmetic_dataset

    env = make_env("python-tool", timeout_s=5.0)
    for row in arithmetic_dataset("test", size=3, ops=["*"], template="{a}{op}{b}=?"):
        conv = env.reference_conversation(row)
        assert [m["role"] for m in conv] == ["user", "assistant", "user", "assistant"]
        obs, _ = env.reset(options=row)
        assert obs == conv[0]["content"]
        assert env.step(conv[1]["content"])[0] == conv[2]["content"]  # the sandbox's real output
        _, reward, terminated, _, info = env.step(conv[3]["content"])
        assert terminated and reward == 1.0 and info["success"]
    assert env.reference_conversation({"prompt": "7/2=?", "answer": "3.5", "expression": "7/2", "op": "/"}) is None


def test_countdown_feedback() -> None:
    env = make_env("countdown")
    env.reset(options={"numbers": [3, 5, 7], "target": 22})
    assert env.step("3+5+7")[0] == "That gives 15, not 22."
    assert env.step("3*9")[0] == "Use only 3 5 7, each once."
    assert env.step("import os")[0] == "Invalid expression."
    assert env.step("7/0")[0] == "Invalid expression."
    _, reward, terminated, _, info = env.step("3*5+7 = 22")
    assert terminated and reward == 1.0 and info["success"]


@pytest.mark.parametrize("kwargs,max_turns", [({"count": 2, "high": 20}, 4), ({"count": 3, "high": 10}, 6)])
def test_countdown_reference_games_are_won_through_the_env(kwargs: dict[str, int], max_turns: int) -> None:
    """Every reference game, replayed move by move, gets the env's own feedback and ends in a
    win within the turn limit; the 2-number game needs no more than the 3 methodical tries."""
    from envs.countdown import countdown_dataset

    env = make_env("countdown", max_turns=max_turns)
    longest = 0
    for row in countdown_dataset("train", size=300, **kwargs):
        conv = env.reference_conversation(row)
        assert conv is not None and conv[0] == {"role": "user", "content": row["prompt"]}
        obs, _ = env.reset(options=dict(row))
        assert obs == row["prompt"]
        replies = [m["content"] for m in conv[1::2]]
        for i, reply in enumerate(replies):
            obs, reward, terminated, truncated, info = env.step(reply)
            if i + 1 < len(replies):
                assert obs == conv[2 * i + 2]["content"] and not terminated and not truncated
        assert terminated and reward == 1.0 and info["success"], (row, conv)
        longest = max(longest, len(replies))
    assert longest <= (3 if kwargs["count"] == 2 else max_turns)
    assert longest >= 2  # some games do use the feedback


def test_countdown_default_is_the_two_number_game() -> None:
    env = make_env("countdown")
    for seed in range(20):
        obs, _ = env.reset(seed=seed)  # no row: one of the default dataset's, drawn with the seed
        assert len(env.row["numbers"]) == 2 and max(env.row["numbers"]) <= 20 and obs == env.row["prompt"]


def test_python_tool_runs_code_and_reports_broken_calls() -> None:
    env = make_env("python-tool", max_turns=4, timeout_s=2.0)
    env.reset(options={"prompt": "123*456=?", "answer": "56088"})
    obs, reward, terminated, _, _ = env.step("<python>print(123*456)</python>")
    assert obs == "<output>56088</output>" and reward == 0.0 and not terminated
    obs, *_ = env.step("<python>print(1")
    assert obs == "Tool error: close the code with </python>."
    obs, *_ = env.step("<python>1/0</python>")
    assert "ZeroDivisionError" in obs
    _, reward, terminated, _, info = env.step("\\boxed{56088}")
    assert terminated and reward == 1.0 and info["success"] and info["tool_calls"] == 2
    env.reset(options={"prompt": "q", "answer": "1"})
    obs, *_ = env.step("<python>while True: pass</python>")
    assert obs.endswith("Timed out.</output>")


def test_make_env_errors_are_one_clear_line() -> None:
    with pytest.raises(RegistryError, match="unknown env 'nope'; registered: .*math"):
        make_env("nope")
    with pytest.raises(TypeError, match="env 'math': bad constructor arguments"):
        make_env("math", no_such_arg=1)


class _Base(Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "q", {}

    def step(self, action):
        return "", 1.0, True, False, {"success": True}


@pytest.mark.parametrize(
    ("step_result", "message"),
    [
        (("", 1.0, True, False), "must return 5 values"),
        ((3, 1.0, True, False, {"success": True}), "observation of type int"),
        (("", "1", True, False, {"success": True}), "reward '1' of type str"),
        (("", float("nan"), True, False, {"success": True}), "rewards must be finite"),
        (("", 1.0, 1, False, {"success": True}), "terminated=1"),
        (("", 1.0, True, False, {"success": 1}), r"info\['success'\]=1 \(int\); return a bool"),
        (("", 1.0, False, False, []), "info as a dict"),
    ],
)
def test_check_env_names_the_problem(step_result, message) -> None:
    class Bad(_Base):
        def step(self, action):
            return step_result

    with pytest.raises(EnvCheckError, match=message):
        check_env(Bad())


def test_check_env_catches_nondeterminism_and_non_envs() -> None:
    import random

    class Random(_Base):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return str(random.random()), {}

    with pytest.raises(EnvCheckError, match="not deterministic: reset differs.*self.np_random"):
        check_env(Random())
    with pytest.raises(EnvCheckError, match="must subclass areal_agents.Env"):
        check_env(object())
    check_env(_Base())


def test_check_env_from_inside_a_coroutine_still_checks_async_methods() -> None:
    class AsyncDiffers(_Base):
        async def astep(self, action):
            return "different", 1.0, True, False, {"success": True}

    async def main() -> None:
        check_env(_Base())
        with pytest.raises(EnvCheckError, match="areset/astep give different results"):
            check_env(AsyncDiffers())

    asyncio.run(main())
