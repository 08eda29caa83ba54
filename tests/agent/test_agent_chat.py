"""ChatAgent and the token-recording LLM: exact bookkeeping across turns."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from areal_agents import ChatAgent, Env, Trajectory
from areal_agents.llm import LLM, Generation
from areal_agents.llm.scripted import CharTokenizer, ScriptedLLM
from areal_agents.rollout.returns import settle_returns


class EchoEnv(Env):
    """Three turns; reward = turn index + 1 when the reply is 'ok'; fixed replies."""

    def __init__(self, turns: int = 3, fail_at: int | None = None) -> None:
        self.turns, self.fail_at = turns, fail_at

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return "start", {}

    def step(self, action):
        self.t += 1
        if self.fail_at == self.t:
            raise RuntimeError("boom in step")
        reward = float(self.t) if action == "ok" else 0.0
        done = self.t >= self.turns
        return f"obs{self.t}", reward, done, False, {"success": done}


def play(env: Env, llm: LLM, gamma: float = 1.0, **agent_kw: Any) -> Trajectory:
    """One episode, its return settled with the run's turn discount ``gamma`` as the rollout does."""
    return settle_returns(asyncio.run(ChatAgent(**agent_kw).run(env, llm)), gamma)


def test_multi_turn_token_bookkeeping() -> None:
    tok = CharTokenizer()
    llm = ScriptedLLM(["ok", "ok", "no"], tok)
    traj = play(EchoEnv(), llm, max_turns=5, system_prompt="sys")
    traj.validate()
    assert traj.num_turns == 3 and traj.status == "ok"
    # Generated tokens are exactly the scripted replies + EOS, and only they carry loss.
    for (start, end), reply in zip(traj.turn_spans, ["ok", "ok", "no"], strict=True):
        assert traj.input_ids[start:end] == tok.encode(reply) + [tok.eos_token_id]
        assert traj.loss_mask[start:end] == [1] * (end - start)
        assert traj.logprobs[start:end] == pytest.approx([-0.1 * (1 + i % 5) for i in range(end - start)])
        assert traj.versions[start:end] == [0] * (end - start)
    assert sum(traj.loss_mask) == sum(e - s for s, e in traj.turn_spans)
    outside = [i for i in range(traj.num_tokens) if not any(s <= i < e for s, e in traj.turn_spans)]
    assert all(traj.loss_mask[i] == 0 and traj.versions[i] == -1 and traj.logprobs[i] == 0.0 for i in outside)
    # The whole sequence is what the chat template renders for the conversation, up to the last
    # reply's eos (the end of turn after it comes with a next message, and there is none).
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "start"}]
    for i, reply in enumerate(["ok", "ok", "no"]):
        msgs.append({"role": "assistant", "content": reply})
        if i < 2:
            msgs.append({"role": "user", "content": f"obs{i + 1}"})
    rendered = tok.apply_chat_template(msgs, tokenize=False)
    assert rendered.endswith("<|im_end|>\n")
    assert tok.decode(traj.input_ids) == rendered.removesuffix("\n")
    assert traj.input_ids[-1] == tok.eos_token_id
    assert traj.turn_rewards == [1.0, 2.0, 0.0]
    assert traj.info["end_reason"] == "terminated" and traj.info["success"] is True
    assert traj.info["messages"] == msgs  # the conversation by role, for the episode record and its viewer


def test_no_retokenization_each_request_extends_the_previous_one() -> None:
    llm = ScriptedLLM(["ok", "ok", "ok"])
    traj = play(EchoEnv(), llm, max_turns=3)
    prompts = [c["input_ids"] for c in llm.calls]
    for prev, nxt in zip(prompts, prompts[1:], strict=False):
        assert nxt[: len(prev)] == prev  # append-only
    # Each request = previous request + its generated tokens + the closing/new-message delta.
    for i, (start, _end) in enumerate(traj.turn_spans):
        assert len(prompts[i]) == start
        assert traj.input_ids[:start] == prompts[i]


class MergingTokenizer(CharTokenizer):
    """Fault injection: merges two tokens that follow each other into one, as BPE merges can, so
    that how a text is cut into encode calls shows in the ids."""

    MERGED = 10**7

    def __init__(self, first: int, second: int) -> None:
        super().__init__()
        self.pair = [first, second]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out: list[int] = []
        for t in super().encode(text, add_special_tokens):
            if out and [out[-1], t] == self.pair:
                out[-1] = self.MERGED
            else:
                out.append(t)
        return out

    def decode(self, ids, skip_special_tokens=False) -> str:
        plain = CharTokenizer.decode
        return "".join(plain(self, self.pair, skip_special_tokens) if t == self.MERGED
                       else plain(self, [t], skip_special_tokens) for t in ids)


def bpe_like_tokenizer() -> MergingTokenizer:
    """Merges <|im_end|> and the newline after it: re-tokenizing the full text gives other ids
    than appending per-turn deltas (a generated turn ends at its sampled eos; the newline after
    it is encoded with the next message)."""
    tok = CharTokenizer()
    return MergingTokenizer(tok.eos_token_id, tok.OFFSET + ord("\n"))


def header_merging_tokenizer() -> MergingTokenizer:
    """Merges a newline and <|im_start|>, as the tiny model's tokenizer does with its message
    headers (``\\n<|im_start|>user\\n`` is one token)."""
    tok = CharTokenizer()
    return MergingTokenizer(tok.OFFSET + ord("\n"), tok.SPECIALS.index("<|im_start|>"))


def test_recorded_ids_are_the_concatenation_of_deltas_not_a_retokenization() -> None:
    tok = bpe_like_tokenizer()
    llm = ScriptedLLM(["ok", "ok"], tok)
    traj = play(EchoEnv(turns=2), llm, max_turns=2)
    full_text = tok.decode(traj.input_ids)
    assert tok.encode(full_text) != traj.input_ids  # a re-tokenization would have merged tokens
    # ... while the record is prompt + gen + ("\n" + delta(new messages)) + gen, each encoded alone.
    s0, e0 = traj.turn_spans[0]
    s1, e1 = traj.turn_spans[1]
    prompt = tok.apply_chat_template([{"role": "user", "content": "start"}], tokenize=False, add_generation_prompt=True)
    delta = "\n<|im_start|>user\nobs1<|im_end|>\n<|im_start|>assistant\n"
    expected = tok.encode(prompt) + tok.encode("ok") + [tok.eos_token_id] + tok.encode(delta)
    assert traj.input_ids[:s1] == expected
    assert traj.input_ids[s1:e1] == tok.encode("ok") + [tok.eos_token_id]
    assert traj.loss_mask[e0:s1] == [0] * (s1 - e0)


def test_the_end_of_a_turn_is_tokenized_with_the_next_message() -> None:
    """The newline after a generated eos and the next header are one token in the record, as in
    a tokenization of the whole conversation (appended alone, the newline would stay a token of its own)."""
    tok = header_merging_tokenizer()
    traj = play(EchoEnv(turns=2), ScriptedLLM(["ok", "ok"], tok), max_turns=2)
    _, e0 = traj.turn_spans[0]
    s1, _ = traj.turn_spans[1]
    assert traj.input_ids[e0 - 1] == tok.eos_token_id
    assert traj.input_ids[e0] == tok.MERGED
    assert traj.input_ids[e0:s1] == tok.encode("\n<|im_start|>user\nobs1<|im_end|>\n<|im_start|>assistant\n")
    assert traj.input_ids == tok.encode(tok.decode(traj.input_ids))  # here the record is the whole text's tokens


def test_eos_then_only_the_rest_of_the_turn_end_is_appended() -> None:
    tok = CharTokenizer()
    llm = ScriptedLLM(["ok", "ok"], tok)
    traj = play(EchoEnv(turns=2), llm, max_turns=2)
    _, e0 = traj.turn_spans[0]
    assert traj.input_ids[e0 - 1] == tok.eos_token_id and traj.loss_mask[e0 - 1] == 1
    assert traj.input_ids[e0] == tok.encode("\n")[0] and traj.loss_mask[e0] == 0


def test_turn_discount_hand_computed() -> None:
    # gamma = 0.5 over three turns with rewards 1, 2, 0: return 1 + 0.5*2 + 0.25*0 = 2.0
    traj = play(EchoEnv(), ScriptedLLM(["ok", "ok", "no"]), max_turns=3, gamma=0.5)
    assert traj.reward == pytest.approx(2.0)
    assert traj.turn_returns == pytest.approx([2.0, 2.0, 0.0])
    # gamma = 1: plain sum.
    traj = play(EchoEnv(), ScriptedLLM(["ok", "ok", "ok"]), max_turns=3, gamma=1.0)
    assert traj.reward == pytest.approx(6.0) and traj.turn_returns == pytest.approx([6.0, 5.0, 3.0])
    # single turn: the discount starts at gamma^0.
    traj = play(EchoEnv(turns=1), ScriptedLLM(["ok"]), max_turns=3, gamma=0.3)
    assert traj.reward == pytest.approx(1.0) and traj.turn_returns == [1.0]
    late = settle_returns(Trajectory(turn_rewards=[0.0, 0.0, 1.0]), 0.5)
    assert (late.reward, late.turn_returns) == (0.25, [0.25, 0.5, 1.0])


def test_env_error_is_recorded_not_raised() -> None:
    traj = play(EchoEnv(fail_at=2), ScriptedLLM(["ok", "ok"]), max_turns=3)
    assert traj.status == "env_error" and "boom in step" in traj.info["error"]
    assert traj.num_turns == 2 and traj.turn_rewards == [1.0, 0.0]
    traj.validate()

    class BadReset(EchoEnv):
        def reset(self, *, seed=None, options=None):
            raise KeyError("no such row")

    traj = play(BadReset(), ScriptedLLM([]), max_turns=3)
    assert traj.status == "env_error" and "no such row" in traj.info["error"] and traj.num_tokens == 0


def test_max_turns_and_max_tokens_budgets() -> None:
    traj = play(EchoEnv(turns=10), ScriptedLLM(["ok"] * 10), max_turns=2)
    assert traj.num_turns == 2 and traj.info["end_reason"] == "max_turns" and traj.info["success"] is False
    llm = ScriptedLLM(["a" * 20] * 10)
    traj = play(EchoEnv(turns=10), llm, max_turns=10, max_tokens=25, sampling={"max_new_tokens": 15})
    assert [c["sampling"]["max_new_tokens"] for c in llm.calls] == [15, 10]
    assert traj.num_generated == 25 and traj.info["end_reason"] == "max_tokens"
    assert traj.finish_reason == "length"


def test_aborted_generation_sets_status() -> None:
    class AbortingLLM(ScriptedLLM):
        """Fault injection: the server aborts the request."""

        async def _generate(self, input_ids, sampling):
            gen = await super()._generate(input_ids, sampling)
            return Generation(gen.output_ids[:1], gen.logprobs[:1], gen.versions[:1], "abort")

    traj = play(EchoEnv(), AbortingLLM(["ok"]), max_turns=3)
    assert traj.status == "aborted" and traj.num_turns == 1


def test_jsonl_round_trip(tmp_path) -> None:
    traj = play(EchoEnv(), ScriptedLLM(["ok", "ok", "no"], version=3), max_turns=3, gamma=0.9)
    path = tmp_path / "rollouts.jsonl"
    path.write_text(traj.to_json() + "\n" + traj.to_json() + "\n")
    back = [Trajectory.from_json(line) for line in path.read_text().splitlines()]
    assert back[0] == traj and back[1].turn_spans == traj.turn_spans
    assert back[0].versions[traj.turn_spans[0][0]] == 3


def test_generate_records_token_level_turns() -> None:
    tok = CharTokenizer()
    llm = ScriptedLLM(["ab", "cd"], tok, append_eos=False)

    async def main() -> None:
        g1 = await llm.generate([5, 6, 7], max_new_tokens=8)
        assert g1.output_ids == tok.encode("ab")
        await llm.generate(llm.input_ids + [9], max_new_tokens=8)
        with pytest.raises(ValueError, match="must start with"):
            await llm.generate([1, 2, 3])

    asyncio.run(main())
    traj = llm.to_trajectory()
    assert traj.input_ids == [5, 6, 7] + tok.encode("ab") + [9] + tok.encode("cd")
    assert traj.loss_mask == [0, 0, 0, 1, 1, 0, 1, 1]
    assert traj.turn_spans == [(3, 5), (6, 8)]


def test_a_fork_and_an_export_do_not_share_the_recording() -> None:
    tok = CharTokenizer()
    llm = ScriptedLLM(["ab", "cd"], tok, append_eos=False)

    async def main() -> LLM:
        await llm.generate([5, 6], max_new_tokens=8)
        twin = llm.fork()
        await twin.generate(twin.input_ids + [9], max_new_tokens=8)
        return twin

    twin = asyncio.run(main())
    assert llm.input_ids == [5, 6, *tok.encode("ab")] and llm.turn_spans == [(2, 4)] and llm.num_generated == 2
    assert twin.input_ids == [5, 6, *tok.encode("ab"), 9, *tok.encode("cd")] and twin.turn_spans == [(2, 4), (5, 7)]
    exported = llm.to_trajectory()
    exported.input_ids.append(0)
    exported.loss_mask.append(1)
    exported.turn_spans.append((4, 5))
    exported.info["note"] = "x"
    again = llm.to_trajectory()
    assert again.input_ids == [5, 6, *tok.encode("ab")] and again.loss_mask == [0, 0, 1, 1]
    assert again.turn_spans == [(2, 4)] and again.info == {}


def test_chat_rejects_a_conversation_that_does_not_extend_the_episode() -> None:
    llm = ScriptedLLM(["x", "y"])

    async def main() -> None:
        await llm.chat([{"role": "user", "content": "a"}])
        with pytest.raises(ValueError, match="must repeat"):
            await llm.chat([{"role": "user", "content": "different"}, {"role": "user", "content": "b"}])

    asyncio.run(main())


def test_stop_strings_and_default_sampling() -> None:
    llm = ScriptedLLM(["abc STOP def", "x"], default_sampling={"temperature": 0.7, "stop": ["STOP"]})
    text = asyncio.run(llm.chat([{"role": "user", "content": "q"}], top_p=0.9))
    assert text == "abc STOP"
    assert llm.calls[0]["sampling"] == {"temperature": 0.7, "stop": ["STOP"], "top_p": 0.9}
    assert llm.to_trajectory().completion_text == "abc STOP"  # nothing follows an episode's last turn
    # A stop string is not EOS, so the full ChatML turn end comes, as context, before the next message.
    asyncio.run(llm.chat([{"role": "user", "content": "q"}, {"role": "assistant", "content": text},
                          {"role": "user", "content": "r"}]))
    traj = llm.to_trajectory()
    assert traj.completion_text == "abc STOP<|im_end|>\n<|im_start|>user\nr<|im_end|>\n<|im_start|>assistant\nx<|im_end|>"
    s, _ = traj.turn_spans[1]
    assert sum(traj.loss_mask[traj.turn_spans[0][1]:s]) == 0


def test_hf_tokenizer_with_chat_template() -> None:
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    bpe.train_from_iterator(["12+34=46", "user assistant", "Wrong, try again."] * 20, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    llm = ScriptedLLM(["46", "47"], tok)
    traj = play(EchoEnv(turns=2), llm, max_turns=2)
    msgs = [{"role": "user", "content": "start"}, {"role": "assistant", "content": "46"},
            {"role": "user", "content": "obs1"}, {"role": "assistant", "content": "47"}]
    assert tok.decode(traj.input_ids) == tok.apply_chat_template(msgs, tokenize=False).removesuffix("\n")
    s, e = traj.turn_spans[1]
    assert traj.input_ids[s:e] == tok.encode("47", add_special_tokens=False) + [tok.eos_token_id]


def test_message_list_observations_are_appended_as_messages() -> None:
    class MsgEnv(Env):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], {}

        def step(self, action):
            return [{"role": "user", "content": "bye"}], 0.5, False, False, {}

    tok = CharTokenizer()
    traj = play(MsgEnv(), ScriptedLLM(["a", "b"], tok), max_turns=2)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "bye"},
            {"role": "assistant", "content": "b"}]
    assert tok.decode(traj.input_ids) == tok.apply_chat_template(msgs, tokenize=False).removesuffix("\n")
    assert traj.turn_rewards == [0.5, 0.5] and traj.info["end_reason"] == "max_turns"


def test_reward_failure_reported_by_the_env_sets_the_status() -> None:
    class FailingRewardEnv(EchoEnv):
        def step(self, action):
            return "", 0.0, True, False, {"success": False, "reward_status": "timeout", "reward_error": "slow"}

    traj = play(FailingRewardEnv(), ScriptedLLM(["x"]), max_turns=2)
    assert traj.status == "timeout" and traj.info["reward_error"] == "slow"


class Misbehaving(Env):
    """Fault injection: ``step`` returns what ``self.reply`` says."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


@pytest.mark.parametrize(("reply", "error"), [
    (RuntimeError("boom"), "step: RuntimeError: boom"),
    (("obs", 1.0, True), "step: ValueError: not enough values to unpack"),
    (("obs", float("nan"), True, False, {}), "non-finite reward nan"),
    (("obs", "abc", True, False, {}), "step: ValueError: could not convert string to float"),
    (("obs", 1.0, True, False, ["not", "a", "dict"]), "info of type list, not dict"),
])
def test_checked_step_turns_a_misbehaving_env_into_an_error(reply: Any, error: str) -> None:
    from areal_agents import checked_step

    step = asyncio.run(checked_step(Misbehaving(reply), "x"))
    assert step.error is not None and error in step.error and step.reward == 0.0
    rewards: list[float] = []
    info: dict[str, Any] = {"kept": 1}
    assert step.record(rewards, info, "ok") == "env_error" and step.end_reason == "env_error"
    assert rewards == [0.0] and info == {"kept": 1, "error": step.error}


def test_checked_step_passes_a_good_step_through() -> None:
    from areal_agents import checked_step

    env = Misbehaving(("next", 2, 1, 0, {"reward_status": "timeout", "success": True}))
    step = asyncio.run(checked_step(env, "x"))
    assert (step.obs, step.reward, step.terminated, step.truncated, step.error) == ("next", 2.0, True, False, None)
    assert step.reward_status == "timeout" and step.info["success"] is True
    rewards, info = [0.5], {"kept": 1}
    assert step.record(rewards, info, "ok") == "timeout" and step.end_reason == "terminated"
    assert rewards == [0.5, 2.0] and info == {"kept": 1, "reward_status": "timeout", "success": True}
    going = asyncio.run(checked_step(Misbehaving(("next", 1.0, False, False, {})), "x"))
    assert going.end_reason is None and going.record([], {}, "reward_error") == "reward_error"
    assert asyncio.run(checked_step(Misbehaving(("", 0.0, False, True, {})), "x")).end_reason == "truncated"


def test_customize_guide_agent_runs_verbatim() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "customize.md").read_text()
    code = re.search(r"## Agent\n\n```python\n(.*?)```", text, flags=re.DOTALL).group(1)
    scope: dict[str, Any] = {}
    exec(compile(code, "customize.md", "exec"), scope)  # the guide's agent class, as written
    agent = scope["MyAgent"]()
    traj = asyncio.run(agent.run(EchoEnv(turns=1), ScriptedLLM(["ok"], CharTokenizer())))
    assert traj.status == "ok" and traj.turn_rewards == [1.0] and traj.info["success"] is True
    broken = asyncio.run(agent.run(EchoEnv(fail_at=1), ScriptedLLM(["ok"], CharTokenizer())))
    assert broken.status == "env_error" and "boom in step" in broken.info["error"]


def test_a_group_renders_its_shared_prompt_once_with_the_same_tokens() -> None:
    """The chat template is rendered once per distinct conversation and tokenizer (the 8
    episodes of a group share their prompt): the same tokens as rendering each time."""

    class CountingTokenizer(CharTokenizer):
        renders = 0

        def apply_chat_template(self, conversation, tokenize=True, add_generation_prompt=False, **kwargs):
            CountingTokenizer.renders += 1
            return super().apply_chat_template(conversation, tokenize, add_generation_prompt, **kwargs)

    tok = CountingTokenizer()
    trajs = [play(EchoEnv(turns=2), ScriptedLLM(["ok", "no"], tok), max_turns=2, system_prompt="sys") for _ in range(8)]
    fresh = play(EchoEnv(turns=2), ScriptedLLM(["ok", "no"], CharTokenizer()), max_turns=2, system_prompt="sys")
    assert all(t.input_ids == fresh.input_ids and t.loss_mask == fresh.loss_mask for t in trajs)
    # one episode's renders: the prompt, the turn-end probe, and old + full text of turn 2
    assert CountingTokenizer.renders == 4
    other = play(EchoEnv(turns=1), ScriptedLLM(["ok"], tok), max_turns=1, system_prompt="another")
    assert CountingTokenizer.renders == 5 and other.num_turns == 1  # a new prompt is rendered
