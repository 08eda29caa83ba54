"""Datasets: synthetic arithmetic determinism and splits, local files with clear errors."""

from __future__ import annotations

import json

import pytest

from areal_agents.config import DataConfig, EnvConfig, ExperimentConfig
from areal_agents.data import (
    DatasetError,
    arithmetic_dataset,
    gsm8k_dataset,
    jsonl_dataset,
    load_dataset_rows,
)
from areal_agents.registry import datasets
from areal_agents.rewards import math_reward
from envs.countdown import evaluate_expression


def test_arithmetic_is_deterministic_and_splits_are_disjoint() -> None:
    a = arithmetic_dataset("train", size=500, seed=3)
    assert a == arithmetic_dataset("train", size=500, seed=3)
    assert a != arithmetic_dataset("train", size=500, seed=4)
    for seed in (0, 1):
        train = {r["expression"] for r in arithmetic_dataset("train", seed=seed)}
        test = {r["expression"] for r in arithmetic_dataset("test", seed=seed)}
        assert train and test and not train & test
        assert len(train) + len(test) == 90 * 90
    row = a[0]
    assert row["prompt"] == f"{row['a']}+{row['b']}=" and int(row["answer"]) == row["a"] + row["b"]
    assert math_reward(row["answer"], answer=row["answer"]) == 1.0


def test_arithmetic_options() -> None:
    rows = arithmetic_dataset("test", size=50, ops=("-", "*"), low=2, high=9, template="What is {a}{op}{b}?")
    assert {r["op"] for r in rows} <= {"-", "*"} and all(2 <= r["a"] <= 9 for r in rows)
    assert all(int(r["answer"]) == eval(r["expression"]) for r in rows)  # noqa: S307 - our own digits
    assert rows[0]["prompt"].startswith("What is ")
    assert len(arithmetic_dataset("train", size=10_000, low=1, high=5)) == 10_000  # repeats when asked
    with pytest.raises(DatasetError, match="ops must be"):
        arithmetic_dataset(ops=("/",))
    with pytest.raises(DatasetError, match="split must be"):
        arithmetic_dataset("valid")
    with pytest.raises(DatasetError, match="unknown argument"):
        arithmetic_dataset(nope=1)


def test_jsonl_and_gsm8k_round_trip(tmp_path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"{i}+1", "a": str(i + 1), "extra": i}) for i in range(5)) + "\n\n")
    rows = jsonl_dataset("train", path=str(path), prompt_field="q", answer_field="a", size=3)
    assert [r["prompt"] for r in rows] == ["0+1", "1+1", "2+1"] and rows[2]["extra"] == 2
    gpath = tmp_path / "gsm_{split}.jsonl"
    (tmp_path / "gsm_test.jsonl").write_text(
        json.dumps({"question": "Tom has 3 apples and buys 4,000 more. How many?", "answer": "3+4000=4003\n#### 4,003"})
        + "\n"
    )
    g = gsm8k_dataset("test", path=str(gpath))
    assert g == [{"prompt": "Tom has 3 apples and buys 4,000 more. How many?", "answer": "4003",
                  "solution": "3+4000=4003\n#### 4,003"}]
    assert math_reward("They have 4003 apples.", **{k: v for k, v in g[0].items() if k != "prompt"}) == 1.0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "q", "answer": "#### 1"}\n{"question": "q2"\n', r"gsm\.jsonl:2: not valid JSON"),
        ('{"question": "q", "answer": "#### 1"}\n{"answer": "#### 2"}\n', r"gsm\.jsonl:2: missing field 'question'"),
        ('{"question": "q", "answer": "just 3"}\n', r"gsm\.jsonl:1: field 'answer' has no '#### <number>'"),
        ('{"question": "", "answer": "#### 3"}\n', r"gsm\.jsonl:1: field 'question' is empty"),
        ("[1, 2]\n", r"gsm\.jsonl:1: expected a JSON object"),
        ("\n", r"gsm\.jsonl: the file has no records"),
    ],
)
def test_bad_files_name_file_line_and_field(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "gsm.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        gsm8k_dataset("train", path=str(path))


def test_missing_file(tmp_path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        jsonl_dataset("train", path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(DatasetError, match="needs path"):
        jsonl_dataset("train")


def test_parquet_files_load_like_jsonl(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = {"train": [{"question": f"What is {a} + 2?", "answer": f"{a} + 2 = {a + 2}\n#### {a + 2}"}
                         for a in range(6)],
               "test": [{"question": "What is 9 + 9?", "answer": "#### 18"}]}
    for split, rows in records.items():
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"gsm8k_{split}.parquet")
    cfg = ExperimentConfig(env=EnvConfig(name="math"),
                           data=DataConfig(name="gsm8k", path=str(tmp_path / "gsm8k_{split}.parquet")))
    train, test = load_dataset_rows(cfg, "train"), load_dataset_rows(cfg, "test")
    assert [r["answer"] for r in train] == [str(a + 2) for a in range(6)] and test[0]["answer"] == "18"
    assert train[0]["prompt"] == "What is 0 + 2?"
    rows = jsonl_dataset("train", path=str(tmp_path / "gsm8k_train.parquet"), prompt_field="question")
    assert rows[0]["prompt"] == "What is 0 + 2?" and len(rows) == 6

    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(DatasetError, match=r"broken\.parquet: not a readable Parquet file") as info:
        jsonl_dataset("train", path=str(broken))
    assert "\n" not in str(info.value)


def test_load_dataset_rows_uses_env_default_and_config() -> None:
    cfg = ExperimentConfig(env=EnvConfig(name="math"), data=DataConfig(train_size=7, test_size=3))
    train, test = load_dataset_rows(cfg, "train"), load_dataset_rows(cfg, "test")
    assert len(train) == 7 and len(test) == 3 and train[0]["op"] == "+"
    cfg = ExperimentConfig(env=EnvConfig(name="python-tool"), data=DataConfig(train_size=4, kwargs={"seed": 5}))
    rows = load_dataset_rows(cfg, "train")
    assert all(r["op"] == "*" for r in rows) and rows == arithmetic_dataset(
        "train", size=4, seed=5, ops=["*"], template="{a}{op}{b}=?"
    )
    cfg = ExperimentConfig(env=EnvConfig(name="countdown"), data=DataConfig(name="guess-number", train_size=5))
    assert [r["prompt"] for r in load_dataset_rows(cfg, "train")] == ["Guess my number (1-100)."] * 5


def test_builtin_datasets_are_registered_and_seeded() -> None:
    for name in ("arithmetic", "jsonl", "gsm8k", "guess-number", "countdown"):
        assert name in datasets
    cd = datasets.get("countdown")
    train, test = cd("train", size=200), cd("test", size=50)
    assert train == cd("train", size=200)
    key = lambda r: (tuple(r["numbers"]), r["target"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in test}
    # one reference answer per puzzle (learnable by SFT, checkable by exact match), and a right one
    answers: dict = {}
    for r in train + test:
        assert answers.setdefault(key(r), r["answer"]) == r["answer"]
        value, used = evaluate_expression(r["answer"])
        assert value == r["target"] and sorted(used) == r["numbers"]
    assert cd("train", size=3, seed=0)[0]["answer"] == "3+4+8"  # the first solution: ascending order, + before - and *
    gn = datasets.get("guess-number")("train", size=150)
    assert len(gn) == 150 and sorted(r["target"] for r in gn[:100]) == list(range(1, 101))
