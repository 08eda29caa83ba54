"""Checkpoints a killed run can resume from: sharded model + optimiser (torch.distributed.checkpoint),
LR schedules, RNG states of every rank, the rollout/dataloader position, weight version and step.

Layout under ``root``::

    step_00000010/model/      DCP shards of every trainable model and its optimiser (any world size)
    step_00000010/state.pt    step, version, schedulers, rollout state, user extras
    step_00000010/rng_rank<r>.pt
    step_00000010/meta.json   written last: {"step", "version", "complete": true}
    latest                    name of the newest complete checkpoint (atomic rename)

A checkpoint is written into ``.tmp-step_...`` and renamed only after every file is fsynced,
so a crash mid-save leaves a directory :func:`find_latest` never picks.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from areal_agents.failures import message_line
from areal_agents.runtime.stopping import interrupt
from trainers import dist as tdist
from trainers.hf_io import fsync_dir, publish_dir

if TYPE_CHECKING:
    from areal_agents.rollout.interface import SavedRollout
    from trainers.engine import ShardedModel, TrainEngine

__all__ = ["CheckpointMismatch", "Checkpointer", "Restored", "find_latest", "rng_state", "set_rng_state"]

_PREFIX = "step_"


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch (and CUDA) generator states of this process."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _complete(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("complete") is True else None


def find_latest(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint under ``root``; half-written (``.tmp-*``) or meta-less
    directories are ignored (the ``latest`` file is a pointer for people and tools)."""
    done = [(meta["step"], p) for p in Path(root).glob(f"{_PREFIX}*") if (meta := _complete(p)) is not None]
    return max(done)[1] if done else None


def _save_error(exc: BaseException, where: Path) -> Exception:
    """An ``OSError`` (errno kept, e.g. ENOSPC) or ``RuntimeError`` for a failed DCP save."""
    last = message_line(exc, last=True)
    code = re.search(r"\[Errno (\d+)\]", last)
    if code:
        return OSError(int(code.group(1)), f"cannot write checkpoint {where}: {last}")
    return RuntimeError(f"cannot write checkpoint {where}: {last}")


def _optimizer(sm: ShardedModel, name: str) -> torch.optim.Optimizer:
    if sm.optimizer is None:
        raise ValueError(f"checkpoint: the {name} model has no optimiser (only trained models are checkpointed)")
    return sm.optimizer


class Restored(TypedDict):
    """What :meth:`Checkpointer.load` hands back besides the restored engine: the step and weight
    version to go on from, the rollout's state, the caller's extras, and the checkpoint's path."""

    step: int
    version: int
    rollout: SavedRollout | None
    extra: dict[str, Any] | None
    path: str


class CheckpointMismatch(ValueError):
    """The newest checkpoint was written by a run that differs in what resuming needs."""


class Checkpointer:
    """Save/load checkpoints of a :class:`~trainers.engine.TrainEngine` under ``root``.

    Every method that touches model state is collective over the trainer ranks.
    ``keep`` complete checkpoints are kept (older ones are deleted after a save).
    """

    def __init__(self, root: str | os.PathLike[str], keep: int = 2, fingerprint: dict[str, Any] | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (got {keep})")
        self.root, self.keep = Path(root), keep
        self.fingerprint = fingerprint  # what a run must share to resume these checkpoints (env, model...)
        self._stop = False
        self._interruptible = False  # in a phase SIGTERM interrupts at once

    # -- model state ----------------------------------------------------------------------
    @staticmethod
    def _options(engine: TrainEngine) -> StateDictOptions | None:
        """With LoRA a checkpoint holds what trains (adapters, value head) and its optimiser
        state, not the frozen base weights, which come from ``actor.path`` again."""
        lora = getattr(engine, "lora", None) is not None
        return StateDictOptions(ignore_frozen_params=True, strict=False) if lora else None

    @classmethod
    def _model_states(cls, engine: TrainEngine) -> dict[str, Any]:
        out = {}
        for name, sm in engine.trainable().items():
            model_sd, optim_sd = get_state_dict(sm.model, _optimizer(sm, name), options=cls._options(engine))
            out[name] = {"model": model_sd, "optim": optim_sd}
        return out

    def save(self, engine: TrainEngine, *, step: int, version: int, rollout: SavedRollout | None = None,
             extra: dict[str, Any] | None = None) -> Path:
        """Write checkpoint ``step`` atomically and point ``latest`` at it; return its path."""
        name = f"{_PREFIX}{step:08d}"
        final, tmp = self.root / name, self.root / f".tmp-{name}"
        if engine.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        tdist.barrier()
        try:
            dcp.save(self._model_states(engine), checkpoint_id=str(tmp / "model"))
        except CheckpointException as exc:  # a BaseException in torch: raise what it wraps, in one line
            raise _save_error(exc, tmp) from None
        torch.save(rng_state(), tmp / f"rng_rank{engine.rank}.pt")
        tdist.barrier()
        if engine.rank == 0:
            state = {"step": step, "version": version, "engine_step": engine.step, "rollout": rollout,
                     "extra": extra or {}, "world_size": engine.world,
                     "schedulers": {n: sm.scheduler.state_dict() for n, sm in engine.trainable().items()
                                    if sm.scheduler is not None}}
            torch.save(state, tmp / "state.pt")
            meta = {"step": step, "version": version, "fingerprint": self.fingerprint, "complete": True}
            (tmp / "meta.json").write_text(json.dumps(meta))
            publish_dir(tmp, final)
            pointer = self.root / ".latest.tmp"
            pointer.write_text(name)
            os.replace(pointer, self.root / "latest")
            fsync_dir(self.root)
            self._prune()
        tdist.barrier()
        return final

    def _prune(self) -> None:
        done = sorted((meta["step"], p) for p in self.root.glob(f"{_PREFIX}*") if (meta := _complete(p)))
        for _, p in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(p, ignore_errors=True)

    def load(self, engine: TrainEngine, path: str | os.PathLike[str]) -> Restored:
        """Restore ``engine`` (models, optimisers, schedules, RNG) from ``path``; return
        ``{"step", "version", "rollout", "extra", "path"}``."""
        path = Path(path)
        if _complete(path) is None:
            raise ValueError(f"{path}: not a complete checkpoint (no meta.json with complete=true)")
        states = self._model_states(engine)
        dcp.load(states, checkpoint_id=str(path / "model"))
        for name, sm in engine.trainable().items():
            set_state_dict(sm.model, _optimizer(sm, name), model_state_dict=states[name]["model"],
                           optim_state_dict=states[name]["optim"], options=self._options(engine))
        state = torch.load(path / "state.pt", weights_only=False)
        for name, sd in state["schedulers"].items():
            sched = engine.trainable()[name].scheduler
            if sched is not None:
                sched.load_state_dict(sd)
        engine.step = int(state["engine_step"])
        rng_file = path / f"rng_rank{engine.rank}.pt"
        if rng_file.exists():  # absent when resuming on more ranks than were saved
            set_rng_state(torch.load(rng_file, weights_only=False))
        tdist.barrier()
        return {"step": int(state["step"]), "version": int(state["version"]), "rollout": state["rollout"],
                "extra": state["extra"], "path": str(path)}

    def latest(self) -> Path | None:
        """The newest complete checkpoint (rank 0 decides which), or None if there is none.

        Raises :class:`CheckpointMismatch` when it was written under another
        :attr:`fingerprint`, e.g. by a run of another env or model.
        """
        latest = tdist.broadcast_object(find_latest(self.root) if tdist.get_rank() == 0 else None)
        if latest is None:
            return None
        saved = (_complete(Path(latest)) or {}).get("fingerprint")
        if self.fingerprint is not None and saved is not None and saved != self.fingerprint:
            diff = ", ".join(f"{k} {saved.get(k)!r} (now {v!r})" for k, v in self.fingerprint.items() if saved.get(k) != v)
            raise CheckpointMismatch(f"{latest} belongs to another run: {diff}")
        return Path(latest)

    def set_aside(self) -> Path | None:
        """Move the checkpoints of an earlier run out of the way, to ``checkpoints.set-aside-N``
        beside them (rank 0 moves, every rank waits): a run that starts over would otherwise
        prune its own new checkpoints in favour of their higher steps, and a later resume would
        pick theirs. The new path, or None when there were none."""
        moved = None
        if tdist.get_rank() == 0 and any(_complete(p) for p in self.root.glob(f"{_PREFIX}*")):
            taken = [p.name.rsplit("-", 1)[1] for p in self.root.parent.glob(f"{self.root.name}.set-aside-*")]
            n = 1 + max((int(t) for t in taken if t.isdigit()), default=0)  # after the highest, gaps or not
            moved = self.root.rename(self.root.with_name(f"{self.root.name}.set-aside-{n}"))
            print(f"trainer.recover=disabled: the earlier run's checkpoints moved to {moved}", file=sys.stderr)
        return tdist.broadcast_object(moved)

    def resume_point(self, recover: str) -> Path | None:
        """The checkpoint a run resumes from: with ``recover="auto"`` the newest (:meth:`latest`);
        with ``"disabled"`` none, the earlier run's set aside (:meth:`set_aside`)."""
        if recover == "disabled":
            self.set_aside()
            return None
        return self.latest()

    def load_latest(self, engine: TrainEngine) -> Restored | None:
        """Load :meth:`latest` into ``engine``; None if there is no checkpoint."""
        latest = self.latest()
        return None if latest is None else self.load(engine, latest)

    # -- SIGTERM ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """While inside, a SIGTERM under :meth:`save_on_sigterm` interrupts instead of waiting for the step boundary."""
        self._interruptible = True
        try:
            if self._stop:  # it came just before
                interrupt(signal.SIGTERM)
            yield
        finally:
            self._interruptible = False

    def stop_requested(self) -> bool:
        """True on every rank once any rank got SIGTERM (collective: call at step boundaries)."""
        flag = torch.tensor([1.0 if self._stop else 0.0])
        if dist.is_initialized() and dist.get_world_size() > 1:
            if dist.get_backend() == "nccl":  # NCCL reduces device tensors only
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self._stop = bool(flag.item())
        return self._stop

    @contextlib.contextmanager
    def save_on_sigterm(self, state_fn: Callable[[], tuple[TrainEngine, int, int, SavedRollout | None]]) -> Iterator[Checkpointer]:
        """While inside, SIGTERM requests a save instead of killing the process.

        The loop should check :meth:`stop_requested` at each step boundary and leave; on the
        way out a checkpoint of ``state_fn() = (engine, step, version, rollout_state)`` is
        saved if a SIGTERM came. In a phase marked :meth:`interruptible` (an eval, the wait for a
        batch: nothing to finish, and they may wait long) SIGTERM interrupts it at once
        (:func:`areal_agents.runtime.stopping.interrupt`). A second SIGTERM terminates at once.
        """
        def handler(signum: int, frame: FrameType | None) -> None:
            if self._stop:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
            self._stop = True
            if self._interruptible:
                interrupt(signum, frame)

        previous = signal.signal(signal.SIGTERM, handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)
            if self._stop:
                engine, step, version, rollout = state_fn()
                self.save(engine, step=step, version=version, rollout=rollout)
