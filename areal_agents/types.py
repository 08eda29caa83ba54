"""Plain data passed between agents, the rollout executor and the trainer (no torch)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

__all__ = ["STATUSES", "Trajectory", "is_turn_discount"]

STATUSES = ("ok", "env_error", "agent_error", "reward_error", "timeout", "aborted", "server_error")


def is_turn_discount(gamma: float) -> bool:
    """Whether ``gamma`` is a valid turn discount, γ ∈ (0, 1]: the rule of the ``env.turn_discount``
    config field, the one place γ is checked."""
    return 0.0 < gamma <= 1.0


@dataclass
class Trajectory:
    """One episode as token ids the trainer consumes exactly as they were sampled.

    Token-aligned lists all have ``len(input_ids)`` entries. ``turn_spans[t] = (start, end)``
    are the token positions the LLM generated at turn ``t`` (``end`` exclusive), so
    ``loss_mask[start:end]`` is 1 there and 0 on prompt and env tokens. ``state_keys[t]`` names
    the env state turn ``t`` acted in (its *anchor state*; see :meth:`areal_agents.llm.LLM.chat`):
    turns of one group with equal keys are compared with each other by GiGPO. ``""`` (or a list
    not aligned with ``turn_spans``, as in files written before the field existed) means unknown.

    ``turn_rewards[t]`` is what turn ``t`` earned, undiscounted, as the agent reported it
    (:meth:`set_rewards`). ``reward`` (the episode's return ``Σ_k γ^k r_k``) and ``turn_returns``
    (each turn's return) are *settled* from them where the episode ends, with the run's
    ``env.turn_discount`` γ (:func:`~areal_agents.rollout.returns.settle_returns`); before that
    they are 0.0 and ``[]``.
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

    def set_rewards(self, turn_rewards: Sequence[float]) -> None:
        """Record what each turn earned, undiscounted: what an agent calls to report its rewards.

        The return is not the agent's to compute: ``reward`` and ``turn_returns`` are cleared
        (0.0 and ``[]``, so no earlier value passes for a return) until the rollout settles
        them where the episode ends, with the run's ``env.turn_discount``
        (:func:`~areal_agents.rollout.returns.settle_returns`)."""
        self.turn_rewards = [float(r) for r in turn_rewards]
        self.reward, self.turn_returns = 0.0, []

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
