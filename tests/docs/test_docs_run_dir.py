"""docs/run_dir.md names every file and folder a run writes, and only what the code can write.

The page's table rows are read as path patterns (``<...>`` stands for one name). A small real run
(every writer on: checkpoints, plots, TensorBoard, the episode record), then ``areal-agents eval``
into the same run directory, must leave nothing that no row names, in the run directory and in
each of its folders that rows describe the entries of (``checkpoints/``, ``logs/``, ...), nor in
the model cache; and every row not marked conditional (its last cell starts with "only") must have
been written. A conditional row must name something the source writes: its name is a string
constant or f-string pattern of the source, or one of :data:`BUILT` (names made of pieces)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_docs_metrics import SOURCES, _strings

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "run_dir.md"
CACHE = "$AREAL_AGENTS_CACHE/"  # rows of the model cache start with it; the others are relative to the run dir
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$", re.MULTILINE)

# Conditional names the source builds from pieces or leaves to a library: name -> (file, text it holds).
BUILT = {
    "final_adapter": ("trainers/engine.py", 'out.name + "_adapter"'),
    ".tmp-step_*": ("trainers/checkpoint.py", 'f".tmp-{name}"'),
    "wandb": ("trainers/metrics.py", "dir=str(self.run_dir)"),
}

# The smallest run that writes everything a default run writes: the overrides of the "math-tiny"
# warm start (tests/conftest.py WARM_RECIPES), 2 steps, a checkpoint after each.
COMMON = [
    "--env",
    "math",
    "sft.warm_start_steps=4",
    "sft.batch_size=8",
    "sft.eval_every=0",
    "eval.n=4",
    "logging.progress=false",
    "experiment_name=outputs",
]
RUN = ["trainer.total_steps=2", "trainer.save_every=1", "rollout.batch_size=2", "rollout.group_size=2", "eval.every=0"]


@dataclass(frozen=True)
class Row:
    path: str  # relative to the run dir or the cache; a folder ends with "/"
    conditional: bool  # its last cell starts with "only": a default run need not write it

    @property
    def pattern(self) -> re.Pattern[str]:
        return _pattern(self.path)

    @property
    def parent(self) -> re.Pattern[str]:
        """The folder this row names an entry of ("" for the top)."""
        head = self.path.rstrip("/").rpartition("/")[0]
        return _pattern(head + "/" if head else "")

    @property
    def name(self) -> str:
        """The last part of the path, each ``<...>`` as ``*``."""
        return re.sub(r"<[^>]+>", "*", self.path.rstrip("/").rpartition("/")[2])


def _pattern(path: str) -> re.Pattern[str]:
    return re.compile(
        "".join("[^/]+" if part.startswith("<") else re.escape(part) for part in re.split(r"(<[^>]+>)", path))
    )


def page_rows() -> list[Row]:
    rows = []
    for path, rest in ROW.findall(PAGE.read_text(encoding="utf-8")):
        cells = rest.split("|")
        assert len(cells) == 4, f"docs/run_dir.md: the row of {path} has {len(cells) + 1} cells, not 5"
        rows.append(Row(path, cells[-1].strip().startswith("only")))
    return rows


def run_rows() -> list[Row]:
    return [r for r in page_rows() if not r.path.startswith(CACHE)]


def cache_rows() -> list[Row]:
    return [Row(r.path.removeprefix(CACHE), r.conditional) for r in page_rows() if r.path.startswith(CACHE)]


def entries(root: Path, rows: list[Row], rel: str = "") -> Iterator[str]:
    """The paths under ``root`` (folders with a "/"): its entries, and those of each folder the rows
    describe the entries of."""
    for entry in sorted((root / rel).iterdir()):
        path = rel + entry.name + ("/" if entry.is_dir() else "")
        yield path
        if entry.is_dir() and any(r.parent.fullmatch(path) for r in rows):
            yield from entries(root, rows, path)


def mismatches(root: Path, rows: list[Row]) -> tuple[list[str], list[str]]:
    """What is under ``root`` that no row names, and the unconditional rows that nothing there matches."""
    found = list(entries(root, rows))
    unnamed = [p for p in found if not any(r.pattern.fullmatch(p) for r in rows)]
    unwritten = [r.path for r in rows if not r.conditional and not any(r.pattern.fullmatch(p) for p in found)]
    return unnamed, unwritten


def source_strings() -> set[str]:
    return {
        s
        for root in SOURCES
        for path in sorted((ROOT / root).rglob("*.py"))
        for s in _strings(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    }


def test_the_page_s_rows_are_unique_and_each_folder_has_a_row() -> None:
    paths = [r.path for r in page_rows()]
    assert len(paths) == len(set(paths)), sorted({p for p in paths if paths.count(p) > 1})
    for rows in (run_rows(), cache_rows()):
        folders = [r for r in rows if r.path.endswith("/")]
        for row in rows:
            head = row.path.rstrip("/").rpartition("/")[0]
            assert not head or any(f.pattern.fullmatch(head + "/") for f in folders), (
                f"no row for the folder of {row.path}"
            )
    tops = {r.path for r in run_rows() if "/" not in r.path.rstrip("/")}
    assert {"config.yaml", "metrics.jsonl", "logs/", "checkpoints/", "final/"} <= tops, tops


def test_every_conditional_row_names_something_the_source_writes() -> None:
    strings = source_strings()
    conditional = [r for r in page_rows() if r.conditional]
    assert len(conditional) >= 10, conditional  # the parse finds the marks
    for row in conditional:
        if row.name in BUILT:
            where, text = BUILT[row.name]
            assert text in (ROOT / where).read_text(encoding="utf-8"), f"{where} no longer holds {text!r} ({row.path})"
        else:
            assert row.name in strings, f"docs/run_dir.md: {row.path} is no string of the source: is it still written?"


def test_the_cache_is_where_the_code_puts_it() -> None:
    tiny = (ROOT / "trainers" / "tiny_model.py").read_text(encoding="utf-8")
    assert 'os.environ.get("AREAL_AGENTS_CACHE")' in tiny and 'Path.home() / ".cache" / "areal-agents"' in tiny
    assert "`$AREAL_AGENTS_CACHE` (default `~/.cache/areal-agents`)" in PAGE.read_text(encoding="utf-8")


def test_the_tree_check_sees_an_unnamed_file(tmp_path: Path) -> None:
    rows = [Row("a/", False), Row("a/b-<n>.txt", False), Row("c.json", True)]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b-1.txt").write_text("")
    assert mismatches(tmp_path, rows) == ([], [])
    (tmp_path / "a" / "new.txt").write_text("")
    (tmp_path / "d").mkdir()
    assert mismatches(tmp_path, rows) == (["a/new.txt", "d/"], [])
    assert mismatches(tmp_path, [*rows, Row("e.txt", False)])[1] == ["e.txt"]


def _cli(args: list[str], cache: Path) -> None:
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "areal_agents.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{args[0]} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.slow
def test_a_run_writes_only_what_the_page_names(tmp_path: Path, warm_cache: Callable[[str], Path]) -> None:
    cache = warm_cache("math-tiny")
    common = [*COMMON, f"output_dir={tmp_path / 'runs'}"]
    _cli(["run", *common, *RUN], cache)
    _cli(["eval", *common], cache)
    run_dir = tmp_path / "runs" / "outputs" / "trial"
    unnamed, unwritten = mismatches(run_dir, run_rows())
    assert not unnamed, f"the run wrote entries docs/run_dir.md does not name: {unnamed}"
    assert not unwritten, f"docs/run_dir.md names entries the run did not write (mark them 'only ...'): {unwritten}"
    assert (run_dir / "eval.json").is_file() and (run_dir / "checkpoints" / "step_00000002" / "meta.json").is_file()
    unnamed, unwritten = mismatches(cache, cache_rows())
    assert not unnamed and not unwritten, (unnamed, unwritten)
