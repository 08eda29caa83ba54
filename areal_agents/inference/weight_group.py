"""The process group a trainer and its inference servers share for broadcasting new weights."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["drop_weight_group", "new_weight_group"]


def new_weight_group(backend: str, address: str, port: int, world_size: int, rank: int, name: str,
                     timeout_s: float) -> ProcessGroup:
    """This process's side (``rank``) of a weight-update group, laid out as SGLang lays out its
    own: a TCP store at ``address:port`` served by rank 0, keys prefixed by ``name``, then
    torch's group helper. Trainer rank 0, SGLang's ranks and the embedded server meet alike.
    Blocks until all ``world_size`` ranks have joined; :func:`drop_weight_group` ends it."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    timeout = datetime.timedelta(seconds=timeout_s)
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
