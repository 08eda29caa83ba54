"""Drive a server with SGLang's own frontend language and print what came back, as JSON.

``python sglang_frontend_client.py URL`` runs ``gen`` (plain, with logprobs, streamed),
``run_batch``, ``fork`` and ``select`` through ``sglang.RuntimeEndpoint`` against the
SGLang-protocol server at URL. It needs the ``sglang`` wheel importable (the wheel file on
``PYTHONPATH``; see test_inference_sglang.py) and the frontend's small dependencies.

``sglang/__init__.py`` is not run: before re-exporting the frontend it patches
transformers for SGLang's own server runtime, which imports ``triton`` (a ~1 GB GPU
compiler) and a CUDA build of torch. The frontend (``sglang.lang``) imports neither, and
``sglang.gen``, ``sglang.select``, ``sglang.function`` and ``sglang.RuntimeEndpoint`` are the
objects loaded here from ``sglang.lang``, unchanged.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from typing import Any

PROMPTS = ["What is 3 + 4?", "What is 12 + 30?", "What is 7 + 8?"]
SELECT_PREFIX = "What is 2 + 2? The answer is"
SELECT_CHOICES = [" 4.", " 22.", " 5 and more.", " 40."]
FORK_PREFIX = "What is 5 + 6?"
FORK_TAILS = [" The answer", " It is"]


def load_frontend() -> tuple[Any, Any]:
    """``(sglang.lang.api, RuntimeEndpoint)`` from the installed wheel, without ``sglang/__init__.py``."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not importable (put its wheel file on PYTHONPATH)")
    package = types.ModuleType("sglang")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules["sglang"] = package
    from sglang.lang import api
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    return api, RuntimeEndpoint


def main(url: str) -> None:
    sgl, RuntimeEndpoint = load_frontend()
    sgl.set_default_backend(RuntimeEndpoint(url))

    @sgl.function
    def answer(s: Any, question: str) -> None:
        s += question
        s += sgl.gen("answer", max_tokens=8, temperature=0)

    @sgl.function
    def scored(s: Any, question: str) -> None:
        s += question
        s += sgl.gen("answer", max_tokens=6, temperature=0, return_logprob=True, top_logprobs_num=3,
                     return_text_in_logprobs=True, logprob_start_len=0)  # fmt: skip

    @sgl.function
    def branches(s: Any, prefix: str, tails: list[str]) -> None:
        s += prefix
        forks = s.fork(len(tails))
        for f, tail in zip(forks, tails, strict=True):
            f += tail + sgl.gen("more", max_tokens=5, temperature=0)
        s += "|".join(f["more"] for f in forks)

    @sgl.function
    def pick(s: Any, prefix: str, choices: list[str]) -> None:
        s += prefix
        s += sgl.select("choice", choices=choices)

    out: dict[str, Any] = {}
    state = answer.run(question=PROMPTS[0])
    out["gen"] = {"answer": state["answer"], "text": state.text()}
    state = scored.run(question=PROMPTS[0])
    out["gen_logprobs"] = {"answer": state["answer"], "meta_info": state.get_meta_info("answer")}
    state = answer.run(question=PROMPTS[1], stream=True)
    out["gen_stream"] = {"chunks": list(state.text_iter("answer")), "answer": state["answer"]}
    states = answer.run_batch([{"question": q} for q in PROMPTS], num_threads=3)
    out["run_batch"] = [s["answer"] for s in states]
    state = branches.run(prefix=FORK_PREFIX, tails=FORK_TAILS)
    out["fork"] = {"text": state.text()}
    state = pick.run(prefix=SELECT_PREFIX, choices=SELECT_CHOICES)
    out["select"] = {"choice": state["choice"], "meta_info": state.get_meta_info("choice")}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
