"""The docs hold: every relative link resolves, the README links every guide, the quickstart's config file
loads and customize.md's script trains (the other recipes: test_examples_doc_recipes.py)."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from examples_support import DOCS, ROOT, TINY, run_command, train_steps

from areal_agents.config.loader import load_config


def test_relative_links_resolve() -> None:
    broken = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            path = (ROOT / doc).parent / target.split("#", 1)[0]
            if not path.exists():
                broken.append(f"{doc}: {target}")
    assert not broken, broken


def test_readme_links_every_guide() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- docs:start -->", 1)[1].split("<!-- docs:end -->", 1)[0]
    for page in sorted((ROOT / "docs").glob("*.md")):  # every page but the site's home and changelog stand-in
        if page.name not in ("index.md", "changelog.md"):
            assert f"(docs/{page.name})" in block, page.name
    assert "(docs/api/index.md)" in block
    assert "(examples/README.md)" in block or "(examples)" in block


def _block(doc: str, pattern: str) -> str:
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    match = re.search(pattern, text, re.DOTALL)
    assert match is not None, pattern
    return match.group(1)


@pytest.mark.slow
def test_customize_train_script_with_its_agent_trains_as_written(tmp_path: Path, warm_cache: Callable[[str], Path]) -> None:
    warm_cache("math-tiny")
    (tmp_path / "my_module.py").write_text(_block("customize.md", r"## Agent\n\n```python\n(.*?)```"))
    (tmp_path / "train.py").write_text(_block("customize.md", r"```python\n(# train\.py\n.*?)```"))
    run_command([sys.executable, str(tmp_path / "train.py"), "--env", "math", "agent.name=my-agent", *TINY,
                 f"output_dir={tmp_path / 'runs'}"], tmp_path)
    steps = train_steps(tmp_path / "runs" / "math" / "trial")
    assert [r["step"] for r in steps] == [1, 2] and all(r["rollout/failed"] == 0 for r in steps)


def test_quickstart_config_file_is_shown_and_loads(tmp_path: Path) -> None:
    yaml_text = _block("quickstart.md", r"```yaml\n(# my\.yaml\n.*?)```")
    (tmp_path / "my.yaml").write_text(yaml_text)
    commands = _block("quickstart.md", r"## 3\. Configure.*?```bash\n(.*?)```")
    for line in commands.splitlines():
        args = shlex.split(line.split("#", 1)[0])
        assert args[:1] == ["areal-agents"] and "--config" in args, line
        args = [a for a in args[1:] if a not in ("run", "config", "check")]
        i = args.index("--config")
        cfg = load_config(tmp_path / args[i + 1], [a for j, a in enumerate(args) if j not in (i, i + 1)])
        assert cfg.env.name == "math" and cfg.trainer.total_steps == 50
