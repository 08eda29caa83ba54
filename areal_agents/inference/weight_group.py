"""The process group a trainer and its inference servers share for broadcasting new weights."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["new_weight_group"]


def new_weight_group(backend: str, address: str, port: int, world_size: int, rank: int, name: str,
                     timeout_s: float) -> ProcessGroup:
    """This process's side (``rank``) of a weight-update group, laid out as SGLang lays out its
    own: a TCP store at ``address:port`` served by rank 0, keys prefixed by ``name``, then
    torch's group helper. Trainer rank 0, SGLang's ranks and the embedded server meet alike.
    Blocks until all ``world_size`` ranks have joined."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _new_process_group_helper

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout)
    made = _new_process_group_helper(world_size, rank, [], backend, dist.PrefixStore(name, store),
                                     group_name=name,  # type: ignore[arg-type]  # a plain str at runtime
                                     timeout=timeout)
    return made[0] if isinstance(made, tuple) else made
