"""Recorded completions to trajectories (no torch).

Completions are taken in the order they were made. One whose prompt tokens start with all the
tokens of a trajectory built so far (its prompts and completions) extends it: the new prompt
tokens are appended as context (loss mask 0) and the completion as generated tokens (loss mask
1, with its logprobs and versions), as ``llm.chat`` records a multi-turn episode. Any other
completion starts a trajectory of its own. The episode's reward ``R`` reaches every trajectory
through the turn discount γ, counted in completions back from the episode's last: a trajectory
whose last completion is ``d`` completions before the episode's last gets ``γ^d · R`` on its
last turn (0 on its earlier turns), so the last completion gets ``γ^0 · R = R``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from areal_agents.openai_compat.session import CallRecord
from areal_agents.types import Trajectory

__all__ = ["assemble"]


@dataclass
class _Build:
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)

    def add(self, ids: list[int], *, generated: bool, logprobs: Sequence[float] = (), versions: Sequence[int] = ()) -> None:
        self.ids += ids
        self.mask += [int(generated)] * len(ids)
        self.logprobs += map(float, logprobs) if generated else [0.0] * len(ids)
        self.versions += map(int, versions) if generated else [-1] * len(ids)


def _index(rec: CallRecord) -> int:
    return rec.index


def _extends(prompt: list[int], build: _Build) -> bool:
    n = len(build.ids)
    return len(prompt) >= n and prompt[:n] == build.ids


def assemble(records: Sequence[CallRecord], reward: float, turn_discount: float) -> list[Trajectory]:
    """The trajectories of an episode's ``records`` (see the module docstring).

    The last entry holds the episode's last completion; each trajectory's ``info`` has
    ``calls`` (the record indices it holds).
    """
    builds: list[_Build] = []
    ordered = sorted(records, key=_index)
    for rec in ordered:
        prompt = list(rec.prompt_ids)
        target = max((b for b in builds if _extends(prompt, b)), key=lambda b: len(b.ids), default=None)
        if target is None:
            target = _Build()
            builds.append(target)
        target.add(prompt[len(target.ids):], generated=False)
        start = len(target.ids)
        target.add(list(rec.completion_ids), generated=True, logprobs=rec.logprobs, versions=rec.versions)
        target.spans.append((start, len(target.ids)))
        target.calls.append(rec)
    if not builds:
        return []
    order = {r.index: i for i, r in enumerate(ordered)}
    out = []
    for b in sorted(builds, key=lambda b: b.calls[-1].index):
        back = len(ordered) - 1 - order[b.calls[-1].index]
        traj = Trajectory(input_ids=b.ids, loss_mask=b.mask, logprobs=b.logprobs, versions=b.versions,
                          turn_spans=b.spans, finish_reason=b.calls[-1].finish_reason,
                          info={"calls": [r.index for r in b.calls]})
        traj.set_rewards([0.0] * (len(b.calls) - 1) + [turn_discount**back * reward], turn_discount)
        out.append(traj)
    return out
