"""Envs of other libraries as areal-agents envs, each installed with its own extra.

* ``reasoning-gym`` (``pip install 'areal-agents[reasoning-gym]'``): any reasoning-gym task,
  ``env.kwargs.task=chain_sum``; scored by the task's own ``score_answer``.
* ``textarena`` (``[textarena]``): a single-player TextArena game, ``env.kwargs.game=Wordle-v0``.
* ``gem`` (``[gem]``): a GEM env by id, ``env.kwargs.env_id=game:Sudoku-v0-easy``.

The libraries are imported when an env is built, never by this package, so the core and the
built-in envs do not need them (``[ecosystem]`` installs all three).
"""

from __future__ import annotations

__all__: list[str] = []
