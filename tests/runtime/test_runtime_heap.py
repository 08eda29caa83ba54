"""freeze_setup and quiet_setup: what setup left alive is frozen out of collections; later garbage is still collected."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_freeze_setup_freezes_what_lives_and_later_cycles_are_still_collected() -> None:
    # in a process of its own: freezing is for the rest of a process's life
    code = textwrap.dedent("""
        import gc, weakref
        from areal_agents.runtime.heap import freeze_setup

        class Node:
            pass

        kept = [Node() for _ in range(1000)]
        garbage = Node(); garbage.me = garbage; del garbage  # a cycle left by setup: collected first
        freeze_setup()
        frozen = gc.get_freeze_count()
        assert frozen >= 1000, frozen
        later = Node(); later.me = later
        ref = weakref.ref(later)
        del later
        gc.collect()
        assert ref() is None, "a cycle made after the freeze was not collected"
        assert gc.get_freeze_count() == frozen and len(kept) == 1000
        defaults = gc.get_threshold()
        freeze_setup(young=50_000)  # a rollout process: young collections every 50,000 allocations
        assert gc.get_threshold() == (50_000, *defaults[1:]), gc.get_threshold()
        print("ok", frozen)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok ")


def test_quiet_setup_collects_nothing_inside_then_freezes_and_turns_the_collector_back_on() -> None:
    code = textwrap.dedent("""
        import gc, weakref
        from areal_agents.runtime.heap import quiet_setup

        class Node:
            pass

        assert gc.isenabled()
        with quiet_setup():
            assert not gc.isenabled()
            cycle = Node(); cycle.me = cycle
            ref = weakref.ref(cycle)
            del cycle
            for _ in range(200_000):  # allocations that would set off collections
                Node()
            with quiet_setup():  # nested: leaving it does not turn the collector on
                pass
            assert not gc.isenabled()
            assert ref() is not None, "a collection ran inside quiet_setup"
            kept = [Node() for _ in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() >= 1000
        gc.collect()
        assert ref() is not None, "setup's garbage is frozen, not collected"
        later = Node(); later.me = later
        ref_later = weakref.ref(later)
        del later
        gc.collect()
        assert ref_later() is None, "a cycle made after setup was not collected"

        gc.disable()  # a collector that was off stays off, also when setup raises
        try:
            with quiet_setup():
                raise KeyError("boom")
        except KeyError:
            pass
        assert not gc.isenabled()
        gc.enable()
        try:
            with quiet_setup():
                raise KeyError("boom")
        except KeyError:
            pass
        assert gc.isenabled() and len(kept) == 1000
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ok\n"


def test_keep_freed_memory_sets_the_allocator_here_and_for_children_unless_the_user_did() -> None:
    code = textwrap.dedent("""
        import os, subprocess, sys
        from areal_agents.runtime.heap import FREED_MEMORY_KEPT, keep_freed_memory

        for name in FREED_MEMORY_KEPT:
            os.environ.pop(name, None)
        assert keep_freed_memory() is True
        assert {k: os.environ[k] for k in FREED_MEMORY_KEPT} == {k: str(v) for k, v in FREED_MEMORY_KEPT.items()}
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['MALLOC_TRIM_THRESHOLD_'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
        assert child == str(64 << 20), child  # a server or rank started now reads them at its start
        assert keep_freed_memory() is False  # set: a second call (a server under a run) changes nothing
        mine = {"MALLOC_TRIM_THRESHOLD_": "131072"}  # the user's own choice is kept, the other is not added
        assert keep_freed_memory(mine) is False and mine == {"MALLOC_TRIM_THRESHOLD_": "131072"}
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
