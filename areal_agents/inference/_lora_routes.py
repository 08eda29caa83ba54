"""The embedded server's LoRA endpoints, as SGLang names them.

* ``POST /load_lora_adapter {lora_name, lora_path, pinned?}`` and
  ``POST /unload_lora_adapter {lora_name}`` → ``{success, error_message, loaded_adapters}``
  (HTTP 400 with ``success: false`` when refused);
* ``POST /update_weight_version {new_version, abort_all_requests=true}`` →
  ``{success, message, new_version}``: later tokens carry the new version (a trainer syncing an
  adapter bumps the version with it, as a full weight update does);
* ``lora_path`` on ``/generate`` names a loaded adapter (400 if it is not loaded);
* extension: an ``/update_weights_from_distributed`` body with ``lora_name`` and ``lora_config``
  (an ``adapter_config.json`` as a mapping) announces adapter tensors, held under that name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aiohttp import web

from areal_agents.inference.protocol import BadRequest, GenerateSpec, require

if TYPE_CHECKING:
    import torch

    from areal_agents.inference._engine import Engine

__all__ = ["OnDecodeThread", "adapter_swap", "add_routes", "broadcast_target", "details", "require_loaded"]

_T = TypeVar("_T")


class OnDecodeThread(Protocol):
    """``await call(app, fn)``: ``fn()`` run on the engine's decode thread, its result."""

    def __call__(self, app: web.Application, fn: Callable[[], _T], /) -> Awaitable[_T]: ...


def details(engine: Engine) -> dict[str, dict[str, str | int]]:
    """Loaded adapters with where they came from and their size (``/server_info``)."""
    return {name: {"path": a.path, "bytes": sum(t.numel() * t.element_size() for ab in a.weights.values() for t in ab),
                   "modules": len(a.weights)} for name, a in engine.lora.adapters.items()}


def require_loaded(engine: Engine, specs: Sequence[GenerateSpec]) -> None:
    missing = sorted({s.lora_path for s in specs if s.lora_path is not None} - set(engine.lora.adapters))
    require(not missing, f"'lora_path': the requested LoRA adapters are not loaded: {', '.join(missing)}; "
                         f"loaded: {', '.join(sorted(engine.lora.adapters)) or 'none'}")  # fmt: skip


def _name(body: dict[str, Any]) -> str:
    name = body.get("lora_name")
    require(isinstance(name, str) and bool(name), "'lora_name' (a non-empty string) is required")
    assert isinstance(name, str)
    return name


def _reply(engine: Engine, error: str | None = None) -> web.Response:
    loaded = {name: a.path for name, a in engine.lora.adapters.items()}  # name -> where it came from
    return web.json_response({"success": error is None, "error_message": error, "loaded_adapters": loaded},
                             status=200 if error is None else 400)


def broadcast_target(body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``(lora_name, lora_config)`` when an ``/update_weights_from_distributed`` body announces an adapter."""
    if body.get("lora_name") is None:
        return None
    config = body.get("lora_config")
    require(isinstance(config, dict), "'lora_config' (the adapter_config.json mapping) must come with 'lora_name'")
    assert isinstance(config, dict)
    return _name(body), config


def adapter_swap(engine: Engine, target: tuple[str, dict[str, Any]], state: dict[str, torch.Tensor], version: str | None,
                 abort_all: bool) -> Callable[[], int]:
    """The swap, for the decode thread, that holds the received adapter tensors under their name
    (replacing) and tags ``version``."""
    from areal_agents.inference._lora import adapter_from_tensors

    name, config = target
    try:
        adapter = adapter_from_tensors(name, "<broadcast>", config, state, engine.model)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None

    def swap() -> int:
        n = engine.load_lora(adapter)
        if version is not None:
            engine.set_version(version, False)
        if abort_all:
            n += engine.abort_where(lambda r: True, "aborted by a weight update")
        return n

    return swap


def add_routes(app: web.Application, engine_key: web.AppKey[Engine], call: OnDecodeThread,
               _json: Callable[[web.Request], Awaitable[dict[str, Any]]]) -> None:
    """Register the LoRA endpoints; ``call(app, fn)`` runs ``fn`` on the decode thread, ``_json``
    reads a request's JSON object."""

    async def load(request: web.Request) -> web.Response:
        from areal_agents.inference._lora import read_adapter

        engine = request.app[engine_key]
        body = await _json(request)
        name, path = _name(body), body.get("lora_path")
        require(isinstance(path, str) and bool(path), "'lora_path' (an adapter dir) is required")
        assert isinstance(path, str)
        if name in engine.lora.adapters:
            return _reply(engine, f"The LoRA adapter {name!r} is already loaded; unload it first")
        try:
            adapter = await asyncio.get_running_loop().run_in_executor(None, read_adapter, name, path, engine.model)
        except (ValueError, OSError) as exc:
            return _reply(engine, str(exc))
        await call(request.app, lambda: engine.load_lora(adapter))
        return _reply(engine)

    async def unload(request: web.Request) -> web.Response:
        engine = request.app[engine_key]
        name = _name(await _json(request))
        if name not in engine.lora.adapters:
            return _reply(engine, f"The LoRA adapter {name!r} is not loaded")
        await call(request.app, lambda: engine.unload_lora(name))
        return _reply(engine)

    async def update_weight_version(request: web.Request) -> web.Response:
        engine = request.app[engine_key]
        body = await _json(request)
        version, abort_all = body.get("new_version"), body.get("abort_all_requests", True)
        require(isinstance(version, (str, int)) and not isinstance(version, bool) and str(version) != "",
                "'new_version' (a string) is required")  # fmt: skip
        require(isinstance(abort_all, bool), "'abort_all_requests' must be true or false")
        await call(request.app, lambda: engine.set_version(str(version), abort_all))
        return web.json_response({"success": True, "message": f"Weight version updated to {version}",
                                  "new_version": str(version)})  # fmt: skip

    app.router.add_post("/load_lora_adapter", load)
    app.router.add_post("/unload_lora_adapter", unload)
    app.router.add_post("/update_weight_version", update_weight_version)
