"""Recorded completions to trajectories (no torch).

Completions are taken in the order they were made. One whose prompt tokens start with all the
tokens of a trajectory built so far (its prompts and completions) extends it: the new prompt
tokens are appended as context (loss mask 0) and the completion as generated tokens (loss mask
1, with its logprobs and versions), as ``llm.chat`` records a multi-turn episode. Any other
completion starts a trajectory of its own. This is the ``concat`` mode (:data:`MODES`).

In the ``individual`` mode every completion is a trajectory of its own (its prompt as context,
its completion as generated tokens), whether or not its prompt extends an earlier one. Use it for
agents whose calls do not extend one another (sub-agents, context compaction, rewritten
histories), where ``concat`` would give as many trajectories anyway, each a different length;
``concat`` trains a multi-turn conversation as one sequence (shared prompt tokens once, per-turn
returns).

In both modes every trajectory earns the episode's reward ``R`` on its last turn (0 on its
earlier turns); where the episode ends the rollout discounts it by the completions after that
turn, ``γ^d · R`` with the run's ``env.turn_discount`` γ, so the episode's last completion keeps ``R``
(:func:`~areal_agents.rollout.returns.settle_returns`, which reads the completion indices in each
trajectory's ``info["calls"]``).
"""

from __future__ import annotations

from collections.abc import Sequence

from areal_agents.openai_compat.session import CallRecord
from areal_agents.types import Trajectory

__all__ = ["MODES", "assemble", "check_mode"]

MODES = ("concat", "individual")
"""The trajectory modes: one trajectory per chain of extending calls, or one per call."""


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`MODES`; else ``ValueError`` naming them."""
    if mode not in MODES:
        raise ValueError(f"trajectory_mode must be one of {', '.join(MODES)} (got {mode!r})")
    return mode


def assemble(records: Sequence[CallRecord], reward: float, mode: str = "concat") -> list[Trajectory]:
    """The trajectories of an episode's ``records`` in ``mode`` (see the module docstring).

    The last entry holds the episode's last completion; each trajectory's ``info`` has
    ``calls`` (the record indices it holds).
    """
    check_mode(mode)
    ordered = sorted(records, key=lambda r: r.index)
    trajs: list[Trajectory] = []
    for rec in ordered:
        prompt = list(rec.prompt_ids)
        target = None if mode == "individual" else max(
            (t for t in trajs if prompt[: t.num_tokens] == t.input_ids), key=lambda t: t.num_tokens, default=None)
        if target is None:
            target = Trajectory(info={"calls": []})
            trajs.append(target)
        target.append_tokens(prompt[target.num_tokens:], generated=False)
        start = target.num_tokens
        target.append_tokens(rec.completion_ids, generated=True, logprobs=rec.logprobs, versions=rec.versions)
        target.turn_spans.append((start, target.num_tokens))
        target.state_keys.append(rec.state_key)
        target.info["calls"].append(rec.index)
        target.finish_reason = rec.finish_reason
    for traj in trajs:  # R earned on each trajectory's last turn; settle_returns discounts it by position
        traj.set_rewards([0.0] * (len(traj.info["calls"]) - 1) + [reward])
    return sorted(trajs, key=lambda t: t.info["calls"][-1])
