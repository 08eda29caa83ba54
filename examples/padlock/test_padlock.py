# test_padlock.py: python -m pytest test_padlock.py
import asyncio

from padlock_game.env import PadlockEnv
from padlock_game.game import DIGITS, LENGTH, padlock_dataset

from areal_agents import ChatAgent, check_env
from areal_agents.llm.scripted import ScriptedLLM

LOCKS = padlock_dataset("test")  # every code once


def expert(messages):  # plays from the conversation alone, as a model does
    tries = sum(m["role"] == "assistant" for m in messages)
    return DIGITS[0] * LENGTH if tries == 0 else messages[-1]["content"].replace("_", DIGITS[tries])


def play(script, row):
    return asyncio.run(ChatAgent(max_turns=4).run(PadlockEnv(), ScriptedLLM(script), row))


def test_the_env_passes_check_env():
    check_env(PadlockEnv(), options=LOCKS[0])


def test_the_expert_opens_every_lock_within_three_tries():
    for row in LOCKS:
        game = play(expert, row)
        assert game.info["success"] and game.turn_rewards[-1] == 1.0 and len(game.turn_rewards) <= 3


def test_the_warm_start_games_are_games_the_env_plays():
    for row in LOCKS:
        assert PadlockEnv().reference_conversation(row) == play(expert, row).info["messages"]


def test_a_player_who_ignores_the_lock_opens_few():
    games = [play(["111", "222", "333", "123"], row) for row in LOCKS]
    assert sum(g.info["success"] for g in games) == 4  # of 27
