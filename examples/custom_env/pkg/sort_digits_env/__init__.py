"""An example areal-agents plug-in: sort a few digits in ascending order.

Registered through entry points (see ``pyproject.toml``): env ``sort-digits``, reward
``sort-digits`` (partial credit per position) and dataset ``sort-digits``.
"""

__all__: list[str] = []
