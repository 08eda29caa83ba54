"""MkDocs hook (mkdocs.yml ``hooks:``): links from docs/ into the rest of the repository.

The pages link to files outside ``docs/`` (``../examples/custom_env``, ``../CHANGELOG.md``,
``../benchmarks/results/...``), which MkDocs cannot check since they are not pages of the site.
This hook checks each such link against the repository and logs a warning for a missing one,
which ``mkdocs build --strict`` turns into a failure. It also shows the repository's
``CHANGELOG.md`` as the ``changelog.md`` page, its links rebased onto ``docs/``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

__all__ = ["on_page_markdown"]

_LOG = logging.getLogger("mkdocs.hooks.repo_links")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Warn for each relative link of ``page`` that leaves ``docs/`` and names no file of the repository."""
    docs = Path(config["docs_dir"]).resolve()
    source = docs / page.file.src_path
    if page.file.src_path == "changelog.md":
        markdown = (docs.parent / "CHANGELOG.md").read_text(encoding="utf-8").replace("](docs/", "](")
    for target in _LINK.findall(_FENCE.sub("", markdown)):
        if re.match(r"[a-z]+:", target) or target.startswith(("#", "/")):
            continue
        path = (source.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(docs) and not path.exists():
            _LOG.warning("%s links to %s, which is not in the repository", page.file.src_path, target)
    return markdown
