"""Config loading: defaults, YAML + overrides, interpolation, and one-line errors."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_agents.config import RENAMED_KEYS, ConfigError, ExperimentConfig
from areal_agents.config.loader import config_fields, load_config, to_yaml


def test_defaults_validate_and_interpolate():
    cfg = load_config()
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.sglang.dtype == cfg.actor.dtype == "float32"
    cfg = load_config(overrides=["actor.dtype=bfloat16"])
    assert cfg.sglang.dtype == "bfloat16"
    cfg = load_config(overrides=["actor.dtype=bfloat16", "sglang.dtype=float16"])
    assert cfg.sglang.dtype == "float16"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("actor:\n  lr: 0.5\nrollout:\n  group_size: 3\nenv:\n  name: guess-number\n")
    cfg = load_config(path, ["rollout.group_size=5"])
    assert cfg.actor.lr == 0.5
    assert cfg.rollout.group_size == 5
    assert cfg.env.name == "guess-number"
    # the dumped YAML loads back to the same config
    again = tmp_path / "again.yaml"
    again.write_text(to_yaml(cfg))
    assert load_config(again) == cfg


def test_algorithm_defaults_sit_under_user_values():
    from areal_agents.registry import algorithms

    spec = algorithms.get("dapo")
    assert spec.defaults, "dapo must declare defaults"
    key, value = next(iter(spec.defaults.items()))
    cfg = load_config(overrides=["algorithm.name=dapo"])
    assert getattr(cfg.algorithm, key) == value
    # an explicit override wins over the algorithm's default
    cfg = load_config(overrides=["algorithm.name=dapo", "algorithm.loss_agg_mode=seq-mean-token-mean"])
    assert cfg.algorithm.loss_agg_mode == "seq-mean-token-mean"


BAD = [
    (["algorithm.c_clip=0.5"], "algorithm.c_clip", "> 1"),
    (["actor.c_clip=0.5"], "actor.c_clip", "unknown key"),
    (["no.such.key=1"], "no.such.key", "unknown key"),
    (["actor.lr=abc"], "actor.lr", "Float"),
    (["actor.lr=-1"], "actor.lr", "> 0"),
    (["rollout.batch_size=1.5"], "rollout.batch_size", "Integer"),
    (["env.turn_discount=0"], "env.turn_discount", "(0, 1]"),
    (["env.turn_discount=1.5"], "env.turn_discount", "(0, 1]"),
    (["rollout.max_head_offpolicyness=-1"], "rollout.max_head_offpolicyness", ">= 0"),
    (["actor.dtype=float64"], "actor.dtype", "one of"),
    (["actor.grad_reduce_dtype=int8"], "actor.grad_reduce_dtype", "one of"),
    (["algorithm.use_decoupled_loss=true", "algorithm.recompute_logprob=false"], "algorithm.recompute_logprob", "proximal"),
    (["inference.backend=sglang"], "inference.backend", "0.4.9.post2"),
    (["inference.backend=tpu"], "inference.backend", "one of"),
    (["actor=3"], "actor", "section"),
    (["justtext"], "justtext", "key=value"),
    (["algorithm.name=nope"], "algorithm.name", "unknown algorithm"),
    (["trainer.nproc=3", "actor.hsdp_replicate=2"], "actor.hsdp_replicate", "divide"),
    (["agent.name=nope"], "agent.name", "unknown agent 'nope'"),
    (["env.name=nope"], "env.name", "unknown env 'nope'"),
    (["data.name=nope"], "data.name", "unknown dataset 'nope'"),
    (["imports=[no_such_module_xyz]"], "imports", "No module named"),
    (["mode=train"], "train_data", "rollout JSONL"),
    (["actor.lrr=1"], "actor.lrr", "did you mean actor.lr"),
    (["trainer.weight_sync=nccl"], "trainer.weight_sync", "embedded servers take gloo"),
    (["trainer.weight_sync=rsync"], "trainer.weight_sync", "one of"),
    (["trainer.first_gpu=-1"], "trainer.first_gpu", ">= 0"),
    (["trainer.weight_sync=gloo", "inference.backend=remote", "inference.addresses=[gpu-7:30000]"],
     "trainer.weight_sync_address", "servers on other hosts (gpu-7) cannot join a gloo group at 127.0.0.1"),
    (["allocation_mode=gpu:4"], "allocation_mode", "sglang.d2t2+d4"),
    (["allocation_mode=sglang.d1p2t1+d2"], "allocation_mode", "only p1"),
    (["allocation_mode=embedded.d2t2+d1"], "allocation_mode", "no tensor parallelism"),
    (["allocation_mode=embedded.d2+d1", "inference.num_servers=3"], "inference.num_servers", "implies 2"),
]


@pytest.mark.parametrize(("overrides", "key", "rule"), BAD)
def test_bad_values_name_the_key(overrides, key, rule):
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    msg = str(info.value)
    assert msg.startswith(key + ":"), msg
    assert rule in msg, msg
    assert "\n" not in msg


def test_allocation_mode_sets_the_device_split(monkeypatch, tmp_path):
    import importlib.metadata as md

    from areal_agents.config.loader import parse_allocation_mode

    yaml = tmp_path / "split.yaml"
    yaml.write_text("allocation_mode: embedded.d2+d1\n")
    assert load_config(yaml).inference.num_servers == 2
    assert load_config(yaml, ["allocation_mode=embedded.d3+d1"]).inference.num_servers == 3  # the override wins

    cfg = load_config(overrides=["allocation_mode=embedded.d2+d2", "actor.path=/m", "trainer.nproc=2"])
    assert (cfg.inference.backend, cfg.inference.num_servers, cfg.trainer.nproc, cfg.trainer.device) == \
        ("embedded", 2, 2, "cpu")  # an explicit value that agrees is fine
    assert parse_allocation_mode("sglang.d2p1t2+d4p1t1") == {
        "inference.backend": "sglang", "inference.num_servers": 2, "sglang.tp_size": 2, "trainer.nproc": 4,
        "trainer.device": "cuda"}
    real = md.version  # fault injection: pretend sglang 0.5.2 is installed
    monkeypatch.setattr(md, "version", lambda name: "0.5.2" if name == "sglang" else real(name))
    cfg = load_config(overrides=["allocation_mode=sglang.d2t2+d4"])
    assert (cfg.sglang.tp_size, cfg.trainer_first_gpu, cfg.trainer.nproc) == (2, 4, 4)


def test_remote_servers_join_a_weight_group_at_a_reachable_address():
    base = ["trainer.weight_sync=gloo", "inference.backend=remote"]
    cfg = load_config(overrides=[*base, "inference.addresses=[127.0.0.1:30000]"])  # loopback: fine
    assert (cfg.inference.addresses, cfg.trainer.weight_sync_address) == (["127.0.0.1:30000"], "127.0.0.1")
    with pytest.raises(ValueError, match=r"trainer.weight_sync_address: servers on other hosts \(gpu-7\) cannot join"):
        load_config(overrides=[*base, "inference.addresses=[gpu-7:30000]"])  # a far server, a loopback group
    cfg = load_config(overrides=[*base, "inference.addresses=[gpu-7:30000]", "trainer.weight_sync_address=10.0.0.5"])
    assert cfg.trainer.weight_sync_address == "10.0.0.5"


def test_trainer_gpus_follow_the_launched_sglang_servers():
    from areal_agents.config import ExperimentConfig

    cfg = ExperimentConfig()
    assert cfg.trainer_first_gpu == 0  # embedded servers use no GPU
    cfg.inference.backend, cfg.inference.num_servers, cfg.sglang.tp_size = "sglang", 2, 2
    assert cfg.trainer_first_gpu == 4  # servers on GPUs 0-3 (--base-gpu-id 0, 2), trainer from GPU 4
    cfg.trainer.first_gpu = 1
    assert cfg.trainer_first_gpu == 1
    cfg.trainer.first_gpu, cfg.inference.backend = None, "remote"
    assert cfg.trainer_first_gpu == 0  # remote servers live elsewhere


def test_sglang_version_check(monkeypatch):
    import importlib.metadata as md

    real = md.version
    # Fault injection: pretend an installed sglang of a given version.
    monkeypatch.setattr(md, "version", lambda name: "0.4.8" if name == "sglang" else real(name))
    with pytest.raises(ConfigError, match="needs sglang >= 0.4.9.post2.*found 0.4.8"):
        load_config(overrides=["inference.backend=sglang"])
    monkeypatch.setattr(md, "version", lambda name: "0.5.2" if name == "sglang" else real(name))
    assert load_config(overrides=["inference.backend=sglang"]).inference.backend == "sglang"


def test_bad_yaml_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor: [unclosed\n")
    with pytest.raises(ConfigError, match="^--config: cannot parse"):
        load_config(bad)
    nested = tmp_path / "nested.yaml"
    nested.write_text("actor:\n  optimizer:\n    kind: sgd\n")
    with pytest.raises(ConfigError, match=r"^actor\.optimizer\.kind: unknown key"):
        load_config(nested)
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.yaml")


def test_every_field_has_help():
    rows = config_fields()
    assert len(rows) > 80
    missing = [key for key, _, _, help_text in rows if not help_text.strip()]
    assert not missing, missing


_KEYS = [row[0] for row in config_fields()]
_VALUES = st.one_of(
    st.integers(-10**6, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "false", "null", "abc", "[1, 2]", "{a: 1}", "''", "${actor.lr}", "${nope}"]),
    st.text(alphabet="abc.=_-[]{}:,' 0123", max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(
    key=st.one_of(st.sampled_from(_KEYS), st.text(alphabet="abcxyz._", min_size=1, max_size=20)),
    value=_VALUES,
)
def test_random_overrides_fail_with_one_line(key, value):
    try:
        load_config(overrides=[f"{key}={value}"])
    except ConfigError as exc:
        msg = str(exc)
        assert "\n" not in msg
        assert ":" in msg and msg.split(":", 1)[0].strip(), msg


def test_cli_prints_one_line_and_no_traceback():
    for args, key in ((["actor.c_clip=0.5"], "actor.c_clip"), (["no.such.key=1"], "no.such.key"),
                      (["algorithm.c_clip=0.5"], "algorithm.c_clip"), (["trainer.nproc=2"], "trainer.nproc")):
        proc = subprocess.run(
            [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", *args],
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert key in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_KEYS.items()))
def test_a_renamed_key_fails_in_one_line_naming_its_new_name(old, new, tmp_path, capsys):
    from areal_agents.cli import main

    keys = {key for key, *_ in config_fields()}
    assert new in keys and old not in keys
    expected = f"{old}: renamed to {new}"
    with pytest.raises(ConfigError) as override:
        load_config(overrides=[f"{old}=1"])
    section, leaf = old.split(".")
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({section: {leaf: 1}}))
    with pytest.raises(ConfigError) as from_yaml:
        load_config(path)
    assert str(override.value) == str(from_yaml.value) == expected
    assert main(["config", "check", f"{old}=1"]) == 2
    assert capsys.readouterr().err == f"error: {expected}\n"


@pytest.mark.parametrize(("args", "message"), [
    (["run", "--env", "math", "actor.path=/no/such/model"], "actor.path: no such model directory"),
    (["run", "--env", "math", "actor.path=/tmp"], "actor.path: /tmp is not a Hugging Face model directory"),
    (["eval", "--env", "math", "--model", "./nope"], "--model: no such model directory"),
    (["serve", "--model", "/nope"], "--model: no such model directory"),
])
def test_a_model_path_that_is_not_a_model_is_one_line(args, message):
    proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {message}")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_input_found_at_run_time_is_one_line_too(tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": oops}\n')
    cases = ((["data.name=jsonl", f"data.path={tmp_path / 'missing.jsonl'}"], "DatasetError: jsonl_dataset: no such file"),
             (["data.name=jsonl", f"data.path={bad}"], "rows.jsonl:2: not valid JSON"))
    for args, message in cases:
        proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", *args,
                               f"output_dir={tmp_path / 'runs'}", f"sft.output_dir={tmp_path / 'warm'}"],
                              capture_output=True, text=True, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
        assert lines[0].startswith("error: ") and message in lines[0] and "Traceback" not in proc.stderr
        assert not (tmp_path / "warm").exists()  # stopped before any model was built


def _show_rows(*args: str) -> dict[str, tuple[str, str]]:
    """``areal-agents config show ARGS`` as {key: (value cell, from cell)}."""
    proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", "config", "show", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 4 and cells[0] and cells[0] != "key":
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def test_config_show_prints_the_values_a_run_uses_and_their_source(tmp_path):
    from areal_agents.registry import algorithms

    rows = _show_rows("--env", "math")
    assert list(rows) == [key for key, *_ in config_fields()]  # every key, once
    check = subprocess.run([sys.executable, "-m", "areal_agents.cli", "config", "check", "--env", "math"],
                           capture_output=True, text=True, timeout=120)
    resolved = yaml.safe_load(check.stdout)  # what `config check` and a run's config.yaml hold
    for key, (value, _) in rows.items():
        want = resolved
        for part in key.split("."):
            want = want[part]
        shown = value.split(" (")[0] if key == "rollout.reward_workers" else value
        assert yaml.safe_load(shown) == want, (key, value, want)
    grpo = dict(algorithms.get("grpo").defaults)
    assert grpo  # GRPO's own defaults differ from the dataclass's: shown, and said to come from it
    for field_name, spec_value in grpo.items():
        assert yaml.safe_load(rows[f"algorithm.{field_name}"][0]) == spec_value
        assert rows[f"algorithm.{field_name}"][1] == "algorithm grpo"
    assert rows["env.name"] == ("math", "override")
    assert rows["actor.lr"][1] == "default" and yaml.safe_load(rows["actor.lr"][0]) == ExperimentConfig().actor.lr
    # a YAML file and an override: each value from where it was set, the new algorithm's defaults under them
    path = tmp_path / "exp.yaml"
    path.write_text("algorithm:\n  name: dr-grpo\nactor:\n  lr: 0.5\n")
    rows = _show_rows("--config", str(path), "algorithm.loss_agg_mode=token-mean", "--env", "countdown")
    assert rows["algorithm.name"] == ("dr-grpo", "yaml") and rows["actor.lr"] == ("0.5", "yaml")
    assert rows["algorithm.loss_agg_mode"] == ("token-mean", "override") and rows["env.name"] == ("countdown", "override")
    for field_name, spec_value in algorithms.get("dr-grpo").defaults.items():
        if field_name != "loss_agg_mode":
            assert (yaml.safe_load(rows[f"algorithm.{field_name}"][0]), rows[f"algorithm.{field_name}"][1]) == \
                (spec_value, "algorithm dr-grpo")


def test_explain_config_is_load_config_with_sources(tmp_path):
    from areal_agents.config.loader import explain_config
    from areal_agents.registry import algorithms

    path = tmp_path / "exp.yaml"
    path.write_text("rollout:\n  group_size: 3\n")
    args = (str(path), ["algorithm.name=rloo", "allocation_mode=embedded.d2+d1", "actor.lr=0.01"])
    cfg, sources = explain_config(*args)
    assert cfg == load_config(*args)
    spec = dict(algorithms.get("rloo").defaults)
    expected = {"rollout.group_size": "yaml", "algorithm.name": "override", "allocation_mode": "override",
                "actor.lr": "override", "inference.backend": "allocation_mode", "inference.num_servers": "allocation_mode",
                "sglang.tp_size": "allocation_mode", "trainer.nproc": "allocation_mode",
                "trainer.device": "allocation_mode", **{f"algorithm.{k}": "algorithm rloo" for k in spec}}
    from areal_agents.config.loader import env_presets  # the default env's own layers: its recipe

    expected.update({f"{section}.{k}": source for source, preset in env_presets("math")
                     for section, keys in preset.items() for k in keys})
    assert {k: v for k, v in sources.items() if v != "default"} == expected
    defaults = ExperimentConfig()
    for key, source in sources.items():
        if source == "default" and key not in ("experiment_name", "sglang.dtype"):  # derived: env name, actor.dtype
            section, _, leaf = key.rpartition(".")
            parts = section.split(".") if section else []  # sections nest (actor.lora)
            assert getattr(functools.reduce(getattr, parts, cfg), leaf) == \
                getattr(functools.reduce(getattr, parts, defaults), leaf), key


def test_config_reference_doc_is_current():
    from pathlib import Path

    from areal_agents.config.doc import config_reference

    doc = Path(__file__).resolve().parents[2] / "docs" / "config.md"
    assert doc.read_text() == config_reference(), "docs/config.md is stale: areal-agents config markdown > docs/config.md"


def test_imports_register_user_code_before_validation(tmp_path):
    from areal_agents.registry import envs

    user = tmp_path / "my_envs_for_test.py"
    user.write_text(
        "from areal_agents import register_env\n"
        "from envs.math import MathEnv\n"
        "@register_env('math-copy-for-test')\n"
        "class MathCopy(MathEnv):\n"
        "    pass\n"
    )
    try:
        cfg = load_config(overrides=[f"imports=[{user}]", "env.name=math-copy-for-test"])
        assert cfg.env.name == "math-copy-for-test" and cfg.imports == [str(user)]
        assert envs.get("math-copy-for-test").__name__ == "MathCopy"
        # importing the same file again is a no-op, not a duplicate registration
        load_config(overrides=[f"imports=[{user}]", "env.name=math-copy-for-test"])
    finally:
        envs.remove("math-copy-for-test")


def _user_env_file(path, name):
    path.write_text(
        "from areal_agents import register_env\n"
        "from envs.math import MathEnv\n"
        f"@register_env({name!r})\n"
        "class Copy(MathEnv):\n"
        "    pass\n"
    )
    return path


@pytest.mark.parametrize("form", ["bare", "list", "comma", "yaml-bare"])
def test_imports_takes_a_bare_path_or_a_list(tmp_path, form):
    from areal_agents.registry import envs

    a = _user_env_file(tmp_path / f"imp_a_{form.replace('-', '_')}.py", f"imp-a-{form}")
    b = _user_env_file(tmp_path / f"imp_b_{form.replace('-', '_')}.py", f"imp-b-{form}")
    overrides = {"bare": [f"imports={a}"], "list": [f"imports=[{a},{b}]"], "comma": [f"imports={a},{b}"],
                 "yaml-bare": []}[form]
    config_file = None
    if form == "yaml-bare":
        config_file = tmp_path / "exp.yaml"
        config_file.write_text(f"imports: {a}\n")
    try:
        cfg = load_config(config_file, [*overrides, f"env.name=imp-a-{form}"])
        expected = [str(a)] if form in ("bare", "yaml-bare") else [str(a), str(b)]
        assert cfg.imports == expected
        assert envs.get(f"imp-a-{form}").__name__ == "Copy"
        assert (f"imp-b-{form}" in envs) == (len(expected) == 2)
    finally:
        for name in (f"imp-a-{form}", f"imp-b-{form}"):
            if name in envs:
                envs.remove(name)


def test_imports_errors_are_one_clear_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"imports={tmp_path / 'missing_env.py'}"])
    assert err.value.key == "imports" and "no such file" in str(err.value) and "missing_env.py" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["imports=3"])
    assert err.value.key == "imports" and "imports=my_env.py" in str(err.value) and "must be a list" not in str(err.value)


def test_section_name_shorthand() -> None:
    """``agent=NAME`` (also env=, algorithm=, data=) sets the section's name; a mapping still sets fields."""
    from areal_agents.config.loader import load_config

    cfg = load_config(overrides=["agent=chat", "algorithm=rloo", "env={name: math, turn_discount: 0.5}"])
    assert (cfg.agent.name, cfg.algorithm.name, cfg.env.name, cfg.env.turn_discount) == ("chat", "rloo", "math", 0.5)


# What each built-in env's run resolved to before recipes existed (`areal-agents config check --env NAME`,
# every key whose value is not the dataclass's or the algorithm's default), and the layer that sets it now.
_BUILTIN_RUNS = {
    "math": {"sft.warm_start_target": 0.55, "sft.warm_start_far_check_every": 20, "rollout.group_filter": "nonzero_std",
             "rollout.skip_no_signal": 0.97, "trainer.total_steps": 200, "trainer.save_every": 50, "eval.every": 50},
    "countdown": {"agent.max_turns": 4, "sft.warm_start_target": 0.8, "sft.warm_start_check_every": 20,
                  "rollout.group_filter": "nonzero_std", "trainer.total_steps": 100, "trainer.save_every": 25,
                  "eval.every": 25},
    "guess-number": {"agent.max_turns": 7, "sft.warm_start_target": 0.8, "sft.warm_start_check_every": 10,
                     "rollout.group_filter": "nonzero_std", "trainer.total_steps": 100, "trainer.save_every": 25,
                     "eval.every": 25},
    "python-tool": {"sft.warm_start_far_check_every": 10, "sampling.temperature": 0.7, "trainer.total_steps": 20,
                    "trainer.save_every": 20},
    "unit-convert": {"agent.name": "unit-convert", "sampling.max_new_tokens": 40, "sft.batch_size": 16,
                     "sft.warm_start_lr": 1e-3, "sft.warm_start_check_every": 10, "sft.warm_start_target": 0.8,
                     "rollout.batch_size": 8, "rollout.group_filter": "nonzero_std", "trainer.total_steps": 80,
                     "eval.every": 20},
    "reasoning-gym": {},
    "textarena": {"agent.max_turns": 16},
    "gem": {"agent.max_turns": 16},
}
_BUILTIN_RUNS["math-multiturn"] = dict(_BUILTIN_RUNS["math"])


def _value(cfg: ExperimentConfig, key: str) -> object:
    return functools.reduce(getattr, key.split("."), cfg)


@pytest.mark.parametrize("name", sorted(_BUILTIN_RUNS))
def test_builtin_env_runs_resolve_as_before_recipes(name: str) -> None:
    """``--env NAME`` resolves every key as it did when the envs' classes held their run settings:
    the same env-specific values, every other key at its dataclass or algorithm default; env-level
    keys come from the class (``env NAME``), the rest from ``envs/recipes/NAME.yaml`` (``recipe NAME``)."""
    from areal_agents.config.loader import ENV_LEVEL_SECTIONS, explain_config

    cfg, sources = explain_config(None, [f"env.name={name}"])
    plain, plain_sources = explain_config(None, ["env.name=reasoning-gym"])  # an env that proposes nothing
    want = _BUILTIN_RUNS[name]
    assert {key: _value(cfg, key) for key in want} == want
    for key in want:
        layer = "env" if key.split(".")[0] in ENV_LEVEL_SECTIONS else "recipe"
        assert sources[key] == f"{layer} {name}", key
    for key, source in sources.items():
        if key not in want and key not in ("env.name", "experiment_name"):
            assert (source, _value(cfg, key)) == (plain_sources[key], _value(plain, key)), key
    assert cfg.experiment_name == name


def _register_env_package(tmp_path, monkeypatch, name: str, default_config: dict, recipe: str | None) -> None:
    """A package of the user's on ``sys.path`` that registers env ``name`` (``default_config`` on its
    class) and ships ``recipes/<name>.yaml`` holding ``recipe`` when given."""
    from areal_agents.registry import envs

    pkg = tmp_path / "recipe_test_pkg"
    (pkg / "recipes").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "my_env.py").write_text(
        "from areal_agents import Env, register_env\n\n"
        f"@register_env({name!r})\n"
        "class MyEnv(Env):\n"
        f"    default_config = {default_config!r}\n")
    if recipe is not None:
        (pkg / "recipes" / f"{name}.yaml").write_text(recipe)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("recipe_test_pkg", "recipe_test_pkg.my_env"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(envs, "_entries", dict(envs._entries))  # the registration ends with the test
    monkeypatch.setattr(envs, "_where", dict(envs._where))
    __import__("recipe_test_pkg.my_env")


def test_a_package_recipe_is_a_layer_under_the_users_config(tmp_path, monkeypatch) -> None:
    from areal_agents.config.loader import explain_config, recipe_path

    _register_env_package(tmp_path, monkeypatch, "recipe-test", {"agent": {"max_turns": 3}},
                          "trainer:\n  total_steps: 7\nagent:\n  max_turns: 5\neval:\n  every: 4\n")
    assert recipe_path("recipe-test") == tmp_path / "recipe_test_pkg" / "recipes" / "recipe-test.yaml"
    assert recipe_path("countdown") is not None and recipe_path("countdown").name == "countdown.yaml"
    assert recipe_path("reasoning-gym") is None
    cfg, sources = explain_config(None, ["env.name=recipe-test", "eval.every=9"])
    assert (cfg.trainer.total_steps, sources["trainer.total_steps"]) == (7, "recipe recipe-test")
    assert (cfg.agent.max_turns, sources["agent.max_turns"]) == (5, "recipe recipe-test")  # over the class's proposal
    assert (cfg.eval.every, sources["eval.every"]) == (9, "override")  # the user's overrides win
    path = tmp_path / "exp.yaml"
    path.write_text("trainer:\n  total_steps: 11\n")
    assert load_config(path, ["env.name=recipe-test"]).trainer.total_steps == 11  # and the user's YAML


@pytest.mark.parametrize(("default_config", "recipe", "message"), [
    ({"trainer": {"total_steps": 5}}, None,
     r"^trainer\.total_steps: env 'recipe-test' \(MyEnv\.default_config\) may set only env\.\*, agent\.\* and "
     r"sampling\.\* keys; put run-level keys in a recipe \(recipes/recipe-test\.yaml"),
    ({"seed": 3}, None, r"^seed: env 'recipe-test' \(MyEnv\.default_config\) may set only"),
    ({}, "trainer:\n  total_stepz: 5\n", r"^trainer\.total_stepz: unknown key.*\(set by recipe recipe-test\)$"),
    ({}, "env:\n  name: math\n", r"^env\.name: env 'recipe-test': its recipe .*recipe-test\.yaml may not set env\.name$"),
    ({}, "- a\n- b\n", r"^env\.name: env 'recipe-test': its recipe .* must hold a mapping of sections$"),
])
def test_env_proposals_out_of_bounds_are_one_line_config_errors(tmp_path, monkeypatch, default_config, recipe,
                                                                message) -> None:
    _register_env_package(tmp_path, monkeypatch, "recipe-test", default_config, recipe)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(overrides=["env.name=recipe-test"])
    assert "\n" not in str(caught.value)
