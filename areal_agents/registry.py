"""Named registries for envs, agents, datasets, rewards and algorithms.

Entries are objects or lazy ``"module:attr"`` strings resolved on first use. Built-ins and
third-party packages register through the entry-point groups ``areal_agents.<kind>``; a
duplicate name is an error that names both places.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Any, TypeVar

__all__ = [
    "KINDS",
    "Registry",
    "RegistryError",
    "agents",
    "algorithms",
    "datasets",
    "envs",
    "get_registry",
    "load_object",
    "register_agent",
    "register_algorithm",
    "register_dataset",
    "register_env",
    "register_reward",
    "rewards",
]

T = TypeVar("T")
KINDS = ("envs", "agents", "datasets", "rewards", "algorithms")


class RegistryError(KeyError):
    """A name is unknown, taken twice, or its lazy entry cannot be loaded."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0]) if self.args else ""


def load_object(spec: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute."""
    if ":" not in spec:
        raise RegistryError(f"lazy entry {spec!r} must look like 'module:attr'")
    module_name, attr = spec.split(":", 1)
    return functools.reduce(getattr, attr.split("."), importlib.import_module(module_name))


def _where(obj: Any) -> str:
    if isinstance(obj, str):
        return obj
    try:
        return f"{inspect.getsourcefile(obj)}:{inspect.getsourcelines(obj)[1]}"
    except (TypeError, OSError):
        return repr(obj)


class Registry:
    """A name → object map of one kind, filled by decorators, strings and entry points."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}
        self._where: dict[str, str] = {}
        self._entry_points_loaded = False
        self._loading = threading.Lock()

    # -- registration -------------------------------------------------------------------
    def add(self, name: str, obj: Any, *, where: str | None = None, override: bool = False) -> None:
        """Register ``obj`` (or a ``"module:attr"`` string) under ``name``."""
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind}: name must be a non-empty string, got {name!r}")
        place = where or _where(obj)
        if name in self._entries and not override:
            if self._where[name] == place:  # the same definition imported twice
                return
            raise RegistryError(
                f"{self.kind}: name {name!r} is registered twice: at {self._where[name]} and at {place}"
            )
        self._entries[name] = obj
        self._where[name] = place

    def register(self, name: str, *, override: bool = False) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def deco(obj: T) -> T:
            self.add(name, obj, override=override)
            return obj

        return deco

    def entries(self) -> dict[str, tuple[Any, str]]:
        """Every registration as ``name -> (object or "module:attr", where it was defined)``."""
        return {name: (obj, self._where[name]) for name, obj in self._entries.items()}

    def remove(self, name: str) -> None:
        self._entries.pop(name, None)
        self._where.pop(name, None)

    # -- lookup ---------------------------------------------------------------------------
    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        with self._loading:  # concurrent first lookups wait for the loading thread to finish
            if self._entry_points_loaded:
                return
            try:
                for ep in entry_points(group=f"areal_agents.{self.kind}"):
                    self.add(ep.name, ep.value, where=ep.value)  # a no-op when registered from there already
            finally:
                self._entry_points_loaded = True

    def get(self, name: str) -> Any:
        """Return the object under ``name``, importing a lazy entry on first use."""
        self._load_entry_points()
        if name not in self._entries:
            known = ", ".join(sorted(self._entries)) or "none"
            raise RegistryError(f"unknown {self.kind[:-1]} {name!r}; registered: {known}")
        obj = self._entries[name]
        if isinstance(obj, str):
            try:
                self._entries[name] = obj = load_object(obj)
            except (ImportError, AttributeError) as exc:
                raise RegistryError(f"{self.kind[:-1]} {name!r}: cannot load {obj!r}: {exc}") from exc
        return obj

    def where(self, name: str) -> str:
        self._load_entry_points()
        return self._where[name]

    def names(self) -> list[str]:
        self._load_entry_points()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_entry_points()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


envs = Registry("envs")
agents = Registry("agents")
datasets = Registry("datasets")
rewards = Registry("rewards")
algorithms = Registry("algorithms")
_BY_KIND = {r.kind: r for r in (envs, agents, datasets, rewards, algorithms)}


def get_registry(kind: str) -> Registry:
    """The registry for ``kind`` (``envs``, ``agents``, ...; the singular is accepted)."""
    key = kind if kind.endswith("s") else kind + "s"
    if key not in _BY_KIND:
        raise RegistryError(f"unknown registry {kind!r}; kinds: {', '.join(KINDS)}")
    return _BY_KIND[key]


# The decorators (``override=True`` replaces a name): @register_env("name") over an
# :class:`~areal_agents.env.Env` subclass (or factory), @register_agent over an
# :class:`~areal_agents.agent.Agent` subclass (or factory), @register_dataset over a factory
# ``fn(split: str, **kwargs) -> list[dict]``, @register_reward over ``fn(completion: str, **row) -> float``,
# @register_algorithm over an algorithm spec (see ``algorithms.specs.AlgorithmSpec``).
register_env = envs.register
register_agent = agents.register
register_dataset = datasets.register
register_reward = rewards.register
register_algorithm = algorithms.register
