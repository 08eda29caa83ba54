"""The preflight refuses a warm start on reference games longer than ``agent.max_turns``.

A user's env whose expert needs 5 replies, run with the default ``agent.max_turns=4``, would be
warm-started on games its episodes can never finish: the run stops before any model is built,
with one line naming the key and the value to set.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from areal_agents.cli import main
from areal_agents.config import ConfigError
from areal_agents.config.loader import load_config
from areal_agents.data import load_dataset_rows
from areal_agents.env import ReferenceMixin, TurnLimitedEnv
from areal_agents.gym.registration import make_env
from areal_agents.registry import datasets, envs
from areal_agents.rollout.preflight import PreflightError, check_reference_turns, preflight, reference_turns

ENV = "preflight-count-to"
REFUSED = (f"agent.max_turns: env {ENV!r}: reference games take up to 5 assistant turns but agent.max_turns=4; "
           "set agent.max_turns=5 (or more)")


def count_rows(split: str = "train", *, size: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Games of 3 and 5 replies."""
    return [{"prompt": f"Say next {n} times.", "n": n} for n in [3, 5] * ((size or 8) // 2)]


class CountTo(ReferenceMixin, TurnLimitedEnv):
    """Say ``next`` ``row["n"]`` times: each ``next`` is answered ``again`` until the last one ends the game."""

    default_dataset = "preflight-count-rows"
    required_fields = ("prompt", "n")

    def __init__(self, fail_reference: bool = False) -> None:
        super().__init__(max_turns=8)
        self.fail_reference = fail_reference

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        if action.strip() != "next":
            return "Say next.", 0.0, False, {}
        done = self.turn >= int(row["n"])
        return ("" if done else "again"), float(done), done, {"success": done}

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        return "next"

    def reference_conversation(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        if self.fail_reference and row["n"] == 5:
            raise KeyError("solver")
        conv: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
        for _ in range(int(row["n"]) - 1):
            conv += [{"role": "assistant", "content": "next"}, {"role": "user", "content": "again"}]
        return [*conv, {"role": "assistant", "content": "next"}]


@pytest.fixture
def count_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    monkeypatch.setenv("AREAL_AGENTS_CACHE", str(tmp_path / "cache"))
    datasets.register("preflight-count-rows")(count_rows)
    envs.register(ENV)(CountTo)
    try:
        yield ENV
    finally:
        envs.remove(ENV)
        datasets.remove("preflight-count-rows")


def test_assistant_turns_are_counted_as_the_agent_counts_them() -> None:
    conv = CountTo().reference_conversation({"prompt": "p", "n": 5})
    assert conv is not None and reference_turns(conv) == 5
    assert reference_turns(None) == 0
    assert reference_turns([{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                            {"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": "1"},
                            {"role": "assistant", "content": "a"}]) == 2


def test_reference_games_longer_than_max_turns_are_refused_in_one_line(count_env: str) -> None:
    cfg = load_config(None, [f"env.name={count_env}"])
    rows = load_dataset_rows(cfg, "train")
    with pytest.raises(ConfigError) as err:
        check_reference_turns(cfg, make_env(count_env), rows)
    assert err.value.key == "agent.max_turns" and str(err.value) == REFUSED
    check_reference_turns(load_config(None, [f"env.name={count_env}", "agent.max_turns=5"]), make_env(count_env), rows)
    check_reference_turns(cfg, make_env(count_env), rows[:1])  # a 3-reply game fits


def test_the_preflight_refuses_a_warm_start_only(count_env: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^agent\.max_turns: .* up to 5 assistant turns but agent\.max_turns=4;"):
        preflight(load_config(None, [f"env.name={count_env}"]))
    preflight(load_config(None, [f"env.name={count_env}", "agent.max_turns=5"]))
    # a model of the user's own: the reference games train nothing, so nothing to refuse
    preflight(load_config(None, [f"env.name={count_env}", f"actor.path={tmp_path}"]))


def test_a_failing_reference_conversation_names_the_env(count_env: str) -> None:
    cfg = load_config(None, [f"env.name={count_env}", "env.kwargs.fail_reference=true", "agent.max_turns=5"])
    with pytest.raises(PreflightError, match=rf"^env {ENV!r}: reference_conversation raised KeyError: 'solver' "
                                             r"\(test_rollout_preflight\.py:\d+\)$"):
        preflight(cfg)


def test_the_run_command_stops_before_training(count_env: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--env", count_env, f"output_dir={tmp_path / 'runs'}", "logging.progress=false"])
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: {REFUSED}\n", err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()  # nothing built, nothing run


@pytest.mark.parametrize("name", ["countdown", "guess-number", "python-tool", "unit-convert"])
def test_no_builtin_env_with_reference_games_trips_the_check_in_its_default_run(name: str) -> None:
    cfg = load_config(None, [f"env.name={name}"])
    env = make_env(name, **cfg.env.kwargs)
    rows = load_dataset_rows(cfg, "train")
    assert reference_turns(env.reference_conversation(rows[0])) >= 1  # it has reference games to check
    check_reference_turns(cfg, env, rows)
