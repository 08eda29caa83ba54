"""An app that knows nothing of the trainer: it asks a model sums through the OpenAI API, scores
the replies itself and posts each score to the gateway of an online run.

    python examples/online_client/client.py --url http://127.0.0.1:8400

The admin key comes from $AREAL_AGENTS_ADMIN_KEY or --admin-key-file. Each prompt is played
--group-size times, as one group (its sessions are compared with one another). It runs until
--minutes pass, --sessions are played, or the gateway goes away (the run ended), and prints what
it saw: how often the model's replies were right, per minute. Needs only `openai` and `httpx`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import time
from pathlib import Path

import httpx
import openai

HERE = Path(__file__).resolve().parent


def score(reply: str, answer: str) -> float:
    """1.0 when the last number in the reply is the answer, else 0.0: this app's own rule."""
    numbers = re.findall(r"-?\d+", reply)
    return 1.0 if numbers and numbers[-1] == answer else 0.0


class Gone(Exception):
    """The gateway stopped answering: the run is over."""


class App:
    def __init__(self, args: argparse.Namespace, admin_key: str) -> None:
        self.args = args
        self.admin = httpx.AsyncClient(base_url=args.url, headers={"Authorization": f"Bearer {admin_key}"},
                                       timeout=args.timeout, limits=httpx.Limits(max_connections=512))
        self.llm = openai.AsyncOpenAI(base_url=f"{args.url}/v1", api_key="set-per-session", max_retries=0,
                                      timeout=args.timeout, http_client=httpx.AsyncClient(
                                          timeout=args.timeout, limits=httpx.Limits(max_connections=512)))
        self.played: list[tuple[float, float]] = []  # (time, score)
        self.started = time.monotonic()
        self.gone = False

    async def session(self, prompt: str, answer: str, group: str) -> None:
        try:
            opened = await self.admin.post("/rl/sessions", json={"group": group, "metadata": {"prompt": prompt}})
            if opened.status_code == 429:  # too many open: try this one later
                await asyncio.sleep(1.0)
                return
            opened.raise_for_status()
            s = opened.json()
            llm = self.llm.with_options(api_key=s["key"])
            reply = await llm.chat.completions.create(model="policy", messages=[{"role": "user", "content": prompt}])
            reward = score(reply.choices[0].message.content or "", answer)
            posted = await self.admin.post(f"/rl/sessions/{s['key']}/reward", json={"reward": reward})
            posted.raise_for_status()
            self.played.append((time.monotonic(), reward))
        except (httpx.TransportError, openai.APIConnectionError) as exc:
            raise Gone() from exc
        except (httpx.HTTPStatusError, openai.APIStatusError) as exc:
            status = exc.response.status_code
            if status == 503:  # the run is ending
                raise Gone() from exc
            print(f"refused ({status}): {exc.response.text[:200]}", file=sys.stderr)

    async def group(self, row: dict[str, str], n: int) -> None:
        name = f"{row['prompt']}#{n}"
        await asyncio.gather(*(self.session(row["prompt"], row["answer"], name) for _ in range(self.args.group_size)))

    def done(self) -> bool:
        a = self.args
        return (self.gone or time.monotonic() - self.started > a.minutes * 60
                or (a.sessions is not None and len(self.played) >= a.sessions))

    async def worker(self, rows: list[dict[str, str]], counter: list[int]) -> None:
        while not self.done():
            counter[0] += 1
            try:
                await self.group(rows[counter[0] % len(rows)], counter[0])
            except Gone:
                self.gone = True

    async def run(self) -> None:
        rows = [json.loads(line) for line in Path(self.args.prompts).read_text().splitlines() if line.strip()]
        random.Random(self.args.seed).shuffle(rows)
        counter = [0]
        reporter = asyncio.ensure_future(self.report())
        try:
            await asyncio.gather(*(self.worker(rows, counter) for _ in range(self.args.concurrency)))
        finally:
            reporter.cancel()
            await self.admin.aclose()
            await self.llm.close()
        self.print_minute(final=True)

    async def report(self) -> None:
        while True:
            await asyncio.sleep(self.args.report_every)
            self.print_minute()

    def print_minute(self, final: bool = False) -> None:
        now = time.monotonic()
        recent = [r for t, r in self.played if now - t <= 60]
        mean = sum(recent) / len(recent) if recent else float("nan")
        head = "done" if final else f"{(now - self.started) / 60:5.1f} min"
        print(f"{head}: {len(self.played)} sessions rewarded, right in the last minute: {mean:.3f} "
              f"({len(recent)} sessions)" + (" - the gateway went away" if self.gone else ""), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8400", help="the gateway (RUN_DIR/gateway.json has it)")
    ap.add_argument("--admin-key-file", help="file holding the admin key (else $AREAL_AGENTS_ADMIN_KEY)")
    ap.add_argument("--prompts", default=str(HERE / "prompts.jsonl"), help="JSONL of {prompt, answer}")
    ap.add_argument("--group-size", type=int, default=8, help="sessions per prompt, as one group")
    ap.add_argument("--concurrency", type=int, default=16, help="groups played at once")
    ap.add_argument("--minutes", type=float, default=10.0, help="stop after this long")
    ap.add_argument("--sessions", type=int, default=None, help="stop after this many rewarded sessions")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take")
    ap.add_argument("--report-every", type=float, default=30.0, help="seconds between progress lines")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    key = (Path(args.admin_key_file).read_text().strip() if args.admin_key_file
           else os.environ.get("AREAL_AGENTS_ADMIN_KEY", "").strip())
    if not key:
        sys.exit("no admin key: set AREAL_AGENTS_ADMIN_KEY or pass --admin-key-file")
    asyncio.run(App(args, key).run())


if __name__ == "__main__":
    main()
