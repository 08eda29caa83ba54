"""Plain data passed between agents, the rollout executor and the trainer (no torch)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

__all__ = ["STATUSES", "Trajectory", "check_turn_discount", "discounted_returns", "is_turn_discount"]

STATUSES = ("ok", "env_error", "agent_error", "reward_error", "timeout", "aborted", "server_error")


def is_turn_discount(gamma: float) -> bool:
    """Whether ``gamma`` is a valid turn discount: γ ∈ (0, 1]."""
    return 0.0 < gamma <= 1.0


def check_turn_discount(gamma: float) -> float:
    """``gamma`` when :func:`is_turn_discount`; else ``ValueError``."""
    if not is_turn_discount(gamma):
        raise ValueError(f"turn_discount must be in (0, 1] (got {gamma})")
    return gamma


def discounted_returns(turn_rewards: Sequence[float], gamma: float) -> tuple[float, list[float]]:
    """Episode return ``Σ_k γ^k r_k`` and per-turn returns ``G_t = Σ_{k≥t} γ^(k-t) r_k``.

    >>> discounted_returns([0.0, 1.0], 0.5)
    (0.5, [0.5, 1.0])
    """
    check_turn_discount(gamma)
    returns = list(itertools.accumulate(reversed([float(r) for r in turn_rewards]), lambda g, r: r + gamma * g))
    returns.reverse()
    return (returns[0] if returns else 0.0), returns


@dataclass
class Trajectory:
    """One episode as token ids the trainer consumes exactly as they were sampled.

    Token-aligned lists all have ``len(input_ids)`` entries. ``turn_spans[t] = (start, end)``
    are the token positions the LLM generated at turn ``t`` (``end`` exclusive), so
    ``loss_mask[start:end]`` is 1 there and 0 on prompt and env tokens. ``state_keys[t]`` names
    the env state turn ``t`` acted in (its *anchor state*; see :meth:`areal_agents.llm.LLM.chat`):
    turns of one group with equal keys are compared with each other by GiGPO. ``""`` (or a list
    not aligned with ``turn_spans``, as in files written before the field existed) means unknown.
    """

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_returns: list[float] = field(default_factory=list)
    state_keys: list[str] = field(default_factory=list)
    reward: float = 0.0
    status: str = "ok"
    info: dict[str, Any] = field(default_factory=dict)
    group_id: str = ""
    start_version: int = 0
    finish_reason: str = "stop"
    prompt_text: str = ""
    completion_text: str = ""
    segments: list[Trajectory] = field(default_factory=list)
    """More trajectories of the same episode, trained beside this one: the calls of an agent
    whose prompts did not extend this token sequence (see ``areal_agents.openai_compat``)."""

    # -- derived ------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def append_tokens(self, ids: Sequence[int], *, generated: bool, logprobs: Sequence[float] | None = None,
                      versions: Sequence[int] | None = None) -> None:
        """Append ``ids`` with loss mask 1 (``generated``) or 0; tokens without ``logprobs`` /
        ``versions`` get logprob 0.0 and version -1."""
        n = len(ids)
        self.input_ids += [int(i) for i in ids]
        self.loss_mask += [int(generated)] * n
        self.logprobs += [float(x) for x in logprobs] if logprobs is not None else [0.0] * n
        self.versions += [int(v) for v in versions] if versions is not None else [-1] * n

    def copy(self) -> Trajectory:
        """A copy whose lists and ``info`` are its own (the items in them are shared): what a fork
        or an export of a recording needs, at a fraction of ``copy.deepcopy``'s cost (about 8 µs
        against 250 µs for a 140-token episode), paid once per episode."""
        own: dict[str, Any] = {f.name: type(v)(v) for f in fields(self)
                               if isinstance(v := getattr(self, f.name), (list, dict))}
        return replace(self, **own)

    def set_rewards(self, turn_rewards: Sequence[float], turn_discount: float = 1.0) -> None:
        """Store per-turn rewards and derive ``reward`` and ``turn_returns`` (undiscounted by default).

        What an agent calls to report its rewards; the rollout settles the returns again with the
        run's ``env.turn_discount`` where the episode ends
        (:func:`~areal_agents.rollout.returns.settle_returns`), so an agent need not know γ."""
        self.turn_rewards = [float(r) for r in turn_rewards]
        self.reward, self.turn_returns = discounted_returns(self.turn_rewards, turn_discount)

    def flatten(self) -> list[Trajectory]:
        """The episode's trajectories to train on: its ``segments`` (with this one's group,
        start version and status), then this one without them."""
        if not self.segments:
            return [self]
        extra = [replace(s, group_id=self.group_id, start_version=self.start_version, status=self.status)
                 for s in self.segments]
        return [*extra, replace(self, segments=[])]

    def validate(self) -> None:
        """Raise ``ValueError`` if the token-aligned fields disagree."""
        n = len(self.input_ids)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"trajectory.{name} has {len(getattr(self, name))} entries, input_ids {n}")
        if self.status not in STATUSES:
            raise ValueError(f"trajectory.status must be one of {STATUSES} (got {self.status!r})")
        if not math.isfinite(self.reward):
            raise ValueError(f"trajectory.reward must be finite (got {self.reward})")
        for start, end in self.turn_spans:
            if not 0 <= start <= end <= n:
                raise ValueError(f"trajectory.turn_spans entry {(start, end)} is outside 0..{n}")
        for segment in self.segments:
            segment.validate()

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["turn_spans"] = [list(s) for s in self.turn_spans]
        d["segments"] = [s.to_dict() for s in self.segments]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        traj = cls(**known)
        traj.turn_spans = [(int(a), int(b)) for a, b in traj.turn_spans]
        traj.state_keys = ["" if k is None else str(k) for k in traj.state_keys]
        traj.segments = [s if isinstance(s, Trajectory) else cls.from_dict(s) for s in traj.segments]
        return traj

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        return cls.from_dict(json.loads(line))
