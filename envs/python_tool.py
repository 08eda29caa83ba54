"""``python-tool``: answer a question, optionally running Python in a sandbox first."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from areal_agents.env import ReferenceMixin, RewardMixin, TextSpace, TurnLimitedEnv
from areal_agents.tools.sandbox import run_python

__all__ = ["PythonToolEnv"]

_CALL = re.compile(r"<python>(.*?)</python>", re.DOTALL)


class PythonToolEnv(RewardMixin, ReferenceMixin, TurnLimitedEnv):
    """Tool use: a reply containing ``<python>code</python>`` runs the code in the sandbox
    (:func:`areal_agents.tools.sandbox.run_python`) and the observation is ``<output>...</output>``;
    a reply without a tool call is the final answer, scored by ``reward`` (default ``math``).

    A ``<python>`` without ``</python>`` gets ``Tool error: close the code with </python>.``;
    a tool run that times out says ``Timed out.`` in its output. ``max_turns`` replies truncate.
    Sampling at temperature 0.7 (``default_config``): at 1.0 a tiny model that calls the tool right
    miscopies its output into the answer in most sampled episodes. A run's settings:
    ``envs/recipes/python-tool.yaml``.
    """

    default_config: ClassVar[dict[str, Any]] = {"sampling": {"temperature": 0.7}}
    default_dataset = "arithmetic"
    default_dataset_kwargs = {"ops": ["*"], "template": "{a}{op}{b}=?"}
    action_space = TextSpace(probes=("<python>print(6*7)</python>", "42", "", "<python>print(", "The answer is \\boxed{7}."))
    required_fields = ("prompt", "answer")

    def __init__(
        self,
        max_turns: int = 4,
        reward: str = "math",
        timeout_s: float = 5.0,
        memory_mb: int = 256,
        max_output_chars: int = 300,
        hint: str = " Run code with <python>...</python>.",
    ) -> None:
        super().__init__(max_turns)
        self.reward = reward
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars
        self.hint = hint

    def start(self, row: dict[str, Any]) -> str:
        self.tool_calls = 0
        return self._question(row)

    def _question(self, row: dict[str, Any]) -> str:
        return str(row["prompt"]) + self.hint

    def _run_tool(self, action: str) -> str:
        match = _CALL.search(action)
        if match is None:
            return "Tool error: close the code with </python>."
        self.tool_calls += 1
        result = run_python(match.group(1), timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                            max_output_chars=self.max_output_chars)
        text = result.stdout
        if result.exit_code != 0 and result.stderr:
            text += result.stderr.strip().splitlines()[-1]
        text = text.strip()[: self.max_output_chars]
        if result.timed_out:
            text += "\nTimed out."
        return f"<output>{text}</output>"

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        if "<python>" in action:
            obs = self._run_tool(action)
            return obs, 0.0, False, {"tool_calls": self.tool_calls}
        reward, info = self.compute_reward(self.reward, action, row)
        info.update(success=reward >= 1.0, tool_calls=self.tool_calls)
        return "", reward, True, info

    def reference_conversation(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The whole episode of an integer ``expression`` row: the tool call, the sandbox's output
        (what ``print`` writes for the integer, i.e. the answer), the answer copied from it."""
        if not row.get("expression") or row.get("op", "+") not in ("+", "-", "*"):
            return None
        answer = str(row["answer"])
        return [{"role": "user", "content": self._question(row)},
                {"role": "assistant", "content": f"<python>print({row['expression']})</python>"},
                {"role": "user", "content": f"<output>{answer}</output>"},
                {"role": "assistant", "content": answer}]

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        """The tool call that computes the answer (``expression`` rows), else the answer itself."""
        return f"<python>print({row['expression']})</python>" if row.get("expression") else str(row["answer"])
