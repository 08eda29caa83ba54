"""Rewards: the built-in reward functions and the runner that evaluates rewards in worker processes (no torch).

A reward is ``fn(completion: str, **row) -> float`` registered with ``@register_reward("name")``.

* :mod:`.builtin` — ``math``, ``exact-match``, ``format`` and :func:`fast_path`;
* :mod:`.judge` — :class:`Judge`: a reward read from a judge model's reply (an OpenAI-compatible endpoint), and
  :class:`GroupJudge`: one call that scores a whole group (a :func:`group_reward`);
* :mod:`.reward_model` — :class:`RewardModel`: a reward model's score (a sequence-classification model at ``/classify``);
* :mod:`.runner` — :class:`RewardRunner`: worker processes, a timeout per call, failures counted, never a stuck run;
* :mod:`.worker` — one worker process, tied to the life of the process that started it.
"""

from __future__ import annotations

from areal_agents.rewards.builtin import (
    RewardFn,
    exact_match_reward,
    extract_answer,
    fast_path,
    format_reward,
    group_reward,
    is_group_reward,
    math_reward,
    resolve_reward,
)
from areal_agents.rewards.judge import GroupJudge, Judge, JudgeError, parse_group_scores, parse_score
from areal_agents.rewards.reward_model import RewardModel
from areal_agents.rewards.runner import (
    RewardResult,
    RewardRunner,
    default_reward_workers,
    default_runner,
    get_default_runner,
    set_default_runner,
)
from areal_agents.rewards.worker import check_not_in_worker

__all__ = [
    "GroupJudge",
    "Judge",
    "JudgeError",
    "RewardFn",
    "RewardModel",
    "RewardResult",
    "RewardRunner",
    "check_not_in_worker",
    "default_reward_workers",
    "default_runner",
    "exact_match_reward",
    "extract_answer",
    "fast_path",
    "format_reward",
    "get_default_runner",
    "group_reward",
    "is_group_reward",
    "math_reward",
    "parse_group_scores",
    "parse_score",
    "resolve_reward",
    "set_default_runner",
]
