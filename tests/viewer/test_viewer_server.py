"""The viewer's server over real run directories, through real HTTP: the episode table's filters and
paging, one episode and one group, the metrics read by offset, and what it refuses (paths outside a
run, bodies, bad numbers, a missing run dir)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from viewer_support import ROOT, append_metrics, make_run, metric_row, start_view, stop

from areal_agents.viewer.server import bind_warning


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    base = tmp_path_factory.mktemp("runs")
    run = make_run(base / "a" / "trial")
    make_run(base / "b" / "trial", lr=3e-5, run=1, hostile=False)
    (base / "secret.txt").write_text("not yours")
    (run / "link-out").symlink_to(base / "secret.txt")
    (run / "plots").mkdir()
    (run / "plots" / "inside.txt").write_text("yours")
    proc, url = start_view([run, base / "b" / "trial"])
    try:
        yield url, run
    finally:
        stop(proc)


def get(url: str, path: str, **params: object) -> httpx.Response:
    return httpx.get(url + path, params={k: str(v) for k, v in params.items()}, timeout=10)


def test_two_runs_get_distinct_names_and_their_configs(served: tuple[str, Path]) -> None:
    runs = get(served[0], "/api/runs").json()
    assert [r["name"] for r in runs] == ["trial", "b-trial"]
    assert runs[0]["config"]["actor.lr"] != runs[1]["config"]["actor.lr"]
    assert runs[0]["config"]["env.name"] == runs[1]["config"]["env.name"] == "guess-number"


@pytest.mark.parametrize(("params", "ids"), [
    ({"status": "failed"}, ["ep-1-1-3", "ep-2-1-3", "ep-3-1-3"]),
    ({"status": "env_error", "step_min": 2}, ["ep-2-1-3", "ep-3-1-3"]),
    ({"step_min": 2, "step_max": 2, "reward_min": 0.5, "group": "g2-0"}, ["ep-2-0-1", "ep-2-0-3"]),
    ({"version": 0, "success": "true"}, ["ep-1-0-1", "ep-1-0-3", "ep-1-1-1"]),
    ({"q": "WINDOW.__PWNED"}, ["hostile"]),  # only in its whole text: the search reads the text column
    ({"q": "broke at turn 2 (3.1"}, ["ep-3-1-3"]),  # the failure's exception line
    ({"turns": 3}, []),
    ({"env": "math"}, []),
])
def test_the_episode_filters(served: tuple[str, Path], params: dict[str, object], ids: list[str]) -> None:
    got = get(served[0], "/api/episodes", run="trial", size=100, **params).json()
    assert [r["episode_id"] for r in got["rows"]] == ids
    assert got["total"] == len(ids)


def test_pages_and_sorting(served: tuple[str, Path]) -> None:
    first = get(served[0], "/api/episodes", run="trial", size=10, page=0).json()
    last = get(served[0], "/api/episodes", run="trial", size=10, page=2).json()
    assert first["total"] == last["total"] == 25 and len(first["rows"]) == 10 and len(last["rows"]) == 5
    assert "input_ids" not in first["rows"][0]  # the table gets the light columns only
    top = get(served[0], "/api/episodes", run="trial", sort="reward", desc=1, size=1).json()["rows"][0]
    assert top["reward"] == 1.0
    assert get(served[0], "/api/episodes", run="trial", size=10**6).json()["size"] == 500
    assert set(first["facets"]["status"]) == {"ok", "env_error"} and first["facets"]["steps"] == [1, 3]


def test_one_episode_and_one_group(served: tuple[str, Path]) -> None:
    ep = get(served[0], "/api/episode", run="trial", id="ep-2-1-3").json()
    assert ep["status"] == "env_error" and ep["messages"][2]["tool_calls"][0]["function"]["name"] == "guess"
    assert len(ep["token_text"]) == len(ep["loss_mask"]) == ep["n_tokens"] and ep["info"]["note"] == "w2.1.3.0"
    group = get(served[0], "/api/group", run="trial", step=2, group="g2-1").json()
    assert [r["group_index"] for r in group] == [0, 1, 2, 3]
    assert get(served[0], "/api/episode", run="trial", id="nope").status_code == 404
    assert get(served[0], "/api/episode", run="nope", id="ep-2-1-3").status_code == 404


def test_metrics_are_read_from_an_offset(served: tuple[str, Path]) -> None:
    url, run = served
    got = get(url, "/api/metrics", run="trial").json()
    assert len(got["rows"]) == 5
    append_metrics(run, [metric_row(4)])
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 5, "rollout/rew')  # a row being written is left for the next read
    more = get(url, "/api/metrics", run="trial", offset=got["offset"]).json()
    assert [r["step"] for r in more["rows"]] == [4]
    assert get(url, "/api/metrics", run="trial", offset=more["offset"]).json()["rows"] == []


@pytest.mark.parametrize("path", ["/files/trial/..%2F..%2Fsecret.txt", "/files/trial/..%2Fb%2Ftrial%2Fconfig.yaml",
                                  "/files/trial/%2Fetc%2Fpasswd", "/files/trial//etc/passwd", "/files/trial/link-out"])
def test_paths_outside_the_run_are_refused(served: tuple[str, Path], path: str) -> None:
    got = httpx.get(served[0] + path, timeout=10)
    assert got.status_code == 403, got.text
    assert "not yours" not in got.text and "root:" not in got.text


def test_files_inside_the_run_and_the_assets_are_served(served: tuple[str, Path]) -> None:
    assert httpx.get(served[0] + "/files/trial/plots/inside.txt", timeout=10).text == "yours"
    page = httpx.get(served[0] + "/", timeout=10)
    assert "script-src 'self'" in page.headers["content-security-policy"] and "/static/viewer.js" in page.text
    assert httpx.get(served[0] + "/static/viewer.css", timeout=10).status_code == 200
    assert httpx.get(served[0] + "/static/..%2Fserver.py", timeout=10).status_code == 404


def test_bodies_bad_numbers_and_other_methods_are_refused(served: tuple[str, Path]) -> None:
    assert httpx.request("GET", served[0] + "/api/runs", content=b"x" * 100_000, timeout=10).status_code == 413
    assert httpx.post(served[0] + "/api/runs", content=b"{}", timeout=10).status_code == 405
    bad = get(served[0], "/api/episodes", run="trial", step_min="two")
    assert bad.status_code == 400 and "step_min" in bad.text


def test_only_a_non_loopback_host_is_warned_about() -> None:
    assert bind_warning("127.0.0.1") is None and bind_warning("::1") is None and bind_warning("localhost") is None
    assert "0.0.0.0" in (bind_warning("0.0.0.0") or "") and bind_warning("example.org") is not None


def test_a_missing_run_dir_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", "view", str(tmp_path / "nope")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"error: UserError: view: {tmp_path / 'nope'} is not a directory "
                                                "(give run directories, e.g. runs/guess-number/trial)"]
