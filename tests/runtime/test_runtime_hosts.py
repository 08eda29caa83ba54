"""One rule for "stays on this machine", shared by the viewer and the online gateway."""

from __future__ import annotations

import pytest

from areal_agents.runtime.hosts import is_loopback


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.4", False), ("example.com", False), ("", False),
])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
