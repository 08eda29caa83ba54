# padlock_game/game.py: the rules, shared by every stage
import itertools
import random

DIGITS, LENGTH = "123", 3  # 27 codes
PROMPT = f"Open the lock: {LENGTH} digits, each {DIGITS[0]}-{DIGITS[-1]}."


def padlock_dataset(split: str = "train", *, size: int | None = None, seed: int = 0) -> list[dict]:
    # every code once, or `size` codes drawn at random; both splits draw from every code: the
    # player never sees the code, so what it learns is how to play, not the codes
    codes = ["".join(c) for c in itertools.product(DIGITS, repeat=LENGTH)]
    rng = random.Random(f"padlock:{split}:{seed}")
    picked = codes if size is None else [rng.choice(codes) for _ in range(size)]
    return [{"prompt": PROMPT, "code": code} for code in picked]


def shown(guess: str, code: str) -> str:
    """What the lock shows after a wrong try: the digits in place, _ for the others."""
    return "".join(g if g == c else "_" for g, c in zip(guess, code, strict=True))


def is_code(text: str) -> bool:
    return len(text) == LENGTH and set(text) <= set(DIGITS)
