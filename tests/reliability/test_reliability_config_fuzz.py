"""Config fuzzing through the real command line: random YAML files (and overrides) into
``areal-agents config check --config F`` in-process. Each run exits 0 with the resolved YAML,
or exits 2 with exactly one stderr line that names a key; no exception ever escapes.

Under ``CI=true`` the examples are derandomized (tests/conftest.py), so a red CI run always
means a code change; locally every run explores new cases."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import tempfile

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from reliability_support import record

from areal_agents.cli import main
from areal_agents.config.loader import config_fields

FIELDS = {key: default for key, _, default, _ in config_fields()}
KNOWN = list(FIELDS)
SECTIONS = sorted({k.split(".")[0] for k in KNOWN if "." in k})
STATS = {"runs": 0, "exit_0": 0, "exit_0_with_keys": 0, "exit_2": 0, "tracebacks": 0}

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "???", "${actor.lr}", "${nope.x}", "${", "bfloat16", "grpo", "cpu", "sglang", "[1,2]",
                     "~", "1e-5", "nan", "-inf", "0x10", "yes", "1_000", "\x00", "é", "${oc.env:HOME}"]),
    st.text(max_size=12),
)  # fmt: skip
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                       max_leaves=6)  # fmt: skip
_leaf_key = st.one_of(st.sampled_from(KNOWN), st.sampled_from(SECTIONS), st.text(alphabet="abcxyz_.", min_size=1, max_size=14))


def _nest(flat: dict[str, object]) -> dict[str, object]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}`` where possible (later keys win on clashes)."""
    out: dict[str, object] = {}
    for key, value in flat.items():
        node = out
        parts = [p for p in key.split(".") if p] or [key]
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return out


_mostly_valid = st.dictionaries(  # known keys at their defaults, some of them mutated
    st.sampled_from(KNOWN),
    st.one_of(st.just(None), _scalars),
    max_size=5,
).map(lambda d: {k: (FIELDS[k] if v is None else v) for k, v in d.items()})
_docs = st.one_of(
    _mostly_valid.map(_nest).map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.dictionaries(_leaf_key, _values, max_size=6).map(_nest).map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.dictionaries(_leaf_key, _values, max_size=4).map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    _values.map(lambda v: yaml.safe_dump(v, allow_unicode=True)),
    st.text(alphabet="abc: -[]{}\n\t'\"&*!|>%@#,?0123.", max_size=60),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)
_overrides = st.lists(st.builds(lambda k, v: f"{k}={v}", _leaf_key, st.text(alphabet="abc0123.-[]{}:,' $", max_size=10)),
                      max_size=2)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


_QUOTED = re.compile(r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")(?=: )""")


def _named_key(line: str) -> tuple[str, bool]:
    """The key an ``error: KEY: rule`` line names, and whether it was shown quoted."""
    rest = line[len("error: "):]
    quoted = _QUOTED.match(rest)
    if quoted:
        return ast.literal_eval(quoted.group(1)), True
    return rest.split(": ", 1)[0], False


def _key_paths(node: object, prefix: str = "") -> set[str]:
    """Every dotted key path of a loaded YAML document (keys as ``str`` shows them)."""
    paths: set[str] = set()
    if isinstance(node, dict):
        for key, child in node.items():
            path = f"{prefix}{key!s}"
            paths |= {path} | _key_paths(child, path + ".")
    return paths


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_docs, overrides=_overrides)
@example(doc="''': '''\n", overrides=[])  # found by a fuzz run: "error: : : unknown key" named no key
@example(doc='"a: b": 1\n', overrides=[])  # a key holding ": " is shown quoted
@example(doc="? ''\n: 1\n", overrides=[])
@example(doc='" a": 1\n', overrides=[])
@example(doc="0\t0", overrides=[])  # PyYAML rejects the tab, OmegaConf's loader reads the key "0\t0"
@example(doc="sampling:\n  stop: {}\n", overrides=[])  # a mapping where the schema has a list: was a TypeError
@example(doc="actor:\n  lr: 0.0003\nrollout:\n  batch_size: 4\n", overrides=["trainer.total_steps=3"])  # valid
def _fuzz_config_check(doc: str, overrides: list[str]) -> None:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(doc)
        code, out, err = run_cli(["config", "check", "--config", path, *overrides])
    finally:
        os.unlink(path)
    STATS["runs"] += 1
    STATS["tracebacks"] += "Traceback" in err
    assert code in (0, 2), (code, err)
    if code == 0:
        STATS["exit_0"] += 1
        assert err == "" and "actor:" in out
        with contextlib.suppress(yaml.YAMLError):
            STATS["exit_0_with_keys"] += bool(yaml.safe_load(doc))  # a file that set something, and was valid
        return
    STATS["exit_2"] += 1
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and out == ""
    key, quoted = _named_key(lines[0])
    if quoted:  # an odd key (empty, control characters, ": ") is shown quoted: it must be a key of the loaded file
        loaded = OmegaConf.to_container(OmegaConf.load(io.StringIO(doc)), resolve=False)
        assert key in _key_paths(loaded) or any(key in o for o in overrides), (lines[0], doc, overrides)
        return
    head, flat = key.split(".")[0], " ".join(doc.split())  # YAML folds line breaks of plain scalars
    named = key == "--config" or key in KNOWN or head in flat or any(head in o for o in overrides)
    assert key and key.isprintable() and ": " not in key and named, (lines[0], doc, overrides)


def test_random_yaml_files_fail_with_one_line_naming_a_key() -> None:
    """The fuzz run (each example asserts its own outcome), then what it covered: both outcomes
    were reached; a checker that rejected every file with a tidy line would pass each example alone."""
    STATS.update(dict.fromkeys(STATS, 0))
    _fuzz_config_check()
    record("config_fuzz", yaml_files=STATS["runs"], exit_0=STATS["exit_0"], exit_2_one_line=STATS["exit_2"],
           tracebacks=STATS["tracebacks"])
    assert STATS["runs"] >= 100 and STATS["tracebacks"] == 0, STATS
    assert STATS["exit_0_with_keys"] >= 1 and STATS["exit_2"] >= 5, STATS


def test_found_by_fuzzing_odd_keys_and_scalar_files_are_one_clear_line(tmp_path) -> None:
    for doc, start in (('"\\r": 1\n', "error: '\\r': unknown key"), ("? ''\n: 1\n", "error: '': unknown key"),
                       ('"a: b": 1\n', "error: 'a: b': unknown key"), ('" a": 1\n', "error: ' a': unknown key"),
                       ("''': '''\n", "error: --config: "), ('"actor: {lr: 0.5}"\n', "error: --config: "),
                       ("'0x10'\n", "error: --config: ")):
        path = tmp_path / "odd.yaml"
        path.write_text(doc)
        code, _, err = run_cli(["config", "check", "--config", str(path)])
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith(start), (doc, err)
    assert "must hold a mapping of sections" in err


def test_overrides_after_an_option_are_not_lost(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("actor:\n  lr: 0.5\n")
    for argv in (["config", "check", "--config", str(cfg), "actor.lr=0.25"],
                 ["config", "check", "actor.lr=0.25", "--config", str(cfg)],
                 ["config", "check", "trainer.total_steps=3", "--config", str(cfg), "actor.lr=0.25"]):
        code, out, err = run_cli(argv)
        assert code == 0 and err == "", (argv, err)
        assert yaml.safe_load(out)["actor"]["lr"] == 0.25, argv
    code, out, err = run_cli(["config", "check", "--config", str(cfg), "actor.lr=0.25", "trainer.total_steps=x"])
    assert code == 2 and err.startswith("error: trainer.total_steps") and len(err.splitlines()) == 1


def test_interpolated_algorithm_name_and_non_mapping_kwargs_are_one_line(tmp_path) -> None:
    code, _, err = run_cli(["config", "check", "algorithm.name=${actor.lr}"])
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: algorithm.name"), err
    code, _, err = run_cli(["config", "check", "data.kwargs=[1, 2]"])
    assert code == 2 and err == "error: data.kwargs: must be a mapping of key: value\n", err
    path = tmp_path / "k.yaml"
    path.write_text("env:\n  kwargs: 3\n")
    code, _, err = run_cli(["config", "check", "--config", str(path)])
    assert code == 2 and err == "error: env.kwargs: must be a mapping of key: value\n", err
    path.write_text("env:\n  kwargs: null\n")
    code, _, err = run_cli(["config", "check", "--config", str(path)])
    assert code == 2 and err.startswith("error: env.kwargs: ") and len(err.splitlines()) == 1, err


DRAW = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("suite_conftest", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
from hypothesis import given, settings, strategies as st
seen = []
@settings(max_examples=20)
@given(st.text(min_size=4))
def draw(s):
    seen.append(s)
draw()
print(repr(seen))
"""


def test_property_tests_are_derandomized_under_ci(tmp_path) -> None:
    conftest = os.path.join(os.path.dirname(os.path.dirname(__file__)), "conftest.py")

    def draws(ci: str | None) -> str:
        import subprocess
        import sys

        env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci is not None else {})
        proc = subprocess.run([sys.executable, "-c", DRAW, conftest], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, env=env)  # cwd: a fresh directory, so no saved examples replay
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert draws("true") == draws("true")  # CI: the same examples every run
    assert draws(None) != draws(None)  # locally: new examples each run
