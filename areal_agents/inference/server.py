"""The embedded inference server: SGLang's native HTTP protocol over a transformers model.

Run it with ``areal-agents serve --model DIR`` or ``python -m areal_agents.inference.server
--model DIR``; it prints ``serving on http://HOST:PORT`` once it accepts requests (port 0
picks a free port). Decoding happens in :class:`~areal_agents.inference._engine.Engine`
on a background thread with continuous batching, so the event loop only parses,
validates and answers requests. See SGLANG_PROTOCOL notes in the docs for the fields.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from areal_agents.inference import _lora_routes
from areal_agents.inference._events import stream_each, stream_one
from areal_agents.inference._http import error, error_middleware, read_json
from areal_agents.inference._weights import WeightGroups, load_state_dict
from areal_agents.inference.protocol import BadRequest, GenerateSpec, flag, parse_generate, require, response_body
from areal_agents.runtime.heap import freeze_setup, keep_freed_memory, quiet_setup

__all__ = ["cli_serve", "create_app", "load_model", "load_state_dict", "main", "serve"]

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from areal_agents.inference._engine import Engine, GenRequest

_T = TypeVar("_T")
_ENGINE: web.AppKey[Engine] = web.AppKey("engine")
_STATE = web.AppKey("state", dict)
_GROUPS = web.AppKey("weight_groups", WeightGroups)


def load_model(path: str | Path, device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` from an HF model dir (float32 on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path)
    dtype = torch.float32 if device == "cpu" else "auto"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device), tokenizer  # type: ignore[arg-type]  # transformers' decorated ``to`` loses its self


async def _call(app: web.Application, fn: Callable[[], _T]) -> _T:
    return await asyncio.wrap_future(app[_ENGINE].call(fn))


async def _generate(request: web.Request) -> web.StreamResponse:
    from areal_agents.inference._engine import GenRequest

    engine = request.app[_ENGINE]
    if not engine.alive:
        return error(503, f"decode loop is not running: {engine.error!r}")
    body = await read_json(request)
    specs, as_list = parse_generate(body, engine.tokenizer, int(engine.model.config.vocab_size), engine.context_len)
    if not engine.paused:  # while paused (a sync swapping the adapter) requests wait; admission checks again
        _lora_routes.require_loaded(engine, specs)
    stream = flag(body.get("stream"), False, "'stream'")
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    progress: asyncio.Queue[None] = asyncio.Queue()
    futures: list[asyncio.Future[GenRequest]] = []
    reqs: list[GenRequest] = []
    for spec in specs:
        fut: asyncio.Future[GenRequest] = loop.create_future()
        futures.append(fut)
        req = GenRequest(
            spec, budget=min(spec.max_new_tokens, engine.context_len - len(spec.prompt)),
            done=_finished(request.app).callback(fut),
            on_token=(lambda r: loop.call_soon_threadsafe(progress.put_nowait, None)) if stream and not as_list else None,
        )
        reqs.append(req)
        if req.budget <= 0 and spec.logprob_start_len < 0:  # nothing to compute
            req.finish = {"type": "length", "length": 0}
            fut.set_result(req)
        else:
            engine.submit(req)
    try:
        if stream and as_list:
            return await stream_each(request, engine, specs, reqs, futures, start)
        if stream:
            return await stream_one(request, engine, specs[0], reqs[0], futures[0], progress, start)
        done = await asyncio.gather(*futures)
    except asyncio.CancelledError:  # the client went away: free its batch slots
        ids = {id(r) for r in reqs}
        engine.call(lambda: engine.abort_where(lambda r: id(r) in ids, "client disconnected"))
        raise
    latency = time.monotonic() - start
    failed = [r.error for r in done if r.error]
    if failed:  # 5xx: the client retries, possibly on another server
        return error(500, f"generation failed: {failed[0]}")
    bodies = [
        response_body(spec, r, len(r.output_ids), r.finish, engine.weight_version, latency, engine.tokenizer)
        for spec, r in zip(specs, done, strict=True)
    ]
    return web.json_response(bodies if as_list else bodies[0])


class _Finished:
    """Requests the decode thread finishes, handed to the event loop: one wake-up of the loop for
    all that finish before it runs (a decode step ends many at once), not a wake-up each; a
    batch's stream then sends them in one write."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self._lock = loop, threading.Lock()
        self._ready: list[tuple[asyncio.Future[GenRequest], GenRequest]] = []

    def callback(self, fut: asyncio.Future[GenRequest]) -> Callable[[GenRequest], object]:
        """A ``done`` callback, for the decode thread, that resolves ``fut`` with its request."""
        return lambda req: self._add(fut, req)

    def _add(self, fut: asyncio.Future[GenRequest], req: GenRequest) -> None:
        with self._lock:
            self._ready.append((fut, req))
            first = len(self._ready) == 1
        if first:  # the others join this wake-up's list until it runs
            self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for fut, req in ready:
            if not fut.done():
                fut.set_result(req)


def _finished(app: web.Application) -> _Finished:
    """The app's hand-off of finished requests to the event loop that serves it (made anew if
    the app is served on another loop)."""
    loop, state = asyncio.get_running_loop(), app[_STATE]
    if "finished" not in state or state["finished"].loop is not loop:
        state["finished"] = _Finished(loop)
    return state["finished"]  # type: ignore[no-any-return]


def _update_flags(body: dict[str, Any]) -> tuple[str | None, dict[str, bool]]:
    """``weight_version`` and the flags shared by both weight-update requests."""
    version = body.get("weight_version")
    require(version is None or isinstance(version, (str, int)) and not isinstance(version, bool),
            "'weight_version' must be a string")  # fmt: skip
    flags = {k: body.get(k, d) for k, d in (("abort_all_requests", False), ("keep_pause", False), ("flush_cache", True))}
    for key, value in flags.items():
        require(isinstance(value, bool), f"'{key}' must be true or false")
    return (None if version is None else str(version)), flags


async def _swap(app: web.Application, state: dict[str, Any], version: str | None, flags: dict[str, bool],
                lora: tuple[str, dict[str, Any]] | None = None) -> int:
    """New base weights, or with ``lora`` an adapter (the base stays as loaded); the pause ends unless ``keep_pause``."""
    engine = app[_ENGINE]
    new_version = engine.weight_version if version is None else version
    apply = None if lora is None else _lora_routes.adapter_swap(engine, lora, state, version, flags["abort_all_requests"])

    def swap() -> int:
        n = engine.swap_weights(state, new_version, flags["abort_all_requests"]) if apply is None else apply()
        if not flags["keep_pause"]:
            engine.set_paused(False)
        return n

    return int(await _call(app, swap))


async def _update_weights_from_disk(request: web.Request) -> web.Response:
    app, engine = request.app, request.app[_ENGINE]
    body = await read_json(request)
    path: Any = body.get("model_path")
    require(isinstance(path, str) and bool(path), "'model_path' (a string) is required")
    version, flags = _update_flags(body)
    require(body.get("load_format") in (None, "auto", "safetensors"), "'load_format' must be auto or safetensors")
    try:
        state = await asyncio.get_running_loop().run_in_executor(None, load_state_dict, path, engine.model)
    except (ValueError, OSError) as exc:
        return web.json_response({"success": False, "message": str(exc), "num_paused_requests": 0}, status=400)
    n = await _swap(app, state, version, flags)
    app[_STATE]["model_path"] = path
    return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                              "num_paused_requests": n})  # fmt: skip


async def _in_group_thread(app: web.Application, fn: Callable[..., _T], *args: object) -> _T:
    """Blocking process-group work on its own thread (a slow join never starves other requests)."""
    return await asyncio.get_running_loop().run_in_executor(app[_STATE]["group_pool"], fn, *args)


async def _init_weights_update_group(request: web.Request) -> web.Response:
    body = await read_json(request)
    try:
        await _in_group_thread(request.app, request.app[_GROUPS].join, body)
    except BadRequest:
        raise
    except Exception as exc:  # the trainer never came, or the address is wrong: the server keeps serving
        return web.json_response({"success": False, "message": f"could not join the group: {exc}"}, status=500)
    return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})


async def _update_weights_from_distributed(request: web.Request) -> web.Response:
    app = request.app
    body = await read_json(request)
    version, flags = _update_flags(body)
    lora = _lora_routes.broadcast_target(body)
    try:
        state = await _in_group_thread(app, app[_GROUPS].receive, body, app[_ENGINE].model, lora is None)
    except BadRequest:
        raise
    except Exception as exc:  # a broken or timed-out broadcast
        return web.json_response({"success": False, "message": f"broadcast failed: {exc}"}, status=500)
    n = await _swap(app, state, version, flags, lora)
    message = "Succeeded to update parameter online." if lora is None else "Succeeded to update LoRA adapter online."
    return web.json_response({"success": True, "message": message, "num_paused_requests": n})


async def _pause(request: web.Request) -> web.Response:
    engine = request.app[_ENGINE]
    mode = (await read_json(request)).get("mode", "abort")
    require(mode in ("abort", "retract", "in_place"), "'mode' must be abort, retract or in_place")

    def pause() -> None:
        engine.set_paused(True)
        if mode == "abort":
            engine.abort_where(lambda r: True, "aborted by pause_generation")
        elif mode == "retract":  # back to the queue, re-prefilled after the pause (no reply, no resubmission)
            engine.retract()

    await _call(request.app, pause)
    return web.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def _continue(request: web.Request) -> web.Response:
    engine = request.app[_ENGINE]
    await read_json(request)
    await _call(request.app, lambda: engine.set_paused(False))
    return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


async def _abort_request(request: web.Request) -> web.Response:
    engine = request.app[_ENGINE]
    body = await read_json(request)
    rid, abort_all = body.get("rid"), body.get("abort_all", False)
    require(isinstance(abort_all, bool), "'abort_all' must be true or false")
    require(abort_all or isinstance(rid, str), "'rid' (a string) or 'abort_all': true is required")
    n = await _call(request.app, lambda: engine.abort_where(lambda r: abort_all or r.spec.rid == rid, "aborted by request"))
    return web.json_response({"success": True, "num_aborted": n})


async def _flush_cache(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed.\n")


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[_ENGINE].alive else 503)


async def _health_generate(request: web.Request) -> web.Response:
    from areal_agents.inference._engine import GenRequest

    engine = request.app[_ENGINE]
    if not engine.alive:
        return web.Response(status=503)
    if engine.paused:
        return web.Response(status=200)
    fut: asyncio.Future[GenRequest] = asyncio.get_running_loop().create_future()
    req = GenRequest(GenerateSpec(rid="health", prompt=[engine.pad_id], max_new_tokens=1, temperature=0.0),
                     done=_finished(request.app).callback(fut))
    engine.submit(req)
    try:
        await asyncio.wait_for(fut, timeout=20)
    except asyncio.TimeoutError:
        return web.Response(status=503)
    return web.Response(status=200)


async def _model_info(request: web.Request) -> web.Response:
    state, engine = request.app[_STATE], request.app[_ENGINE]
    return web.json_response({
        "model_path": state["model_path"], "tokenizer_path": state["tokenizer_path"], "is_generation": True,
        "weight_version": engine.weight_version, "preferred_sampling_params": None,
        "max_context_length": engine.context_len, "vocab_size": int(engine.model.config.vocab_size),
    })  # fmt: skip


def batching_stats(engine: Engine) -> dict[str, float]:
    m = dict(engine.metrics)
    running, waiting = engine.queue_sizes()
    return {
        "decode_steps": m["decode_steps"], "prefills": m["prefills"], "generated_tokens": m["tokens"],
        "mean_batch_size": m["decode_seqs"] / m["decode_steps"] if m["decode_steps"] else 0.0,
        "max_batch_size_seen": m["max_batch"], "num_running": running, "num_waiting": waiting,
        "step_errors": m["errors"],
    }  # fmt: skip


async def _server_info(request: web.Request) -> web.Response:
    engine, state = request.app[_ENGINE], request.app[_STATE]
    return web.json_response({
        "backend": "embedded", "model_path": state["model_path"], "weight_version": engine.weight_version,
        "max_batch_size": engine.max_batch_size, "context_len": engine.context_len, "device": str(engine.device),
        "paused": engine.paused, "batching": batching_stats(engine), "lora_adapters": _lora_routes.details(engine),
    })  # fmt: skip


async def _metrics(request: web.Request) -> web.Response:
    stats = batching_stats(request.app[_ENGINE])
    lines = [f"embedded_{k} {float(v)}" for k, v in stats.items()]
    return web.Response(text="\n".join(lines) + "\n")


def create_app(engine: Engine, model_path: str, tokenizer_path: str | None = None) -> web.Application:
    """The aiohttp application serving ``engine`` (started and stopped with the app)."""
    app = web.Application(middlewares=[error_middleware], client_max_size=64 * 1024**2)
    app[_ENGINE] = engine
    app[_STATE] = {"model_path": model_path, "tokenizer_path": tokenizer_path or model_path,
                   "group_pool": concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weight-group")}
    app[_GROUPS] = WeightGroups()
    for path, handler in (("/generate", _generate), ("/update_weights_from_disk", _update_weights_from_disk),
                          ("/init_weights_update_group", _init_weights_update_group),
                          ("/update_weights_from_distributed", _update_weights_from_distributed),
                          ("/pause_generation", _pause), ("/continue_generation", _continue),
                          ("/abort_request", _abort_request), ("/flush_cache", _flush_cache)):  # fmt: skip
        app.router.add_post(path, handler)
    _lora_routes.add_routes(app, _ENGINE, _call, read_json)
    for path, handler in (("/flush_cache", _flush_cache), ("/health", _health), ("/ready", _health),
                          ("/health_generate", _health_generate), ("/model_info", _model_info),
                          ("/get_model_info", _model_info), ("/server_info", _server_info),
                          ("/get_server_info", _server_info), ("/metrics", _metrics)):  # fmt: skip
        app.router.add_get(path, handler)

    from areal_agents.openai_compat.http import add_serve_routes  # OpenAI's /v1/chat/completions over /generate

    add_serve_routes(app, engine.tokenizer)  # type: ignore[arg-type]  # HF types decode as str | list[str]

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        if not engine.alive:
            engine.start()
        yield
        app[_STATE]["group_pool"].shutdown(wait=False, cancel_futures=True)
        await asyncio.get_running_loop().run_in_executor(None, engine.stop)

    app.cleanup_ctx.append(lifecycle)
    return app


async def serve(app: web.Application, host: str, port: int) -> None:
    """Serve ``app`` until SIGINT/SIGTERM; prints ``serving on http://HOST:PORT``."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    print(f"serving on http://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def cli_serve(args: argparse.Namespace) -> int:
    """Load ``args.model`` and serve it with the flags of :func:`~areal_agents.inference.launcher.add_serve_args`
    (a reward model, :func:`~areal_agents.inference.scoring.is_reward_model`, is served for scoring)."""
    path = str(args.model)
    if not (Path(path) / "config.json").is_file():
        print(f"error: --model {path}: no config.json there (not a Hugging Face model dir)", file=sys.stderr)
        return 2
    if getattr(args, "parent_pid", None) is not None:
        from areal_agents.runtime.lifeline import watch_parent

        watch_parent(args.parent_pid)
    with quiet_setup():  # torch, transformers and the model: no collection until the server serves
        from areal_agents.inference._engine import Engine
        from areal_agents.inference._lora import read_adapter
        from areal_agents.inference.scoring import Scorer, create_scoring_app, is_reward_model, load_reward_model

        if is_reward_model(path):  # a sequence-classification model: its scores at /classify
            reward_model, reward_tokenizer = load_reward_model(path, args.device)
            app = create_scoring_app(Scorer(reward_model, reward_tokenizer, args.max_batch_size), path)
        else:
            model, tokenizer = load_model(path, args.device)
            engine = Engine(model, tokenizer, max_batch_size=args.max_batch_size, weight_version=str(args.weight_version))
            for name, adapter_dir in dict(getattr(args, "lora_paths", None) or ()).items():  # the last NAME=DIR wins
                try:
                    engine.load_lora(read_adapter(name, adapter_dir, model))
                except (ValueError, OSError) as exc:
                    print(f"error: --lora-paths {name}={adapter_dir}: {exc}", file=sys.stderr)
                    return 2
            app = create_app(engine, path)
    return _run(app, args)  # serving: collections on, setup frozen (freeze_setup)


def _run(app: web.Application, args: argparse.Namespace) -> int:
    freeze_setup()
    try:
        asyncio.run(serve(app, args.host, args.port))
    except OSError as exc:
        print(f"error: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m areal_agents.inference.server --model DIR [--port N] ...``."""
    from areal_agents.inference.launcher import add_serve_args

    keep_freed_memory()  # as a run's command line would have (a server started on its own)
    parser = add_serve_args(argparse.ArgumentParser(prog="python -m areal_agents.inference.server"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.model:
        parser.error("--model DIR is required")
    return cli_serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
