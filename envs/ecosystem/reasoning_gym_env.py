"""``reasoning-gym``: one question of any reasoning-gym task, scored by the task's own
``score_answer`` (``pip install 'areal-agents[reasoning-gym]'``)."""

from __future__ import annotations

import re
import threading
from types import ModuleType
from typing import Any, Protocol

from areal_agents.rewards import extract_answer
from envs.ecosystem._games import import_library
from envs.math import MathEnv

__all__ = ["EXTRACTORS", "ReasoningGymEnv", "extract_reply", "reasoning_gym_dataset", "reasoning_gym_reward"]

EXTRACTORS = ("auto", "answer-tag", "math", "raw")
_TEST_SEED_OFFSET = 1_000_000_007  # reasoning-gym seeds item i with seed + i: the test split's items start far away
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{")


def _library() -> ModuleType:
    return import_library("reasoning_gym", "reasoning-gym", "reasoning-gym")


class _TaskDataset(Protocol):
    """What is used of a reasoning-gym dataset (``reasoning_gym.create_dataset``)."""

    def __getitem__(self, i: int) -> dict[str, Any]: ...

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float: ...


def _task_dataset(task: str, config: dict[str, Any], seed: int | None = None, size: int = 1) -> _TaskDataset:
    rg = _library()
    try:
        dataset: _TaskDataset = rg.create_dataset(task, seed=seed, size=size, **config)
        return dataset
    except (ValueError, TypeError) as exc:  # an unknown task or config field
        raise ValueError(f"reasoning-gym task {task!r} (config {config}): {exc}") from None


def reasoning_gym_dataset(split: str = "train", *, task: str = "chain_sum", size: int = 500, seed: int = 0,
                          task_config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``size`` items of ``reasoning_gym.create_dataset(task, seed=..., size=size, **task_config)``
    as rows ``{"prompt": question, "answer", "task", "task_config", "entry"}`` (``entry`` is the
    item itself, which ``score_answer`` needs). The test split is the same task from a seed
    ``1_000_000_007`` further on (a task with few distinct questions may repeat some of train)."""
    if split not in ("train", "test"):
        raise ValueError(f"reasoning_gym_dataset: split must be train or test (got {split!r})")
    config = dict(task_config or {})
    data = _task_dataset(task, config, seed + (_TEST_SEED_OFFSET if split == "test" else 0), size)
    rows = []
    for i in range(size):
        entry = data[i]
        rows.append({"prompt": str(entry["question"]), "answer": str(entry["answer"]), "task": task,
                     "task_config": config, "entry": entry})
    return rows


def extract_reply(completion: str, how: str = "auto") -> str:
    """The answer in a reply: ``answer-tag``, the last ``<answer>...</answer>`` (reasoning-gym's own
    convention); ``math``, as the ``math`` env reads it (last ``\\boxed{}``, ``#### N`` or the last
    number); ``raw``, the whole reply; ``auto``, the answer tag, else a ``\\boxed{}``, else the whole reply.
    Surrounding whitespace is stripped."""
    if how not in EXTRACTORS:
        raise ValueError(f"extract must be one of {', '.join(EXTRACTORS)} (got {how!r})")
    if how in ("auto", "answer-tag"):
        tagged = _ANSWER_TAG.findall(completion)
        if tagged or how == "answer-tag":
            return tagged[-1].strip() if tagged else ""
        if not _BOXED.search(completion):
            return completion.strip()
    if how == "raw":
        return completion.strip()
    return extract_answer(completion) or ""


_SCORERS: dict[tuple[str, str], _TaskDataset] = {}  # (task, config) -> a dataset of that task, for its score_answer
_SCORERS_LOCK = threading.Lock()


def reasoning_gym_reward(completion: str, task: str | None = None, entry: dict[str, Any] | None = None,
                         task_config: dict[str, Any] | None = None, extract: str = "auto", **row: Any) -> float:
    """The task's ``score_answer(answer, entry)`` for the answer :func:`extract_reply` finds in
    ``completion`` (in [0, 1] for reasoning-gym's tasks)."""
    if task is None or not isinstance(entry, dict):
        raise ValueError("reasoning_gym_reward needs the row fields 'task' and 'entry' (rows of the reasoning-gym dataset)")
    config = dict(task_config or {})
    key = (task, repr(sorted(config.items())))
    with _SCORERS_LOCK:
        scorer = _SCORERS.get(key)
        if scorer is None:
            scorer = _SCORERS[key] = _task_dataset(task, config)
    return float(scorer.score_answer(extract_reply(completion, extract), entry))


class ReasoningGymEnv(MathEnv):
    """Single turn, like ``math``: the observation is the question, the reply is scored by the
    task's ``score_answer`` (reward ``reasoning-gym``; ``extract`` says where the answer is, see
    :func:`extract_reply`); a reward of 1.0 is a success. ``task`` and ``task_config`` (the task's
    config fields, e.g. ``{"min_terms": 2}``) also choose the rows of the default dataset, so
    ``env.kwargs.task=chain_sum`` is all a run needs. (An instruction such as reasoning-gym's
    "answer in <answer></answer> tags" goes in ``agent.system_prompt``.)
    """

    default_dataset = "reasoning-gym"
    required_fields = ("prompt", "task", "entry")

    def __init__(self, task: str = "chain_sum", task_config: dict[str, Any] | None = None, extract: str = "auto",
                 reward: str = "reasoning-gym") -> None:
        super().__init__(reward=reward)
        if extract not in EXTRACTORS:
            raise ValueError(f"reasoning-gym env: extract must be one of {', '.join(EXTRACTORS)} (got {extract!r})")
        _task_dataset(task, dict(task_config or {}))  # an unknown task or config fails here, in one line
        self.task, self.extract = task, extract
        self.dataset_kwargs = self.dataset_kwargs_for({"task": task, "task_config": task_config})

    @classmethod
    def dataset_kwargs_for(cls, env_kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"task": env_kwargs.get("task", "chain_sum")}
        if env_kwargs.get("task_config"):
            kwargs["task_config"] = dict(env_kwargs["task_config"])
        return kwargs

    def compute_reward(self, reward: Any, completion: str, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        return super().compute_reward(reward, completion, {**row, "extract": self.extract})

    async def acompute_reward(self, reward: Any, completion: str, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        return await super().acompute_reward(reward, completion, {**row, "extract": self.extract})
