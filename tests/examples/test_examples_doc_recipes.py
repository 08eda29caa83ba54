"""Every recipe of README.md, docs/*.md and examples/*/README.md runs as written.

The code blocks are read from the markdown files themselves, so a doc edit is what is tested.
Each command line of a bash block and each python block is listed in ``COMMANDS`` /
``PYTHON_BLOCKS`` with where it is run: here, by a named test elsewhere, or (installs, GPU
machines, placeholders) why not. A command added to a doc without a place there fails
``test_every_recipe_is_accounted_for``. Commands run here are shortened only through
documented ``key=value`` overrides (output and logging switches), and each test checks what its
doc says comes out: files, printed values, a learning gain.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from examples_support import DOCS, ROOT, TINY, metrics_rows, package_env, run_command, train_steps

from areal_agents.config.loader import load_config

QUIET = ["logging.progress=false", "logging.tensorboard=false", "logging.plots=false"]
_HERE = "tests/examples/test_examples_doc_recipes.py"
CUSTOM_ENV = ROOT / "examples" / "custom_env"  # the quickstart's package, file for file
_INSTALL = "install command (the suite runs inside the installed checkout)"
_TINY_JUDGE = "tests/rewards/test_rewards_judge_learning.py::test_a_tiny_judge_alone_raises_exact_match_accuracy"
_GROUP_JUDGE = "tests/rewards/test_rewards_judge_learning.py::test_a_tiny_group_judge_alone_raises_exact_match_accuracy"
_REWARD_MODEL = "tests/rewards/test_rewards_reward_model_run.py::test_a_reward_model_trained_here_is_served_and_trains_the_policy"
_DEFAULT_RUN = "the default run (4-5 min): README's figures come from it; its config is the dataclass defaults"
_TUTORIAL = "tests/examples/test_examples_tutorial_multiturn.py::test_"  # + the test's name

# doc -> command (its shell words joined by spaces) -> "<test file>::<test name>" that runs or checks it, or "not run: <why>"
COMMANDS: dict[str, dict[str, str]] = {
    "README.md": {
        'pip install torch==2.13.0 -e . && areal-agents run --env math': f"not run: {_DEFAULT_RUN}",
        'apt-get update && apt-get install -y --no-install-recommends chromium chromium-driver && '
        'pip install torch==2.13.0 -e .[dev] && pip download --no-deps -r tests/inference/sglang-frontend.txt -d .wheels '
        '&& python3 -m pytest -q -n 2': "not run: the test suite itself (.ci/run; tests/docs/test_docs_readme.py checks it "
                                      "runs this command)",
        "pip install torch==2.13.0 -e .": f"not run: {_INSTALL}",
        "pip install -e .[sglang]": f"not run: {_INSTALL}",
        "pip install -e .[docs]": f"not run: {_INSTALL}; the docs build: tests/docs/test_docs_site.py",
    },
    "docs/deployment.md": {
        "pip install torch==2.13.0 -e .": f"not run: {_INSTALL}",
        "areal-agents run --env math": f"not run: {_DEFAULT_RUN}",
        "pip install -e .[sglang-client]": f"not run: {_INSTALL}",
        "pip install --no-deps sglang==0.5.23": f"not run: {_INSTALL}",
        "pip install -e .[sglang]": f"not run: {_INSTALL}",
        "areal-agents run --env math actor.path=/models/Qwen2.5-1.5B-Instruct inference.backend=sglang "
        "actor.dtype=bfloat16 trainer.device=cuda sglang.mem_fraction_static=0.4":
            f"{_HERE}::test_gpu_and_remote_commands_are_valid_configs",
        "python -m sglang.launch_server --model-path /models/Qwen2.5-7B-Instruct --port 30000 --host 0.0.0.0":
            "not run: SGLang's own server, on a GPU machine",
        "areal-agents serve --model /models/my-model --port 30001":
            "tests/inference/test_inference_launcher.py::test_serve_command_line",
        "areal-agents run --config my.yaml inference.backend=remote "
        "inference.addresses=[gpu-node-1:30000,gpu-node-2:30000]":
            f"{_HERE}::test_gpu_and_remote_commands_are_valid_configs",
        "python -m torch.distributed.run --standalone --nproc-per-node=4 -m <module> ...":
            "not run: a template (<module>); torchrun ranks: tests/e2e/test_e2e_run.py",
        "python -m torch.distributed.run --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d "
        "--rdzv-endpoint=node0:29500 -m <module> ...": "not run: a template for two nodes",
        'ray start --head --port=6379 --resources={"node_a": 1}':
            "tests/trainers/test_trainer_ray.py::test_run_on_two_ray_nodes",
        'ray start --address=HEAD:6379 --resources={"node_b": 1}':
            "tests/trainers/test_trainer_ray.py::test_run_on_two_ray_nodes",
        "areal-agents run --env math launcher=ray ray.address=HEAD:6379 ray.server_resource=node_a "
        "ray.trainer_resource=node_b inference.num_servers=2 trainer.nproc=2 trainer.weight_sync=gloo "
        "actor.path=/shared/model output_dir=/shared/runs": "tests/trainers/test_trainer_ray.py::test_run_on_two_ray_nodes",
        "HEAD=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)": "not run: Slurm (not on this machine)",
        "srun areal-agents run --config my.yaml inference.backend=remote "
        "inference.addresses=[sglang-0:30000,sglang-1:30000] trainer.device=cuda trainer.nproc=8 trainer.nnodes=2 "
        "trainer.rdzv_endpoint=$HEAD:29500 trainer.weight_sync=disk output_dir=/shared/runs actor.path=/shared/model":
            "not run: Slurm on GPUs; its shape on two local torchrun nodes: "
            "tests/trainers/test_trainer_multinode.py::test_two_torchrun_nodes_train_one_run",
    },
    "docs/quickstart.md": {
        "pip install torch==2.13.0 -e .[dev]": f"not run: {_INSTALL}",
        "areal-agents list": f"{_HERE}::test_quickstart_list_names_every_registry",
        "areal-agents run --env math": f"not run: {_DEFAULT_RUN}",
        "areal-agents run --env math trainer.total_steps=3 rollout.batch_size=4 rollout.group_size=4 eval.n=20 "
        "sft.warm_start_steps=50 experiment_name=smoke": f"{_HERE}::test_quickstart_smoke_run_writes_the_listed_outputs",
        "areal-agents run --config my.yaml algorithm.name=rloo rollout.max_head_offpolicyness=0 actor.lr=3e-4":
            "tests/examples/test_examples_docs.py::test_quickstart_config_file_is_shown_and_loads",
        "areal-agents config check --config my.yaml":
            "tests/examples/test_examples_docs.py::test_quickstart_config_file_is_shown_and_loads",
        "pip install -e .": f"{_HERE}::test_quickstart_reverse_package_learns_as_written",
        "python -c from areal_agents import check_env, make_env; check_env(make_env('reverse'))":
            f"{_HERE}::test_quickstart_reverse_package_learns_as_written",
        "areal-agents run --env reverse sft.warm_start_steps=200 trainer.total_steps=40":
            f"{_HERE}::test_quickstart_reverse_package_learns_as_written",
    },
    "docs/tutorial_multiturn.md": {
        "pip install -e .": f"{_TUTORIAL}the_tutorial_trains_as_written",
        "python -c from areal_agents import check_env, make_env; check_env(make_env('padlock'))":
            f"{_TUTORIAL}the_tutorial_trains_as_written",
        "python -m pytest test_padlock.py": f"{_TUTORIAL}the_example_s_tests_pass_against_a_scripted_model",
        "areal-agents run --env padlock": f"{_TUTORIAL}the_tutorial_trains_as_written",
    },
    "docs/gpu.md": {
        "pip install -e .[sglang]": f"not run: {_INSTALL}",
        "areal-agents run --config examples/gsm8k_grpo/gpu.yaml actor.path=/models/Qwen2.5-1.5B-Instruct "
        "data.path=/data/gsm8k/{split}.jsonl":
            "tests/examples/test_examples_gsm8k.py::test_gpu_config_validates_apart_from_the_sglang_install",
    },
    "docs/index.md": {
        "pip install torch==2.13.0 -e .": f"not run: {_INSTALL}",
        "areal-agents run --env math": f"not run: {_DEFAULT_RUN}",
    },
    "docs/viewer.md": {
        "areal-agents run --env guess-number": "not run: a default env run (about 3 min); the viewer's tests serve "
                                               "recorded runs (tests/viewer/viewer_support.py)",
        "areal-agents view runs/guess-number/trial":
            "tests/viewer/test_viewer_server.py::test_two_runs_get_distinct_names_and_their_configs",
        "areal-agents view runs/a/trial runs/b/trial --port 8800":
            "tests/viewer/test_viewer_server.py::test_two_runs_get_distinct_names_and_their_configs",
    },
    "docs/byo_agent.md": {
        "areal-agents run --env math agent=my-agent imports=[my_agent.py]":
            "tests/examples/test_examples_openai_agent.py::test_byo_doc_agent_trains_as_written",
    },
    "docs/rewards.md": {
        "areal-agents run --env my-env imports=[my_env.py,my_judges.py] judge.model_path=/models/judge":
            "not run: a template (my-env, /models/judge); the same run with a served judge: "
            "tests/rewards/test_rewards_judge_run.py::test_a_run_trains_on_the_rewards_of_the_judge_it_serves",
        "areal-agents run --env my-env imports=[my_env.py,my_group_judges.py] rollout.group_reward=best-first "
        "judge.model_path=/models/judge":
            "not run: a template (my-env, /models/judge); group rewards in a run's executor: "
            "tests/rollout/test_rollout_group_reward.py::test_the_executor_hands_out_groups_with_their_group_scores",
        "areal-agents sft --env math-grading sft.output_dir=judges/math": _TINY_JUDGE,
        "areal-agents eval --env math-grading --model judges/math": _TINY_JUDGE,
        "areal-agents run --env math env.kwargs.reward=math-judge judge.model_path=judges/math "
        "eval.env_kwargs.reward=math": _TINY_JUDGE,
        "areal-agents sft --env math-grading actor.path=judges/math data.kwargs.candidates=4 sft.steps=2000 "
        "sft.eval_every=0 sft.output_dir=judges/math-group": _GROUP_JUDGE,
        "areal-agents eval --env math-grading --model judges/math-group data.kwargs.candidates=4": _GROUP_JUDGE,
        "areal-agents run --env math rollout.group_reward=math-group-judge rollout.group_size=4 "
        "judge.model_path=judges/math-group eval.env_kwargs.reward=math": _GROUP_JUDGE,
        "areal-agents rm --env math data.name=math-preference reward_model.output_dir=reward_models/math": _REWARD_MODEL,
        "areal-agents run --env math env.kwargs.reward=math-reward-model judge.model_path=reward_models/math "
        "eval.env_kwargs.reward=math": _REWARD_MODEL,
    },
    "docs/online.md": {
        "areal-agents run --env math mode=online":
            "tests/online/test_online_learning.py::test_an_app_outside_the_run_raises_held_out_accuracy",
        "python examples/online_client/client.py --url http://127.0.0.1:8400 --admin-key-file runs/math/trial/admin_key":
            "tests/online/test_online_learning.py::test_an_app_outside_the_run_raises_held_out_accuracy",
    },
    "examples/online_client/README.md": {
        "areal-agents run --env math mode=online":
            "tests/online/test_online_learning.py::test_an_app_outside_the_run_raises_held_out_accuracy",
        "python examples/online_client/client.py --url http://127.0.0.1:8400 --admin-key-file runs/math/trial/admin_key":
            "tests/online/test_online_learning.py::test_an_app_outside_the_run_raises_held_out_accuracy",
        "AREAL_AGENTS_ADMIN_KEY=$(cat runs/math/trial/admin_key) sh examples/online_client/client.sh "
        "http://127.0.0.1:8400 8": "tests/online/test_online_run.py::test_external_apps_train_an_online_run_that_survives_a_restart",
    },
    "examples/openai_agent/README.md": {
        "areal-agents run --config examples/openai_agent/config.yaml":
            "tests/examples/test_examples_openai_agent.py::test_example_config_trains",
    },
    "examples/openai_agents_sdk/README.md": {
        "areal-agents run --config examples/openai_agents_sdk/config.yaml":
            "tests/examples/test_examples_agent_frameworks.py::test_framework_example_trains",
        "areal-agents run --config examples/openai_agents_sdk/config.yaml agent.name=sdk-unit-convert-chat":
            "tests/examples/test_examples_agent_frameworks.py::test_framework_example_trains",
    },
    "examples/langgraph_agent/README.md": {
        "areal-agents run --config examples/langgraph_agent/config.yaml":
            "tests/examples/test_examples_agent_frameworks.py::test_framework_example_trains",
    },
    "docs/reliability.md": {
        "pytest tests/reliability -m not slow": "not run: the tests themselves",
        "pytest tests/reliability -m slow": "not run: the tests themselves",
    },
    "examples/custom_algorithm/README.md": {
        "python examples/custom_algorithm/median_grpo.py --config examples/custom_algorithm/config.yaml":
            "tests/examples/test_examples_custom_algorithm.py::test_script_trains_with_the_new_estimator",
        "python examples/custom_algorithm/median_grpo.py --config examples/custom_algorithm/config.yaml "
        "trainer.total_steps=5 algorithm.adv_eps=0.1":
            "tests/examples/test_examples_custom_algorithm.py::test_registration_applies_the_spec_defaults",
    },
    "examples/custom_env/README.md": {
        "pip install -e examples/custom_env": f"{_HERE}::test_quickstart_reverse_package_learns_as_written",
        "python -c from areal_agents import check_env, make_env; check_env(make_env('reverse'))":
            f"{_HERE}::test_quickstart_reverse_package_learns_as_written",
        "areal-agents run --env reverse sft.warm_start_steps=200 trainer.total_steps=40":
            f"{_HERE}::test_quickstart_reverse_package_learns_as_written",
        "pip uninstall my-envs": "not run: undoes the install (the test's package lives in a throw-away venv)",
    },
    "examples/gsm8k_grpo/README.md": {
        "areal-agents run --config examples/gsm8k_grpo/cpu_smoke.yaml":
            "tests/examples/test_examples_gsm8k.py::test_cpu_smoke_config_trains_on_the_shipped_data",
        "pip install -e .[sglang]": f"not run: {_INSTALL}",
        "areal-agents run --config examples/gsm8k_grpo/gpu.yaml actor.path=/models/Qwen2.5-1.5B-Instruct "
        "data.path=/data/gsm8k/{split}.jsonl":
            "tests/examples/test_examples_gsm8k.py::test_gpu_config_validates_apart_from_the_sglang_install",
    },
    "examples/multi_turn_math/README.md": {
        "python examples/multi_turn_math/compare.py":
            "tests/examples/test_examples_multi_turn.py::test_compare_runs_both_credit_modes",
        "python examples/multi_turn_math/compare.py trainer.total_steps=5 sft.warm_start_steps=50":
            "tests/examples/test_examples_multi_turn.py::test_compare_runs_both_credit_modes",
        "areal-agents run --config examples/multi_turn_math/config.yaml algorithm.credit=turn":
            "tests/examples/test_examples_multi_turn.py::test_compare_runs_both_credit_modes",
    },
    "examples/tool_agent/README.md": {
        "python examples/tool_agent/sandbox_agent.py --config examples/tool_agent/config.yaml":
            "tests/examples/test_examples_tool_agent.py::test_warm_start_teaches_the_tool_call_and_the_answer",
        "python examples/tool_agent/sandbox_agent.py --config examples/tool_agent/config.yaml trainer.total_steps=5":
            "tests/examples/test_examples_tool_agent.py::test_warm_start_teaches_the_tool_call_and_the_answer",
    },
}

# doc -> first line of a python block -> where it runs, or "not run: <why>"
PYTHON_BLOCKS: dict[str, dict[str, str]] = {
    "README.md": {"from areal_agents import DatasetMixin, Env, ReferenceMixin, RewardMixin, register_env, register_reward":
                  f"{_HERE}::test_readme_env_trains_through_imports"},
    "docs/quickstart.md": {"# my_envs/reverse.py": f"{_HERE}::test_quickstart_reverse_package_learns_as_written"},
    "docs/custom_env.md": {"import asyncio": "tests/docs/test_docs_custom_env.py::test_custom_env_example_runs_verbatim"},
    "docs/tutorial_multiturn.md": dict.fromkeys((  # examples/padlock's files, run by the example's own tests
        "# padlock_game/game.py: the rules, shared by every stage", "# padlock_game/once.py: stage 1, one try",
        "# padlock_game/env.py: stage 2, several tries, each answered by the lock",
        "    # stage 3: an expert's games, for the tiny model's warm start",
        "# test_padlock.py: python -m pytest test_padlock.py"), f"{_TUTORIAL}the_example_s_tests_pass_against_a_scripted_model"),
    "docs/record.md": {"from areal_agents.record import load, summary, episode, group":
                       "tests/record/test_record_run.py::test_the_record_holds_what_the_loss_read"},
    "docs/customize.md": {
        "def my_reward(completion: str, *, answer: str = \"\", **row) -> float: ...": "not run: a signature",
        "def my_dataset(split: str = \"train\", *, size: int | None = None, **kwargs) -> list[dict]: ...":
            "not run: a signature",
        "from areal_agents import Agent, Trajectory, checked_step":
            "tests/examples/test_examples_docs.py::test_customize_train_script_with_its_agent_trains_as_written",
        "from algorithms.specs import AlgorithmSpec": "not run: a sketch (the estimator's body is `...`); "
                                                      "examples/custom_algorithm is the runnable one",
        "# train.py": "tests/examples/test_examples_docs.py::test_customize_train_script_with_its_agent_trains_as_written",
    },
    "docs/byo_agent.md": {
        "# my_agent.py": "tests/examples/test_examples_openai_agent.py::test_byo_doc_agent_trains_as_written",
        "# math_http_agent.py: areal-agents run --env math agent=math-http imports=[math_http_agent.py]":
            "tests/examples/test_examples_openai_agent.py::test_byo_doc_http_agent_trains_as_written"},
    "examples/openai_agents_sdk/README.md": {
        "openai_client = AsyncOpenAI(base_url=await client.http_endpoint(), api_key=client.api_key, max_retries=0)":
            "tests/examples/test_examples_agent_frameworks.py::test_readme_excerpts_are_the_example_code"},
    "examples/langgraph_agent/README.md": {
        "llm = ChatOpenAI(model=\"policy\", base_url=await client.http_endpoint(), api_key=client.api_key, "
        "max_retries=0)": "tests/examples/test_examples_agent_frameworks.py::test_readme_excerpts_are_the_example_code"},
    "docs/algorithms.md": {"# my_algo.py — import it before load_config (e.g. from your launcher script)":
                           f"{_HERE}::test_algorithms_doc_registration_applies_its_defaults"},
    "docs/concepts.md": {
        "obs, info = env.reset(seed=seed, options=row)          # obs: str or [{\"role\", \"content\"}, ...]":
            "not run: a fragment (names defined around it)",
        "class Agent:": "not run: a signature",
    },
    "docs/rollout.md": {"from areal_agents.rollout import RolloutExecutor": "not run: a fragment (cfg, train, ...)"},
    "docs/gpu.md": {"# write_gsm8k.py": "not run: downloads GSM8K from the Hugging Face Hub"},
    "docs/ecosystem.md": {"from areal_agents import check_env, make_env":
                          "tests/envs/test_envs_ecosystem.py::test_the_docs_example_runs_verbatim"},
    "docs/rewards.md": {
        'def my_reward(completion: str, *, answer: str = "", **row) -> float:': f"{_HERE}::test_rewards_doc_blocks_run",
        "# my_rewards.py": "not run: a signature (the README's and quickstart's rewards are registered this way)",
        "class MyEnv(RewardMixin, Env):  # from areal_agents import Env, RewardMixin": "not run: a fragment; the README's and quickstart's envs call compute_reward this way",
        "from areal_agents import register_reward": f"{_HERE}::test_rewards_doc_blocks_run",
        "# my_judges.py": "tests/rewards/test_rewards_judge.py::test_the_docs_judge_registers_and_fails_in_one_line",
        "# my_group_judges.py": "tests/rewards/test_rewards_judge.py::test_the_docs_group_judge_ranks_a_group_in_one_call",
        "# my_reward_models.py": "tests/rewards/test_rewards_reward_model.py::test_the_docs_reward_models_register_and_score",
    },
    "docs/trainer.md": {"engine = build_engine(cfg, model_path, spec)        # trainers.loop: critic / reference as the spec needs":
                        "not run: a fragment (cfg, batch, ...)"},
}


def blocks(doc: str, lang: str) -> list[str]:
    """The fenced ```lang blocks of ``doc``, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", (ROOT / doc).read_text(encoding="utf-8"), re.S | re.M)


def block(doc: str, lang: str, first_line: str) -> str:
    """The one ```lang block of ``doc`` whose first line is ``first_line``."""
    found = [b for b in blocks(doc, lang) if b.splitlines()[0] == first_line]
    assert len(found) == 1, f"{doc}: {len(found)} {lang} blocks start with {first_line!r}"
    return found[0]


def commands(doc: str) -> list[list[str]]:
    """The command lines of ``doc``'s bash blocks as shell words (continuations joined, comments dropped)."""
    lines = [line for text in blocks(doc, "bash") for line in text.replace("\\\n", " ").splitlines()]
    return [words for words in (shlex.split(line, comments=True) for line in lines) if words]


def command(doc: str, start: str) -> list[str]:
    """The one command of ``doc`` whose words joined by spaces start with ``start``."""
    found = [c for c in commands(doc) if " ".join(c).startswith(start)]
    assert len(found) == 1, f"{doc}: {len(found)} commands start with {start!r}"
    return found[0]


def test_every_recipe_is_accounted_for() -> None:
    found = {doc: {" ".join(c) for c in commands(doc)} for doc in DOCS}
    listed = {doc: set(COMMANDS.get(doc, {})) for doc in DOCS}
    assert {d: c - listed[d] for d, c in found.items() if c - listed[d]} == {}, "commands without a place in COMMANDS"
    assert {d: c - found[d] for d, c in listed.items() if c - found[d]} == {}, "COMMANDS lists what no doc says"
    firsts = {doc: {b.splitlines()[0] for b in blocks(doc, "python")} for doc in DOCS}
    py_listed = {doc: set(PYTHON_BLOCKS.get(doc, {})) for doc in DOCS}
    assert {d: f - py_listed[d] for d, f in firsts.items() if f - py_listed[d]} == {}, "python blocks without a place"
    assert {d: f - firsts[d] for d, f in py_listed.items() if f - firsts[d]} == {}, "PYTHON_BLOCKS lists what no doc has"
    for where in [w for table in (COMMANDS, PYTHON_BLOCKS) for doc in table.values() for w in doc.values()]:
        if where.startswith("not run: "):
            continue
        path, name = where.split("::")
        assert re.search(rf"^(def|async def) {name}\(", (ROOT / path).read_text(), re.M), where


def test_gpu_and_remote_commands_are_valid_configs(tmp_path: Path) -> None:
    (tmp_path / "my.yaml").write_text(block("docs/quickstart.md", "yaml", "# my.yaml"))
    for start in ("areal-agents run --env math actor.path=", "areal-agents run --config my.yaml inference.backend="):
        args = command("docs/deployment.md", start)
        proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", "config", "check", *args[2:]], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        if "inference.backend=sglang" in args and proc.returncode:  # SGLang is a GPU install: one clear line
            assert proc.stderr.strip().splitlines() == [
                "error: inference.backend: backend 'sglang' needs sglang >= 0.4.9.post2: pip install 'areal-agents[sglang]'"]
            args = [a if a != "inference.backend=sglang" else "inference.backend=embedded" for a in args]
            cfg = load_config(None, ["env.name=math", *args[4:]])  # every other key of the command is valid
            assert (cfg.actor.dtype, cfg.trainer.device, cfg.sglang.mem_fraction_static) == ("bfloat16", "cuda", 0.4)
        else:
            assert proc.returncode == 0, proc.stderr
            shown = yaml.safe_load(proc.stdout)  # the resolved config: every key=value of the command, as given
            pairs = [a.split("=", 1) for a in args[2:] if "=" in a and not a.startswith("-")]
            assert len(pairs) >= 2, args
            if "--env" in args:
                assert shown["env"]["name"] == args[args.index("--env") + 1]
            for key, value in pairs:
                node = shown
                for part in key.split("."):
                    node = node[part]
                assert node == yaml.safe_load(value), (key, node, value)


def test_quickstart_list_names_every_registry(tmp_path: Path) -> None:
    out = run_command(command("docs/quickstart.md", "areal-agents list"), tmp_path).stdout
    for kind, name in [("envs", "math"), ("agents", "chat"), ("datasets", "arithmetic"), ("rewards", "math"),
                       ("algorithms", "grpo")]:
        assert kind in out and name in out, (kind, name)


def test_algorithms_doc_registration_applies_its_defaults(tmp_path: Path) -> None:
    first = "# my_algo.py — import it before load_config (e.g. from your launcher script)"
    (tmp_path / "my_algo.py").write_text(block("docs/algorithms.md", "python", first))
    code = ("import my_algo; from areal_agents.config.loader import load_config; "
            "c = load_config(None, ['algorithm.name=reinforce-rebn']).algorithm; print(c.rebn, c.credit)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["True", "turn"], proc.stderr


@pytest.mark.slow
def test_readme_env_trains_through_imports(tmp_path: Path) -> None:
    (tmp_path / "my_env.py").write_text(block("README.md", "python", "from areal_agents import DatasetMixin, Env, "
                                                                       "ReferenceMixin, RewardMixin, register_env, "
                                                                       "register_reward"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    cmd = shlex.split(re.search(r"train it with `(areal-agents run --env shout [^`]+)`", readme).group(1))
    run_command([*cmd, *TINY], tmp_path, cwd=tmp_path)
    steps = train_steps(tmp_path / "runs" / "shout" / "trial")
    assert [r["step"] for r in steps] == [1, 2] and all(r["rollout/failed"] == 0 for r in steps)
    assert "Say hello loudly." in (tmp_path / "runs" / "shout" / "trial" / "samples.jsonl").read_text()


@pytest.mark.slow
def test_quickstart_smoke_run_writes_the_listed_outputs(tmp_path: Path) -> None:
    cmd = command("docs/quickstart.md", "areal-agents run --env math trainer.total_steps=3")
    run_command([*cmd, "logging.progress=false"], tmp_path, cwd=tmp_path, timeout=600)
    run_dir = tmp_path / "runs" / "smoke" / "trial"  # runs/<experiment_name>/<trial_name>/
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]
    assert [r["eval/n"] for r in rows if "eval/accuracy" in r] == [20, 20]  # before and after
    for name in ("config.yaml", "samples.jsonl", "final/config.json", "final/model.safetensors"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "plots").glob("*.png")) and list((run_dir / "tensorboard").iterdir())
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())  # ends before one


def test_quickstart_package_is_the_custom_env_example() -> None:
    """The quickstart's blocks are examples/custom_env's files, and both READMEs give the same commands."""
    doc, readme = "docs/quickstart.md", "examples/custom_env/README.md"
    assert block(doc, "python", "# my_envs/reverse.py") == (CUSTOM_ENV / "my_envs" / "reverse.py").read_text()
    assert block(doc, "toml", "# pyproject.toml") == (CUSTOM_ENV / "pyproject.toml").read_text()
    assert (CUSTOM_ENV / "my_envs" / "__init__.py").read_text() == ""  # "an empty my_envs/__init__.py"
    assert block(readme, "toml", "[project.entry-points.\"areal_agents.envs\"]") in block(doc, "toml", "# pyproject.toml")
    for start in ("python -c", "areal-agents run --env reverse"):
        assert command(readme, start) == command(doc, start)
    assert command(readme, "pip install -e") == ["pip", "install", "-e", str(CUSTOM_ENV.relative_to(ROOT))]
    assert command(doc, "pip install -e") == ["pip", "install", "-e", "."]
    uninstall = command(readme, "pip uninstall")[2:]
    assert f'name = "{uninstall[0]}"' in (CUSTOM_ENV / "pyproject.toml").read_text().splitlines()  # no tomllib on 3.10


@pytest.mark.slow
def test_quickstart_reverse_package_learns_as_written(tmp_path: Path) -> None:
    doc = "docs/quickstart.md"
    test_quickstart_package_is_the_custom_env_example()  # the files trained here are the quickstart's blocks
    pkg = tmp_path / "pkg"  # a copy: the editable install writes its egg-info next to the files
    shutil.copytree(CUSTOM_ENV, pkg, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    python = package_env(tmp_path, pkg)
    run_command(command(doc, "python -c"), tmp_path, python=python, cwd=tmp_path)
    probe = ("from areal_agents.registry import datasets; d = datasets.get('reverse'); "
             "tr, te = d('train', size=20000), d('test', size=500); "
             "print(len({r['prompt'] for r in tr} & {r['prompt'] for r in te}), len({r['prompt'] for r in te}), "
             "set(''.join(r['prompt'][8:] for r in te)) <= set(''.join(r['prompt'][8:] for r in tr)))")
    assert run_command([python, "-c", probe], tmp_path).stdout.split() == ["0", "500", "True"]
    run_command([*command(doc, "areal-agents run --env reverse"), *QUIET], tmp_path, python=python, cwd=tmp_path,
                timeout=900)
    evals = [r["eval/accuracy"] for r in metrics_rows(tmp_path / "runs" / "reverse" / "trial") if "eval/accuracy" in r]
    text = (ROOT / doc).read_text(encoding="utf-8")
    start = float(re.search(r"greedy accuracy on the 500 test strings went from (0\.\d+)", text).group(1))
    assert abs(evals[0] - start) <= 0.1, evals  # the warm start lands where the doc says
    assert evals[-1] >= evals[0] + 0.02, evals  # and RL gains, as the doc says (+0.03 to +0.17 measured)
    report = json.loads(next((tmp_path / "cache" / "warm").glob("reverse-*/sft_report.json")).read_text())
    assert report["reached"] and report["steps"] <= 200


def test_rewards_doc_blocks_run(tmp_path: Path) -> None:
    namespace: dict = {}
    exec(block("docs/rewards.md", "python", 'def my_reward(completion: str, *, answer: str = "", **row) -> float:'),
         namespace)
    assert namespace["my_reward"](" 42 ", answer="42") == 1.0 and namespace["my_reward"]("41", answer="42") == 0.0
    (tmp_path / "lenient.py").write_text(block("docs/rewards.md", "python", "from areal_agents import register_reward"))
    code = ("from areal_agents.config.loader import load_config; load_config(None, ['imports=[lenient.py]']); "
            "from areal_agents.rewards import RewardRunner\n"
            "with RewardRunner(timeout=60, max_workers=1) as r:\n"
            "    a, b = r.compute('lenient', ' 42', {'answer': '42'}), r.compute('lenient', 'Paris', {'answer': 'paris'})\n"
            "    print(a.value, a.seconds == 0.0, b.value, b.seconds > 0.0, r.stats['ok'])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    # the fast path decides the exact answer in this process; the other goes to a worker, which says 1.0
    assert proc.returncode == 0 and proc.stdout.split() == ["1.0", "True", "1.0", "True", "2"], proc.stderr


def test_gpu_page_shows_the_gsm8k_gpu_config_verbatim() -> None:
    assert block("docs/gpu.md", "yaml", "# GSM8K with GRPO on GPUs: a Qwen2.5 instruct model served by SGLang, "
                 "trained with FSDP2.") == (ROOT / "examples" / "gsm8k_grpo" / "gpu.yaml").read_text(encoding="utf-8")
