"""``launcher=ray``: the inference servers and the trainer ranks as Ray actors, across nodes.

    driver (areal-agents run)            Ray cluster
      ray.init(ray.address) ──────────►  placement group "servers": one bundle per server
                                           ServerActor i ─► embedded / SGLang server on <node IP>:<port>
                                         placement group "trainers": nnodes x nproc bundles
                                           RankActor r ─► areal-agents run (RANK=r, MASTER_ADDR=rank 0's IP)
      waits on every rank (ray.wait) ◄── exit codes / actor deaths

Rank 0 keeps its duties of a local run (rollout executor, eval, logs, checkpoints): its config
says ``inference.backend=remote`` with the servers' addresses. Placement: ``ray.strategy``,
``ray.server_resource`` / ``ray.trainer_resource`` (custom node resources) and ``ray.separate``
(trainer ranks avoid the servers' nodes). A request the cluster cannot meet is a one-line
:class:`RayLaunchError` naming the resource. A rank that ends badly or whose actor dies stops
the run at once (the last checkpoint stays; ``trainer.recover=auto`` resumes it); a server
actor that dies is restarted by Ray on its node and port (``ray.server_restarts``) while the
run goes on without it. Whatever happens, :meth:`RayRun.close` stops the servers, kills every
actor and removes the placement groups.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.config.loader import to_yaml
from areal_agents.failures import message_line
from areal_agents.inference.launcher import LaunchError
from trainers.ray_actors import RankActor, ServerActor

__all__ = ["RayLaunchError", "RayRun", "run_on_ray"]

_STANDARD = ("CPU", "GPU", "memory", "object_store_memory")
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


class RayLaunchError(LaunchError):
    """The cluster cannot take the run (resources, visibility) or a trainer rank failed."""

    names_its_cause = True  # the CLI prints the message alone


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("launcher", "ray is not installed: pip install 'areal-agents[ray]'") from None
    return ray


def _fmt(bundle: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in bundle.items()) + "}"


def _bundle(cpus: float, gpus: float, label: str | None) -> dict[str, float]:
    bundle = {"CPU": float(cpus)}
    if gpus:
        bundle["GPU"] = float(gpus)
    if label:
        bundle[label] = 0.001  # any node carrying the label; many actors per node
    return bundle


def server_bundle(cfg: ExperimentConfig) -> dict[str, float]:
    """What one inference server reserves: CPUs, its GPUs (SGLang: tp_size) and the node label."""
    gpus = cfg.sglang.tp_size if cfg.inference.backend == "sglang" else float(cfg.inference.device == "cuda")
    return _bundle(cfg.ray.cpus_per_server, gpus, cfg.ray.server_resource)


def trainer_bundle(cfg: ExperimentConfig) -> dict[str, float]:
    """What one trainer rank reserves: CPUs, one GPU on CUDA, the node label."""
    return _bundle(cfg.ray.cpus_per_trainer, float(cfg.trainer.device == "cuda"), cfg.ray.trainer_resource)


class RayRun(contextlib.AbstractContextManager["RayRun"]):
    """One run's actors and placement groups on a Ray cluster; a context manager that tears them down."""

    def __init__(self, cfg: ExperimentConfig, model_path: str, *, out: Any = None) -> None:
        self.ray = _ray()
        self.cfg, self.model_path, self.out = cfg, model_path, out or sys.stderr
        self.run_dir = Path(cfg.run_dir)
        self.pgs: list[Any] = []
        self.servers: list[Any] = []
        self.ranks: list[Any] = []
        self.placement: dict[str, list[dict[str, Any]]] = {"servers": [], "ranks": []}

    # -- cluster -------------------------------------------------------------------------------
    def connect(self) -> None:
        ray = self.ray
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False} if self.cfg.ray.address is None else {}
            ray.init(address=self.cfg.ray.address, logging_level="warning", log_to_driver=True, **kwargs)
        self.note(f"ray: {len(self._nodes())} node(s), {ray.cluster_resources().get('CPU', 0):g} CPUs")

    def note(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.ray.nodes() if n.get("Alive")]

    def _labels(self, node_id: str) -> list[str]:
        """The custom resources of node ``node_id`` (``node_a``...), for the placement record."""
        for n in self._nodes():
            if n["NodeID"] == node_id:
                return sorted(k for k in n["Resources"] if k not in _STANDARD and not k.startswith("node:"))
        return []

    def check_feasible(self, bundle: dict[str, float], count: int, what: str) -> None:
        """Fail at once, naming the resource, when no node (or not the whole cluster) has it."""
        nodes = [n["Resources"] for n in self._nodes()]
        for key, need in bundle.items():
            have = sum(r.get(key, 0.0) for r in nodes)
            if not any(r.get(key, 0.0) >= need for r in nodes):
                raise RayLaunchError(f"ray: {what} need {key}={need:g} per {'bundle'} but no node of the cluster "
                                     f"has it (cluster total {key}={have:g})")
            if key in ("CPU", "GPU") and have < need * count:
                raise RayLaunchError(f"ray: {what} need {key}={need * count:g} in all ({count} x {_fmt(bundle)}) "
                                     f"but the cluster has {key}={have:g}")

    def place(self, bundle: dict[str, float], count: int, what: str, avoid: list[str] | None = None) -> Any:
        """A ready placement group of ``count`` x ``bundle`` (``avoid``: node ids to keep off)."""
        from ray.util.placement_group import placement_group, remove_placement_group

        self.check_feasible(bundle, count, what)
        kwargs: dict[str, Any] = {}
        if avoid:
            kwargs["bundle_label_selector"] = [{"ray.io/node-id": f"!in({','.join(avoid)})"}] * count
        pg = placement_group([dict(bundle) for _ in range(count)], strategy=self.cfg.ray.strategy, **kwargs)
        self.pgs.append(pg)
        ready, _ = self.ray.wait([pg.ready()], timeout=self.cfg.ray.placement_timeout)
        if not ready:
            remove_placement_group(pg)
            self.pgs.remove(pg)
            free = {k: round(v, 3) for k, v in self.ray.available_resources().items() if k in (*_STANDARD[:2], *bundle)}
            raise RayLaunchError(
                f"ray: cannot place {what} ({count} x {_fmt(bundle)}, strategy {self.cfg.ray.strategy}"
                f"{', off the servers nodes' if avoid else ''}) within ray.placement_timeout="
                f"{self.cfg.ray.placement_timeout:g}s; free now: {free}")
        return pg

    def _actors(self, cls: type, bundle: dict[str, float], what: str, args: list[tuple[Any, ...]],
                avoid: list[str] | None = None, **options: Any) -> list[Any]:
        """An actor of ``cls`` for each of ``args`` (its constructor's), one per bundle of a new
        placement group (``avoid`` as in :meth:`place`; ``options``: Ray's)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as Strategy

        pg = self.place(bundle, len(args), what, avoid)
        actor = self.ray.remote(cls)
        return [actor.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), **options,
                              scheduling_strategy=Strategy(pg, placement_group_bundle_index=i)).remote(*a)
                for i, a in enumerate(args)]

    def _placed(self, key: str, what: str, infos: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
        """Record where the actors of ``key`` run (``infos``, with their nodes' labels) and say so."""
        for info in infos:
            info["labels"] = self._labels(info["node_id"])
        self.placement[key] = infos
        self.note(f"ray: {what} " + ", ".join(f"{i[name]} ({' '.join(i['labels']) or i['ip']})" for i in infos))
        return infos

    # -- servers -------------------------------------------------------------------------------
    def start_servers(self) -> list[str]:
        """``inference.num_servers`` server actors, each in its bundle; their addresses."""
        cfg, ray = self.cfg, self.ray
        if cfg.inference.backend == "remote":
            return list(cfg.inference.addresses)
        n = cfg.inference.num_servers
        logs = str(self.run_dir / "logs")
        self.servers = self._actors(ServerActor, server_bundle(cfg), f"{n} inference server(s)",
                                    [(cfg, self.model_path, i, logs) for i in range(n)],
                                    max_restarts=cfg.ray.server_restarts)
        try:
            infos = ray.get([s.describe.remote() for s in self.servers], timeout=cfg.inference.setup_timeout + 60)
        except ray.exceptions.RayActorError as exc:
            raise RayLaunchError(f"ray: an inference server did not start: {message_line(exc, last=True)}") from None
        except ray.exceptions.GetTimeoutError:
            raise RayLaunchError(f"ray: inference servers not up within inference.setup_timeout="
                                 f"{cfg.inference.setup_timeout:g}s (+60 s to start their actors)") from None
        return [i["address"] for i in self._placed("servers", "inference servers", infos, "address")]

    # -- trainer ranks -------------------------------------------------------------------------
    def _avoid(self) -> list[str]:
        """Node ids the ranks keep off: the servers' nodes, when ``ray.separate`` and some node has none."""
        if not self.cfg.ray.separate or self.cfg.ray.trainer_resource or not self.placement["servers"]:
            return []
        used = sorted({i["node_id"] for i in self.placement["servers"]})
        if len({n["NodeID"] for n in self._nodes()} - set(used)) == 0:
            self.note("ray: every node holds a server; the trainer ranks share them (ray.separate)")
            return []
        return used

    def start_ranks(self) -> list[dict[str, Any]]:
        """``trainer.nnodes x trainer.nproc`` rank actors; where each one runs."""
        world = self.cfg.trainer.nnodes * self.cfg.trainer.nproc
        self.ranks = self._actors(RankActor, trainer_bundle(self.cfg), f"{world} trainer rank(s)", [()] * world,
                                  avoid=self._avoid(), max_restarts=0, max_concurrency=2)
        infos = self.ray.get([a.describe.remote() for a in self.ranks], timeout=120)
        return self._placed("ranks", "trainer ranks", [{**i, "rank": r} for r, i in enumerate(infos)], "rank")

    def check_visible(self) -> None:
        """The model (and, for disk weight sync, the weights dir) must exist on every node."""
        weights = Path(self.cfg.weights_dir)
        weights.mkdir(parents=True, exist_ok=True)
        probe = weights / f".visible-{uuid.uuid4().hex[:8]}"
        probe.write_text("")
        try:
            checks = [(a, i, f"server {n}") for n, (a, i) in enumerate(zip(self.servers, self.placement["servers"],
                                                                             strict=True))]
            checks += [(a, i, f"trainer rank {i['rank']}") for a, i in zip(self.ranks, self.placement["ranks"],
                                                                           strict=True)]
            paths = [self.model_path] + ([str(probe)] if self.cfg.trainer.weight_sync == "disk" else [])
            for actor, info, who in checks:
                missing = self.ray.get(actor.missing_paths.remote(paths), timeout=60)
                if self.model_path in missing:
                    raise RayLaunchError(f"actor.path: {self.model_path} is not on node {info['ip']} ({who}); "
                                         "every node needs the model at the same path")
                if missing:
                    key = "ray.shared_dir" if self.cfg.ray.shared_dir else "output_dir"
                    raise RayLaunchError(f"{key}: {weights} is not visible on node {info['ip']} ({who}); disk "
                                         "weight sync needs a directory every node sees (set ray.shared_dir)")
        finally:
            probe.unlink(missing_ok=True)

    def rank_config(self, addresses: list[str], master: str) -> str:
        """The YAML every rank runs: this config, attached to the placed servers."""
        rc = copy.deepcopy(self.cfg)
        rc.launcher, rc.allocation_mode, rc.actor.path = "local", None, self.model_path
        if self.servers:
            rc.inference.backend, rc.inference.addresses = "remote", addresses
        if rc.trainer.weight_sync != "disk" and rc.trainer.weight_sync_address in _LOOPBACK:
            rc.trainer.weight_sync_address = master  # the servers join rank 0's group from their nodes
        if rc.trainer.device == "cuda":
            rc.trainer.first_gpu = 0  # each rank actor sees its own GPU as cuda:0
        return to_yaml(rc)

    def train(self, addresses: list[str]) -> int:
        """Run every rank to the end; 0, or 1 with a one-line error when a rank fails or dies."""
        ray, infos = self.ray, self.placement["ranks"]
        master, port = infos[0]["ip"], ray.get(self.ranks[0].free_port.remote())
        text = self.rank_config(addresses, master)
        per_node: dict[str, int] = {}
        refs: dict[Any, int] = {}
        for r, (actor, info) in enumerate(zip(self.ranks, infos, strict=True)):
            local = per_node.get(info["node_id"], 0)
            per_node[info["node_id"]] = local + 1
            env = {"RANK": str(r), "WORLD_SIZE": str(len(self.ranks)), "MASTER_ADDR": master,
                   "MASTER_PORT": str(port), "LOCAL_RANK": "0" if self.cfg.trainer.device == "cuda" else str(local),
                   "OMP_NUM_THREADS": str(max(1, int(self.cfg.ray.cpus_per_trainer)))}
            refs[actor.run.remote(text, env, os.getcwd())] = r
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                for ref in done:
                    r = refs[ref]
                    try:
                        code = ray.get(ref)
                    except ray.exceptions.RayActorError as exc:
                        return self._failed(r, f"died ({message_line(exc, last=True)})")
                    if code != 0:
                        return self._failed(r, f"exited with code {code}")
        except KeyboardInterrupt:
            self.interrupt(pending)
            raise
        return 0

    def _failed(self, rank: int, how: str) -> int:
        ip = self.placement["ranks"][rank]["ip"]
        self.note(f"error: trainer rank {rank} (node {ip}) {how}; the run is stopped. Checkpoints in "
                  f"{self.run_dir / 'checkpoints'} are kept: the same command resumes (trainer.recover=auto)")
        return 1

    def interrupt(self, pending: list[Any], timeout: float = 120.0) -> None:
        """Ctrl-C / SIGTERM: each rank saves a checkpoint at its step boundary and leaves."""
        self.note("ray: interrupted; the trainer ranks save a checkpoint and stop")
        ray = self.ray
        with contextlib.suppress(ray.exceptions.RayError, KeyboardInterrupt):
            ray.get([a.terminate.remote() for a in self.ranks], timeout=10)
            ray.wait(pending, num_returns=len(pending), timeout=timeout)

    def write_placement(self) -> None:
        path = self.run_dir / "ray_placement.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.placement, indent=2) + "\n")

    # -- teardown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the servers, kill every actor, remove the placement groups, disconnect."""
        ray = self.ray
        if not ray.is_initialized():
            return
        from ray.util.placement_group import remove_placement_group

        if self.servers:
            ray.wait([s.stop.remote() for s in self.servers], num_returns=len(self.servers), timeout=20)
        for actor in [*self.servers, *self.ranks]:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(actor, no_restart=True)
        for pg in self.pgs:
            with contextlib.suppress(Exception):  # already removed
                remove_placement_group(pg)
        self.servers, self.ranks, self.pgs = [], [], []
        ray.shutdown()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_on_ray(cfg: ExperimentConfig) -> int:
    """``areal-agents run launcher=ray``: place, train, tear down; the exit code."""
    _ray()
    cfg = copy.deepcopy(cfg)
    cfg.output_dir = str(Path(cfg.output_dir).resolve())  # the same run dir on every node
    if cfg.ray.shared_dir:
        cfg.ray.shared_dir = str(Path(cfg.ray.shared_dir).resolve())
    model_path = cfg.actor.path
    if model_path is None:
        from trainers.sft import ensure_warm_model

        model_path = str(ensure_warm_model(cfg, progress=cfg.logging.progress, warm_start=True))
    model_path = str(Path(model_path).resolve())
    t0 = time.monotonic()
    previous: Callable[[int, FrameType | None], object] | int | None = None
    try:
        with RayRun(cfg, model_path) as job:
            job.connect()
            # after ray.init, whose own SIGTERM handler aborts the driver before anything is saved
            previous = signal.signal(signal.SIGTERM, _raise_interrupt)
            addresses = job.start_servers()
            job.start_ranks()
            job.write_placement()
            job.check_visible()
            code = job.train(addresses)
            job.note(f"ray: run ended with code {code} after {time.monotonic() - t0:.0f}s")
            return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
