"""The episode record's writer: what a training step saw, written outside the training process (no torch).

The trainer calls :meth:`EpisodeRecorder.record` once per step with the trajectories it trained
(and the advantages its loss used) and the failed episodes the rollout dropped meanwhile. That
call only applies the retention rule and queues the rows; a thread of the recorder hands them
to a writer process (so the step's Python work never holds the training thread's interpreter
lock), which builds the step's table (:mod:`~areal_agents.record.table`) and
writes ``episodes/step-NNNNNN.parquet`` atomically (a temporary name, then a rename), zstd
compressed; every :data:`~areal_agents.record.schema.INDEX_EVERY` steps it writes the index file of
their light columns. A failed write costs one warning line and that step's file, never the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from areal_agents.record.schema import INDEX_EVERY, LIGHT_COLUMNS, SCHEMA, index_file, step_file
from areal_agents.record.table import Recorded, TokenTexts, table_of

__all__ = ["EpisodeRecorder", "writer_main"]

log = logging.getLogger("areal_agents.record")

_STATISTICS = ["episode_id", "step", "group_id", "status"]  # what readers filter on; other statistics cost bytes
_DICTIONARY = ["env", "status", "token_text"]  # few distinct values: dictionary-encoded


class EpisodeRecorder:
    """Writes each training step's episodes to ``run_dir/episodes/`` in a process of its own.

    ``keep``: the groups kept per step (``None``: all; 0 records nothing and starts no process);
    failed episodes are kept up to ``keep`` groups' worth of them. ``env`` names the env in every
    row; ``tokenizer`` decodes the token texts (in the writer process: a fast tokenizer travels as
    its definition, any other must pickle). The writer is a process, not a thread, because the
    step's Python work would hold the interpreter lock the training thread needs between its
    operations; a thread of the recorder only hands it the queued steps. At most ``queue_size``
    steps wait: a step recorded while the queue is full waits for room, so memory stays bounded.
    :meth:`close` writes what is queued and stops the process (idempotent). The process is
    ``python -c`` (it never imports the caller's script), in a session of its own (a Ctrl-C
    reaches the trainer, which closes the recorder), and ends by itself when the trainer's end
    of its socket closes, however the trainer ended.
    """

    def __init__(self, run_dir: str | Path, *, keep: int | None = None, env: str = "", tokenizer: Any = None,
                 queue_size: int = 4) -> None:
        if keep is not None and keep < 0:
            raise ValueError(f"keep must be >= 0 or None for all (got {keep})")
        self.run_dir, self.keep, self.env = Path(run_dir), keep, env
        self.failed_writes = 0
        self._written: list[int] = []
        self._queue: queue.Queue[tuple[int, int, list[Recorded]] | None] = queue.Queue(maxsize=max(1, queue_size))
        self._process: _WriterProcess | None = None
        self._unusable: str | None = None  # why no writer process can be set up, once one could not
        self._thread: threading.Thread | None = None
        if keep != 0:
            spec = _portable(tokenizer)
            self._thread = threading.Thread(target=self._pump, args=(spec,), name="episode-recorder", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self._thread is not None

    @property
    def written(self) -> list[int]:
        """The steps whose file is on disk."""
        return list(self._written)

    def kept(self, group_ids: Sequence[str]) -> list[int]:
        """The retention rule: the indices of the rows of the first ``keep`` groups among rows of
        ``group_ids`` (all of them when ``keep`` is None), so a caller builds only those."""
        if self.keep is None:
            return list(range(len(group_ids)))
        groups: set[str] = set()
        out = []
        for i, gid in enumerate(group_ids):
            if gid not in groups:
                if len(groups) >= self.keep:
                    continue
                groups.add(gid)
            out.append(i)
        return out

    def record(self, step: int, trained: Sequence[Recorded], failed: Sequence[Recorded] = (), *,
               policy_version: int = 0) -> None:
        """Queue the record of training step ``step``: the ``trained`` trajectories (the first
        ``keep`` groups of them: a caller may pass only those, see :meth:`kept`) and the ``failed``
        ones dropped meanwhile; ``policy_version`` is the weight version the step trained (a row's
        staleness is it minus its oldest token's)."""
        if self._thread is None:
            return
        rows = [trained[i] for i in self.kept([r.traj.group_id for r in trained])]
        if self.keep is None:
            rows += failed
        else:  # as many failed episodes as ``keep`` groups hold
            per_group = len(trained) // max(1, len({r.traj.group_id for r in trained})) or 1
            rows += failed[: self.keep * per_group]
        self._queue.put((step, policy_version, rows))

    def flush(self) -> None:
        """Wait until every step recorded so far is written (or has failed)."""
        if self._thread is not None:
            self._queue.join()

    def close(self, timeout: float = 120.0) -> None:
        """Write what is queued, then stop the writer process (at most ``timeout`` seconds)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(None)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("episode record: the writer did not finish within %s s; the last steps may be missing",
                        timeout)
            if self._process is not None:
                self._process.kill()

    def __enter__(self) -> EpisodeRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _failed(self, step: int, why: str) -> None:
        self.failed_writes += 1
        if self.failed_writes == 1:
            log.warning("episode record: step %d not written (%s); training goes on, later failures are not "
                        "reported", step, why)

    def _pump(self, spec: Any) -> None:
        """The recorder's thread: starts the writer process, hands it each queued step in turn
        and notes its answer; a writer that died is started again for the next step."""
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    break
                self._hand_over(item, spec)
            finally:
                self._queue.task_done()
        if self._process is not None:
            self._process.stop()

    def _hand_over(self, item: tuple[int, int, list[Recorded]], spec: Any) -> None:
        step = item[0]
        if self._unusable is not None:
            self._failed(step, self._unusable)
            return
        try:
            if self._process is None:
                self._process = _WriterProcess(str(self.run_dir), self.env, spec)
            self._process.conn.send(item)
            answer = self._process.conn.recv()
        except _WriterUnusable as exc:
            self._unusable = f"the writer process could not start: {exc}"
            self._failed(step, self._unusable)
        except (OSError, EOFError) as exc:  # the writer is gone (killed, or never started)
            if self._process is not None:
                self._process.kill()
                self._process = None
            self._failed(step, f"the writer process ended: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - rows that do not pickle: that step only
            self._failed(step, f"{type(exc).__name__}: {exc}")
        else:
            if answer == step:
                self._written.append(step)
            else:
                self._failed(step, str(answer))


# ---------------------------------------------------------------------- the writer process
def _portable(tokenizer: Any) -> Any:
    """What the writer process gets of ``tokenizer``: a fast tokenizer's definition (JSON, no
    transformers import there) when its decoding is the backend's own, else the object itself,
    which must pickle."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return ("tokenizers", backend.to_str())
    if type(tokenizer).__module__ == "__main__":
        raise TypeError(f"the episode record decodes token texts in a writer process, which does not run your "
                        f"script: define {type(tokenizer).__name__} in a module")
    try:
        pickle.dumps(tokenizer)
    except Exception as exc:  # noqa: BLE001 - any pickling failure reads the same to the user
        raise TypeError(f"the episode record decodes token texts in a writer process, so its tokenizer must "
                        f"pickle; {type(tokenizer).__name__} does not ({type(exc).__name__}: {exc})") from None
    return tokenizer


class _StepWriter:
    """The writer process's state: the token texts decoded so far and the light columns of the
    steps written since the last index file."""

    def __init__(self, run_dir: str, env: str, tokenizer: Any) -> None:
        if isinstance(tokenizer, tuple) and tokenizer[:1] == ("tokenizers",):
            import tokenizers

            tokenizer = tokenizers.Tokenizer.from_str(tokenizer[1])
        self.run_dir, self.env, self.decoder = Path(run_dir), env, TokenTexts(tokenizer)
        self.light: dict[int, pa.Table] = {}

    def write(self, step: int, policy_version: int, rows: list[Recorded]) -> int:
        table = table_of(rows, step, policy_version, self.env, self.decoder)
        _write_atomically(table, step_file(self.run_dir, step))
        self.light[step] = table.select(list(LIGHT_COLUMNS))
        if step % INDEX_EVERY == 0:
            self._write_index(step)
        return step

    def _write_index(self, last: int) -> None:
        """The light columns of steps ``last - INDEX_EVERY + 1 .. last`` in one file: those written
        by this process from memory, the others (a resumed run's) from their step files."""
        parts = []
        for step in range(last - INDEX_EVERY + 1, last + 1):
            part = self.light.pop(step, None)
            path = step_file(self.run_dir, step)
            if part is None and path.is_file():
                part = pq.read_table(path, columns=list(LIGHT_COLUMNS), schema=SCHEMA)
            if part is not None:
                parts.append(part)
        self.light = {s: t for s, t in self.light.items() if s > last}
        if parts:
            _write_atomically(pa.concat_tables(parts), index_file(self.run_dir, last))


_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from areal_agents.record.writer import writer_main; writer_main(int(sys.argv[2]))")


class _WriterUnusable(Exception):
    """The writer process could not set itself up (the reason is the message): no step will be written."""


class _WriterProcess:
    """The writer process and the recorder's end of its socket."""

    def __init__(self, run_dir: str, env: str, tokenizer: Any) -> None:
        ours, theirs = socket.socketpair()
        self.conn = Connection(ours.detach())
        with theirs:  # the writer's end, closed here once the writer holds it
            fd = theirs.fileno()
            self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(sys.path), str(fd)], pass_fds=(fd,),
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.conn.send((run_dir, env, tokenizer))
        ready = self.conn.recv()
        if ready is not True:
            self.kill()
            raise _WriterUnusable(str(ready))

    def stop(self, timeout: float = 30.0) -> None:
        """Close the socket (the writer ends at its end of file) and reap the process."""
        self.conn.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.conn.close()


def writer_main(fd: int) -> None:
    """The writer process: its settings from the first message, then one step a message, each
    answered with the step (written) or the reason it was not, until the recorder's end closes.
    It runs one thread of work at the lowest priority, taking only the CPU the trainer leaves."""
    conn = Connection(fd)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    with contextlib.suppress(OSError):
        os.nice(19)
    try:
        try:
            writer = _StepWriter(*conn.recv())
        except Exception as exc:  # noqa: BLE001 - told to the recorder, which stops recording
            conn.send(f"{type(exc).__name__}: {exc}")
            return
        conn.send(True)
        while True:
            data = conn.recv_bytes()
            try:
                step, policy_version, rows = pickle.loads(data)
                conn.send(writer.write(step, policy_version, rows))
            except Exception as exc:  # noqa: BLE001 - a full or broken disk costs that step, not the run
                conn.send(f"{type(exc).__name__}: {exc}")
    except (EOFError, OSError):  # the recorder closed its end, or its process is gone
        return


def _write_atomically(table: pa.Table, path: Path) -> None:
    """``table`` to ``path`` under a temporary name, then renamed: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        stats = [c for c in _STATISTICS if c in table.column_names]
        pq.write_table(table, tmp, compression="zstd", write_statistics=stats,
                       use_dictionary=[c for c in _DICTIONARY if c in table.column_names])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
