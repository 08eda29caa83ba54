"""Every built-in env rejects a reset row that lacks a field it needs, naming the field."""

from __future__ import annotations

import pytest

from areal_agents.gym.registration import make_env

CASES = [("math", {"prompt": "1+1="}, "answer"), ("python-tool", {"answer": "2"}, "prompt"),
         ("guess-number", {"low": 1}, "target"), ("countdown", {"target": 5}, "numbers")]


@pytest.mark.parametrize(("name", "row", "missing"), CASES)
def test_reset_names_the_missing_field(name: str, row: dict, missing: str) -> None:
    env = make_env(name)
    with pytest.raises(ValueError, match=rf"\.reset: the row needs a '{missing}' field"):
        env.reset(options=row)
    env.close()
