"""The episode record: what the trainer saw, per trajectory, one Parquet file per step (no torch).

Written during a run by :class:`EpisodeRecorder` (``logging.episodes`` sets how much); read with
:func:`load` (a pyarrow table, ``.to_pandas()`` for notebooks), :func:`summary`, :func:`episode`
and :func:`group`. The columns are :data:`SCHEMA`; ``docs/record.md`` explains each.
"""

from areal_agents.record.reader import episode, group, load, record_files, summary
from areal_agents.record.schema import EPISODES_DIR, INDEX_EVERY, LIGHT_COLUMNS, SCHEMA, TOKEN_COLUMNS, step_file
from areal_agents.record.table import Recorded, build_table
from areal_agents.record.writer import EpisodeRecorder

__all__ = [
    "EPISODES_DIR",
    "INDEX_EVERY",
    "LIGHT_COLUMNS",
    "SCHEMA",
    "TOKEN_COLUMNS",
    "EpisodeRecorder",
    "Recorded",
    "build_table",
    "episode",
    "group",
    "load",
    "record_files",
    "step_file",
    "summary",
]
