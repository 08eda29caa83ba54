"""``unit-convert``: convert a quantity between units by calling a ``convert`` tool, then answer.

The model cannot do the arithmetic (37 miles in meters is 59545.73), but it can call
``convert`` with the right value and unit symbols, read the tool's result and copy it. The
default agent (``unit-convert``) is written only against the OpenAI client: it sends the prompt
with ``tools=[CONVERT]``, runs the tool for each call the reply makes, sends the result back as a
``tool`` message and returns when the model answers; the env scores the answer. With the built-in
``chat`` agent the env runs the tool itself (a reply holding a ``<tool_call>`` gets the result as a
``tool`` observation). Either way the episode is one trajectory: the prompt, the call, the tool's
result (context, loss mask 0) and the answer. The warm start trains on that whole conversation
(:meth:`UnitConvertEnv.reference_conversation`).
"""

from __future__ import annotations

import json
import random
from typing import Any, ClassVar

from areal_agents.env import Observation, ReferenceMixin, TextSpace, TurnLimitedEnv
from areal_agents.tools.calls import parse_tool_calls

__all__ = ["CONVERT", "UNITS", "UnitConvertEnv", "convert", "run_tool", "unit_convert_agent", "unit_convert_dataset"]

# symbol: (dimension, size in the dimension's base unit, name in prompts)
UNITS: dict[str, tuple[str, float, str]] = {
    "m": ("length", 1.0, "meters"), "km": ("length", 1000.0, "kilometers"), "ft": ("length", 0.3048, "feet"),
    "mi": ("length", 1609.344, "miles"), "kg": ("mass", 1.0, "kilograms"), "g": ("mass", 0.001, "grams"),
    "lb": ("mass", 0.45359237, "pounds"), "oz": ("mass", 0.028349523125, "ounces"),
}

CONVERT: dict[str, Any] = {"type": "function", "function": {
    "name": "convert",
    "parameters": {"type": "object", "properties": {"value": {"type": "number"}, "from": {"type": "string"},
                                                    "to": {"type": "string"}}}}}


def _number(x: float) -> str:
    """``x`` rounded to 2 decimals, without trailing zeros (``59545.73``, ``3700``)."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def convert(value: float, from_unit: str, to_unit: str) -> str:
    """``value`` in ``from_unit`` expressed in ``to_unit`` (2 decimals); ``ValueError`` for
    unknown units or units of different dimensions."""
    for unit in (from_unit, to_unit):
        if unit not in UNITS:
            raise ValueError(f"unknown unit {unit!r}; known: {', '.join(UNITS)}")
    (dim_a, size_a, _), (dim_b, size_b, _) = UNITS[from_unit], UNITS[to_unit]
    if dim_a != dim_b:
        raise ValueError(f"cannot convert {dim_a} to {dim_b}")
    return _number(value * size_a / size_b)


def run_tool(name: str, arguments: str) -> str:
    """The ``convert`` tool's result for one call (an ``error: ...`` text for a bad call: the model reads it)."""
    try:
        args = json.loads(arguments)
        if name != "convert":
            return f"error: unknown tool {name}"
        return convert(float(args["value"]), str(args["from"]), str(args["to"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


def _in_test_split(value: int, from_unit: str, to_unit: str) -> bool:
    key = (value * 7919 + list(UNITS).index(from_unit) * 131 + list(UNITS).index(to_unit) * 17) * 2_654_435_761
    return key % 4_294_967_296 < 429_496_730  # ~10 %


def unit_convert_dataset(split: str = "train", *, size: int | None = None, seed: int = 0, low: int = 1,
                         high: int = 299) -> list[dict[str, Any]]:
    """Seeded rows ``{"prompt": "How many meters is 37 miles?", "value", "from", "to", "answer"}``
    with integer values in ``[low, high]`` and two different units of one dimension. A question
    (value and units) belongs to exactly one split. ``size=None`` gives 2000 train / 500 test rows."""
    if split not in ("train", "test"):
        raise ValueError(f"unit_convert_dataset: split must be train or test (got {split!r})")
    if not 1 <= low <= high:
        raise ValueError(f"unit_convert_dataset: need 1 <= low <= high (got {low}, {high})")
    pairs = [(a, b) for a in UNITS for b in UNITS if a != b and UNITS[a][0] == UNITS[b][0]]
    pool = [(v, a, b) for v in range(low, high + 1) for a, b in pairs if _in_test_split(v, a, b) == (split == "test")]
    if not pool:
        raise ValueError(f"unit_convert_dataset: no {split} questions with values in [{low}, {high}]")
    n = size if size is not None else (2000 if split == "train" else 500)
    rng = random.Random(f"unit-convert:{split}:{seed}")
    rows = []
    for i in range(n):
        if i % len(pool) == 0:
            rng.shuffle(pool)
        value, a, b = pool[i % len(pool)]
        rows.append({"prompt": f"How many {UNITS[b][2]} is {value} {UNITS[a][2]}?", "value": value, "from": a, "to": b,
                     "answer": convert(value, a, b)})
    return rows


def _is_answer(text: str, answer: str) -> bool:
    try:
        return abs(float(text.strip().split()[0]) - float(answer)) < 0.005
    except (ValueError, IndexError):
        return False


class UnitConvertEnv(ReferenceMixin, TurnLimitedEnv):
    """The reply is the answer (reward 1.0 when its number is the converted value, to 2 decimals),
    or a ``<tool_call>`` whose result comes back as a ``tool`` message (reward 0, the episode goes
    on). ``max_turns`` replies truncate the episode. A run's settings: ``envs/recipes/unit-convert.yaml``."""

    default_dataset = "unit-convert"
    default_config: ClassVar[dict[str, Any]] = {
        "agent": {"name": "unit-convert"},
        "sampling": {"max_new_tokens": 40},
    }
    action_space = TextSpace(probes=(
        '<tool_call>{"name": "convert", "arguments": {"value": 3, "from": "km", "to": "m"}}</tool_call>',
        "3000", "", "<tool_call>convert 3 km</tool_call>"))
    required_fields = ("prompt", "value", "from", "to", "answer")
    tools = [CONVERT]

    def __init__(self, max_turns: int = 3) -> None:
        super().__init__(max_turns)

    def start(self, row: dict[str, Any]) -> str:
        self.tool_calls = 0
        return str(row["prompt"])

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[Observation, float, bool, dict[str, Any]]:
        if "<tool_call>" in action:
            _, calls = parse_tool_calls(action, {"convert"})
            if not calls:
                return [{"role": "tool", "content": "error: write the call as <tool_call>{...}</tool_call>"}], 0.0, \
                    False, {"tool_calls": self.tool_calls}
            results = [{"role": "tool", "tool_call_id": f"call_{self.tool_calls + i}",
                        "content": run_tool(c["function"]["name"], c["function"]["arguments"])} for i, c in enumerate(calls)]
            self.tool_calls += len(calls)
            return results, 0.0, False, {"tool_calls": self.tool_calls}
        success = _is_answer(action, str(row["answer"]))
        return "", float(success), True, {"success": success, "tool_calls": self.tool_calls}

    def _call(self, row: dict[str, Any]) -> dict[str, Any]:
        args = {"value": row["value"], "from": row["from"], "to": row["to"]}
        return {"id": "call_0", "type": "function", "function": {"name": "convert", "arguments": json.dumps(args)}}

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        """The first reply of the reference episode: the tool call."""
        fn = self._call(row)["function"]
        return f'<tool_call>{{"name": "{fn["name"]}", "arguments": {fn["arguments"]}}}</tool_call>'

    def reference_conversation(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Question, the ``convert`` call, its result, the answer (the result copied)."""
        call = self._call(row)
        result = run_tool("convert", call["function"]["arguments"])
        return [{"role": "user", "content": str(row["prompt"])},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": result},
                {"role": "assistant", "content": result}]


async def unit_convert_agent(client: Any, row: dict[str, Any], max_tool_calls: int = 2) -> None:
    """An agent written only against the OpenAI client: ask with the ``convert`` tool, run each
    call the model makes and send back its result, until the model answers (or ``max_tool_calls``
    rounds of calls were made). Returns None: the env scores the last reply."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
    for _ in range(max_tool_calls + 1):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CONVERT])
        message = reply.choices[0].message
        if not message.tool_calls:
            return None
        messages.append({"role": "assistant", "content": message.content,
                         "tool_calls": [c.model_dump() for c in message.tool_calls]})
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(call.function.name, call.function.arguments)})
    return None
