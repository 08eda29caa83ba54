"""Process groups, device meshes and launch helpers for the trainer.

A trainer runs as world size 1 inside the calling process (a one-rank gloo group on a free
loopback port, no ``torchrun`` needed) or as N ranks started by ``torchrun`` (environment
variables ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``) or by :func:`spawn`.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from areal_agents.inference.launcher import free_port

__all__ = [
    "barrier",
    "broadcast_object",
    "build_mesh",
    "free_port",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "seed_all",
    "shutdown",
    "spawn",
    "torchrun_command",
]

_T = TypeVar("_T")


def get_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if get_world_size() > 1:
        dist.barrier()


def broadcast_object(obj: _T, src: int = 0) -> _T:
    """Rank ``src``'s ``obj`` on every rank (identity at world size 1)."""
    if get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def init_distributed(device: str = "cpu", first_gpu: int = 0) -> tuple[int, int]:
    """Join (or create) the default process group; return ``(rank, world_size)``.

    Uses the ``torchrun`` environment when ``WORLD_SIZE`` is set, otherwise a one-rank
    group on a free loopback port. The backend is gloo on CPU and nccl on CUDA, where local
    rank ``r`` takes GPU ``first_gpu + r``. Calling it again once a group exists is a no-op.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    backend, launched = ("nccl" if device == "cuda" else "gloo"), "WORLD_SIZE" in os.environ
    if device == "cuda":
        torch.cuda.set_device(first_gpu + (int(os.environ.get("LOCAL_RANK", "0")) if launched else 0))
    if launched:
        dist.init_process_group(backend, rank=int(os.environ.get("RANK", "0")),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        # a world of one: its store takes a free port as it binds (nobody else needs to know which)
        dist.init_process_group(backend, init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size()


def seed_all(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (every device) with ``seed``: a rank's own
    generators, as ``transformers.set_seed`` does, without importing its trainer (and, through
    it, peft and the generation utilities: 2 s at start-up on 2 CPU cores)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # every device's default generator, CUDA's included


def build_mesh(device: str, hsdp_replicate: int = 1) -> DeviceMesh:
    """A 1-D ``("shard",)`` mesh, or a 2-D ``("replicate", "shard")`` mesh for HSDP.

    ``hsdp_replicate`` must divide the world size; each replica group then holds one full
    copy of the model sharded over ``world / hsdp_replicate`` ranks.
    """
    world = get_world_size()
    if world % hsdp_replicate:
        raise ValueError(f"actor.hsdp_replicate={hsdp_replicate} must divide the world size {world}")
    if hsdp_replicate == 1:
        return init_device_mesh(device, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device, (hsdp_replicate, world // hsdp_replicate), mesh_dim_names=("replicate", "shard"))


def _spawn_entry(rank: int, fn: Callable[..., object], world: int, port: int, args: tuple[object, ...]) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    fn(rank, world, *args)
    shutdown()


def shutdown() -> None:
    """Leave the default process group cleanly: once every rank is here, destroy it (a rank
    that exits with its group alive can abort while the others still talk to it)."""
    barrier()
    if dist.is_initialized():
        dist.destroy_process_group()


def spawn(fn: Callable[..., object], nprocs: int, *args: object) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` fresh processes with the torchrun
    environment set; raises if any rank fails. ``fn`` must be importable (module level)."""
    import torch.multiprocessing as mp

    mp.start_processes(_spawn_entry, args=(fn, nprocs, free_port(), args), nprocs=nprocs, join=True,
                       start_method="spawn")


def torchrun_command(nproc: int, module: str, args: Sequence[str] = (), *, nnodes: int = 1,
                     rdzv_endpoint: str | None = None) -> list[str]:
    """The ``torchrun`` command line that starts ``python -m module args`` on ``nproc`` ranks.

    Single node uses a standalone rendezvous; several nodes use ``rdzv_endpoint`` (host:port).
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise ValueError("several nodes need rdzv_endpoint=host:port")
        cmd += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"]
    return [*cmd, "-m", module, *args]
