"""The field machinery of the config: ``f(default, help, rule)``, the rules, :class:`Section` and :class:`ConfigError`.

A field declares its constraint once, with the field (``f(default, help, rule)``, the rule one
of :func:`ge`, :func:`gt`, :func:`within`, :func:`one_of` or a :class:`Rule`); the rule is
stated in the field's help and checked in ``__post_init__`` (:class:`Section`), followed by
each section's short list of cross-field :meth:`Section.rules`. A broken rule raises
:class:`ConfigError` with the field name; :mod:`areal_agents.config.loader` adds the section
path so the user sees one line such as ``actor.lr: must be > 0 (got -1.0)``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import field
from typing import Any

__all__ = ["ConfigError", "Rule", "Section", "f", "ge", "gt", "one_of", "shown_key", "within"]


class ConfigError(ValueError):
    """A config value breaks a rule; ``key`` is the (possibly partial) dotted key."""

    def __init__(self, key: str, rule: str) -> None:
        super().__init__(f"{shown_key(key)}: {rule}")
        self.key = key
        self.rule = rule

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str]]:  # raised again across processes
        return type(self), (self.key, self.rule)


def shown_key(key: str) -> str:
    """``key`` as a one-line message names it: quoted (``repr``) when it is empty, holds control
    characters, ``": "`` or surrounding spaces, or starts with a quote, so ``KEY: rule`` still
    reads unambiguously; ordinary dotted keys stay bare."""
    plain = bool(key) and key.isprintable() and key == key.strip() and ": " not in key and key[0] not in "'\""
    return key if plain else repr(key)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A constraint on one field's value: ``ok(value)``, stated as ``must be <text>``."""

    ok: Callable[[Any], bool]
    text: str


def ge(n: float) -> Rule:
    return Rule(lambda v: v >= n, f">= {n}")


def gt(n: float) -> Rule:
    return Rule(lambda v: v > n, f"> {n}")


def within(interval: str) -> Rule:
    """``within("(0, 1]")``: a number in that interval (``(``/``)`` open, ``[``/``]`` closed)."""
    lo, hi = (float(x) for x in interval[1:-1].split(","))
    lo_ok: Callable[[Any], bool] = (lambda v: v > lo) if interval[0] == "(" else (lambda v: v >= lo)
    hi_ok: Callable[[Any], bool] = (lambda v: v < hi) if interval[-1] == ")" else (lambda v: v <= hi)
    return Rule(lambda v: lo_ok(v) and hi_ok(v), f"in {interval}")


def one_of(*choices: str) -> Rule:
    return Rule(lambda v: v in choices, f"one of {', '.join(choices)}")


def f(default: Any, help: str, rule: Rule | None = None) -> Any:  # noqa: A002 - "help" mirrors argparse
    """A dataclass field with a default (copied when mutable), a one-line help and its ``rule``,
    which :class:`Section` enforces and the help states (``Must be ...``)."""
    if rule is not None:
        help = f"{help} Must be {rule.text}{' when set' if default is None else ''}."  # noqa: A001
    metadata = {"help": help, "rule": rule}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


class Section:
    """A config section: every field against its rule, then the cross-field rules of :meth:`rules`."""

    def __post_init__(self) -> None:
        # None (unset) and an unresolved ``${...}`` interpolation (a section built directly in Python) pass
        for fld in dataclasses.fields(self):  # type: ignore[arg-type]
            rule, value = fld.metadata.get("rule"), getattr(self, fld.name)
            if rule is None or value is None or isinstance(value, str) and value.startswith("${"):
                continue
            when = " when set" if fld.default is None else ""
            if not rule.ok(value):
                raise ConfigError(fld.name, f"must be {rule.text}{when} (got {value!r})")
        for ok, key, rule in self.rules():
            if not ok:
                raise ConfigError(key, rule)

    def rules(self) -> list[tuple[bool, str, str]]:
        """``(ok, key, rule)`` for each rule that involves more than one field."""
        return []
