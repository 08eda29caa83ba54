"""A server SIGKILLed inside a gloo weight sync, after the sync's pause found it up and before
the broadcast: the sync tears its group down at once (the surviving server does not wait out
the group's timeout), that version goes through disk, the next sync forms the group anew
without the dead server, and the run trains every step on every episode it started."""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from reliability_support import make_model

from areal_agents.config import ExperimentConfig
from areal_agents.config.loader import load_config
from areal_agents.types import Trajectory
from trainers import loop
from trainers.weight_sync import DiskWeightSync, DistributedWeightSync, WeightSync

STEPS, KILL_AT, BATCH, GROUP = 5, 3, 2, 4
TIMEOUT_S = 3600.0  # the group's timeout: a sync that waited for it would be ended by the test's own timeout


def _server_process(address: str) -> psutil.Process:
    """The server subprocess of this run listening on ``address``'s port."""
    port = int(address.rsplit(":", 1)[1])
    found = [c for c in psutil.Process(os.getpid()).children(recursive=True)
             if any(conn.status == psutil.CONN_LISTEN and conn.laddr.port == port
                    for conn in c.net_connections("tcp"))]  # fmt: skip
    assert len(found) == 1, (address, found)
    return found[0]


class _KillsAServerMidSync(DistributedWeightSync):
    """Fault injection: at version ``KILL_AT``, once the pause has found both servers up and
    the group with both is in place, SIGKILLs the second server and waits until it is gone,
    right before the broadcast starts. Records what each sync reports."""

    reports: dict[int, tuple[str | None, list[str], int]]

    def update_payload(self, state: dict[str, torch.Tensor], version: int,
                       lora: tuple[str, dict[str, Any]] | None = None) -> Any:
        if version == KILL_AT:
            assert self.members == self.addresses  # the group formed with both servers is reused
            victim = _server_process(self.members[1])
            victim.kill()
            os.waitid(os.P_PID, victim.pid, os.WEXITED | os.WNOWAIT)  # dead (its launcher reaps it)
        return super().update_payload(state, version, lora)

    def sync(self, engine: Any, version: int) -> None:
        super().sync(engine, version)
        self.reports[version] = (self.last_error, list(self.members), self.torn_down)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a sync that waited for the group's timeout (TIMEOUT_S) is ended here
def test_a_server_killed_between_pause_and_broadcast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(None, [
        "env.name=math", f"actor.path={make_model(tmp_path)}", f"output_dir={tmp_path / 'runs'}",
        "experiment_name=sync-kill", f"trainer.total_steps={STEPS}", "inference.num_servers=2",
        "trainer.weight_sync=gloo", f"trainer.weight_sync_timeout={TIMEOUT_S}", f"rollout.batch_size={BATCH}",
        f"rollout.group_size={GROUP}", "sampling.max_new_tokens=6", "eval.n=4", "eval.every=0",
        "trainer.save_every=0", "logging.progress=false", "logging.plots=false", "logging.tensorboard=false"])
    syncs: list[_KillsAServerMidSync] = []

    def make_sync(cfg: ExperimentConfig, addresses: Sequence[str], root: str | os.PathLike[str]) -> WeightSync:
        sync = _KillsAServerMidSync(addresses, backend="gloo", timeout_s=cfg.trainer.weight_sync_timeout,
                                    fallback=DiskWeightSync(addresses, root, pause=False))
        sync.reports = {}
        syncs.append(sync)
        return sync

    trained: list[list[Trajectory]] = []
    train_step = loop._timed_train_step

    def recording_train_step(*args: Any) -> dict[str, float]:  # records each batch, then trains on it as ever
        trained.append(list(args[3]))
        return train_step(*args)

    monkeypatch.setattr(loop, "make_weight_sync", make_sync)
    monkeypatch.setattr(loop, "_timed_train_step", recording_train_step)
    summary = loop.run(cfg)

    assert summary["steps"] == STEPS
    (sync,) = syncs
    addrs = sync.addresses
    error, members, torn_down = sync.reports[KILL_AT]
    assert error is not None and torn_down == 1, sync.reports  # torn down at the first failure, not timed out
    assert (Path(cfg.weights_dir) / f"v{KILL_AT:06d}").is_dir()  # that version went through disk
    assert sync.reports[KILL_AT - 1] == (None, addrs, 0)
    assert sync.reports[KILL_AT + 1] == (None, addrs[:1], 1)  # the group formed anew without the dead server
    assert list(sync.down) == addrs[1:]

    # no episode lost: every step trained a full batch of whole groups, none twice
    assert [len(batch) for batch in trained] == [BATCH * GROUP] * STEPS
    groups = collections.Counter(t.group_id for batch in trained for t in batch)
    assert len(groups) == STEPS * BATCH and set(groups.values()) == {GROUP}, groups
    assert all(t.status == "ok" for batch in trained for t in batch)
    rows = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    last = [r for r in rows if "train/loss" in r][-1]
    assert last["rollout/failed"] == 0 and last["inference/servers_down"] == 1, last
    assert last["rollout/submitted"] == (last["rollout/accepted"] + last["rollout/failed"] + last["rollout/dropped"]
                                         + last["rollout/in_flight"]), last
