"""Rollout in its own process, so that the trainer's Python never waits on the episodes' Python.

In one process the rollout loop (HTTP client, JSON, tokenising, env turns) and the trainer's
op-by-op dispatch take turns on one interpreter lock, and a train step of a small model is
spent mostly waiting for it. :class:`RolloutProcess` runs the same :class:`RolloutExecutor`
in a child process and forwards its calls over a socket: the calls of the
:class:`~areal_agents.rollout.interface.Rollout` protocol behave as the executor's, and an error
raised in the child is raised again in the caller.

The child's rollout is built by :func:`build_executor` (or the ``build`` function given, e.g. an
online run's) from the run's config, server addresses and model path. It starts from a fresh interpreter, so it receives the parent's environment variables as they
are when the build is sent (a child started early misses none set since) and registrations (envs,
agents, rewards, datasets): registered classes and functions travel by reference and are
imported again there. The script being run (``__main__``) is not imported again (unguarded, it
would start another run), so what it defines itself stays behind. The child ignores SIGINT and SIGTERM (the trainer decides when a run
stops and asks for the rollout state first) and ends when the parent closes the socket or dies.
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.config.loader import import_user_module, user_files
from areal_agents.registry import get_registry
from areal_agents.rollout.executor import RolloutExecutor
from areal_agents.rollout.group_scoring import GroupScorer, group_scorer
from areal_agents.rollout.interface import Rollout, SavedRollout
from areal_agents.runtime.heap import freeze_setup, quiet_setup
from areal_agents.runtime.lifeline import watch_parent
from areal_agents.types import Trajectory

__all__ = ["RolloutChild", "RolloutProcess", "RolloutProcessDied", "build_executor", "build_group_scorer", "registrations",
           "start_child"]

_KINDS = ("envs", "agents", "datasets", "rewards")  # what an episode looks up

Build = Callable[[ExperimentConfig, list[str], str], Rollout]
"""``build(cfg, addresses, model_path) -> Rollout``: what the child runs (a module-level function)."""


class RolloutProcessDied(RuntimeError):
    """The rollout child process ended while the trainer still needed it."""


def build_executor(cfg: ExperimentConfig, addresses: list[str], model_path: str,
                   tokenizer: Any = None) -> RolloutExecutor:
    """The RL run's rollout executor: the configured env and agent over an inference client
    for ``addresses``, cycling the training rows; the envs' rewards run in a reward runner of
    its own (``rollout.reward_*``). The client and the runner close with the executor."""
    from areal_agents.data import load_dataset_rows
    from areal_agents.rewards import RewardRunner
    from areal_agents.rollout.wiring import build_episode_fn, inference_client, sampling_params

    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
    client = inference_client(cfg, addresses, lora_path=cfg.actor.lora.served)
    runner = RewardRunner.for_rollout(cfg.rollout)

    async def close_runner() -> None:
        runner.close()

    episode_fn = build_episode_fn(cfg, tokenizer, client, sampling=sampling_params(cfg), reward_runner=runner)
    return RolloutExecutor(cfg.rollout, episode_fn=episode_fn, rows=load_dataset_rows(cfg, "train"), seed=cfg.seed,
                           shuffle=cfg.data.shuffle, turn_discount=cfg.env.turn_discount,
                           on_shutdown=[client.aclose, close_runner], group_scorer=build_group_scorer(cfg, runner))


def build_group_scorer(cfg: ExperimentConfig, runner: Any) -> GroupScorer | None:
    """The scorer of ``rollout.group_reward`` in ``runner`` (None when unset); :class:`ConfigError` when
    the name is not a group reward."""
    name = cfg.rollout.group_reward
    if name is None:
        return None
    from areal_agents.registry import RegistryError, rewards
    from areal_agents.rewards import is_group_reward

    try:
        found = rewards.get(name)
    except RegistryError as exc:
        raise ConfigError("rollout.group_reward", str(exc)) from None
    if not is_group_reward(found):
        raise ConfigError("rollout.group_reward", f"reward {name!r} scores one reply, not a group: register a "
                          "@group_reward function or a GroupJudge")
    return group_scorer(runner, name, turn_discount=cfg.env.turn_discount,
                        zero_failed=cfg.rollout.failure_policy == "zero")


def registrations(cfg: ExperimentConfig | None = None) -> bytes:
    """This process's envs, agents, datasets and rewards, pickled for the rollout child, with
    the ``.py`` files imported by path (``imports=[my_env.py]``), which the child imports first.

    Entries that cannot travel to another interpreter (a lambda, a class defined inside a
    function) are left out; ``ValueError`` names the first of them when it is the env, agent or
    dataset ``cfg`` runs.
    """
    needed: set[tuple[str, str]] = set()
    if cfg is not None:
        dataset = cfg.data.name or getattr(get_registry("envs").get(cfg.env.name), "default_dataset", None)
        needed = {("envs", cfg.env.name), ("agents", cfg.agent.name), ("datasets", str(dataset))}
    sendable: dict[str, dict[str, tuple[Any, str]]] = {}
    for kind in _KINDS:
        for name, entry in get_registry(kind).entries().items():
            try:
                _NoMainPickler(io.BytesIO()).dump(entry)
            except Exception as exc:  # noqa: BLE001 - pickle raises several kinds
                if (kind, name) in needed:
                    raise ValueError(f"{kind[:-1]} {name!r} cannot be sent to the rollout process "
                                     f"({type(exc).__name__}: {exc}); define it at module level") from None
                continue
            sendable.setdefault(kind, {})[name] = entry
    return pickle.dumps((user_files(), pickle.dumps(sendable)))


class _NoMainPickler(pickle.Pickler):
    """Refuses classes and functions of ``__main__``, which the child does not import (see the module doc)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and obj.__module__ == "__main__":
            raise pickle.PicklingError(f"{obj.__qualname__} is defined in the script being run (__main__); "
                                       "move it into a module")
        return NotImplemented


def _register(blob: bytes) -> None:
    files, entries_blob = pickle.loads(blob)
    for path in files.values():  # before the entries that refer to them by module name
        import_user_module(path)
    for kind, entries in pickle.loads(entries_blob).items():
        registry = get_registry(kind)
        for name, (obj, where) in entries.items():
            if name not in registry:
                registry.add(name, obj, where=where)


def _child(fd: int) -> None:
    """The child's entry point (``python -c``): takes the parent's ``sys.path`` and environment
    variables (as they are when the build is sent), builds the executor, then answers calls
    (``shutdown`` among them) until the parent closes the socket or is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch_parent(os.getppid(), signal=signal.SIGKILL)  # even while a call blocks (its reply has nobody to go to)
    conn = Connection(fd)
    executor: Rollout | None = None
    try:
        with quiet_setup():  # the run's modules, its registrations and the tokenizer: no collections
            from transformers import AutoTokenizer  # noqa: F401 - what builds load (2 s), before the build comes
            path, environ = conn.recv()  # first, so that what comes next is unpickled with them
            sys.path[:] = path
            os.environ.clear()
            os.environ.update(environ)  # as the parent's when it sent the build ($AREAL_AGENTS_JUDGE_URL, ...)
            blob, cfg, addresses, model_path, build = conn.recv()
            try:
                _register(blob)
                executor = build(cfg, addresses, model_path)
            except Exception as exc:  # noqa: BLE001 - the build failed: the parent raises it
                conn.send((0, False, _portable(exc)))
                return
        # Setup's objects (modules, tokenizer, config, the executor) live for the whole run: the
        # full collections that episodes set off skip them; young collections come 70x less often.
        freeze_setup(young=50_000)
        # The parent's calls wait for the interpreter lock that the episodes' thread holds: it
        # hands it over after at most this long (default 5 ms; a step makes about six calls)
        sys.setswitchinterval(0.0005)
        conn.send((0, True, None))
        while True:
            seq, name, call_args = conn.recv()
            try:
                attr = getattr(executor, name)
                result = attr(*call_args) if callable(attr) else attr
                reply = (seq, True, None if result is executor else result)
            except Exception as exc:  # noqa: BLE001 - raised again in the parent
                reply = (seq, False, _portable(exc))
            conn.send(reply)
    except (EOFError, OSError):  # the parent is gone
        pass
    finally:
        if executor is not None:
            executor.shutdown()


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling, else a RuntimeError with its message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__name__}: {exc}")


RolloutChild = tuple["subprocess.Popen[bytes]", Connection]
"""A started rollout child (:func:`start_child`) and the connection to it."""


def start_child() -> RolloutChild:
    """A rollout child in a fresh interpreter (the script that started the run is not imported
    again), started before :class:`RolloutProcess` gives it its rollout: meanwhile it imports what
    every build loads (transformers' tokenizers, about 2 s on 2 CPU cores), while the run waits for
    its servers and builds its trainer. Hand it to :class:`RolloutProcess` (``child=``) or close
    the connection: the child then exits."""
    ours, theirs = socket.socketpair()
    with theirs:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"from areal_agents.rollout.process import _child; _child({theirs.fileno()})"],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
    return proc, Connection(ours.detach())


class RolloutProcess:
    """``build(cfg, addresses, model_path)`` (default :func:`build_executor`) in a child process
    (see the module doc).

    ``registrations_blob`` comes from :func:`registrations`; ``child`` is one started earlier by
    :func:`start_child` (default: a new one). The child builds its executor while the caller goes
    on; the first call waits for it and raises the error if building it failed. Implements
    :class:`~areal_agents.rollout.interface.Rollout`.
    """

    runs_in = "its own process"

    def __init__(self, cfg: ExperimentConfig, addresses: list[str], model_path: str, *,
                 registrations_blob: bytes, build: Build = build_executor, child: RolloutChild | None = None) -> None:
        self._proc, self._conn = child or start_child()
        self._conn.send((list(sys.path), dict(os.environ)))
        self._conn.send((registrations_blob, cfg, list(addresses), model_path, build))
        self.cfg = cfg.rollout
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._closed = self._started = self._built = False

    def _reply(self, seq: int, timeout: float | None) -> Any:
        """The child's answer to call ``seq`` (answers to calls abandoned earlier are skipped)."""
        waited = 0.0
        while True:
            while not self._conn.poll(0.25):
                waited += 0.25
                if self._proc.poll() is not None:
                    raise RolloutProcessDied(f"the rollout process exited (exit code {self._proc.returncode})")
                if timeout is not None and waited >= timeout:
                    raise TimeoutError(f"the rollout process did not answer within {timeout:.0f} s")
            try:
                got, ok, value = self._conn.recv()
            except (EOFError, OSError):
                raise RolloutProcessDied(f"the rollout process exited (exit code {self._exit_code()})") from None
            if got == seq:
                if not ok:
                    raise value
                return value

    def _call(self, name: str, *args: Any, timeout: float | None = None) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError("rollout process is shut down")
            if not self._built:  # the child's first answer: its executor is built, or why not
                self._built = True
                self._reply(0, timeout)
            seq = next(self._seq)
            try:
                self._conn.send((seq, name, args))
            except (BrokenPipeError, OSError):
                raise RolloutProcessDied(f"the rollout process exited (exit code {self._exit_code()})") from None
            return self._reply(seq, timeout)

    # -- the executor's calls ------------------------------------------------------------------
    def start(self) -> RolloutProcess:
        self._call("start")
        self._started = True
        return self

    def pause(self) -> None:
        self._call("pause")

    def resume(self) -> None:
        self._call("resume")

    def set_version(self, version: int) -> None:
        self._call("set_version", version)

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`shutdown` (known here: no call to the child)."""
        return self._started and not self._closed

    @property
    def bounded_staleness(self) -> bool:
        return bool(self._call("bounded_staleness"))

    @bounded_staleness.setter
    def bounded_staleness(self, value: bool) -> None:
        self._call("__setattr__", "bounded_staleness", bool(value))

    def wait(self, count: int, timeout: float | None = None) -> list[list[Trajectory]]:
        return self._call("wait", count, timeout)  # type: ignore[no-any-return]

    def prepare_batch(self, timeout: float | None = None) -> list[list[Trajectory]]:
        return self._call("prepare_batch", timeout)  # type: ignore[no-any-return]

    def take_failed(self) -> list[Trajectory]:
        return list(self._call("take_failed"))

    def stats(self) -> dict[str, float]:
        return dict(self._call("stats"))

    def counts(self) -> dict[str, int]:
        return dict(self._call("counts"))

    def state_dict(self) -> SavedRollout:
        state: SavedRollout = self._call("state_dict")  # the child's rollout's, unpickled
        return state

    def load_state_dict(self, state: Any) -> None:
        self._call("load_state_dict", state)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the child's executor (its episodes cancelled, servers left running) and the child."""
        if self._closed:
            return
        try:
            if self._proc.poll() is None:
                self._call("shutdown", timeout, timeout=timeout + 5.0)
        except (RolloutProcessDied, TimeoutError, RuntimeError):
            pass
        finally:
            self._closed = True
            self._conn.close()
            if self._exit_code() is None:
                self._proc.kill()
                self._proc.wait()

    def _exit_code(self, wait: float = 5.0) -> int | None:
        """The child's exit code, waiting up to ``wait`` s for it to end (None: still running)."""
        try:
            return self._proc.wait(wait)
        except subprocess.TimeoutExpired:
            return None


_IMPLEMENTS: tuple[type[Rollout], ...] = (RolloutExecutor, RolloutProcess)  # checked by mypy: both are Rollouts
