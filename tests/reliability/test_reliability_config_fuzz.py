"""Config fuzzing through the real command line: random YAML files (and overrides) into
``areal-agents config check --config F`` in-process. Each run exits 0 with the resolved YAML,
or exits 2 with exactly one stderr line that names a key; no exception ever escapes."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_support import record

from areal_agents.cli import main
from areal_agents.config_loader import config_fields

FIELDS = {key: default for key, _, default, _ in config_fields()}
KNOWN = list(FIELDS)
SECTIONS = sorted({k.split(".")[0] for k in KNOWN if "." in k})
STATS = {"runs": 0, "exit_0": 0, "exit_2": 0}

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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_docs, overrides=_overrides)
def test_random_yaml_files_fail_with_one_line_naming_a_key(doc: str, overrides: list[str]) -> None:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(doc)
        code, out, err = run_cli(["config", "check", "--config", path, *overrides])
    finally:
        os.unlink(path)
    STATS["runs"] += 1
    assert code in (0, 2), (code, err)
    if code == 0:
        STATS["exit_0"] += 1
        assert err == "" and "actor:" in out
        return
    STATS["exit_2"] += 1
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and out == ""
    key = lines[0][len("error: "):].split(": ", 1)[0]
    head, flat = key.split(".")[0], " ".join(doc.split())  # YAML folds line breaks of plain scalars
    named = (key == "--config" or key in KNOWN or head in flat or any(head in o for o in overrides)
             or key.startswith(("'", '"')))  # an odd key (empty, control characters) is shown quoted
    assert key and key.isprintable() and named, (lines[0], doc, overrides)


def test_record_config_fuzz_figures() -> None:
    """Runs after the fuzz test in file order; records how many files were tried."""
    if STATS["runs"]:
        record("config_fuzz", yaml_files=STATS["runs"], exit_0=STATS["exit_0"], exit_2_one_line=STATS["exit_2"],
               tracebacks=0)
    assert STATS["runs"] == 0 or STATS["exit_0"] + STATS["exit_2"] == STATS["runs"]


def test_found_by_fuzzing_odd_keys_and_scalar_files_are_one_clear_line(tmp_path) -> None:
    for doc, start in (('"\\r": 1\n', "error: '\\r': unknown key"), ("? ''\n: 1\n", "error: '': unknown key"),
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
