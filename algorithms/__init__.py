"""RL algorithms as pure torch functions: advantage estimators, losses and named specs.

``algorithms.advantages``: ``fn(batch, cfg) -> advantages [B, T]``;
``algorithms.losses``: ``fn(logp, batch, cfg, norm, *, entropy, values) -> (loss, metrics)``;
``algorithms.specs``: the named algorithms registered under ``areal_agents.algorithms``.
Nothing is imported here, so ``import algorithms.specs`` stays free of torch.
"""

__all__: list[str] = []
