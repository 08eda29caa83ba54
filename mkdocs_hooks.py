"""MkDocs hook (mkdocs.yml ``hooks:``): links from docs/ into the rest of the repository.

The pages link to files outside ``docs/`` (``../examples/custom_env``, ``../CHANGELOG.md``,
``../benchmarks/results/...``), which MkDocs cannot check since they are not pages of the site.
This hook checks each such link against the repository and logs a warning for a missing one,
which ``mkdocs build --strict`` turns into a failure. It also shows the repository's
``CHANGELOG.md`` as the ``changelog.md`` page, its links rebased onto ``docs/``, and renders the
Sphinx roles of docstrings (``:class:`~pkg.Name```) in the API pages as plain code (``Name``).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

__all__ = ["on_page_content", "on_page_markdown"]

_LOG = logging.getLogger("mkdocs.hooks.repo_links")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):<code>(~?)([^<]*)</code>")


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


def _role(match: re.Match[str]) -> str:
    short, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if short else name}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Docstrings' Sphinx roles as code: ``:meth:`~a.B.c``` becomes ``c``, ``:class:`B``` becomes ``B``."""
    return _ROLE.sub(_role, html) if page.file.src_path.startswith("api/") else html
