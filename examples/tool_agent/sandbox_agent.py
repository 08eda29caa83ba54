"""A custom agent that runs the model's Python itself, in the sandbox, before answering the env.

    python examples/tool_agent/sandbox_agent.py --config examples/tool_agent/config.yaml [key=value ...]

registers the agent as ``sandbox-tool`` and then runs ``areal-agents run`` with the same
arguments (``agent.name=sandbox-tool`` selects it). ``SandboxToolAgent`` plays any text env:
a reply with ``<python>code</python>`` is executed by the agent with
:func:`areal_agents.tools.sandbox.run_python` (no network, memory/CPU/process limits, a fresh temp
dir) and the output goes back to the model as ``<output>...</output>``; a reply without a
tool call is the answer and goes to ``env.step``. Tool turns get reward 0; the env's reward
lands on the answer turn, so with ``credit=turn`` and ``turn_discount < 1`` every tool call
costs a factor γ.

Without ``actor.path``, :func:`warm_start` first fine-tunes the tiny default model on whole
reference episodes (the tool call, then the answer after the tool's output) and the run
starts from it: the run's own warm start would train the first reply only.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_agents import Agent
from areal_agents.agent import checked_step, jsonable
from areal_agents.env import reference_completion
from areal_agents.runtime.threads import run_in_thread
from areal_agents.tools.sandbox import run_python

if TYPE_CHECKING:
    from areal_agents import Env, Trajectory
    from areal_agents.llm import LLM

__all__ = ["SandboxToolAgent", "main", "reference_turns", "register", "warm_start"]

_CALL = re.compile(r"<python>(.*?)</python>", re.DOTALL)
# Sandboxes that run at once, in this process: a burst of tool calls (every episode of a batch
# calls the tool at about the same time) queues here instead of starving each other of CPU
# until they hit their wall-clock timeout (measured: 100 at once on 2 busy cores, 75 timed out).
_SANDBOX_SLOTS = threading.BoundedSemaphore(2 * (os.cpu_count() or 1))


class SandboxToolAgent(Agent):
    """Chat with ``env``; run ``<python>`` blocks in the sandbox (at most ``max_tool_calls``).

    The first four arguments are the ones ``areal-agents run`` passes to every agent (``agent.*``
    and the rollout's sampling); ``agent.kwargs`` may set the others. No turn discount: the rollout
    applies ``env.turn_discount`` to the per-turn rewards where the episode ends.
    """

    def __init__(self, max_turns: int = 4, max_tokens: int = 256, system_prompt: str | None = None,
                 sampling: dict[str, Any] | None = None, *,
                 max_tool_calls: int = 2, timeout_s: float = 5.0, memory_mb: int = 256,
                 max_output_chars: int = 200) -> None:
        if max_turns < 1 or max_tokens < 1 or max_tool_calls < 0:
            raise ValueError("SandboxToolAgent: max_turns and max_tokens must be >= 1, max_tool_calls >= 0")
        self.max_turns, self.max_tokens, self.system_prompt = max_turns, max_tokens, system_prompt
        self.sampling = dict(sampling or {})
        self.max_tool_calls, self.timeout_s, self.memory_mb = max_tool_calls, timeout_s, memory_mb
        self.max_output_chars = max_output_chars

    def run_tool(self, code: str) -> str:
        """Run ``code`` in the sandbox; stdout (or the last stderr line) as ``<output>...</output>``."""
        # keep the whole traceback from the sandbox; only what the model sees is cut short
        with _SANDBOX_SLOTS:
            res = run_python(code, timeout_s=self.timeout_s, memory_mb=self.memory_mb, max_output_chars=16_000)
        text = res.stdout.strip()
        if res.exit_code != 0 and res.stderr.strip():
            text = (text + "\n" + res.stderr.strip().splitlines()[-1]).strip()
        if res.timed_out:
            text += "\nTimed out."
        return self.tool_message(text)

    def tool_message(self, text: str) -> str:
        """What the model is shown after a tool run that printed ``text``."""
        return f"<output>{text[: self.max_output_chars]}</output>"

    async def run(self, env: Env, llm: LLM, row: dict[str, Any] | None = None, *,
                  seed: int | None = None) -> Trajectory:
        from areal_agents import Trajectory

        try:
            obs, _ = await env.areset(seed=seed, options=row)
        except Exception as exc:  # noqa: BLE001 - env failures are recorded, never raised
            return Trajectory(status="env_error", info={"error": f"reset: {type(exc).__name__}: {exc}"})
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages += [{"role": "user", "content": obs}] if isinstance(obs, str) else [dict(m) for m in obs]
        rewards: list[float] = []
        info: dict[str, Any] = {"agent_tool_calls": 0}
        status, end_reason = "ok", "max_turns"
        for _ in range(self.max_turns):
            budget = self.max_tokens - llm.num_generated
            if budget <= 0:
                end_reason = "max_tokens"
                break
            per_turn = int(self.sampling.get("max_new_tokens", budget))
            text = await llm.chat(messages, **{**self.sampling, "max_new_tokens": max(1, min(per_turn, budget))})
            messages.append({"role": "assistant", "content": text})
            if llm.last_generation is not None and llm.last_generation.finish_reason == "abort":
                rewards.append(0.0)
                status = end_reason = "aborted"
                break
            call = _CALL.search(text)
            if call is not None and info["agent_tool_calls"] < self.max_tool_calls:
                info["agent_tool_calls"] += 1
                output = await run_in_thread(self.run_tool, call.group(1))  # the sandbox blocks: off the loop
                rewards.append(0.0)
                messages.append({"role": "user", "content": output})
                continue
            # an answer (or a tool call over the budget, which the env handles its own way)
            step = await checked_step(env, text)  # never raises: a broken env gives step.error
            status = step.record(rewards, info, status)
            if step.end_reason is not None:
                end_reason = step.end_reason
                break
            obs = step.obs
            messages += [{"role": "user", "content": obs}] if isinstance(obs, str) else [dict(m) for m in obs]
        info.update(end_reason=end_reason, num_turns=len(rewards), turn_finish_reasons=llm.finish_reasons)
        info.setdefault("success", False)
        traj = llm.to_trajectory(status=status, info=jsonable(info))
        traj.set_rewards(rewards)  # per-turn rewards: the rollout applies env.turn_discount where the episode ends
        return traj


def reference_turns(env: Env, agent: SandboxToolAgent, row: dict[str, Any]) -> list[tuple[list[dict[str, Any]], str]]:
    """The reference episode of ``row`` as ``(conversation so far, reply)`` pairs: the env's
    reference tool call, then, after the tool's output, the answer.

    The output shown is ``row["answer"]``: what ``print(expression)`` prints for the rows of
    the ``arithmetic`` dataset (the tests check this against a real sandbox run), so the
    warm start does not start a sandbox per row.
    """
    obs, _ = env.reset(options=row)
    chat = [{"role": "system", "content": agent.system_prompt}] if agent.system_prompt else []
    chat += [{"role": "user", "content": obs}] if isinstance(obs, str) else [dict(m) for m in obs]
    call, answer = reference_completion(env, row), str(row["answer"])
    if call is None or _CALL.search(call) is None:
        return [(chat, answer)]
    after = [*chat, {"role": "assistant", "content": call}, {"role": "user", "content": agent.tool_message(answer)}]
    return [(chat, call), (after, answer)]


def _greedy_episode_accuracy(model: Any, tokenizer: Any, episodes: list[list[tuple[list[int], list[int]]]]) -> float:
    """Share of episodes (lists of ``(prompt_ids, reply_ids + eos)`` turns) whose every reply
    the model reproduces by greedy decoding."""
    import torch

    turns = [t for episode in episodes for t in episode]
    pad, width = tokenizer.pad_token_id, max(len(p) for p, _ in turns)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in turns])
    attn = (ids != pad).long()
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=attn, do_sample=False, pad_token_id=pad,
                             eos_token_id=tokenizer.eos_token_id, max_new_tokens=max(len(c) for _, c in turns))
    model.train(was_training)
    hits = iter([out[i, width : width + len(c)].tolist() == c for i, (_, c) in enumerate(turns)])
    return sum(all(next(hits) for _ in episode) for episode in episodes) / len(episodes)


def warm_start(cfg: Any, *, progress: bool = True) -> Path:
    """The tiny default model, fine-tuned on whole reference tool episodes (cached).

    The run's own warm start trains only the first reply (the env's ``reference_completion``,
    the tool call); this one also trains the answer that follows the tool's output, with the
    same settings (``sft.warm_start_steps``, ``sft.warm_start_lr``, ``sft.batch_size``). It
    stops at the first check (every ``sft.warm_start_check_every`` steps) where greedy decoding
    reproduces both turns of at least ``sft.warm_start_target`` of 100 test rows, leaving RL
    room to learn. Cached under ``$AREAL_AGENTS_CACHE/warm`` (or ``sft.output_dir``).
    """
    import dataclasses
    import hashlib
    import json

    from transformers import AutoTokenizer

    from areal_agents.data import load_dataset_rows
    from areal_agents.gym.registration import make_env
    from trainers.sft import sft_train
    from trainers.tiny_model import cache_dir, ensure_tiny_model

    env = make_env(cfg.env.name, **cfg.env.kwargs)
    agent = SandboxToolAgent(system_prompt=cfg.agent.system_prompt, **cfg.agent.kwargs)
    train = [t for row in load_dataset_rows(cfg, "train") for t in reference_turns(env, agent, row)]
    test = [reference_turns(env, agent, row) for row in load_dataset_rows(cfg, "test")[:100]]
    sft = dataclasses.replace(cfg.sft, steps=cfg.sft.warm_start_steps, lr=cfg.sft.warm_start_lr,
                              eval_every=cfg.sft.warm_start_check_every)
    key = json.dumps({"v": 1, "train": train, "test": test, "seed": cfg.seed,
                      "sft": {k: v for k, v in dataclasses.asdict(sft).items() if k != "output_dir"}}, sort_keys=True)
    name = f"{cfg.env.name}-sandbox-tool"
    out = Path(cfg.sft.output_dir or cache_dir() / "warm" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}")
    if (out / "config.json").is_file():
        return out

    def texts() -> list[str]:  # the tokenizer learns from what the model reads and writes
        return [m["content"] for chat, reply in train[:5000] for m in [*chat, {"content": reply}]]

    base = ensure_tiny_model(name, texts)
    tokenizer = AutoTokenizer.from_pretrained(base)

    def encode(turns: list[tuple[list[dict[str, Any]], str]]) -> list[tuple[list[int], list[int]]]:
        return [(tokenizer.encode(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
                                  add_special_tokens=False),
                 tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]) for chat, reply in turns]

    check = [encode(episode) for episode in test]
    report = sft_train(base, encode(train), sft, out, cfg=cfg, tokenizer=tokenizer, progress=progress, seed=cfg.seed,
                       eval_fn=lambda engine: {"acc": _greedy_episode_accuracy(engine.model, tokenizer, check)},
                       stop_at=cfg.sft.warm_start_target or None)
    (out / "sft_report.json").write_text(json.dumps({k: report[k] for k in ("evals", "seconds", "stopped_early")}))
    return out


def register() -> None:
    """Register :class:`SandboxToolAgent` as ``sandbox-tool`` (``agent.name=sandbox-tool``)."""
    from areal_agents import register_agent

    register_agent("sandbox-tool")(SandboxToolAgent)


def main(argv: list[str] | None = None) -> int:
    """Register the agent, warm-start the tiny model (without ``actor.path``), then
    ``areal-agents run`` with ``argv`` (default: the command line)."""
    from areal_agents.cli import build_parser, load_args_config
    from areal_agents.cli import main as cli_main

    args = ["run", *(sys.argv[1:] if argv is None else argv)]
    register()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            cfg = load_args_config(build_parser().parse_args(args))
    except (Exception, SystemExit):  # a mistake in the arguments: `areal-agents run` reports it, once
        return cli_main(args)
    if cfg.actor.path is None and cfg.agent.name == "sandbox-tool":
        args.append(f"actor.path={warm_start(cfg, progress=cfg.logging.progress)}")
    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
