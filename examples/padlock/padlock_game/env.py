# padlock_game/env.py: stage 2, several tries, each answered by the lock
from areal_agents.env import ReferenceMixin, TextSpace, TurnLimitedEnv
from padlock_game.game import DIGITS, PROMPT, is_code, shown


class PadlockEnv(ReferenceMixin, TurnLimitedEnv):
    default_dataset = "padlock"
    required_fields = ("code",)
    action_space = TextSpace(probes=("111", "", "123", "open", "1234"))  # what check_env plays

    def __init__(self, max_turns: int = 4):
        super().__init__(max_turns)

    def play_turn(self, action, row):  # -> (observation, reward, terminated, info)
        guess = action.strip()
        if guess == row["code"]:
            return "", 1.0, True, {"success": True}
        if not is_code(guess):
            return PROMPT, 0.0, False, {}
        return shown(guess, row["code"]), 0.0, False, {}

    # stage 3: an expert's games, for the tiny model's warm start
    def reference_conversation(self, row):
        conv, guess = [{"role": "user", "content": row["prompt"]}], DIGITS[0] * len(row["code"])
        for digit in DIGITS[1:]:
            conv.append({"role": "assistant", "content": guess})
            if guess == row["code"]:
                return conv
            seen = shown(guess, row["code"])
            conv.append({"role": "user", "content": seen})
            guess = seen.replace("_", digit)  # keep the digits in place, try the next digit elsewhere
        return conv + [{"role": "assistant", "content": guess}]
