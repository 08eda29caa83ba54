# padlock_game/once.py: stage 1, one try
from areal_agents import DatasetMixin, Env


class PadlockOnceEnv(DatasetMixin, Env):
    default_dataset = "padlock"  # rows {"prompt", "code"} of the dataset registered as padlock

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.row = self.resolve_row(options, ("code",))  # no row given: one drawn from the dataset
        return self.row["prompt"], {}

    def step(self, action):
        opened = action.strip() == self.row["code"]
        return "", float(opened), True, False, {"success": opened}
