"""The custom env example in docs/custom_env.md runs verbatim."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_custom_env_example_runs_verbatim(tmp_path) -> None:
    text = (ROOT / "docs" / "custom_env.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 1
    code = blocks[0]
    assert len(code.strip().splitlines()) < 40  # small: under 30 lines of code plus blank lines
    assert sum(1 for line in code.splitlines() if line.strip()) < 30
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 1.0] 0.5 True"
