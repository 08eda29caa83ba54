"""Synchronous control plane for SGLang-protocol servers (httpx; used by the trainer).

Every function takes one address or a list (``host:port`` or a URL) and acts on all of
them; failures raise :class:`ControlError` naming the server and its answer. The
weight-update bodies come from :mod:`areal_agents.inference.protocol`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from areal_agents.failures import UserError
from areal_agents.inference.client import normalize_address
from areal_agents.inference.protocol import (
    InitGroupBody,
    UpdateFromDistributedBody,
    update_weights_from_disk_payload,
)

__all__ = [
    "ControlError",
    "ServerUnreachable",
    "continue_generation",
    "init_weights_update_group",
    "load_lora_adapter",
    "model_info",
    "pause_generation",
    "server_info",
    "update_weights_from_disk",
    "update_weights_from_distributed",
    "wait_healthy",
]


class ControlError(UserError, RuntimeError):
    """A control request failed (server down, non-200, or success: false)."""


class ServerUnreachable(ControlError):
    """No answer from the server at all (connection refused or reset, timed out): it is down."""


Addrs = str | Sequence[str]


def _urls(addrs: Addrs) -> list[str]:
    return [normalize_address(a) for a in ([addrs] if isinstance(addrs, str) else addrs)]


@functools.cache
def _client() -> httpx.Client:
    """One client for the process: a fresh one per request would build an SSL context (reading
    the CA bundle) every time, tens of ms per weight sync. No keep-alive, so a server that
    restarted is never reached through a dead pooled connection."""
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def _request(method: str, url: str, timeout: float, json: Mapping[str, object] | None = None) -> httpx.Response:
    try:
        resp = _client().request(method, url, json=json, timeout=timeout)
    except httpx.TransportError as exc:
        raise ServerUnreachable(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise ControlError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise ControlError(f"{method} {url}: HTTP {resp.status_code}: {resp.text[:300]}")
    return resp


def _post_all(addrs: Addrs, path: str, payload: Mapping[str, object], timeout: float) -> list[dict[str, Any]]:
    replies = []
    for url in _urls(addrs):
        resp = _request("POST", url + path, timeout, payload)
        try:
            body = resp.json()
        except ValueError:
            body = {"message": resp.text}
        if isinstance(body, dict) and body.get("success") is False:
            raise ControlError(f"POST {url}{path}: {body.get('message', body)}")
        replies.append(body)
    return replies


def _post_concurrently(urls: list[str], path: str, payloads: Sequence[Mapping[str, object]], timeout: float) -> None:
    """POST to all servers at once: NCCL group calls block until every member has joined."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
        list(pool.map(lambda u, p: _post_all(u, path, p, timeout), urls, payloads))  # raises the first failure


def wait_healthy(addrs: Addrs, timeout: float = 120.0, interval: float = 0.2) -> None:
    """Block until every server answers ``GET /health`` with 200, or raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    for url in _urls(addrs):
        last = "no answer"
        while True:
            try:
                status = _client().get(url + "/health", timeout=max(0.5, min(5.0, timeout))).status_code
                if status == 200:
                    break
                last = f"HTTP {status}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}"
            if time.monotonic() >= deadline:
                raise ControlError(f"{url} not healthy after {timeout:.0f}s ({last})")
            time.sleep(interval)


def update_weights_from_disk(
    addrs: Addrs, path: str, version: int | str | None = None, *, abort_all_requests: bool = False,
    timeout: float = 600.0,
) -> list[dict[str, Any]]:  # fmt: skip
    """Load the HF weights in ``path`` on every server and tag them ``version``."""
    return _post_all(addrs, "/update_weights_from_disk",
                     update_weights_from_disk_payload(path, version, abort_all_requests), timeout)  # fmt: skip


def load_lora_adapter(addrs: Addrs, name: str, path: str, version: int | str, timeout: float = 600.0) -> None:
    """Serve the adapter dir ``path`` as ``name`` on every server, tagged ``version``: SGLang's
    ``/unload_lora_adapter`` (of the one held now, if any), ``/load_lora_adapter``, then
    ``/update_weight_version``. Call it with generation paused."""
    for url in _urls(addrs):
        try:
            _request("POST", url + "/unload_lora_adapter", timeout, {"lora_name": name})
        except ServerUnreachable:
            raise
        except ControlError:  # not loaded yet (the first sync): the load below reports real problems
            pass
        _post_all(url, "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, timeout)
        _post_all(url, "/update_weight_version", {"new_version": str(version), "abort_all_requests": False}, timeout)


def pause_generation(addrs: Addrs, mode: str = "abort", timeout: float = 60.0) -> None:
    """Pause every server; ``abort`` ends in-flight requests (clients resume them), ``in_place`` keeps them."""
    if mode not in ("abort", "retract", "in_place"):
        raise ValueError(f"mode must be abort, retract or in_place (got {mode!r})")
    _post_all(addrs, "/pause_generation", {"mode": mode}, timeout)


def continue_generation(addrs: Addrs, timeout: float = 60.0) -> None:
    """Resume every paused server."""
    _post_all(addrs, "/continue_generation", {}, timeout)


def _get_object(addr: str, path: str, timeout: float) -> dict[str, Any]:
    body = _request("GET", normalize_address(addr) + path, timeout).json()
    if not isinstance(body, dict):
        raise ControlError(f"{addr}{path}: expected a JSON object, got {str(body)[:200]}")
    return body


def model_info(addr: str, timeout: float = 10.0) -> dict[str, Any]:
    """``GET /model_info`` of one server (``model_path``, ``weight_version``, ...)."""
    return _get_object(addr, "/model_info", timeout)


def server_info(addr: str, timeout: float = 10.0) -> dict[str, Any]:
    """``GET /server_info`` of one server (the embedded one adds batching statistics)."""
    return _get_object(addr, "/server_info", timeout)


def init_weights_update_group(addrs: Addrs, payloads: Sequence[InitGroupBody], timeout: float = 600.0) -> None:
    """Send each server its ``init_weights_update_group`` payload (one per server, distinct rank offsets).

    The calls return only once the trainer has joined the group too, so call this from a
    thread while the trainer runs ``init_process_group`` on the same address.
    """
    urls = _urls(addrs)
    if len(payloads) != len(urls):
        raise ValueError(f"{len(urls)} servers but {len(payloads)} payloads")
    _post_concurrently(urls, "/init_weights_update_group", list(payloads), timeout)


def update_weights_from_distributed(addrs: Addrs, payload: UpdateFromDistributedBody, timeout: float = 600.0) -> None:
    """Tell every server to receive the broadcast described by ``payload`` (run it in a
    thread while the trainer broadcasts the tensors)."""
    urls = _urls(addrs)
    _post_concurrently(urls, "/update_weights_from_distributed", [payload] * len(urls), timeout)
