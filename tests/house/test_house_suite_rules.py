"""Rules the test suite holds itself to, checked on its own source (every ``.py`` under ``tests/``,
slow tests included: CI runs them all).

**No clock decides a test.** Neither an ``assert`` nor an ``if`` orders (``<``, ``<=``, ``>``,
``>=``) a clock value. A clock value is a reading of ``time.monotonic/perf_counter/time`` (and
their ``_ns`` forms) by attribute or by a name imported ``from time``, any ``X.time()`` call
(``loop.time()``, ``asyncio.get_running_loop().time()``), ``datetime.now()``, a name or attribute
assigned from one, or what a function of the same file returns when its ``return`` holds one
(``took = asyncio.run(timed())``). An ``assert`` on it is a latency claim that a loaded machine
breaks; an ``if`` on it guards a check that passes vacuously when the machine is slow. The one
allowed comparison is the deadline check of a poll, a clock reading against a name assigned
``<clock> + N`` (``while not done() and time.monotonic() < deadline``, or ``assert
time.monotonic() < deadline, "no progress"`` inside such a loop): the test then asserts the
outcome, never the time. ``while`` conditions are polls and stay free. How soon something
happens is a figure for ``benchmarks/``.

**No sleep-then-act.** A statement ``time.sleep(C)`` / ``await asyncio.sleep(C)`` (also by a
name imported from ``time`` or ``asyncio``) whose argument is a positive numeric literal, outside
the body of a ``while`` loop and followed by another statement in the same block (a module-level
name bound to such a number counts as the number), bets that the
thing slept for has happened by then: the next statement acts on a state no one waited for. Wait
for the state instead (poll it in a ``while`` loop with a deadline, or wait on an event). Not
covered, on purpose: a sleep that ends its block (a hang for fault injection), a sleep in a
``while`` body (a poll interval), ``sleep(0)`` (yields once to the event loop) and sleeps whose
length is computed (jitter in load generators).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
Func = ast.FunctionDef | ast.AsyncFunctionDef

__all__: list[str] = []


def _key(node: ast.AST) -> str | None:
    """``x`` for a name, ``a.b.c`` for a dotted attribute, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _key(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def _targets(node: ast.AST) -> set[str]:
    """What an assignment target binds: names, dotted attributes, the container of a subscript."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return {k for e in node.elts for k in _targets(e)}
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    if isinstance(node, ast.Subscript):
        return _targets(node.value)
    key = _key(node)
    return {key} if key else set()


class _Clocks:
    """What reads the clock in one file: imported clock names and timing functions."""

    def __init__(self, tree: ast.Module) -> None:
        self.imported: set[str] = set()  # from time import monotonic [as m]
        self.sleeps: set[str] = set()  # from time/asyncio import sleep
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("time", "asyncio"):
                for alias in node.names:
                    if node.module == "time" and alias.name in CLOCKS:
                        self.imported.add(alias.asname or alias.name)
                    if alias.name == "sleep":
                        self.sleeps.add(alias.asname or alias.name)
        self.constants: dict[str, float] = {}  # module-level NAME = <number>
        for stmt in tree.body:
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else \
                stmt.target if isinstance(stmt, ast.AnnAssign) else None
            value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant) \
                    and isinstance(value.value, (int, float)) and not isinstance(value.value, bool):
                self.constants[target.id] = float(value.value)
        self.timers: set[str] = set()  # functions whose return value holds a clock value
        funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        changed = True
        while changed:  # a helper returning what a timing helper returned is a timing helper too
            changed = False
            for f in funcs:
                if f.name not in self.timers and self._returns_clock(f):
                    self.timers.add(f.name)
                    changed = True

    def is_call(self, node: ast.AST) -> bool:
        """A direct clock reading."""
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        if isinstance(func, ast.Name):
            return func.id in self.imported or func.id in self.timers
        if isinstance(func, ast.Attribute):
            if func.attr in CLOCKS and _key(func.value) == "time":
                return True
            if func.attr == "time" and not node.args:  # loop.time(), asyncio.get_running_loop().time()
                return True
            if func.attr in ("now", "utcnow") and (_key(func.value) or "").endswith("datetime"):
                return True
        return False

    def reads(self, node: ast.AST, derived: set[str]) -> bool:
        for sub in ast.walk(node):
            if self.is_call(sub):
                return True
            if isinstance(sub, (ast.Name, ast.Attribute)) and _key(sub) in derived:
                return True
        return False

    def derived(self, func: Func) -> tuple[set[str], set[str]]:
        """Names holding clock values in ``func`` (nested functions included), and its deadlines."""
        derived: set[str] = set()
        deadlines: set[str] = set()
        nodes = [n for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))]
        for _ in range(3):  # a few passes: assignment order in the source is not execution order
            for node in sorted(nodes, key=lambda n: n.lineno):
                if node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {k for t in targets for k in _targets(t)}
                value = node.value
                if isinstance(value, ast.Tuple) and len(targets) == 1 and isinstance(targets[0], ast.Tuple) \
                        and len(value.elts) == len(targets[0].elts):  # a, b = x, time.monotonic()
                    for target, part in zip(targets[0].elts, value.elts, strict=True):
                        self._bind(_targets(target), part, derived, deadlines)
                else:
                    self._bind(names, value, derived, deadlines)
        return derived, deadlines

    def _bind(self, names: set[str], value: ast.AST, derived: set[str], deadlines: set[str]) -> None:
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add) and self.is_call(value.left) \
                and not self.reads(value.right, derived):
            deadlines |= names  # deadline = time.monotonic() + N
        elif self.reads(value, derived):
            derived |= names

    def _returns_clock(self, func: Func) -> bool:
        derived, _ = self.derived(func)
        return any(isinstance(n, ast.Return) and n.value is not None and self.reads(n.value, derived)
                   for n in _own_nodes(func))

    def is_deadline_check(self, cmp: ast.Compare, deadlines: set[str]) -> bool:
        sides = [cmp.left, *cmp.comparators]
        return len(sides) == 2 and any(self.is_call(s) for s in sides) and \
            any(_key(s) in deadlines for s in sides)


def _own_nodes(func: Func) -> Iterator[ast.AST]:
    """The nodes of ``func`` outside the functions nested in it."""
    stack: list[ast.AST] = list(func.body)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node)
                     if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def _outermost_functions(tree: ast.Module) -> list[Func]:
    out: list[Func] = []
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(node)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return out


def clock_decisions(source: str) -> list[int]:
    """Lines where an ``assert`` or an ``if`` orders a clock value (deadline checks of polls excepted)."""
    tree = ast.parse(source)
    clocks = _Clocks(tree)
    lines: set[int] = set()
    for func in _outermost_functions(tree):
        derived, deadlines = clocks.derived(func)
        for node in ast.walk(func):
            if not isinstance(node, (ast.Assert, ast.If, ast.IfExp)):
                continue
            for cmp in ast.walk(node.test):
                if isinstance(cmp, ast.Compare) and any(isinstance(op, ORDER) for op in cmp.ops) \
                        and clocks.reads(cmp, derived) and not clocks.is_deadline_check(cmp, deadlines):
                    lines.add(node.lineno)
    return sorted(lines)


def _is_sleep(stmt: ast.stmt, clocks: _Clocks) -> bool:
    """``time.sleep(C)`` or ``await asyncio.sleep(C)`` with a positive number ``C`` (a literal or a
    module-level name bound to one)."""
    if not isinstance(stmt, ast.Expr):
        return False
    call = stmt.value.value if isinstance(stmt.value, ast.Await) else stmt.value
    if not isinstance(call, ast.Call) or len(call.args) != 1 or call.keywords:
        return False
    func = call.func
    named = (isinstance(func, ast.Attribute) and func.attr == "sleep" and _key(func.value) in ("time", "asyncio")) \
        or (isinstance(func, ast.Name) and func.id in clocks.sleeps)
    arg = call.args[0]
    if isinstance(arg, ast.Name):
        return named and clocks.constants.get(arg.id, 0.0) > 0
    return named and isinstance(arg, ast.Constant) and isinstance(arg.value, (int, float)) \
        and not isinstance(arg.value, bool) and arg.value > 0


def sleeps_then_acts(source: str) -> list[int]:
    """Lines of constant sleeps outside a ``while`` body that another statement follows."""
    tree = ast.parse(source)
    clocks = _Clocks(tree)
    lines: list[int] = []
    for node in ast.walk(tree):
        bodies = [getattr(node, f) for f in ("body", "orelse", "finalbody") if isinstance(getattr(node, f, None), list)]
        if isinstance(node, ast.While):
            bodies = [node.orelse]  # the loop body is a poll
        for body in bodies:  # except handlers and match cases are nodes with a body of their own
            lines += [s.lineno for s in body[:-1] if _is_sleep(s, clocks)]
    return sorted(lines)


def test_the_clock_rule_sees_every_clock_form_and_lets_deadline_polls_be() -> None:
    source = '''
import asyncio, time, pytest
from time import monotonic as mono, perf_counter

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

def test_imported():
    t0 = mono()
    assert mono() - t0 < 1
    assert perf_counter() > 0

async def test_loop_time():
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert loop.time() - start < 1
    assert asyncio.get_running_loop().time() - start <= 1

def test_returned_timing():
    async def timed():
        t0 = time.monotonic()
        await work()
        return "out", time.monotonic() - t0
    out, took = asyncio.run(timed())
    assert out == "out"
    assert took < 30

def _helper_seconds():
    t0 = time.monotonic()
    run()
    return time.monotonic() - t0

def test_helper():
    assert _helper_seconds() < 20

def test_vacuous_when_slow():
    t0 = time.monotonic()
    result = work()
    elapsed = time.monotonic() - t0
    if elapsed < 1.0:
        assert result.fast
    self.started = time.monotonic()
    ok = check() if time.monotonic() - self.started > 2 else True
'''
    assert clock_decisions(source) == [8, 12, 25, 29, 30, 35, 36, 45, 53, 59, 62]
    # not 16-20 (a deadline poll and its "no progress" check), not 44 (compared for equality only)


def test_the_sleep_rule_sees_sleep_then_act_and_lets_polls_hangs_and_jitter_be() -> None:
    source = '''
import asyncio, random, time
from asyncio import sleep
SETTLE = 3.0

async def test_race():
    task = asyncio.ensure_future(work())
    await asyncio.sleep(0.3)
    task.cancel()

def test_thread_race():
    start()
    time.sleep(1)
    assert state() == "running"

async def test_imported_sleep():
    await sleep(0.05)
    swap()

def test_polls_and_hangs():
    while not done():
        time.sleep(0.01)
    for i in range(3):
        time.sleep(random.random() * 0.01)
        poke(i)
    with open("f") as fh:
        time.sleep(3600)

async def test_yield():
    await asyncio.sleep(0)
    assert seen()

def test_in_branch():
    if ready():
        time.sleep(0.1)
        act()
    try:
        pass
    except OSError:
        time.sleep(0.2)
        retry()

def test_named_constant(interval):
    time.sleep(SETTLE)
    signal()
    time.sleep(interval)
    poke()
'''
    assert sleeps_then_acts(source) == [8, 13, 17, 35, 40, 44]  # not 45: a parameter, not a constant


def _files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.resolve() != Path(__file__).resolve())


def test_no_clock_decides_a_test() -> None:
    found = {str(path.relative_to(TESTS)): lines for path in _files() if (lines := clock_decisions(path.read_text()))}
    assert found == {}, f"a clock orders an assert or an if (file: lines): {found}"


def test_no_sleep_then_act() -> None:
    found = {str(path.relative_to(TESTS)): lines for path in _files() if (lines := sleeps_then_acts(path.read_text()))}
    assert found == {}, f"a constant sleep with an action after it (file: lines): {found}"


def importorskips(source: str) -> list[int]:
    """Lines calling ``importorskip``: every test dependency is in ``[dev]``, imported plainly."""
    return sorted(n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
                  and (_key(n.func) or "").rsplit(".", 1)[-1] == "importorskip")


def test_no_test_skips_on_a_missing_import() -> None:
    assert importorskips("import pytest\ntok = pytest.importorskip('tokenizers')\n") == [2]
    found = {str(path.relative_to(TESTS)): lines for path in _files() if (lines := importorskips(path.read_text()))}
    assert found == {}, f"importorskip (file: lines): {found}"


# Test directories that are not a room of the code: whole runs (e2e), fault injection across rooms
# (reliability), the docs and the README (docs), the house's own rules (house).
ACROSS_ROOMS = {"e2e", "reliability", "docs", "house"}


def rooms_of_the_code(repo: Path) -> set[str]:
    """What a test directory may be named after: the top-level packages and the directories at
    the top of the repo (``envs``, ``examples``, ...), the core's sub-packages and root modules."""
    core = repo / "areal_agents"
    return ({p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith((".", "_")) and "." not in p.name}
            | {p.name for p in core.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
            | {p.stem for p in core.glob("*.py") if not p.stem.startswith("_")})


def test_the_tests_mirror_the_packages() -> None:
    """``tests/NAME/`` is named after a room of the code (or one of the few that cross rooms): no
    catch-all directory. Test files import their directory's ``*_support.py`` by bare name (no
    ``__init__.py``), so every file name is unique across directories."""
    allowed = rooms_of_the_code(TESTS.parent) - {"tests", "docs"} | ACROSS_ROOMS
    dirs = sorted(p for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))
    assert not [d.name for d in dirs if d.name not in allowed], f"test dirs named after no room: {sorted(allowed)}"
    names = [f.name for d in dirs for f in d.glob("*.py")]
    assert len(names) == len(set(names)), f"file names used twice: {sorted({n for n in names if names.count(n) > 1})}"
