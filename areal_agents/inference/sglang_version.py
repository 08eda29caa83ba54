"""The installed SGLang against the version the SGLang backend needs (no torch)."""

from __future__ import annotations

import importlib.metadata

__all__ = ["SGLANG_MIN_VERSION", "sglang_version_problem"]

SGLANG_MIN_VERSION = "0.4.9.post2"


def sglang_version_problem() -> str | None:
    """Why the installed sglang cannot serve a run (missing, or older than :data:`SGLANG_MIN_VERSION`,
    which weight updates need) as one line; ``None`` when it can."""
    from packaging.version import Version

    needs = f"backend 'sglang' needs sglang >= {SGLANG_MIN_VERSION}"
    try:
        found = importlib.metadata.version("sglang")  # looked up at call time (tests stand in for it)
    except importlib.metadata.PackageNotFoundError:
        return f"{needs}: pip install 'areal-agents[sglang]'"
    if Version(found) < Version(SGLANG_MIN_VERSION):
        return f"{needs} for weight updates (found {found})"
    return None
