"""The docs hold: the quickstart's custom env trains as written, and every relative link resolves."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from examples_support import ROOT, TINY, package_env, run_command, train_steps

DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("README.md"))]


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
    for guide in ("concepts", "quickstart", "customize", "custom_env", "deployment", "troubleshooting", "config",
                  "algorithms", "rollout"):
        assert f"(docs/{guide}.md)" in block, guide
    assert "(examples/README.md)" in block or "(examples)" in block


def test_quickstart_custom_env_trains_as_written(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    module = next(b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if b.startswith("# my_envs/reverse.py"))
    toml = next(b for b in re.findall(r"```toml\n(.*?)```", text, re.DOTALL) if b.startswith("# pyproject.toml"))
    pkg = tmp_path / "pkg"
    (pkg / "my_envs").mkdir(parents=True)
    (pkg / "my_envs" / "__init__.py").write_text("")
    (pkg / "my_envs" / "reverse.py").write_text(module)
    (pkg / "pyproject.toml").write_text(toml)
    python = package_env(tmp_path, pkg)
    check = "from areal_agents import check_env, make_env; check_env(make_env('reverse')); print('ok')"
    proc = subprocess.run([python, "-c", check], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    run_command(["areal-agents", "run", "--env", "reverse", *TINY, f"output_dir={tmp_path / 'runs'}"], tmp_path,
                python=python)
    steps = train_steps(tmp_path / "runs" / "reverse" / "trial")
    assert [r["step"] for r in steps] == [1, 2]
    assert "reverse " in (tmp_path / "runs" / "reverse" / "trial" / "samples.jsonl").read_text()
