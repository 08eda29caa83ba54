"""New policy weights to the inference servers, behind one ``sync(engine, version)`` interface.

* :class:`DiskWeightSync` — export a HF dir per version (atomic), then
  ``POST /update_weights_from_disk {model_path, weight_version}`` to every server; keeps the
  last ``keep`` exported versions on disk.
* :class:`DistributedWeightSync` — SGLang's broadcast path: ``/init_weights_update_group``
  once, then per version ``/update_weights_from_distributed {names, dtypes, shapes,
  group_name, weight_version}`` while rank 0 broadcasts each full tensor over a process group
  that includes the servers: NCCL for SGLang on GPUs, gloo for the embedded CPU server.

With LoRA (``actor.lora.rank > 0``) only the adapter travels: the disk sync exports a PEFT
adapter dir and has each server ``/unload_lora_adapter`` + ``/load_lora_adapter`` it under
``actor.lora.name``, then ``/update_weight_version``; the broadcast sends the adapter's tensors
(the announcement names the adapter, an embedded-server extension). The version bumps as with
full weights, so interruption and staleness work the same.

Servers that do not answer are skipped (:attr:`WeightSync.down`) and caught up once back.

Requests go through :mod:`areal_agents.inference.control`.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from areal_agents.inference import control, protocol
from areal_agents.inference.weight_group import drop_weight_group, master_store, new_weight_group
from trainers import dist as tdist
from trainers.hf_io import TORCH_DTYPES
from trainers.lora import adapter_config

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from areal_agents.config import ExperimentConfig
    from trainers.engine import ShardedModel

__all__ = ["DiskWeightSync", "DistributedWeightSync", "Policy", "WeightSync", "broadcast_timeout",
           "make_weight_sync"]


def broadcast_timeout(numel: int) -> float:
    """Seconds a broadcast sync of ``numel`` values may take before it gives up (forming the
    group, then one update): 60 s, plus 20 s per billion values. A small model's sync takes
    well under a second, so the bound only matters when a member stops answering; the first
    failure it sees tears the group down far earlier (:class:`DistributedWeightSync`)."""
    return 60.0 + 20.0 * numel / 1e9


class Policy(Protocol):
    """What a weight sync needs of the trainer (:class:`~trainers.engine.TrainEngine`)."""

    rank: int
    cfg: ExperimentConfig
    model_path: Path
    actor: ShardedModel  # its .model: the wrapped policy, whose adapter names its target modules

    def export_hf(self, out_dir: str | os.PathLike[str], *, durable: bool = True) -> Path: ...

    def full_state_dict(self) -> dict[str, torch.Tensor]: ...

    def adapter_state_dict(self) -> dict[str, torch.Tensor]: ...


class WeightSync:
    """Interface: ``sync(engine, version)`` puts ``engine``'s policy on every live server as ``version``.

    A server that does not answer at all (killed, restarting) is left out of that sync and
    listed in :attr:`down`; it gets the weights at the first sync after it answers again. A
    sync fails only when no server is reachable, or when one answers with an error.
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = list(addresses)
        self.down: dict[str, str] = {}  # address -> why it was unreachable at the last sync
        self.events: list[str] = []  # servers lost and regained, fallbacks: for the run's log (pop them)

    def sync(self, engine: Policy, version: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the sync holds (process groups); the servers keep running."""

    def _on_each(self, addrs: Sequence[str], fn: Callable[[str], Any]) -> list[str]:
        """``fn(addr)`` for each address; return those that answered, recording the others in :attr:`down`."""
        answered = []
        for addr in addrs:
            try:
                fn(addr)
            except control.ServerUnreachable as exc:
                if addr not in self.down:
                    self.events.append(f"inference server {addr} is unreachable; weight sync skips it until it is back")
                self.down[addr] = str(exc)
                continue
            if self.down.pop(addr, None) is not None:
                self.events.append(f"inference server {addr} is back and gets the new weights")
            answered.append(addr)
        return answered

    def _paused(self, version: int, update: Callable[[list[str]], list[str]], *, pause: bool = True) -> None:
        """``update`` the reachable servers (it returns those it reached), paused around it
        unless ``pause`` is off (then ``update`` meets unreachable servers itself)."""
        if not pause:
            up = update(self.addresses)
        else:
            # retract: in-flight requests wait in the server's queue and are re-prefilled under
            # the new weights; abort would end them and have every client send them again
            up = self._on_each(self.addresses, lambda a: control.pause_generation(a, "retract"))
            try:
                up = update(up) if up else up
            finally:
                self._on_each(up, control.continue_generation)
        if not up:
            raise control.ControlError(f"weight version {version}: no inference server is reachable "
                                       f"({'; '.join(self.down.values())})")


class DiskWeightSync(WeightSync):
    """Export to ``root/v<version>`` then ``/update_weights_from_disk`` on every server, with
    generation paused around it (in-flight requests are retracted into the server's queue and
    continue from their partial output under the new version). Collective over trainer ranks;
    only rank 0 talks to the servers.
    """

    def __init__(self, addresses: Sequence[str], root: str | os.PathLike[str], *, keep: int = 2,
                 pause: bool = True) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (got {keep})")
        super().__init__(addresses)
        # False: the servers swap weights at a token boundary on their own (embedded), so a full
        # update needs no pause and generation goes on while they load (an adapter swap still pauses)
        self.root, self.keep, self.pause = Path(root), keep, pause

    def path_for(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def sync(self, engine: Policy, version: int) -> None:
        path = engine.export_hf(self.path_for(version), durable=False)  # with LoRA: the adapter dir
        lora = getattr(engine, "lora", None)  # actor.lora when it trains a LoRA adapter
        if engine.rank == 0 and self.addresses:
            update: Callable[[str], Any] = ((lambda a: control.update_weights_from_disk(a, str(path), version))
                                            if lora is None else
                                            (lambda a: control.load_lora_adapter(a, lora.name, str(path), version)))
            self._paused(version, lambda up: self._on_each(up, update), pause=self.pause or lora is not None)
        if engine.rank == 0:
            self.prune()
        tdist.barrier()

    def prune(self) -> None:
        """Delete exported versions beyond the newest ``keep``."""
        versions = sorted(p for p in self.root.glob("v[0-9]*") if p.is_dir())
        for p in versions[: max(0, len(versions) - self.keep)]:
            shutil.rmtree(p, ignore_errors=True)


class DistributedWeightSync(WeightSync):
    """SGLang's distributed update: trainer rank 0 and every server's ranks form one process
    group (``nccl`` for SGLang on GPUs, ``gloo`` for the embedded CPU server), and rank 0
    broadcasts each full tensor after ``/update_weights_from_distributed`` announced them.

    ``server_world`` is the number of ranks per server (``sglang.tp_size``). The group has
    ``1 + len(servers) * server_world`` members; rank 0 is the trainer, server ``i`` starts at
    ``rank_offset = 1 + i * server_world``. The group is made on the first sync, and made
    again (on a new port) whenever the set of reachable servers changes. If a broadcast
    fails, that version goes through ``fallback`` (disk) and the group is made anew.

    The first failure on either side of an update (rank 0's collective raises, or a server's
    request does) tears the group down at once, so the members still waiting in it (a
    server that outlived one that died after the pause) fail fast instead of after
    ``timeout_s``: the bound on forming the group and on one update, by default
    :func:`broadcast_timeout` of the broadcast's size.
    """

    def __init__(self, addresses: Sequence[str], *, backend: str = "nccl", master_address: str = "127.0.0.1",
                 master_port: int | None = None, server_world: int = 1, group_name: str = "areal_agents_weights",
                 timeout_s: float | None = None, fallback: DiskWeightSync | None = None) -> None:
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be nccl or gloo (got {backend!r})")
        super().__init__(addresses)
        self.backend, self.server_world, self.group_name, self.timeout_s = backend, server_world, group_name, timeout_s
        self.master_address, self.master_port = master_address, master_port
        self.fallback = fallback
        self.group: ProcessGroup | None = None
        self._formed = 0  # groups made so far
        self._id = uuid.uuid4().hex[:8]
        self.members: list[str] = []  # the servers of the current group, in rank order
        self.torn_down = 0  # groups torn down mid-update (a member failed while the others waited)
        self.last_error: str | None = None  # why the last sync fell back to disk

    @property
    def current_name(self) -> str:
        """Name of the current (or next) group: ``group_name``, this sync's id and how many
        groups it made (a restarted trainer never reuses a name the servers still hold)."""
        return f"{self.group_name}-{self._id}-{max(1, self._formed)}"

    def world_size(self, n_servers: int | None = None) -> int:
        return 1 + (len(self.addresses) if n_servers is None else n_servers) * self.server_world

    def init_group_payloads(self, servers: Sequence[str] | None = None, port: int | None = None,
                            timeout_s: float | None = None) -> list[protocol.InitGroupBody]:
        """Body of ``/init_weights_update_group`` for each server, in order (``port``: the
        trainer's store, ``master_port`` unless given). With gloo (embedded servers) it carries
        the group's ``timeout_s``, so that a server waits no longer than the trainer does."""
        servers = self.addresses if servers is None else servers
        port = port or self.master_port or 0
        bodies = [protocol.init_weights_update_group_payload(
                      self.master_address, port, 1 + i * self.server_world, self.world_size(len(servers)),
                      group_name=self.current_name, backend=self.backend)
                  for i in range(len(servers))]  # fmt: skip
        if timeout_s is not None and self.backend == "gloo":
            for body in bodies:
                body["timeout_s"] = float(timeout_s)
        return bodies

    def update_payload(self, state: dict[str, torch.Tensor], version: int,
                       lora: tuple[str, dict[str, Any]] | None = None) -> protocol.UpdateFromDistributedBody:
        """Body of ``/update_weights_from_distributed`` announcing ``state``'s tensors in broadcast
        order (``lora``: ``(name, adapter_config)`` when they are a LoRA adapter)."""
        body = protocol.update_weights_from_distributed_payload(
            list(state), [str(t.dtype) for t in state.values()], [list(t.shape) for t in state.values()],
            version=version, group_name=self.current_name)
        if lora is not None:
            body["lora_name"], body["lora_config"] = lora
        return body

    def _while(self, request: Callable[[], None], work: Callable[[], None]) -> None:
        """Run the collective ``work`` (rank 0's side) and the blocking HTTP ``request`` (the
        servers' side) on two threads. The first failure of either tears the group down: the
        trainer's connections close, so a surviving server blocked in the same collective fails
        at once instead of waiting out the group's timeout, and its reply ends the request.
        A request refused while the group is still forming raises at once; the forming, which
        would wait for the missing server until the timeout, is left to end on its own."""
        errors: list[BaseException] = []
        lock = threading.Lock()
        running = [2]
        ended = threading.Event()  # the first failure, or both done

        def run(fn: Callable[[], None]) -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                with lock:
                    errors.append(exc)
            with lock:
                running[0] -= 1
                if errors or not running[0]:
                    ended.set()

        threads = [threading.Thread(target=run, args=(fn,), daemon=True, name=name)
                   for fn, name in ((work, "weight-broadcast"), (request, "weight-announce"))]
        for thread in threads:
            thread.start()
        ended.wait()
        if errors:
            if self.group is None:  # still forming: nothing to tear down, nothing to wait for
                raise errors[0]
            self.torn_down += 1
            self.close()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _init_group(self, servers: list[str], timeout_s: float) -> None:
        """Servers join over HTTP while rank 0 creates its side (both block until all meet)."""
        self.close()
        world = self.world_size(len(servers))
        store = master_store(self.master_address, self.master_port or 0, world, timeout_s)  # bound before it is announced
        port = store.port  # type: ignore[attr-defined]  # a TCPStore's
        self._formed += 1  # group names are process-wide in torch (and SGLang): each group a new one
        payloads = self.init_group_payloads(servers, port, timeout_s)

        def create() -> None:
            self.group = new_weight_group(self.backend, self.master_address, port, world, 0, self.current_name,
                                          timeout_s, store)

        self._while(lambda: control.init_weights_update_group(servers, payloads, timeout=timeout_s), create)
        self.members = list(servers)

    def _group(self) -> ProcessGroup:
        if self.group is None:
            raise RuntimeError("the weight update group was torn down")
        return self.group

    def _broadcast(self, up: list[str], state: dict[str, torch.Tensor], version: int,
                   lora: tuple[str, dict[str, Any]] | None = None) -> list[str]:
        timeout_s = self.timeout_s or broadcast_timeout(sum(t.numel() for t in state.values()))
        if self.group is None or up != self.members:
            self._init_group(up, timeout_s)
        payload = self.update_payload(state, version) if lora is None else self.update_payload(state, version, lora)

        def broadcast() -> None:
            # no reference to the group outlives a call: tearing it down (close) must free it
            for t in state.values():
                self._group().broadcast(t.cuda() if self.backend == "nccl" else t, 0).wait()

        self._while(lambda: self.announce(up, payload, timeout_s), broadcast)
        return up

    def announce(self, servers: list[str], payload: protocol.UpdateFromDistributedBody, timeout_s: float) -> None:
        """``/update_weights_from_distributed`` on ``servers`` (they receive while rank 0 broadcasts)."""
        control.update_weights_from_distributed(servers, payload, timeout=timeout_s)

    def sync(self, engine: Policy, version: int) -> None:
        lora = getattr(engine, "lora", None)
        state = engine.full_state_dict() if lora is None else engine.adapter_state_dict()
        failed: str | None = None
        if engine.rank == 0 and self.addresses:
            dtype = TORCH_DTYPES[engine.cfg.actor.dtype]
            state = {k: v.detach().to(dtype).contiguous() for k, v in state.items()}
            target = None if lora is None else (lora.name, adapter_config(lora, engine.model_path, engine.actor.model))
            try:
                self._paused(version, lambda up: self._broadcast(up, state, version, target))
            except Exception as exc:
                self.close()  # a member died or refused mid-update: the group is unusable
                if self.fallback is None:
                    raise
                failed = f"{type(exc).__name__}: {exc}"
        self.last_error = tdist.broadcast_object(failed)
        if self.last_error is not None and self.fallback is not None:  # every rank: the export is collective
            self.events.append(f"{self.backend} weight broadcast failed ({self.last_error[:200]}); "
                               f"version {version} goes through disk")
            self.fallback.addresses, self.fallback.down = self.addresses, self.down
            self.fallback.sync(engine, version)
            self.events += self.fallback.events
            self.fallback.events = []
        else:
            tdist.barrier()

    def close(self) -> None:
        """Tear the group down: rank 0's connections close, so a member still waiting in one of
        its collectives (a member died or refused mid-update) fails at once."""
        group, self.group, self.members = self.group, None, []
        if group is not None:
            drop_weight_group(group)


def make_weight_sync(cfg: ExperimentConfig, addresses: Sequence[str], root: str | os.PathLike[str]) -> WeightSync:
    """The weight sync ``trainer.weight_sync`` selects: ``disk``, or a broadcast over ``nccl``
    (SGLang on GPUs) or ``gloo`` (embedded servers), which falls back to disk when it fails."""
    # SGLang updates only while generation is paused; a broadcast pauses too, as the pause is
    # what finds the servers that are up to form its group with
    pause = cfg.inference.backend != "embedded"
    disk = DiskWeightSync(addresses, root, pause=pause)
    if cfg.trainer.weight_sync == "disk":
        return disk
    world = cfg.sglang.tp_size if cfg.inference.backend == "sglang" else 1
    return DistributedWeightSync(addresses, backend=cfg.trainer.weight_sync, server_world=world,
                                 master_address=cfg.trainer.weight_sync_address,
                                 timeout_s=cfg.trainer.weight_sync_timeout or None, fallback=disk)
