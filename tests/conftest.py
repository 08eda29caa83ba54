"""Suite-wide test settings and shared fixtures.

Under ``pytest -n N`` (pytest-xdist, as the README's test command runs) each worker and the
processes its tests start use one OpenMP thread: N workers share the machine's cores, and a
pool sized for all of them would spin against the other workers' tests.

Property tests (hypothesis) are derandomized when the ``CI`` environment variable is set (as
``.ci/run`` and CI services do): the same code always meets the same examples there, so a red
CI run means a code change. Locally each run draws new examples and replays failures saved in
``.hypothesis/``.

``warm_cache(recipe)`` gives a test its own copy of a model cache that already holds the tiny
model and its SFT warm start for one of :data:`WARM_RECIPES`, built once per test run (the workers
of ``-n N`` share it): the runs
of tests whose subject is not the first run's build (an example that trains, a killed run that
resumes) then start where a user's second run starts. Tests of the build itself keep an empty cache.

``tiny_model(texts, **kw)`` is :func:`trainers.tiny_model.build_tiny_model` of ``texts``, built once per
session for each corpus and keywords: the modules that serve or tokenize with the same tiny model
share one directory, which they only read.

The longest modules run first (:func:`pytest_collection_modifyitems`, from ``tests/durations.json``:
the seconds each slow test took in a recent whole run, call and setup; refresh it from the
``--durations`` lines a run prints; the quick modules keep their file order: sorted heaviest first
they ran no faster, 5:58 and 6:59 against 5:41 and 6:47, the machine's drift being as large), and
``--dist loadscope --no-loadscope-reorder`` (pyproject's addopts) hands the workers whole modules
in that order as they free up: the other worker takes the short modules while one runs a long test,
instead of a long test starting last and running alone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of several workers (-n N): a thread each, here and in its runs
    os.environ.setdefault("OMP_NUM_THREADS", "1")

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("local")
settings.load_profile("ci" if os.environ.get("CI", "").lower() not in ("", "0", "false") else "local")

ROOT = Path(__file__).resolve().parents[1]

# The shortest warm start that still exercises it (the examples' and the kill tests' runs use it).
_TINY_WARM = ["sft.warm_start_steps=4", "sft.batch_size=8", "sft.eval_every=0", "eval.n=4"]

# recipe -> (config file relative to the repository root or None, overrides): the warm start that
# the runs of the tests asking for the recipe would do from an empty cache. A run whose config
# hashes to another warm start fails the test (see ``warm_cache``): keep these in step with them.
WARM_RECIPES: dict[str, tuple[str | None, list[str]]] = {
    "math-tiny": (None, ["env.name=math", *_TINY_WARM]),
    "math": (None, ["env.name=math"]),  # the default command's own warm start (a learning test's)
    # 150 steps: a model that answers every sum with a number, mostly wrong (a served model to ask)
    "math-numbers": (None, ["env.name=math", "sft.warm_start_steps=150", "sft.warm_start_target=0", "sft.eval_every=0"]),
}

# What ``areal-agents run`` does first without actor.path, and nothing after it.
_FILL = """\
import sys
from areal_agents.config.loader import load_config
from trainers.sft import ensure_warm_model
print(ensure_warm_model(load_config(sys.argv[1] or None, sys.argv[2:]), progress=False, warm_start=True))
"""


_UNRECORDED_SLOW_S = 30.0  # about what a slow test takes (most take 30-60 s)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest modules first: by the seconds their tests took together (``tests/durations.json``),
    a slow-marked test without a record counting :data:`_UNRECORDED_SLOW_S`; then modules with a
    slow-marked test, then the rest, each module whole and in its own order (a stale or missing
    record only costs wall time, never a result)."""
    recorded: dict[str, float] = json.loads((ROOT / "tests" / "durations.json").read_text())
    total: dict[str, float] = {}
    slow: dict[str, bool] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        marked = item.get_closest_marker("slow") is not None  # unrecorded, a slow test counts as a long one
        total[module] = total.get(module, 0.0) + recorded.get(item.nodeid, _UNRECORDED_SLOW_S if marked else 0.0)
        slow[module] = slow.get(module, False) or marked

    def rank(item: pytest.Item) -> tuple[float, bool]:
        module = item.nodeid.split("::", 1)[0]
        return -total[module], not slow[module]

    items.sort(key=rank)  # stable: a module's tests stay together and in their order


class WarmCaches:
    """Model caches filled on first use, one directory per recipe, for the whole session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filled: dict[str, Path] = {}

    def get(self, recipe: str) -> Path:
        """The session's cache for ``recipe``, built by the warm start on first use (read it, never write).
        The workers of one ``pytest -n N`` share the caches: the first to ask builds one under a lock."""
        if recipe not in self.filled:
            config, overrides = WARM_RECIPES[recipe]
            cache = self.root / recipe
            with open(self.root / f"{recipe}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                if not (cache / "warm").is_dir():
                    shutil.rmtree(cache, ignore_errors=True)  # a build that failed part-way
                    env = {**os.environ, "AREAL_AGENTS_CACHE": str(cache)}
                    proc = subprocess.run([sys.executable, "-c", _FILL, config or "", *overrides], cwd=ROOT, env=env,
                                          capture_output=True, text=True, timeout=900)
                    assert proc.returncode == 0, f"warm start {recipe!r} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            assert (cache / "warm").is_dir() and len(list((cache / "warm").iterdir())) == 1, list(cache.rglob("*"))
            self.filled[recipe] = cache
        return self.filled[recipe]


def _entries(cache: Path) -> set[str]:
    """The built models of a cache: ``models/<name>`` (tiny models) and ``warm/<name>`` (warm starts)."""
    return {f"{kind}/{p.name}" for kind in ("models", "warm") if (cache / kind).is_dir()
            for p in (cache / kind).iterdir() if not p.name.startswith(".")}


@pytest.fixture(scope="session")
def warm_caches(tmp_path_factory: pytest.TempPathFactory) -> WarmCaches:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one directory for all the workers of this run
        root = tmp_path_factory.getbasetemp().parent / "warm-caches"
        root.mkdir(exist_ok=True)
        return WarmCaches(root)
    return WarmCaches(tmp_path_factory.mktemp("warm-caches"))


@pytest.fixture
def warm_cache(warm_caches: WarmCaches, tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``warm_cache(recipe)`` copies the session's cache for ``recipe`` to ``tmp_path / "cache"``
    (the test's own: it may write there) and returns it. After the test, its runs must have
    built nothing there: a run that did had a config the recipe does not match."""
    copies: list[tuple[Path, set[str]]] = []

    def copy(recipe: str) -> Path:
        dest = tmp_path / "cache"
        shutil.copytree(warm_caches.get(recipe), dest)
        copies.append((dest, _entries(dest)))
        return dest

    yield copy
    for dest, before in copies:
        built = sorted(_entries(dest) - before)
        assert not built, (f"the test's run built {built} beside the shared warm start: align its config "
                           "with its recipe in tests/conftest.py WARM_RECIPES, or give it an empty cache")


class TinyModels:
    """Tiny models built once per session, one directory per corpus and builder keywords (read them, never write)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.built: dict[str, Path] = {}

    def get(self, texts: Iterable[str], **kw: Any) -> Path:
        """The model :func:`~trainers.tiny_model.build_tiny_model` makes of ``texts`` and ``kw``."""
        from trainers.tiny_model import build_tiny_model

        corpus = list(texts)
        key = hashlib.sha256(json.dumps([corpus, kw], sort_keys=True).encode()).hexdigest()[:16]
        if key not in self.built:
            self.built[key] = build_tiny_model(corpus, self.root / key, **kw)
        return self.built[key]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``tiny_model(texts, **kw)``: the session's tiny model of that corpus and those builder keywords."""
    return TinyModels(tmp_path_factory.mktemp("tiny-models")).get
