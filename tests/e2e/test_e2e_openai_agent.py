"""End to end: agents written only against the OpenAI client, in files the project has never
seen, trained with ``areal-agents run --env math agent=NAME imports=[agent.py]``: one calls the
in-process client, the other runs as a subprocess speaking raw HTTP to its episode's endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainers.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

STEPS = 3

AGENT_FILE = '''
import asyncio
import sys

from areal_agents import register_agent

CHILD = """
import json, sys, urllib.request
url, key, prompt = sys.argv[1:4]
body = {"model": "policy", "messages": [{"role": "user", "content": prompt}], "max_tokens": 6}
req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
reply = json.load(urllib.request.urlopen(req, timeout=60))
print(reply["choices"][0]["message"]["content"])
"""


@register_agent("openai-math")
async def openai_math(client, row):
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": row["prompt"]}], max_tokens=6)
    return float((reply.choices[0].message.content or "").strip() == str(row["answer"]))


@register_agent("http-math")
async def http_math(client, row):
    url = await client.http_endpoint()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, url, client.api_key, row["prompt"],
                                                stdout=asyncio.subprocess.PIPE)
    await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"agent process exited with {proc.returncode}")
    return None  # the env scores the last reply
'''


@pytest.mark.parametrize("agent", ["openai-math", "http-math"])
def test_openai_agent_file_trains(tmp_path: Path, agent: str) -> None:
    model = build_tiny_model([f"{a}+{b}= {a + b}" for a in range(10, 60) for b in range(10, 60)], tmp_path / "model")
    (tmp_path / "my_agents.py").write_text(AGENT_FILE)
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    args = ["run", "--env", "math", f"agent={agent}", f"imports=[{tmp_path / 'my_agents.py'}]", f"actor.path={model}",
            f"output_dir={tmp_path / 'runs'}", "experiment_name=oai", "rollout.batch_size=2", "rollout.group_size=4",
            "sampling.max_new_tokens=6", "eval.n=4", "eval.every=0", "logging.progress=false",
            f"trainer.total_steps={STEPS}", "logging.plots=false"]
    proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "oai" / "trial"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["version"] for r in train] == list(range(1, STEPS + 1))
    for r in train:
        assert r["rollout/accepted"] >= 8
        assert not any(k.startswith("rollout/failed/") and v for k, v in r.items()), r
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all("+" in s["prompt"] for s in samples)
