"""RolloutProcess: the rollout executor in a spawned child, against a real embedded server.

The child is a real ``multiprocessing`` spawn child talking over a real pipe; episodes run the
test's own registered env on the tiny model served on loopback.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from areal_agents.config import ExperimentConfig
from areal_agents.config.loader import import_user_module
from areal_agents.env import TurnLimitedEnv
from areal_agents.inference.launcher import ServerHandle, launch_servers
from areal_agents.registry import envs, register_dataset, register_env
from areal_agents.rollout.process import RolloutProcess, RolloutProcessDied, registrations, start_child
from areal_agents.types import Trajectory
from trainers.tiny_model import build_tiny_model

ROWS = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(1, 2), (30, 4), (7, 70), (11, 11)]]


@register_dataset("process-test-rows")
def process_test_rows(split: str) -> list[dict[str, Any]]:
    return [dict(r) for r in ROWS]


@register_env("process-test-env")
class PidEnv(TurnLimitedEnv):
    """A one-turn env registered only by this module: it reports the pid it ran in."""

    default_dataset = "process-test-rows"
    required_fields = ("prompt", "answer")

    def __init__(self) -> None:
        super().__init__(max_turns=1)

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        return "", float(action.strip() == row["answer"]), True, {"pid": os.getpid()}


def corpus() -> Iterator[str]:
    for a in range(60):
        yield f"<|im_start|>user\nWhat is {a} + {a % 7}?<|im_end|>\n<|im_start|>assistant\n{a + a % 7}<|im_end|>\n"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(corpus(), tmp_path_factory.mktemp("process-model") / "m", seed=0)


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    with launch_servers(ExperimentConfig(), model, 1, log_dir=tmp_path_factory.mktemp("logs"),
                        env={"OMP_NUM_THREADS": "1"}) as group:
        yield group[0]


def config(**rollout: Any) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.env.name = "process-test-env"
    cfg.sampling.max_new_tokens = 4
    for k, v in {"batch_size": 2, "group_size": 2, "max_concurrent_rollouts": 8, **rollout}.items():
        setattr(cfg.rollout, k, v)
    return cfg


def test_the_child_runs_this_modules_env_and_answers_like_the_executor(server: ServerHandle, model: Path) -> None:
    cfg = config()
    proc = RolloutProcess(cfg, [server.address], str(model), registrations_blob=registrations())
    try:
        assert not proc.running
        assert proc._call("running") is False
        proc.set_version(0)
        proc.start()
        assert proc.running and proc._call("running") is True
        groups = proc.prepare_batch(timeout=60)
        assert len(groups) == 2 and all(len(g) == 2 for g in groups)
        pids = {t.info["pid"] for g in groups for t in g}
        assert pids and os.getpid() not in pids  # the registered env ran in the child
        assert all(t.status == "ok" and t.input_ids and any(t.loss_mask) for g in groups for t in g)
        proc.pause()
        proc.set_version(1)
        proc.resume()
        stats = proc.stats()
        assert stats["rollout/version"] == 1.0 and stats["rollout/accepted"] >= 4
        counts = proc.counts()
        assert counts["submitted"] == counts["accepted"] + counts["failed"] + counts["dropped"] + counts["in_flight"]
        state = proc.state_dict()
        assert state["consumed_groups"] == 2
        with pytest.raises(RuntimeError, match="before start"):  # the child's error, raised here
            proc.load_state_dict(state)
        assert proc.running  # an error leaves the child serving
    finally:
        proc.shutdown()
    assert proc._proc.poll() is not None
    with pytest.raises(RuntimeError, match="shut down"):
        proc.stats()


def test_rollout_only_mode_writes_through_the_child_as_through_the_executor(server: ServerHandle, model: Path,
                                                                            tmp_path: Path) -> None:
    """Both are a ``Rollout``: the calls rollout-only mode makes reach the child's executor."""
    from trainers.rollout_only import write_rollouts

    proc = RolloutProcess(config(), [server.address], str(model), registrations_blob=registrations())
    try:
        assert proc.runs_in == "its own process" and proc.cfg.group_size == 2
        assert proc.bounded_staleness is True
        proc.bounded_staleness = False
        assert proc._call("bounded_staleness") is False  # set on the child's executor
        proc.bounded_staleness = True
        out = write_rollouts(proc, 4, tmp_path / "rollouts.jsonl", progress=False, timeout=60)
        lines = (tmp_path / "rollouts.jsonl").read_text().splitlines()
        assert out["episodes"] == len(lines) == 4 and proc.bounded_staleness is True  # lifted, then restored
        assert all(Trajectory.from_json(line).status == "ok" for line in lines)  # taken by wait() in the child
    finally:
        proc.shutdown()


def test_an_env_from_a_py_file_reaches_the_child(server: ServerHandle, model: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``imports=[my_env.py]``: the file is imported again in the child, before the registrations."""
    from areal_agents.config import loader as config_loader

    monkeypatch.setattr(config_loader, "_USER_FILES", dict(config_loader._USER_FILES))  # forgotten afterwards
    path = tmp_path / "process_file_env.py"
    path.write_text(textwrap.dedent("""
        import os
        from areal_agents import register_env
        from areal_agents.env import TurnLimitedEnv

        @register_env("process-file-env")
        class FileEnv(TurnLimitedEnv):
            default_dataset = "process-test-rows"
            def __init__(self):
                super().__init__(max_turns=1)
            def play_turn(self, action, row):
                return "", 0.0, True, {"pid": os.getpid(), "from_file": True}
    """))
    import_user_module(str(path))
    cfg = config()
    cfg.env.name = "process-file-env"
    proc = RolloutProcess(cfg, [server.address], str(model), registrations_blob=registrations(cfg))
    try:
        proc.start()
        episodes = [t for g in proc.prepare_batch(timeout=60) for t in g]
        assert episodes and all(t.info["from_file"] and t.info["pid"] != os.getpid() for t in episodes)
    finally:
        proc.shutdown()
        envs.remove("process-file-env")


def test_state_moves_to_a_new_child(server: ServerHandle, model: Path) -> None:
    """A checkpoint's rollout state, loaded into a fresh child, queues the unconsumed groups first."""
    cfg = config()
    blob = registrations()
    first = RolloutProcess(cfg, [server.address], str(model), registrations_blob=blob)
    try:
        first.start()
        first.prepare_batch(timeout=60)
        first.pause()
        state = first.state_dict()
    finally:
        first.shutdown()
    second = RolloutProcess(cfg, [server.address], str(model), registrations_blob=blob)
    try:
        second.load_state_dict(state)
        second.start()
        assert len(second.prepare_batch(timeout=60)) == 2
        assert second.state_dict()["consumed_groups"] == state["consumed_groups"] + 2
    finally:
        second.shutdown()


def test_a_build_error_is_raised_in_the_parent(server: ServerHandle, model: Path) -> None:
    cfg = config()
    cfg.env.name = "no-such-env"
    proc = RolloutProcess(cfg, [server.address], str(model), registrations_blob=registrations())
    try:
        with pytest.raises(KeyError, match="unknown env 'no-such-env'"):  # at the first call
            proc.set_version(0)
    finally:
        proc.shutdown()
    assert proc._proc.poll() is not None


def environment_probe_build(cfg: ExperimentConfig, addresses: list[str], model_path: str) -> Any:
    """A build that fails with what the child sees of ``$ROLLOUT_CHILD_PROBE``."""
    raise LookupError(os.environ.get("ROLLOUT_CHILD_PROBE", "unset"))


def test_a_child_started_early_takes_the_environment_as_it_is_when_the_build_is_sent(
        server: ServerHandle, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    child = start_child()  # as a run starts it, before its judge's server exports $AREAL_AGENTS_JUDGE_URL
    monkeypatch.setenv("ROLLOUT_CHILD_PROBE", "set after the child started")
    proc = RolloutProcess(config(), [server.address], str(model), registrations_blob=registrations(),
                          build=environment_probe_build, child=child)
    try:
        with pytest.raises(LookupError, match="set after the child started"):
            proc.set_version(0)
    finally:
        proc.shutdown()
    assert child[0].poll() is not None


def test_a_killed_child_is_reported_in_one_line(server: ServerHandle, model: Path) -> None:
    proc = RolloutProcess(config(), [server.address], str(model), registrations_blob=registrations())
    try:
        os.kill(proc._proc.pid or 0, signal.SIGKILL)
        proc._proc.wait(10)
        with pytest.raises(RolloutProcessDied, match=r"exited \(exit code -9\)"):
            proc.prepare_batch(timeout=5)
    finally:
        proc.shutdown()  # nothing left to stop: returns at once
    assert proc._proc.poll() is not None


def test_signals_to_the_group_leave_the_child_to_the_trainer(server: ServerHandle, model: Path) -> None:
    """SIGINT/SIGTERM (Ctrl-C, a scheduler's preemption) reach the whole process group; the child
    ignores them, so the trainer can still ask it for the rollout state it checkpoints."""
    proc = RolloutProcess(config(), [server.address], str(model), registrations_blob=registrations())
    try:
        proc.start()
        for sig in (signal.SIGINT, signal.SIGTERM):
            os.kill(proc._proc.pid or 0, sig)
        # a round trip to the child: pending signals are delivered before it runs on to answer
        assert "feeder" in proc.state_dict()
        assert proc._proc.poll() is None and "feeder" in proc.state_dict()
    finally:
        proc.shutdown()


def test_the_child_ends_when_its_trainer_is_killed(server: ServerHandle, model: Path, tmp_path: Path) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_rollout_process as t
        from areal_agents.rollout.process import RolloutProcess, registrations
        if __name__ == "__main__":
            proc = RolloutProcess(t.config(), [{server.address!r}], {str(model)!r},
                                  registrations_blob=registrations())
            proc.start()
            print(proc._proc.pid, flush=True)
            time.sleep(600)
    """))
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) as trainer:
        try:
            assert trainer.stdout is not None
            child = int(trainer.stdout.readline())
        finally:
            trainer.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.2)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_registrations_that_cannot_travel_stay_behind() -> None:
    """A lambda cannot be sent to another interpreter: it is left out, unless the run needs it,
    and then the RL loop keeps rollout on a thread of the trainer."""
    envs.add("process-test-lambda", lambda: PidEnv(), where="here")
    try:
        files, entries = pickle.loads(registrations(config()))
        sent = pickle.loads(entries)
        assert "process-test-env" in sent["envs"] and "process-test-lambda" not in sent["envs"]
        cfg = config()
        cfg.env.name = "process-test-lambda"
        cfg.data.name = "process-test-rows"
        with pytest.raises(ValueError, match="env 'process-test-lambda' cannot be sent to the rollout process"):
            registrations(cfg)
    finally:
        envs.remove("process-test-lambda")


def test_what_the_running_script_defines_stays_behind() -> None:
    """The child never imports ``__main__`` again (an unguarded script would start another run)."""
    envs.add("process-test-main", type("MainEnv", (PidEnv,), {"__module__": "__main__"}), where="script")
    try:
        files, entries = pickle.loads(registrations(config()))
        assert "process-test-main" not in pickle.loads(entries)["envs"]
        cfg = config()
        cfg.env.name = "process-test-main"
        with pytest.raises(ValueError, match=r"defined in the script being run \(__main__\)"):
            registrations(cfg)
    finally:
        envs.remove("process-test-main")
