"""The viewer's HTTP server: three static assets, a small JSON API over the run directories, and
the files of those directories (a run's plots), nothing else.

Safety: a request names a run by its name and a file by a path inside that run; the path is
resolved (symlinks followed) and refused with 403 unless it stays inside the run directory. Only
GET is served, request bodies are refused past a few KiB, and a page size is capped. The page
itself renders episode text with ``textContent`` only; the Content-Security-Policy sent with it
allows scripts from this server's own asset alone, so text that reaches the DOM as markup anyway
would still not run.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from areal_agents.failures import UserError
from areal_agents.runtime.hosts import is_loopback
from areal_agents.viewer.runs import EpisodeQuery, Run

__all__ = ["ASSETS", "bind_warning", "build_app", "name_runs", "serve"]

ASSETS = {"viewer.js": "text/javascript", "viewer.css": "text/css", "index.html": "text/html"}
MAX_REQUEST_BYTES = 16 << 10
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
RUNS = web.AppKey("runs", dict[str, Run])


def name_runs(paths: Sequence[str | Path]) -> dict[str, Run]:
    """Each run directory under a short name without ``/`` (its folder's name; ``parent-name`` or a
    number appended when two are alike), in the order given. A path that is no directory is an error."""
    runs: dict[str, Run] = {}
    for raw in paths:
        path = Path(raw).expanduser().resolve()
        if not path.is_dir():
            raise UserError(f"view: {raw} is not a directory (give run directories, e.g. runs/guess-number/trial)")
        name = path.name or "run"
        if name in runs:
            name = f"{path.parent.name}-{path.name}"
        base, n = name, 2
        while name in runs:
            name, n = f"{base}-{n}", n + 1
        runs[name] = Run(name, path)
    return runs


def _finite(value: Any) -> Any:
    """JSON the browser parses: non-finite floats become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json(data: Any) -> web.Response:
    return web.Response(text=json.dumps(_finite(data), allow_nan=False), content_type="application/json")


def _run(request: web.Request) -> Run:
    run = request.app[RUNS].get(request.query.get("run", ""))
    if run is None:
        raise web.HTTPNotFound(text="no such run")
    return run


def _int(request: web.Request, key: str) -> int | None:
    raw = request.query.get(key, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{key} must be an integer, got {raw[:40]!r}") from None


def _float(request: web.Request, key: str) -> float | None:
    raw = request.query.get(key, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{key} must be a number, got {raw[:40]!r}") from None


def episode_query(request: web.Request) -> EpisodeQuery:
    """The table's filters from the query string (bad numbers are a 400 naming the key)."""
    success = request.query.get("success", "")
    return EpisodeQuery(
        step_min=_int(request, "step_min"), step_max=_int(request, "step_max"), version=_int(request, "version"),
        reward_min=_float(request, "reward_min"), reward_max=_float(request, "reward_max"),
        success={"true": True, "false": False}.get(success), status=request.query.get("status", ""),
        env=request.query.get("env", ""), turns=_int(request, "turns"), q=request.query.get("q", "")[:200],
        group=request.query.get("group", ""), sort=request.query.get("sort", "step"),
        desc=request.query.get("desc", "") == "1", page=_int(request, "page") or 0, size=_int(request, "size") or 50)


async def _asset(request: web.Request) -> web.StreamResponse:
    name = request.match_info.get("name", "index.html")
    if name not in ASSETS:
        raise web.HTTPNotFound()
    body = resources.files("areal_agents.viewer").joinpath("static").joinpath(name).read_bytes()
    return web.Response(body=body, content_type=ASSETS[name], headers={"Cache-Control": "no-cache"})


async def _runs(request: web.Request) -> web.Response:
    return _json([{"name": r.name, "path": str(r.path), "config": r.config()} for r in request.app[RUNS].values()])


async def _metrics(request: web.Request) -> web.Response:
    rows, offset = _run(request).metrics(max(0, _int(request, "offset") or 0))
    return _json({"rows": rows, "offset": offset})


async def _episodes(request: web.Request) -> web.Response:
    run, query = _run(request), episode_query(request)
    page = await asyncio.to_thread(run.episodes, query)
    page["facets"] = await asyncio.to_thread(run.facets)
    return _json(page)


async def _episode(request: web.Request) -> web.Response:
    found = await asyncio.to_thread(_run(request).episode, request.query.get("id", ""))
    if found is None:
        raise web.HTTPNotFound(text="no such episode")
    return _json(found)


async def _group(request: web.Request) -> web.Response:
    step = _int(request, "step")
    rows = await asyncio.to_thread(_run(request).group, step or 0, request.query.get("group", ""))
    return _json(rows)


def inside(root: Path, relative: str) -> Path | None:
    """``root/relative`` with symlinks resolved, or None when that leaves ``root`` (``..``, an
    absolute path, a link pointing out)."""
    target = (root / relative).resolve()
    return target if target == root or target.is_relative_to(root) else None


async def _file(request: web.Request) -> web.StreamResponse:
    run = request.app[RUNS].get(request.match_info["run"])
    if run is None:
        raise web.HTTPNotFound(text="no such run")
    target = inside(run.path.resolve(), request.match_info["path"])
    if target is None:
        raise web.HTTPForbidden(text="outside the run directory")
    if not target.is_file():
        raise web.HTTPNotFound()
    return web.FileResponse(target, headers={"Content-Disposition": "inline", "X-Content-Type-Options": "nosniff"})


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                 ) -> web.StreamResponse:
    """Refuse bodies and overlong URLs; send the safety headers with every answer."""
    if (request.content_length or 0) > MAX_REQUEST_BYTES or len(request.raw_path) > MAX_REQUEST_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_REQUEST_BYTES, actual_size=request.content_length or 0)
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    return response


def build_app(run_dirs: Sequence[str | Path]) -> web.Application:
    """The viewer's aiohttp application over ``run_dirs``."""
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[_guard])
    app[RUNS] = name_runs(run_dirs)
    app.router.add_get("/", _asset)
    app.router.add_get("/static/{name}", _asset)
    app.router.add_get("/api/runs", _runs)
    app.router.add_get("/api/metrics", _metrics)
    app.router.add_get("/api/episodes", _episodes)
    app.router.add_get("/api/episode", _episode)
    app.router.add_get("/api/group", _group)
    app.router.add_get("/files/{run}/{path:.*}", _file)
    return app


def bind_warning(host: str) -> str | None:
    """The line ``serve`` prints when ``host`` reaches beyond this machine's loopback, else None."""
    if is_loopback(host):
        return None
    return (f"warning: the viewer listens on {host}: anyone who reaches this port reads these runs' episodes "
            "and config (no authentication)")


def serve(run_dirs: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the viewer until Ctrl-C (``areal-agents view``); any host but loopback prints a warning."""
    app = build_app(run_dirs)
    warning = bind_warning(host)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    shown = f"[{host}]" if ":" in host else host
    runs = app[RUNS]
    names = ", ".join(runs)
    web.run_app(app, host=host, port=port, print=lambda _: print(f"viewer of {names}: http://{shown}:{port}/",
                                                                 flush=True))
