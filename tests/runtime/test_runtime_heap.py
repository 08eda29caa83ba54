"""freeze_setup: what setup left alive is frozen out of collections; later garbage is still collected."""

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
        print("ok", frozen)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok ")
