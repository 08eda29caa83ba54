"""The envs are Gymnasium envs to Gymnasium itself: its checker passes, ``reset()`` draws a
seeded row of the default dataset, and the registered envs are in Gymnasium's registry after
``register_gymnasium_envs()`` (never on import)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

from areal_agents import register_gymnasium_envs
from areal_agents.env import (
    DatasetMixin,
    Env,
    ReferenceMixin,
    RewardMixin,
    TurnLimitedEnv,
    reference_completion,
    reference_conversation,
)
from areal_agents.gym.registration import gymnasium_id, make_env
from areal_agents.registry import datasets, envs

ROOT = Path(__file__).resolve().parents[2]
BUILTINS = {"math", "math-multiturn", "guess-number", "python-tool", "countdown", "unit-convert"}


@pytest.fixture
def gym_ids() -> Iterator[dict[str, str]]:
    """Every registered env in Gymnasium's registry (name -> id) for one test, removed afterwards."""
    before = set(gymnasium.registry)
    ids = register_gymnasium_envs()
    yield dict(zip(sorted(envs.names()), ids, strict=True))
    for env_id in set(gymnasium.registry) - before:
        del gymnasium.registry[env_id]


def test_import_registers_nothing_in_gymnasium() -> None:
    code = ("import gymnasium, areal_agents, areal_agents.env, areal_agents.gym.registration\n"
            "print(sorted(i for i in gymnasium.registry if i.startswith('areal_agents/')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_builtins_get_namespaced_versioned_ids(gym_ids: dict[str, str]) -> None:
    assert {gym_ids[name] for name in BUILTINS} == {f"areal_agents/{name}-v0" for name in BUILTINS}
    assert all(gym_ids[name] in gymnasium.registry for name in BUILTINS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second call changes nothing (Gymnasium would warn on an override)
        assert register_gymnasium_envs(["math"]) == ["areal_agents/math-v0"]
    env = gymnasium.make("areal_agents/math-multiturn-v0", max_turns=2)  # make's kwargs reach the constructor
    assert env.unwrapped.max_turns == 2 and env.spec is not None and env.spec.id == "areal_agents/math-multiturn-v0"
    env.close()


def test_bad_names_are_refused() -> None:
    with pytest.raises(ValueError, match="'two words' .* does not make a Gymnasium id"):
        gymnasium_id("two words")
    with pytest.raises(ValueError, match="unknown env 'no-such-env'"):
        register_gymnasium_envs(["no-such-env"])


@pytest.mark.parametrize("name", envs.names())
def test_gymnasium_checker_passes_on_every_registered_env(name: str, gym_ids: dict[str, str]) -> None:
    env = gymnasium.make(gym_ids[name])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Gymnasium's checker reports what it dislikes as warnings
            gymnasium_check_env(env.unwrapped)  # its default arguments: the render and close checks too
        obs, _ = env.reset(seed=1)  # through Gymnasium's wrappers (order enforcing, passive checker)
        assert obs in env.observation_space and env.observation_space.sample() in env.observation_space
        assert env.action_space.sample() in env.action_space
        step_obs = env.step(env.action_space.sample())[0]
        assert step_obs in env.observation_space
    finally:
        env.close()


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_reset_without_a_row_draws_a_seeded_row(name: str) -> None:
    env, other = make_env(name), make_env(name)
    try:
        env.reset(seed=11)
        first = env.row
        assert isinstance(first, dict) and first
        other.reset(seed=11)
        assert other.row == first  # the same seed: the same row, in another instance too
        other.reset(seed=11, options={})  # Gymnasium's "no options" draws the same way
        assert other.row == first
        rows = []
        for seed in range(8):
            env.reset(seed=seed)
            rows.append(env.row)
        assert len({repr(r) for r in rows}) > 1  # different seeds: different rows
        env.reset(seed=5)
        other.reset(seed=5)
        unseeded = []
        for _ in range(3):  # reset() without a seed continues the RNG, as in Gymnasium
            env.reset()
            other.reset()
            assert env.row == other.row
            unseeded.append(repr(env.row))
        assert len(set(unseeded)) > 1
    finally:
        env.close()
        other.close()


class _CountingEnv(TurnLimitedEnv):
    default_dataset = "gym-test-counting"
    default_dataset_kwargs: dict[str, Any] = {"n": 5}

    def __init__(self) -> None:
        super().__init__(max_turns=1)

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        return "", 0.0, True, {"success": False}


def test_default_rows_are_loaded_once_per_dataset() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    def counting(split: str, **kwargs: Any) -> list[dict[str, Any]]:
        calls.append((split, kwargs))
        return [{"prompt": f"row {i}"} for i in range(kwargs["n"])]

    def replacement(split: str, **kwargs: Any) -> list[dict[str, Any]]:
        return [{"prompt": "replaced"}]

    datasets.add("gym-test-counting", counting, where="test")
    try:
        prompts = set()
        for _ in range(3):
            env = _CountingEnv()
            for seed in range(6):
                prompts.add(env.reset(seed=seed)[0])
        assert calls == [("train", {"n": 5})]  # no size: the factory does not take one
        assert prompts <= {f"row {i}" for i in range(5)} and len(prompts) > 1
        env.row["prompt"] = "changed"  # the env's row is a copy: the cached rows stay as loaded
        assert all(_CountingEnv().reset(seed=s)[0] != "changed" for s in range(6))
        datasets.add("gym-test-counting", replacement, where="test2", override=True)
        assert _CountingEnv().reset(seed=0)[0] == "replaced"  # a new registration is loaded afresh
    finally:
        datasets.remove("gym-test-counting")


def test_an_env_without_default_dataset_names_what_to_pass() -> None:
    class NoDataset(_CountingEnv):
        default_dataset = None

    class PlainEnv(DatasetMixin, Env):
        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            return "", 0.0, True, False, {}

    with pytest.raises(ValueError, match=r"^NoDataset\.reset\(\) needs options=<dataset row>: .*no default_dataset")\
            as caught:
        NoDataset().reset(seed=0)
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"NoDataset\.reset: the row needs a 'prompt' field \(got \[\]\)"):
        NoDataset().reset(options={})  # without a dataset to draw from, {} is a row, checked as one
    with pytest.raises(ValueError, match=r"PlainEnv\.reset\(\) needs options=<dataset row>"):
        PlainEnv().sample_row()


def test_env_is_gymnasiums_contract_and_the_rest_are_mixins() -> None:
    """``Env`` adds to ``gymnasium.Env`` only the async variants (and text spaces): datasets,
    rewards and warm-start references are each a mixin of their own, which an env lists."""
    added = {name for name in vars(Env) if not name.startswith("_")} - set(dir(gymnasium.Env))
    assert added == {"areset", "astep", "observation_space", "action_space"}  # gymnasium.Env only annotates the spaces
    assert {name for name in vars(Env) if not name.startswith("_")} == {
        "reset", "step", "areset", "astep", "close", "observation_space", "action_space"}
    for name in ("default_dataset", "resolve_row", "compute_reward", "reward_runner", "reference_completion",
                 "reference_conversation", "default_config", "tools"):
        assert not hasattr(Env, name), name
    assert {"resolve_row", "sample_row", "dataset_kwargs_for", "default_dataset"} <= set(vars(DatasetMixin))
    assert {"compute_reward", "acompute_reward", "reward_runner"} <= set(vars(RewardMixin))
    assert {"reference_completion", "reference_conversation"} == {n for n in vars(ReferenceMixin) if not n.startswith("_")}
    assert issubclass(TurnLimitedEnv, DatasetMixin)


def test_references_are_read_from_any_env_that_has_them() -> None:
    class Bare(Env):
        pass

    class WithMixin(ReferenceMixin, Env):
        def reference_completion(self, row: dict[str, Any]) -> str | None:
            return row["answer"]

    class DuckTyped(Env):  # the methods without the mixin: still read
        def reference_conversation(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
            return [{"role": "assistant", "content": row["answer"]}]

    row = {"answer": "7"}
    assert (reference_completion(Bare(), row), reference_conversation(Bare(), row)) == (None, None)
    assert (reference_completion(WithMixin(), row), reference_conversation(WithMixin(), row)) == ("7", None)
    assert reference_conversation(DuckTyped(), row) == [{"role": "assistant", "content": "7"}]
    assert reference_completion(DuckTyped(), row) is None
