"""Registries: decorators, lazy entries, duplicates, entry points."""

from __future__ import annotations

import subprocess
import sys

import pytest

from areal_agents.registry import KINDS, Registry, RegistryError, get_registry


def test_decorator_and_lazy_entry():
    reg = Registry("things")

    @reg.register("one")
    def one():
        return 1

    reg.add("path-join", "os.path:join")
    assert reg.get("one") is one
    import os.path

    assert reg.get("path-join") is os.path.join
    assert reg.names() == ["one", "path-join"]
    assert "one" in reg and "two" not in reg


def test_duplicate_names_both_places():
    reg = Registry("things")
    reg.add("x", "os.path:join")
    with pytest.raises(RegistryError) as info:
        reg.add("x", "os.path:split")
    assert "os.path:join" in str(info.value) and "os.path:split" in str(info.value)


def test_unknown_and_broken_entries():
    reg = Registry("things")
    reg.add("broken", "no_such_module_xyz:thing")
    with pytest.raises(RegistryError, match="cannot load 'no_such_module_xyz:thing'"):
        reg.get("broken")
    with pytest.raises(RegistryError, match="unknown thing 'nope'; registered: broken"):
        reg.get("nope")


def test_builtins_come_from_entry_points():
    assert {"math", "math-multiturn", "guess-number", "python-tool"} <= set(get_registry("envs").names())
    assert {"grpo", "dr-grpo", "dapo", "rloo", "reinforce++", "ppo", "decoupled-ppo"} <= set(
        get_registry("algorithm").names()
    )
    assert "chat" in get_registry("agents")
    assert "math" in get_registry("rewards")
    assert "arithmetic" in get_registry("datasets")


def test_user_registration_clashes_with_builtin():
    from areal_agents import register_env

    with pytest.raises(RegistryError, match="registered twice"):

        @register_env("math")
        class Clash:  # noqa: B903 - only its name matters
            pass


def test_list_command_prints_every_registry():
    proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", "list"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for kind in KINDS:
        assert kind in proc.stdout
    assert "guess-number" in proc.stdout and "decoupled-ppo" in proc.stdout
