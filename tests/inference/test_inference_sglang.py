"""The embedded server speaks SGLang's protocol as SGLang's own client uses it.

Two layers: the request bodies SGLang 0.5.23's frontend language sends (recorded from it,
and the whole field set of SGLang's ``GenerateReqInput`` / ``SamplingParams`` at null),
posted as they are; then the frontend itself (``RuntimeEndpoint`` with ``gen``,
``run_batch``, ``fork``, ``select``) driving a real ``areal-agents serve`` subprocess. Every
result is checked against the model run independently here (full forward passes).

The frontend test installs nothing: it imports SGLang's pure-Python frontend from the wheel file
that the install step fetched into ``.wheels/`` (``sglang-frontend.txt`` beside this file says how;
the wheel's metadata pins a CUDA torch and GPU kernels the frontend never imports, so it cannot be
a dependency). The frontend's own imports come with ``pip install -e ".[sglang-client]"`` (part of
``[dev]``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sglang_frontend_client as client
from inference_support import corpus, full_logprobs, greedy_ids, load_reference, start_servers

from areal_agents.inference.launcher import ServerHandle

HERE = Path(__file__).parent
REPO = HERE.parents[1]
FRONTEND_REQUIREMENT = HERE / "sglang-frontend.txt"
SGLANG_VERSION = next(line.removeprefix("sglang==").strip() for line in FRONTEND_REQUIREMENT.read_text().splitlines()
                      if line.startswith("sglang=="))

# What SGLang 0.5.23's frontend sent for ``gen("answer", max_tokens=8, temperature=0)`` and for
# ``select`` (a prefill of the prefix, then the choices as one batch), recorded on the wire.
FRONTEND_GEN = {
    "text": "What is 3 + 4?",
    "sampling_params": {"skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 8,
                        "min_new_tokens": 0, "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [],
                        "temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
                        "presence_penalty": 0.0, "ignore_eos": False, "regex": None, "json_schema": None},
}  # fmt: skip
FRONTEND_PREFILL = {"text": client.SELECT_PREFIX, "sampling_params": {"max_new_tokens": 0}}
FRONTEND_SELECT = {
    "text": [client.SELECT_PREFIX + c for c in client.SELECT_CHOICES],
    "sampling_params": {"max_new_tokens": 0, "temperature": 0},
    "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": 10,
}  # fmt: skip
# Every request field of SGLang 0.5.23 (io_struct.GenerateReqInput, sampling_params.SamplingParams).
SGLANG_FIELDS = (
    "session_id input_embeds image_data video_data audio_data mm_hashes mm_content_hashes use_audio_in_video "
    "video_config watermark return_logprob logprob_start_len top_logprobs_num token_ids_logprob return_sampling_mask "
    "sampling_logprobs_mode return_text_in_logprobs return_flat_raw_top_logprobs return_flat_raw_output_top_logprobs "
    "stream log_metrics return_hidden_states return_routed_experts routed_experts_start_len return_indexer_topk "
    "modalities session_params lora_path lora_id custom_logit_processor positional_embed_overrides bootstrap_host "
    "bootstrap_port bootstrap_room bootstrap_pair_key decode_tp_size routed_dp_rank data_parallel_rank "
    "disagg_prefill_dp_rank routing_key conversation_id http_worker_ipc background require_reasoning "
    "max_thinking_tokens priority extra_key no_logs custom_labels return_bytes return_entropy return_prompt_token_ids "
    "external_trace_header received_time need_wait_for_mm_inputs num_items_assigned encoder_urls max_dynamic_patch "
    "min_dynamic_patch image_max_dynamic_patch video_max_dynamic_patch images_config mm_processor_kwargs "
    "multi_item_delimiter_indices token_indices_to_pool cache_salt kv_hints rid"
).split()
SGLANG_SAMPLING_FIELDS = (
    "max_new_tokens stop stop_token_ids stop_regex temperature top_p top_k min_p frequency_penalty presence_penalty "
    "repetition_penalty min_new_tokens n beam_width json_schema regex ebnf structural_tag ignore_eos "
    "skip_special_tokens spaces_between_special_tokens no_stop_trim stream_interval logit_bias sampling_seed "
    "custom_params watermark ebnf_full_assistant"
).split()


@pytest.fixture(scope="module")
def model_dir(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model(corpus(), seed=0)


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    with start_servers(model_dir, 1, tmp_path_factory.mktemp("logs")) as group:
        yield group[0]


@pytest.fixture(scope="module")
def ref(model_dir: Path) -> Any:
    """The model and tokenizer, run here by full forward passes: the independent reference."""
    model, tok = load_reference(model_dir)
    eos = model.generation_config.eos_token_id
    eos_ids = {int(e) for e in [*(eos if isinstance(eos, list) else [eos]), tok.eos_token_id] if e is not None}

    class Ref:
        def encode(self, text: str) -> list[int]:
            return list(tok.encode(text, add_special_tokens=False))

        def logprobs(self, ids: list[int]) -> Any:
            return full_logprobs(model, ids)

        def greedy(self, text: str, max_new_tokens: int) -> list[int]:
            return greedy_ids(model, self.encode(text), max_new_tokens, eos_ids)

        def greedy_text(self, text: str, max_new_tokens: int) -> str:
            return str(tok.decode(self.greedy(text, max_new_tokens), skip_special_tokens=True))

        def piece(self, token: int) -> str:
            return str(tok.decode([token]))

        def select_scores(self, prefix: str, choices: list[str]) -> list[float]:
            """The frontend's token-length-normalised score of each choice, from scratch."""
            start = max(len(self.encode(prefix)) - 2, 0)
            scores = []
            for c in choices:
                ids = self.encode(prefix + c)
                lp = self.logprobs(ids)
                assert not prefix.endswith(self.piece(ids[start]))  # no token healing to undo for these choices
                values = [float(lp[p - 1, ids[p]]) for p in range(start + 1, len(ids))]
                scores.append(sum(values) / len(values))
            return scores

    return Ref()


def post(server: ServerHandle, body: Any) -> httpx.Response:
    return httpx.post(server.url + "/generate", json=body, timeout=60)


def ok(server: ServerHandle, body: Any) -> Any:
    resp = post(server, body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def close(got: list[Any], want: list[float], tol: float = 1e-4) -> bool:
    return len(got) == len(want) and all(abs(a - b) < tol for a, b in zip(got, want, strict=True))


# ------------------------------------------------------------------ recorded bodies (no sglang needed)
def test_frontend_gen_body(server: ServerHandle, ref: Any) -> None:
    out = ok(server, FRONTEND_GEN)
    assert out["text"] == ref.greedy_text(FRONTEND_GEN["text"], 8)
    assert out["meta_info"]["finish_reason"]["type"] in ("length", "stop")


def test_frontend_select_bodies_score_the_choices(server: ServerHandle, ref: Any) -> None:
    prompt_len = ok(server, FRONTEND_PREFILL)["meta_info"]["prompt_tokens"]
    assert prompt_len == len(ref.encode(client.SELECT_PREFIX))
    body = {**FRONTEND_SELECT, "logprob_start_len": max(prompt_len - 2, 0)}  # as the frontend computes it
    replies = ok(server, body)
    assert len(replies) == len(client.SELECT_CHOICES)
    for choice, reply in zip(client.SELECT_CHOICES, replies, strict=True):
        ids = ref.encode(client.SELECT_PREFIX + choice)
        meta = reply["meta_info"]
        assert reply["output_ids"] == [] and meta["finish_reason"] == {"type": "length", "length": 0}
        assert meta["output_token_logprobs"] == []
        rows = meta["input_token_logprobs"]
        start = prompt_len - 2
        assert [r[1] for r in rows] == ids[start:] and [r[2] for r in rows] == [ref.piece(t) for t in ids[start:]]
        lp = ref.logprobs(ids)
        assert rows[0][0] is None  # the first token of the window has no logprob, as in SGLang
        assert close([r[0] for r in rows[1:]], [float(lp[p - 1, ids[p]]) for p in range(start + 1, len(ids))])


def test_every_sglang_field_at_null_is_accepted(server: ServerHandle) -> None:
    prompt = [5, 9, 14, 3]
    plain = ok(server, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    sampling = {**dict.fromkeys(SGLANG_SAMPLING_FIELDS), "max_new_tokens": 6, "temperature": 0}
    body = {**dict.fromkeys(SGLANG_FIELDS), "input_ids": prompt, "text": None, "sampling_params": sampling}
    assert ok(server, body)["output_ids"] == plain["output_ids"]
    defaults = {"min_p": 0.0, "repetition_penalty": 1.0, "stop_regex": [], "logit_bias": {}, "regex": "",
                "spaces_between_special_tokens": True, "stream_interval": 4, "beam_width": None}
    body = {"input_ids": prompt, "lora_path": [None], "return_hidden_states": False, "log_metrics": False,
            "priority": 3, "sampling_params": {**defaults, "max_new_tokens": 6, "temperature": 0}}
    assert ok(server, body)["output_ids"] == plain["output_ids"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("stop_regex", "\\d"), ("regex", "[0-9]+"), ("json_schema", "{}"), ("min_p", 0.1), ("repetition_penalty", 1.2),
     ("logit_bias", {"5": 1.0}), ("sampling_seed", -1), ("ebnf", "root ::= 'a'"), ("lora_path", "adapter"),
     ("session_id", "s1"), ("return_hidden_states", True), ("image_data", "http://x/y.png"),
     ("token_ids_logprob", [5])],
)  # fmt: skip
def test_an_unsupported_feature_is_a_400_naming_it(server: ServerHandle, field: str, value: Any) -> None:
    body: dict[str, Any] = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}
    if field in SGLANG_SAMPLING_FIELDS:
        body["sampling_params"][field] = value
    else:
        body[field] = value
    resp = post(server, body)
    assert resp.status_code == 400 and field in resp.json()["error"]["message"], resp.text


def test_sampling_seed_draws_the_same_tokens_alone_or_batched(server: ServerHandle) -> None:
    """A seeded request samples from a generator of its own: the same tokens when sent alone,
    again, or in a batch beside unseeded prompts; other seeds draw otherwise; ``n`` samples of
    one seeded request take seeds seed, seed + 1, ..."""
    prompt = [7, 30, 51]

    def sp(seed: int | None, n: int = 1) -> dict[str, Any]:
        return {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True, "sampling_seed": seed, "n": n}

    alone = ok(server, {"input_ids": prompt, "sampling_params": sp(11)})["output_ids"]
    assert ok(server, {"input_ids": prompt, "sampling_params": sp(11)})["output_ids"] == alone
    batch = ok(server, {"input_ids": [[5, 6], prompt, [9]], "sampling_params": [sp(None), sp(11), sp(None)]})
    assert batch[1]["output_ids"] == alone
    others = [ok(server, {"input_ids": prompt, "sampling_params": sp(s)})["output_ids"] for s in (12, 13, 14)]
    assert any(o != alone for o in others)
    two = ok(server, {"input_ids": prompt, "sampling_params": sp(11, n=2)})
    assert [r["output_ids"] for r in two] == [alone, others[0]]


# --------------------------------------------------------------------- logprob fields, by token id
def test_prompt_logprobs_from_any_start(server: ServerHandle, ref: Any) -> None:
    prompt = [7, 30, 51, 12, 99, 4, 61, 23, 18]
    lp = ref.logprobs(prompt)
    for start in (0, 4, 8, 9):
        out = ok(server, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2}, "return_logprob": True,
                          "logprob_start_len": start})  # fmt: skip
        rows = out["meta_info"]["input_token_logprobs"]
        assert [r[1] for r in rows] == prompt[start:] and all(r[2] is None for r in rows)
        if rows:
            assert rows[0][0] is None
            assert close([r[0] for r in rows[1:]], [float(lp[p - 1, prompt[p]]) for p in range(start + 1, 9)])
        assert len(out["output_ids"]) == 2
    default = ok(server, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2}, "return_logprob": True})
    assert default["meta_info"]["input_token_logprobs"] == [] and len(default["meta_info"]["output_token_logprobs"]) == 2
    too_far = post(server, {"input_ids": prompt, "return_logprob": True, "logprob_start_len": 10})
    assert too_far.status_code == 400 and "logprob_start_len" in too_far.json()["error"]["message"]


def test_top_logprobs_and_text_in_logprobs(server: ServerHandle, ref: Any) -> None:
    prompt = [11, 40, 3, 77, 25]
    out = ok(server, {"input_ids": prompt, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 4,
                      "return_text_in_logprobs": True,
                      "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}})  # fmt: skip
    meta, ids = out["meta_info"], out["output_ids"]
    lp = ref.logprobs(prompt + ids)
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"]) == len(prompt)
    tops = meta["input_top_logprobs"][1:] + meta["output_top_logprobs"]  # position p - 1 predicts token p
    assert len(tops) == len(prompt) - 1 + len(ids) == len(lp) - 1
    for p, rows in enumerate(tops, start=1):
        values, best = lp[p - 1].topk(4)
        assert [r[1] for r in rows] == best.tolist() and close([r[0] for r in rows], values.tolist())
        assert [r[2] for r in rows] == [ref.piece(t) for t in best.tolist()]
    assert [rows[0][1] for rows in meta["output_top_logprobs"]] == ids  # greedy takes the top token
    assert [r[2] for r in meta["output_token_logprobs"]] == [ref.piece(t) for t in ids]


def test_prompt_scoring_only_and_per_prompt_lists(server: ServerHandle, ref: Any) -> None:
    prompts = [[8, 16, 32, 64], [9, 18, 36]]
    out = ok(server, {"input_ids": prompts, "return_logprob": [True, True], "logprob_start_len": [0, 1],
                      "sampling_params": [{"max_new_tokens": 0}, {"max_new_tokens": 3}]})  # fmt: skip
    assert out[0]["output_ids"] == [] and out[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert len(out[1]["output_ids"]) == 3 or out[1]["meta_info"]["finish_reason"]["type"] == "stop"
    for prompt, reply, start in zip(prompts, out, (0, 1), strict=True):
        lp = ref.logprobs(prompt)
        rows = reply["meta_info"]["input_token_logprobs"]
        assert [r[1] for r in rows] == prompt[start:]
        assert close([r[0] for r in rows[1:]], [float(lp[p - 1, prompt[p]]) for p in range(start + 1, len(prompt))])
    bad = post(server, {"input_ids": prompts, "logprob_start_len": [0, 1, 2], "return_logprob": True})
    assert bad.status_code == 400 and "logprob_start_len" in bad.json()["error"]["message"]


# ------------------------------------------------------------------------- SGLang's frontend itself
def sglang_wheel() -> Path:
    """SGLang's wheel file in ``.wheels/``, put there by the install step; its frontend is imported
    from the file (a wheel is a zip archive: Python imports pure-Python modules from it)."""
    found = sorted((REPO / ".wheels").glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if not found:
        fetch = f"python3 -m pip download --no-deps -r {FRONTEND_REQUIREMENT.relative_to(REPO)} -d .wheels"
        pytest.fail(f"SGLang's {SGLANG_VERSION} wheel is not in .wheels/ (the README's test command fetches it: {fetch})")
    return found[-1]


@pytest.mark.slow
def test_sglang_frontend_gen_run_batch_fork_select(server: ServerHandle, ref: Any) -> None:
    env = {**os.environ, "PYTHONPATH": str(sglang_wheel())}
    proc = subprocess.run([sys.executable, str(HERE / "sglang_frontend_client.py"), server.url],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)

    want = [ref.greedy_text(q, 8) for q in client.PROMPTS]
    assert out["gen"] == {"answer": want[0], "text": client.PROMPTS[0] + want[0]}
    assert out["run_batch"] == want
    # streamed through the frontend's stream path: how many chunks its reader sees depends on when it reads
    # (a loaded machine reads them all at once); the server's token-by-token events are
    # test_inference_server.py::test_stream_sends_the_reply_token_by_token's
    assert "".join(out["gen_stream"]["chunks"]) == out["gen_stream"]["answer"] == want[1]
    assert out["gen_stream"]["chunks"]

    meta = out["gen_logprobs"]["meta_info"]  # gen(..., return_logprob, top_logprobs_num=3, logprob_start_len=0)
    prompt, ids = ref.encode(client.PROMPTS[0]), ref.greedy(client.PROMPTS[0], 6)
    lp = ref.logprobs(prompt + ids)
    assert [r[1] for r in meta["input_token_logprobs"]] == prompt and meta["input_token_logprobs"][0][0] is None
    assert close([r[0] for r in meta["input_token_logprobs"][1:]], [float(lp[p - 1, prompt[p]]) for p in range(1, len(prompt))])
    assert [r[1] for r in meta["output_token_logprobs"]] == ids
    assert close([r[0] for r in meta["output_token_logprobs"]], [float(lp[len(prompt) + i - 1, t]) for i, t in enumerate(ids)])
    assert [r[2] for r in meta["output_token_logprobs"]] == [ref.piece(t) for t in ids]
    assert [[r[1] for r in rows] for rows in meta["output_top_logprobs"]] == [
        lp[len(prompt) + i - 1].topk(3).indices.tolist() for i in range(len(ids))]

    branches = [ref.greedy_text(client.FORK_PREFIX + tail, 5) for tail in client.FORK_TAILS]
    assert out["fork"]["text"] == client.FORK_PREFIX + "|".join(branches)

    scores = ref.select_scores(client.SELECT_PREFIX, client.SELECT_CHOICES)
    best = max(range(len(scores)), key=scores.__getitem__)
    assert sorted(scores)[-1] - sorted(scores)[-2] > 1e-3  # a clear winner, beyond float noise
    assert out["select"]["choice"] == client.SELECT_CHOICES[best]
    assert close(out["select"]["meta_info"]["normalized_prompt_logprobs"], scores)
