"""Size limits of the house: no module over 450 lines and no function over 80, in the four packages."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("areal_agents", "trainers", "algorithms", "envs")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def _long_functions(path: Path) -> list[tuple[str, int]]:
    """``(name, lines)`` of every function or method of ``path`` longer than the limit (decorators excluded)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append((node.name, lines))
    return found


def test_every_package_is_read() -> None:
    modules = _modules()
    assert {p.relative_to(REPO).parts[0] for p in modules} == set(PACKAGES)
    assert len(modules) > 100


def test_no_module_over_the_line_limit() -> None:
    too_long = {str(p.relative_to(REPO)): n for p in _modules()
                if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert too_long == {}, f"modules over {MAX_MODULE_LINES} lines: split them by responsibility"


def test_no_function_over_the_line_limit() -> None:
    too_long = {f"{p.relative_to(REPO)}:{name}": n for p in _modules() for name, n in _long_functions(p)}
    assert too_long == {}, f"functions over {MAX_FUNCTION_LINES} lines: split them"


def test_the_function_counter_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    src = tmp_path / "long.py"
    src.write_text(f"def short():\n    return 1\n\n\nasync def long():\n{body}\n", encoding="utf-8")
    assert _long_functions(src) == [("long", MAX_FUNCTION_LINES + 1)]
