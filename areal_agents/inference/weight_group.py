"""The process group a trainer and its inference servers share for broadcasting new weights."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup, Store

__all__ = ["drop_weight_group", "master_store", "new_weight_group"]


def master_store(address: str, port: int, world_size: int, timeout_s: float) -> Store:
    """Rank 0's TCP store, listening before anyone is told where: ``port`` 0 takes a free port
    the store itself holds (its ``port`` says which), so no other process can take it between
    choosing the port and binding it. Does not wait for the other ranks."""
    import torch.distributed as dist

    return dist.TCPStore(address, port, world_size, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def new_weight_group(backend: str, address: str, port: int, world_size: int, rank: int, name: str,
                     timeout_s: float, store: Store | None = None) -> ProcessGroup:
    """This process's side (``rank``) of a weight-update group, laid out as SGLang lays out its
    own: a TCP store at ``address:port`` served by rank 0, keys prefixed by ``name``, then
    torch's group helper. Trainer rank 0, SGLang's ranks and the embedded server meet alike.
    Blocks until all ``world_size`` ranks have joined; :func:`drop_weight_group` ends it.
    Rank 0 passes the ``store`` it made with :func:`master_store` (``port`` is then unused)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout)
    made = distributed_c10d._new_process_group_helper(
        world_size, rank, [], backend, dist.PrefixStore(name, store),
        group_name=name,  # type: ignore[arg-type]  # a plain str at runtime
        timeout=timeout)
    group = made[0] if isinstance(made, tuple) else made
    # its ranks, as torch's own group constructor records them: what destroying it looks up
    distributed_c10d._world.pg_group_ranks[group] = {r: r for r in range(world_size)}
    return group


def drop_weight_group(group: ProcessGroup) -> None:
    """Leave ``group`` for good: torch forgets it, and once the caller holds no reference to it
    either, its connections close, so every other member waiting in one of its collectives
    fails at once ("connection closed by peer") instead of waiting out the group's timeout."""
    import torch.distributed as dist

    dist.destroy_process_group(group)
