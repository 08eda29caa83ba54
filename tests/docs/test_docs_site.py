"""The documentation site builds with ``mkdocs build --strict``: every page in the nav, no broken
link or anchor, and an API reference rendered from the public names' docstrings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_docs_page_is_in_the_nav() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    pages = set(_nav_pages(config["nav"]))
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == on_disk, (sorted(on_disk - pages), sorted(pages - on_disk))


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    site = tmp_path / "site"
    env_page = (site / "api" / "env" / "index.html").read_text(encoding="utf-8")
    for name in ("areal_agents.Env", "areal_agents.env.TurnLimitedEnv", "areal_agents.check_env", "reference_completion"):
        assert name in env_page, name  # the docstrings were found and rendered
    assert ":class:" not in env_page and ":meth:" not in env_page  # Sphinx roles shown as code (mkdocs_hooks.py)
    for page, name in [("agent", "areal_agents.ChatAgent"), ("llm", "areal_agents.llm.LLM"),
                       ("llm", "areal_agents.Trajectory"), ("registry", "areal_agents.register_reward"),
                       ("openai", "EpisodeClient"), ("config", "areal_agents.config.RolloutConfig"),
                       ("rewards", "areal_agents.rewards.fast_path")]:
        assert name in (site / "api" / page / "index.html").read_text(encoding="utf-8"), (page, name)
    changelog = (site / "changelog" / "index.html").read_text(encoding="utf-8")
    assert "Unreleased" in changelog  # the repository's CHANGELOG.md, shown as a page
