"""New policy weights to the inference servers, behind one ``sync(engine, version)`` interface.

* :class:`DiskWeightSync` — export a HF dir per version (atomic), then
  ``POST /update_weights_from_disk {model_path, weight_version}`` to every server; keeps the
  last ``keep`` exported versions on disk.
* :class:`NcclWeightSync` — the SGLang GPU path: ``/init_weights_update_group`` once, then per
  version ``/update_weights_from_distributed {names, dtypes, shapes, group_name, weight_version}``
  while rank 0 broadcasts each full tensor over an NCCL group that includes the servers.

Requests go through :mod:`areal_agents.inference.control`.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainers import dist as tdist
from trainers.engine import DTYPES

if TYPE_CHECKING:
    from trainers.engine import TrainEngine

__all__ = ["DiskWeightSync", "NcclWeightSync", "WeightSync", "make_weight_sync", "write_hf_dir"]

_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth")
_SKIP = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}


def write_hf_dir(state: dict[str, torch.Tensor], hf_config: Any, src_dir: str | os.PathLike[str],
                 out_dir: str | os.PathLike[str], dtype: torch.dtype) -> Path:
    """Write ``state`` as ``model.safetensors`` + ``config.json`` + the tokenizer/generation
    files of ``src_dir`` into ``out_dir``, atomically (temp sibling, fsync, rename).

    Tied output embeddings are stored once, as HF does. An existing ``out_dir`` is replaced.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tensors = {k: v.detach().to(dtype).contiguous() for k, v in state.items()}
        if getattr(hf_config, "tie_word_embeddings", False):
            tensors.pop("lm_head.weight", None)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        out_cfg = copy.deepcopy(hf_config)
        out_cfg.dtype = dtype
        out_cfg.save_pretrained(tmp)
        src = Path(src_dir)
        for f in src.iterdir() if src.is_dir() else []:
            if f.is_file() and f.name not in _SKIP and not f.name.endswith(_WEIGHT_FILES):
                shutil.copy2(f, tmp / f.name)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        trash = None
        if out.exists():
            trash = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, trash)
        os.rename(tmp, out)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        fd = os.open(out.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


class WeightSync:
    """Interface: ``sync(engine, version)`` puts ``engine``'s policy on every server as ``version``."""

    def sync(self, engine: TrainEngine, version: int) -> None:
        raise NotImplementedError


def _control() -> Any:
    from areal_agents.inference import control

    return control


class DiskWeightSync(WeightSync):
    """Export to ``root/v<version>`` then ``/update_weights_from_disk`` on every server.

    ``pause=True`` brackets the update with ``/pause_generation`` and ``/continue_generation``
    (in-flight requests are interrupted and resumed by the client with the new version).
    Collective over trainer ranks; only rank 0 talks to the servers.
    """

    def __init__(self, addresses: Sequence[str], root: str | os.PathLike[str], *, keep: int = 2,
                 pause: bool = True) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (got {keep})")
        self.addresses, self.root, self.keep, self.pause = list(addresses), Path(root), keep, pause

    def path_for(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def sync(self, engine: TrainEngine, version: int) -> None:
        path = engine.export_hf(self.path_for(version))
        if engine.rank == 0 and self.addresses:
            control = _control()
            if self.pause:
                control.pause_generation(self.addresses)
            try:
                control.update_weights_from_disk(self.addresses, str(path), version)
            finally:
                if self.pause:
                    control.continue_generation(self.addresses)
        if engine.rank == 0:
            self.prune()
        tdist.barrier()

    def prune(self) -> list[Path]:
        """Delete exported versions beyond the newest ``keep``; return what was removed."""
        versions = sorted(p for p in self.root.glob("v[0-9]*") if p.is_dir())
        removed = versions[: max(0, len(versions) - self.keep)]
        for p in removed:
            shutil.rmtree(p, ignore_errors=True)
        return removed


class NcclWeightSync(WeightSync):
    """SGLang's distributed update: trainer rank 0 + every server's TP ranks form one NCCL group.

    ``server_world`` is the number of GPU ranks per server (``sglang.tp_size``). The group has
    ``1 + len(addresses) * server_world`` members; rank 0 is the trainer, server ``i`` starts
    at ``rank_offset = 1 + i * server_world``. Needs CUDA (the embedded CPU server answers
    these endpoints with an error).
    """

    def __init__(self, addresses: Sequence[str], *, master_address: str, master_port: int, server_world: int = 1,
                 group_name: str = "areal_agents_weights") -> None:
        self.addresses, self.server_world = list(addresses), server_world
        self.master_address, self.master_port, self.group_name = master_address, master_port, group_name
        self.group: Any = None

    @property
    def world_size(self) -> int:
        return 1 + len(self.addresses) * self.server_world

    def init_group_payloads(self) -> list[dict[str, Any]]:
        """Body of ``/init_weights_update_group`` for each server, in ``addresses`` order."""
        return [_control().init_weights_update_group_payload(
                    self.master_address, self.master_port, 1 + i * self.server_world, self.world_size,
                    group_name=self.group_name, backend="nccl")
                for i in range(len(self.addresses))]

    def update_payload(self, state: dict[str, torch.Tensor], version: int) -> dict[str, Any]:
        """Body of ``/update_weights_from_distributed`` announcing ``state``'s tensors in broadcast order."""
        return _control().update_weights_from_distributed_payload(
            list(state), [t.dtype for t in state.values()], [list(t.shape) for t in state.values()],
            version=version, group_name=self.group_name)

    @staticmethod
    def _while(request: Callable[[], None], work: Callable[[], None]) -> None:
        """Run the blocking HTTP ``request`` in a thread while this thread does ``work``."""
        errors: list[BaseException] = []

        def call() -> None:
            try:
                request()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        work()
        thread.join()
        if errors:
            raise errors[0]

    def init_group(self) -> None:
        """Servers join while rank 0 creates its side of the group (both block until all meet)."""
        def create() -> None:
            store = torch.distributed.TCPStore(self.master_address, self.master_port, self.world_size, is_master=True)
            self.group = torch.distributed.ProcessGroupNCCL(torch.distributed.PrefixStore(self.group_name, store), 0,
                                                            self.world_size)

        payloads = self.init_group_payloads()
        self._while(lambda: _control().init_weights_update_group(self.addresses, payloads), create)

    def sync(self, engine: TrainEngine, version: int) -> None:
        state = engine.full_state_dict()
        if engine.rank == 0:
            if self.group is None:
                self.init_group()
            dtype = DTYPES[engine.cfg.actor.dtype]
            state = {k: v.to(dtype) for k, v in state.items()}
            payload = self.update_payload(state, version)

            def broadcast() -> None:
                for t in state.values():
                    self.group.broadcast([t.cuda()], 0).wait()

            self._while(lambda: _control().update_weights_from_distributed(self.addresses, payload), broadcast)
        tdist.barrier()


def make_weight_sync(cfg: Any, addresses: Sequence[str], root: str | os.PathLike[str]) -> WeightSync:
    """The weight sync ``trainer.weight_sync`` selects (``nccl`` uses a free port on this host)."""
    if cfg.trainer.weight_sync == "nccl":
        return NcclWeightSync(addresses, master_address="127.0.0.1", master_port=tdist.free_port(),
                              server_world=cfg.sglang.tp_size)
    return DiskWeightSync(addresses, root)
