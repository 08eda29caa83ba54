"""Rules the test suite holds itself to, checked on its own source.

No wall-clock bound in the default (non-slow) set: an ``assert`` there never orders a reading
of the clock (``time.monotonic()``, ``time.perf_counter()``, ``time.time()``) or a name computed
from one. How soon something happens is a benchmark figure or a slow test; default tests wait
for events, or poll with a deadline (a ``while`` loop, then an assert on the outcome).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)

__all__: list[str] = []


def _reads_clock(node: ast.AST, derived: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in CLOCKS \
                and isinstance(sub.func.value, ast.Name) and sub.func.value.id == "time":
            return True
        if isinstance(sub, ast.Name) and sub.id in derived:
            return True
    return False


def _is_clock_call(node: ast.AST) -> bool:
    return _reads_clock(node, set()) and isinstance(node, ast.Call)


def _is_deadline_check(cmp: ast.Compare, deadlines: set[str]) -> bool:
    """``time.monotonic() < deadline`` (``deadline = time.monotonic() + N``): polling, not a bound."""
    sides = [cmp.left, *cmp.comparators]
    return len(sides) == 2 and any(_is_clock_call(s) for s in sides) and \
        any(isinstance(s, ast.Name) and s.id in deadlines for s in sides)


def _is_slow(decorators: list[ast.expr]) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr == "slow" for d in decorators)


def _clock_bounds(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[int]:
    """Lines of asserts in ``func`` that order a clock reading (names assigned from one count)."""
    derived: set[str] = set()
    deadlines: set[str] = set()
    body = [n for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Assert))]
    for node in sorted(body, key=lambda n: n.lineno):  # assignments before the asserts that use them
        if isinstance(node, ast.Assert) or node.value is None:
            continue
        value = node.value
        names = {t.id for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 for t in ast.walk(target) if isinstance(t, ast.Name)}
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add) and _is_clock_call(value.left):
            deadlines |= names  # deadline = time.monotonic() + N
        elif _reads_clock(value, derived):
            derived |= names
    return [a.lineno for a in body if isinstance(a, ast.Assert) for c in ast.walk(a.test)
            if isinstance(c, ast.Compare) and any(isinstance(op, ORDER) for op in c.ops)
            and _reads_clock(c, derived) and not _is_deadline_check(c, deadlines)]


def clock_bounds_in_default_set(source: str) -> list[int]:
    """Lines of wall-clock bounds in test functions (and their helpers) not marked slow."""
    tree = ast.parse(source)
    module_slow = any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                        for t in n.targets) and "slow" in ast.dump(n.value)
                      for n in tree.body)
    if module_slow:
        return []
    lines: list[int] = []
    for node in tree.body:
        funcs = [node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
            [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))] \
            if isinstance(node, ast.ClassDef) else []
        lines += [line for f in funcs if not _is_slow(f.decorator_list) for line in _clock_bounds(f)]
    return lines


def test_the_rule_sees_bounds_and_lets_deadlines_and_slow_tests_be() -> None:
    source = '''
import time, pytest

def test_bound():
    t0 = time.monotonic()
    took = time.monotonic() - t0
    assert took < 2

def test_inline():
    t0 = time.perf_counter()
    assert 0.9 < time.perf_counter() - t0

def test_deadline():
    deadline = time.monotonic() + 30
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done()
    while not done():
        assert time.monotonic() < deadline, "no progress"

@pytest.mark.slow
def test_slow_bound():
    t0 = time.monotonic()
    assert time.monotonic() - t0 < 20
'''
    assert clock_bounds_in_default_set(source) == [7, 11]  # the bounds; not the deadline, not the slow test


def test_no_wall_clock_bounds_in_the_default_set() -> None:
    found = {str(path.relative_to(TESTS)): lines for path in sorted(TESTS.rglob("test_*.py"))
             if (lines := clock_bounds_in_default_set(path.read_text()))}
    assert found == {}, f"wall-clock asserts in default tests (file: lines): {found}"
