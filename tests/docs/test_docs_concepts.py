"""docs/concepts.md matches the code: every file it names exists, every function it names next to a
file is defined there, and every room of the core is named."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONCEPTS = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
PATH = re.compile(r"`((?:areal_agents|trainers|algorithms|envs)/[\w/.]*)`")
PATH_AND_NAME = re.compile(r"`((?:areal_agents|trainers|algorithms)/[\w/]+\.py)` \(`(\w+)(?:\.(\w+))?`\)")


def test_every_named_file_exists() -> None:
    named = set(PATH.findall(CONCEPTS))
    assert len(named) > 30
    assert sorted(p for p in named if not (ROOT / p).exists()) == []


def test_every_function_named_beside_a_file_is_defined_there() -> None:
    pairs = PATH_AND_NAME.findall(CONCEPTS)
    assert len(pairs) >= 8
    missing = []
    for path, name, attr in pairs:
        text = (ROOT / path).read_text(encoding="utf-8")
        for defined in filter(None, (name, attr)):
            if not re.search(rf"^\s*(?:async def|def|class) {defined}\b", text, flags=re.M):
                missing.append(f"{path}: {defined}")
    assert missing == []


def test_every_room_of_the_core_is_named() -> None:
    core = ROOT / "areal_agents"
    rooms = [f"areal_agents/{p.name}" for p in core.glob("*.py") if p.name != "__init__.py"]
    rooms += [f"areal_agents/{p.name}/" for p in core.iterdir() if (p / "__init__.py").exists()]
    named = set(PATH.findall(CONCEPTS))
    unnamed = [room for room in rooms if not any(n == room or n.startswith(room.rstrip("/") + "/") for n in named)]
    assert unnamed == [], "name each room of areal_agents/ in docs/concepts.md"
