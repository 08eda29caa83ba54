# my_envs/reverse.py
import itertools
import random
import zlib

from areal_agents import DatasetMixin, Env, ReferenceMixin, RewardMixin


def reverse_reward(completion: str, answer: str = "", **row) -> float:
    reply = completion.strip()  # 1.0 when exact, else the share of characters in place
    return sum(a == b for a, b in zip(reply, answer, strict=False)) / max(len(reply), len(answer), 1)


def reverse_dataset(split: str = "train", *, size: int | None = None, seed: int = 0) -> list[dict]:
    # every 4-digit string; a fixed hash sends a fifth of them to test, so the splits never share one
    words = ["".join(w) for w in itertools.product("0123456789", repeat=4)]
    words = [w for w in words if (zlib.crc32(w.encode()) % 5 == 0) == (split == "test")]
    random.Random(f"{split}:{seed}").shuffle(words)
    picked = itertools.islice(itertools.cycle(words), size or len(words))
    return [{"prompt": f"reverse {w}", "answer": w[::-1]} for w in picked]


class ReverseEnv(DatasetMixin, RewardMixin, ReferenceMixin, Env):
    default_dataset = "reverse"  # DatasetMixin: rows of a registered dataset

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.row = self.resolve_row(options)  # no row given: one drawn from default_dataset
        return self.row["prompt"], {}

    def step(self, action):
        reward, info = self.compute_reward("reverse", action, self.row)
        return "", reward, True, False, {**info, "success": reward == 1.0}

    def reference_completion(self, row):
        return row["answer"]
