"""A training process for the trainer-death tests (run as a script, killed with SIGKILL).

``python reliability_trainer_worker.py MODEL CKPT_DIR LOG STEPS [PHASE STEP]`` trains a
TrainEngine on batches from a RolloutExecutor (η = 0, one checkpoint per step with the
executor's ``state_dict`` as the dataloader position), resuming from the newest complete
checkpoint. With ``PHASE STEP`` it parks (sleeps) at that point of that step so the test can
SIGKILL it there: ``train`` (rows consumed, before the optimiser step), ``dcp`` (model shards
written into the temp dir), ``fsync`` (temp dir complete, not yet renamed) or ``prune``
(renamed and pointed to, old checkpoints not yet pruned). Every event is an fsynced LOG line.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from areal_agents.config import RolloutConfig
from areal_agents.rollout import RolloutExecutor
from areal_agents.types import Trajectory

__all__ = ["ROWS", "make_executor", "row_trajectory"]

ROWS = [{"row": i} for i in range(24)]


def row_trajectory(row: int, k: int) -> Trajectory:
    """A small valid trajectory that remembers its dataset row."""
    ids = [2 + (row + j) % 60 for j in range(6)]
    traj = Trajectory(input_ids=ids, loss_mask=[0, 0, 1, 1, 1, 1], logprobs=[0.0, 0.0, -0.5, -0.5, -0.5, -0.5],
                      versions=[-1, -1, 0, 0, 0, 0], turn_spans=[(2, 6)], info={"row": row, "k": k})
    traj.set_rewards([float(k)])  # the executor settles the return
    return traj


def make_executor() -> RolloutExecutor:
    """The run's rollout executor: 2 groups of 2 per batch, synchronous (η = 0)."""
    async def episode(row: dict[str, Any], seed: int, episode_id: str) -> Trajectory:
        return row_trajectory(int(row["row"]), int(episode_id.rsplit("-", 1)[1]))

    cfg = RolloutConfig(batch_size=2, group_size=2, max_concurrent_rollouts=8, max_head_offpolicyness=0)
    return RolloutExecutor(cfg, episode_fn=episode, rows=ROWS, seed=5)


def _main() -> None:
    model, ckpt_dir, log_path, steps = sys.argv[1:5]
    phase, pause_step = (sys.argv[5], int(sys.argv[6])) if len(sys.argv) > 6 else ("", -1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainers"))
    import torch.distributed.checkpoint as dcp
    from trainer_helpers import make_cfg, nll_loss_fn, step_batch

    import trainers.checkpoint as ck
    from trainers.checkpoint import Checkpointer
    from trainers.engine import TrainEngine

    log = open(log_path, "a")

    def note(text: str) -> None:
        log.write(text + "\n")
        log.flush()
        os.fsync(log.fileno())

    current = {"step": -1}

    def park(where: str) -> None:
        if where == phase and current["step"] == pause_step:
            note(f"parked {where} {pause_step}")
            time.sleep(600)

    def wrap(fn: Any, where: str) -> Any:
        def inner(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            park(where)
            return out
        return inner

    dcp.save = wrap(dcp.save, "dcp")
    publish = ck.publish_dir

    def synced_not_renamed(tmp: Any, out: Any) -> Any:  # every file written and fsynced, not yet renamed
        real_rename, os.rename = os.rename, lambda *a: (park("fsync"), real_rename(*a))[1]  # type: ignore[assignment]
        try:
            return publish(tmp, out)
        finally:
            os.rename = real_rename  # type: ignore[assignment]

    ck.publish_dir = synced_not_renamed  # type: ignore[assignment]
    prune = Checkpointer._prune
    Checkpointer._prune = lambda self: (park("prune"), prune(self))[1]  # type: ignore[method-assign]

    engine = TrainEngine(make_cfg(), model)
    ckpt = Checkpointer(ckpt_dir, keep=2)
    ex = make_executor()
    state = ckpt.load_latest(engine)
    start = 0
    if state is not None:
        ex.load_state_dict(state["rollout"])
        ex.set_version(state["version"])
        start = state["step"]
    note(f"resume {start}")
    with ex:
        for s in range(start, int(steps)):
            current["step"] = s
            batch = ex.prepare_batch(timeout=60)
            note(f"rows {s} " + ",".join(str(g[0].info["row"]) for g in batch))
            park("train")
            engine.train_batch(step_batch(s), nll_loss_fn)
            ex.set_version(s + 1)
            ckpt.save(engine, step=s + 1, version=s + 1, rollout=ex.state_dict())
            note(f"saved {s + 1}")
    note("done")


if __name__ == "__main__":
    _main()
