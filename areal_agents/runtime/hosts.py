"""Whether an address to listen on stays on this machine (no torch)."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (``localhost``, or an IP address, bracketed or not) is a loopback address;
    a host name other than ``localhost`` may resolve to anything, so it is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
