"""`areal-agents eval`: greedy accuracy and pass@k on the test split, with a JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from trainers.tiny_model import build_tiny_model

# A reward the untrained model meets on some rows and not on others, so the accuracy is a
# figure the test can recompute (an untrained model never gets a sum right: 0 either way).
REWARDS = '''
from areal_agents import register_reward

@register_reward("even-length")
def even_length(completion: str, **row) -> float:
    return float(len(completion.strip()) % 2 == 0)
'''


def _greedy_by_hand(model: Path, rows: list[dict], max_new_tokens: int) -> float:
    """Greedy decoding with transformers and the same reward, without the server or the agent."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    hits = 0
    for row in rows:
        text = tok.apply_chat_template([{"role": "user", "content": row["prompt"]}], tokenize=False,
                                       add_generation_prompt=True)
        ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
        out = lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                          do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        completion = tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
        hits += len(completion.strip()) % 2 == 0
    return hits / len(rows)


def test_eval_command_writes_report(tmp_path: Path) -> None:
    # seed 2: an untrained model whose greedy replies differ from row to row (with other seeds
    # they can all be the same string, and no probe reward splits identical replies)
    model = build_tiny_model([f"{a}+{b}= {a + b}" for a in range(10, 40) for b in range(10, 40)], tmp_path / "m",
                             seed=2)
    (tmp_path / "even_rewards.py").write_text(REWARDS)
    out = tmp_path / "report.json"
    n, new_tokens = 12, 5
    proc = subprocess.run(
        [sys.executable, "-m", "areal_agents.cli", "eval", "--env", "math", "--model", str(model), "--output", str(out),
         f"eval.n={n}", "eval.k=3", f"sampling.max_new_tokens={new_tokens}", f"output_dir={tmp_path / 'runs'}",
         "logging.progress=false", f"imports=[{tmp_path / 'even_rewards.py'}]", "env.kwargs={reward: even-length}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["eval/n"] == n and report["k"] == 3 and report["model"] == str(model)
    assert report["eval/failed"] == 0
    from areal_agents.config.loader import load_config
    from areal_agents.data import load_dataset_rows

    rows = load_dataset_rows(load_config(overrides=["env.name=math"]), "test")[:n]
    expected = _greedy_by_hand(model, rows, new_tokens)
    assert 0 < expected < 1, "the probe reward must split the rows, or the comparison proves nothing"
    assert report["eval/accuracy"] == expected
    assert "eval/pass@3" in report
    assert "eval/accuracy" in proc.stdout
