"""docs/metrics.md names every metric key a run writes, and only those: the keys are read from
the source (string constants and f-strings starting with a metric prefix) and from the tables of
the page, and the two sets must be equal, so the page cannot go stale either way."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "metrics.md"
SOURCES = ("areal_agents", "trainers", "algorithms")
PREFIXES = ("train", "rollout", "eval", "time", "perf", "staleness", "sync", "inference", "critic", "sft", "online")
KEY = re.compile(rf"^(?:{'|'.join(PREFIXES)})/\S*$")
DOC_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|", re.MULTILINE)


def _render(node: ast.JoinedStr) -> str:
    """An f-string as a pattern: each ``{...}`` becomes ``*``."""
    return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "*" for v in node.values)


def _strings(tree: ast.AST) -> set[str]:
    """Every string constant and f-string pattern of ``tree`` (the literal parts of an f-string
    are not counted on their own)."""
    inside = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.add(_render(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside:
            out.add(node.value)
    return out


def _parse(relative: str) -> ast.Module:
    return ast.parse((ROOT / relative).read_text(encoding="utf-8"), filename=relative)


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"expected one function {name!r}, found {len(found)}"
    return found[0]


def _dict_keys(node: ast.AST) -> set[str]:
    """The string keys of the dict literals under ``node``."""
    return {k.value for d in ast.walk(node) if isinstance(d, ast.Dict)
            for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


@functools.cache
def code_keys() -> frozenset[str]:
    """The metric keys the source writes, f-string families as ``prefix/*`` patterns."""
    keys = {s for root in SOURCES for path in sorted((ROOT / root).rglob("*.py"))
            for s in _strings(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))) if KEY.match(s)}
    # Two families are named by a dict comprehension over the keys of another dict, so the walk
    # sees only "prefix/*": expand each from the dict literal its names come from.
    # 1. RolloutExecutor.stats(): f"rollout/{k}" over counts(), all but ready_groups.
    assert "rollout/*" in keys, "executor.stats() no longer builds rollout/{k}: update this test"
    counts = _dict_keys(_function(_parse("areal_agents/rollout/executor.py"), "counts"))
    assert "ready_groups" in counts, counts  # the one counter stats() leaves out
    keys |= {f"rollout/{k}" for k in counts - {"ready_groups"}}
    # 2. trainers.loop.train_step: f"train/{k}" over the engine's own step metrics (the names
    #    without a "/"; the loss function's are already prefixed and found above).
    assert "train/*" in keys, "train_step no longer builds train/{k}: update this test"
    engine = _dict_keys(_function(_parse("trainers/engine.py"), "_train_minibatch"))
    keys |= {f"train/{k}" for k in engine if "/" not in k}
    keys -= {"rollout/*", "train/*"}
    # Two keys without a prefix: the row's step (MetricsLogger.log) and the weight version (loop).
    for name, where in (("step", "trainers/metrics.py"), ("version", "trainers/loop.py")):
        assert name in _dict_keys(_parse(where)), f"{where} no longer writes {name!r}: update this test"
        keys.add(name)
    return frozenset(keys)


def documented_keys() -> set[str]:
    """The first-column keys of the page's tables, ``<name>`` placeholders as ``*``."""
    return {re.sub(r"<[^>]+>", "*", k) for k in DOC_ROW.findall(PAGE.read_text(encoding="utf-8"))}


def test_every_metric_key_is_documented() -> None:
    missing = code_keys() - documented_keys()
    assert not missing, f"metric keys written by the code but not in docs/metrics.md: {sorted(missing)}"


def test_every_documented_metric_key_is_still_written() -> None:
    gone = documented_keys() - code_keys()
    assert not gone, f"docs/metrics.md names keys the code no longer writes: {sorted(gone)}"


def test_the_walk_finds_the_known_families() -> None:
    """The collection itself works: a sample of keys of each kind is found."""
    keys = code_keys()
    for key in ("train/loss", "train/grad_norm", "rollout/reward", "rollout/failed/*", "rollout/submitted",
                "eval/pass@*", "time/elapsed_s", "perf/gen_tokens_per_s", "staleness/max", "step", "version"):
        assert key in keys, key
