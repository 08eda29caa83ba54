"""A Hub id as actor.path: checked with one request before the run starts; where it cannot be
loaded (not cached, Hub out of reach or refusing), one line naming actor.path."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading


def test_an_unreachable_hub_id_is_one_line_naming_actor_path(tmp_path):
    """A Hub id that is not in the cache, with no Hub to ask (no network here, or an endpoint
    nothing listens on, and an empty cache): one line before any model loads, no retry warnings."""
    with socket.socket() as sock:  # a port nothing listens on: connections are refused at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{port}"}
    env.pop("HF_HUB_OFFLINE", None)
    for extra, says in (({}, "cannot reach the Hub"), ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set")):
        proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", "run", "--env", "math",
                               "actor.path=Qwen/Qwen2.5-0.5B-Instruct", f"output_dir={tmp_path / 'runs'}"],
                              capture_output=True, text=True, timeout=120, env={**env, **extra}, cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("error: actor.path: Hub id Qwen/Qwen2.5-0.5B-Instruct") and says in lines[0], lines
        assert "--local-dir" in lines[0] and "HF_HUB_OFFLINE" in lines[0], lines
        assert not (tmp_path / "runs").exists()  # stopped before the run started


def test_a_cached_hub_id_passes_the_check(tmp_path):
    """A Hub id whose config.json is in the Hugging Face cache loads without asking the Hub."""
    snapshot = tmp_path / "hf" / "hub" / "models--acme--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hf" / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hf" / "hub" / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    code = "from areal_agents.cli import check_model_dir; check_model_dir('acme/tiny', 'actor.path'); print('ok')"
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


class _HubStandIn(http.server.BaseHTTPRequestHandler):
    """Answers the one request the check makes as the Hub would: acme/tiny exists, nothing else.
    A stand-in for the Hub, which this test must not depend on reaching."""

    def do_HEAD(self) -> None:
        found = self.path.startswith("/acme/tiny/resolve/main/config.json")
        self.send_response(200 if found else 404)
        self.send_header("ETag", '"0"') if found else self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("X-Repo-Commit", "0" * 40)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_hub_id_on_a_reachable_hub_passes_and_a_missing_one_is_one_line(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HubStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    code = ("from areal_agents.cli import check_model_dir; check_model_dir('acme/tiny', 'actor.path'); print('ok')\n"
            "try: check_model_dir('acme/none', 'actor.path')\nexcept ValueError as exc: print(exc)")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"}
    env.pop("HF_HUB_OFFLINE", None)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stderr
    ok, refused = proc.stdout.strip().splitlines()
    assert ok == "ok" and refused.startswith("actor.path: the Hub") and "refused Hub id acme/none" in refused, refused
