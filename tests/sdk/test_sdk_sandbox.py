"""The Python sandbox against hostile code (real child processes)."""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import time

from areal_agents.tools.sandbox import VISIBLE_ROOTS, run_python


def _assert_isolated(result) -> None:
    assert result.isolation["namespaces"], f"namespaces unavailable here: {result.isolation_error}"


def test_plain_code_runs_in_a_fresh_temp_dir_that_is_removed() -> None:
    r = run_python("import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\nopen('f.txt','w').write('x')")
    assert r.ok and r.exit_code == 0 and not r.timed_out
    cwd, listing = r.stdout.splitlines()
    assert listing == "['main.py']" and "areal-sandbox-" in cwd
    assert not os.path.exists(cwd)


def test_infinite_loop_is_killed_at_the_wall_clock_limit() -> None:
    r = run_python("while True:\n    pass", timeout_s=1.5)
    assert r.timed_out and r.exit_code == 137


def test_fork_bomb_hits_the_process_limit() -> None:
    r = run_python("import os\nwhile True:\n    os.fork()", timeout_s=5, max_procs=16)
    assert not r.timed_out and r.exit_code != 0
    assert "Resource temporarily unavailable" in r.stderr


def test_ten_gigabyte_allocation_is_a_memory_error() -> None:
    r = run_python("x = bytearray(10 * 1024**3)", memory_mb=256)
    assert r.exit_code == 1 and "MemoryError" in r.stderr


def test_network_connect_fails() -> None:
    r = run_python(
        "import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))", timeout_s=5
    )
    _assert_isolated(r)
    assert r.exit_code == 1 and "Network is unreachable" in r.stderr


def test_host_files_and_processes_are_hidden() -> None:
    code = (
        "import os\n"
        "print(os.path.exists('/etc/passwd'), os.path.exists('/root/.ssh'), os.listdir('/home'))\n"
        "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(os.getuid())\n"
    )
    r = run_python(code)
    _assert_isolated(r)
    files, pids, uid = r.stdout.splitlines()
    assert files == "False False []"
    assert r.isolation["proc"] and pids == "[1]"  # its own PID namespace: no host process is visible
    assert uid != "0"
    r = run_python("print(open('/etc/passwd').read())")
    assert r.exit_code == 1 and "FileNotFoundError" in r.stderr
    r = run_python(f"print(len(open({os.path.abspath(__file__)!r}).read()))")
    assert r.exit_code == 1 and "FileNotFoundError" in r.stderr  # the project tree is hidden too


def test_escaped_background_process_dies_with_the_sandbox() -> None:
    marker = f"areal-sandbox-escape-{os.getpid()}-{time.monotonic_ns()}"
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv('/bin/sleep', ['/bin/sleep', '30', {marker!r}])\n"
        "time.sleep(0.3)\n"
    )
    r = run_python(code, timeout_s=5)
    _assert_isolated(r)
    time.sleep(0.3)
    survivors = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as fh:
                if marker.encode() in fh.read():
                    survivors.append(path)
        except OSError:
            pass
    assert survivors == []


def test_output_and_file_size_limits() -> None:
    r = run_python("print('y' * 100_000)", max_output_chars=1000)
    assert r.truncated and len(r.stdout) == 1000
    r = run_python("open('big', 'wb').write(b'0' * (3 * 1024 * 1024))", max_file_mb=1)
    assert r.exit_code != 0  # SIGXFSZ or OSError: File too large


def test_without_namespaces_the_result_says_so() -> None:
    r = run_python("import os\nprint(os.path.exists('/etc/passwd'))", isolate=False)
    assert r.ok and r.isolation["namespaces"] is False and r.isolation["proc"] is False
    assert r.stdout.strip() == "True"  # nothing hidden, and the result reports it


def test_a_fork_bomb_does_not_starve_a_concurrent_sandbox() -> None:
    import threading

    results = {}

    def bomb() -> None:
        results["bomb"] = run_python("import os, time\nwhile True:\n    try:\n        os.fork()\n"
                                     "    except OSError:\n        time.sleep(0.01)", timeout_s=4, max_procs=16)

    thread = threading.Thread(target=bomb)
    thread.start()
    time.sleep(1.0)  # the bomb is at its process limit now
    r = run_python("import subprocess\nprint(subprocess.run(['/bin/echo', 'fine'], capture_output=True).stdout)",
                   max_procs=16)
    thread.join()
    assert r.ok and "fine" in r.stdout, r.stderr
    assert results["bomb"].timed_out


def test_every_top_level_directory_but_the_system_ones_is_empty_inside() -> None:
    """Wherever a host keeps its files (a CI checkout in /check, /data, /home...), it is hidden:
    a non-system top-level directory shows only the path down to the Python installation and
    the sandbox's own temp dir."""
    code = (
        "import json, os\n"
        "for name in sorted(os.listdir('/')):\n"
        "    p = '/' + name\n"
        "    if os.path.isdir(p) and not os.path.islink(p):\n"
        "        print(p, json.dumps(sorted(os.listdir(p))))\n"
    )
    r = run_python(code)
    _assert_isolated(r)
    kept = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)))]
    kept += ["/etc/ld.so.cache", os.path.realpath(tempfile.gettempdir()) + "/areal-sandbox-"]
    seen = {}
    for line in r.stdout.splitlines():
        root, listing = line.split(" ", 1)
        seen[root] = json.loads(listing)
    hidden = [root for root in seen if root not in VISIBLE_ROOTS]
    assert hidden, seen
    for root in hidden:
        allowed = {k[len(root) + 1:].split("/")[0] for k in kept if k.startswith(root + "/")}
        extra = [n for n in seen[root] if n not in allowed and not any(n.startswith(a) for a in allowed if a.endswith("-"))]
        assert not extra, f"{root} shows {extra} inside the sandbox"
