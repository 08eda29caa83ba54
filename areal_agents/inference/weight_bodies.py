"""The bodies of the weight-update calls (SGLang's ``/update_weights_from_disk``,
``/init_weights_update_group`` and ``/update_weights_from_distributed``): their types, and the
builders a trainer sends them with, so the NCCL weight path can be driven (and tested) without a
GPU. Part of :mod:`~areal_agents.inference.protocol`, which re-exports them (no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

__all__ = ["InitGroupBody", "UpdateFromDiskBody", "UpdateFromDistributedBody", "init_weights_update_group_payload",
           "update_weights_from_disk_payload", "update_weights_from_distributed_payload"]


class _DiskUpdate(TypedDict):
    model_path: str
    abort_all_requests: bool
    flush_cache: bool


class UpdateFromDiskBody(_DiskUpdate, total=False):
    """Body of ``POST /update_weights_from_disk``: the new weights' directory, and the version
    that names them (``weight_version``; a server keeps its own count without it)."""

    weight_version: str


class _InitGroup(TypedDict):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str
    backend: str


class InitGroupBody(_InitGroup, total=False):
    """Body of ``POST /init_weights_update_group``: where the trainer's store listens, this
    server's first rank in the group, the group's size, name and backend. Extension of the
    embedded server: ``timeout_s``, how long its collectives may wait (it keeps its default without)."""

    timeout_s: float


class _DistributedUpdate(TypedDict):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str
    flush_cache: bool


class UpdateFromDistributedBody(_DistributedUpdate, total=False):
    """Body of ``POST /update_weights_from_distributed``: the tensors about to be broadcast, in
    order (names, dtype names, shapes), and their ``weight_version``. Extension: ``lora_name``
    and ``lora_config`` (``adapter_config.json``) when they are a LoRA adapter."""

    weight_version: str
    lora_name: str
    lora_config: dict[str, Any]


def update_weights_from_disk_payload(
    path: str, version: int | str | None = None, abort_all_requests: bool = False, flush_cache: bool = True
) -> UpdateFromDiskBody:
    """Body of ``POST /update_weights_from_disk``."""
    body: UpdateFromDiskBody = {"model_path": str(path), "abort_all_requests": abort_all_requests,
                            "flush_cache": flush_cache}  # fmt: skip
    if version is not None:
        body["weight_version"] = str(version)
    return body


def init_weights_update_group_payload(
    master_address: str, master_port: int, rank_offset: int, world_size: int,
    group_name: str = "weight_update_group", backend: str = "nccl",
) -> InitGroupBody:  # fmt: skip
    """Body of ``POST /init_weights_update_group`` (server ranks start at ``rank_offset``)."""
    if world_size < 2 or not 0 < rank_offset < world_size:
        raise ValueError(f"need world_size >= 2 and 0 < rank_offset < world_size (got {rank_offset}/{world_size})")
    return {"master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend}  # fmt: skip


def update_weights_from_distributed_payload(
    names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
    version: int | str | None = None, group_name: str = "weight_update_group", flush_cache: bool = True,
) -> UpdateFromDistributedBody:  # fmt: skip
    """Body of ``POST /update_weights_from_distributed`` announcing tensors about to be broadcast."""
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"names, dtypes and shapes differ in length ({len(names)}, {len(dtypes)}, {len(shapes)})")
    body: UpdateFromDistributedBody = {"names": list(names), "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
                            "shapes": [[int(s) for s in shape] for shape in shapes], "group_name": group_name,
                            "flush_cache": flush_cache}  # fmt: skip
    if version is not None:
        body["weight_version"] = str(version)
    return body
