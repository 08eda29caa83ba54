"""Which failures the command line shows as one line (exit 1, no traceback): every error of the
rooms below it that describes bad input or a broken setup derives from ``UserError``, keeps its
built-in base, and is known to the command line without a list of names to import."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_agents.cli import main
from areal_agents.cli.main import _is_user_error, _one_line
from areal_agents.data import DatasetError
from areal_agents.failures import EpisodesFailed, UserError
from areal_agents.gym.checker import EnvCheckError
from areal_agents.inference.control import ControlError, ServerUnreachable
from areal_agents.inference.launcher import LaunchError
from areal_agents.inference.protocol import InferenceError
from areal_agents.rollout.preflight import PreflightError

USER_ERRORS = [(DatasetError, ValueError), (EnvCheckError, AssertionError), (EpisodesFailed, RuntimeError),
               (PreflightError, UserError), (ControlError, RuntimeError), (ServerUnreachable, RuntimeError),
               (InferenceError, RuntimeError), (LaunchError, RuntimeError)]


@pytest.mark.parametrize(("cls", "builtin"), USER_ERRORS, ids=[c.__name__ for c, _ in USER_ERRORS])
def test_a_user_error_is_one_line_and_keeps_its_builtin_base(cls: type[Exception], builtin: type[Exception]) -> None:
    exc = cls("what went wrong\nthe log's tail")
    assert isinstance(exc, builtin) and _is_user_error(exc)
    kind = "" if cls in (EpisodesFailed, PreflightError) else f"{cls.__name__}: "  # these name their cause
    assert _one_line(exc) == f"{kind}what went wrong (+1 lines: AREAL_AGENTS_TRACEBACK=1 shows them)"


@pytest.mark.parametrize("exc", [ValueError("x"), RuntimeError("x"), KeyError("x"), AssertionError("x"), TypeError("x")])
def test_any_other_exception_is_a_bug_and_keeps_its_traceback(exc: Exception) -> None:
    assert not _is_user_error(exc)


def test_a_dataset_error_found_by_the_preflight_check_is_one_line(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "rows.jsonl"
    code = main(["run", "--env", "math", "data.name=jsonl", f"data.path={missing}", f"output_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: DatasetError: ") and str(missing) in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_plot_of_a_directory_that_is_no_run_says_so_on_stderr(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"error: {tmp_path / 'metrics.jsonl'} not found: is {tmp_path} a run directory?\n"
