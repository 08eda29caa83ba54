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


def test_the_network_is_cut_even_to_the_hosts_loopback() -> None:
    """A real TCP server on the host's 127.0.0.1: an unsandboxed child reaches it, a sandboxed one
    cannot (its own network namespace), and the server saw exactly the one connection."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[str] = []

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                data = conn.recv(64).decode()
                if data == "stop":
                    return
                accepted.append(data)
                conn.sendall(b"pong")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    code = (
        "import errno, socket, sys\n"
        "s = socket.socket()\n"
        "s.settimeout(10)\n"
        "try:\n"
        f"    s.connect(('127.0.0.1', {port}))\n"
        "except OSError as e:\n"
        "    print('refused', errno.errorcode.get(e.errno, e.errno))\n"
        "    sys.exit(1)\n"
        "s.sendall(sys.argv[0].encode() and b'ping')\n"
        "print('reply', s.recv(4).decode())\n"
    )
    try:
        open_child = run_python(code, timeout_s=20, isolate=False)
        sandboxed = run_python(code, timeout_s=20)
    finally:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stop:
            stop.sendall(b"stop")
        thread.join(10)
        server.close()
    assert open_child.ok and open_child.stdout.split() == ["reply", "pong"], open_child.stderr
    _assert_isolated(sandboxed)
    assert sandboxed.exit_code == 1 and sandboxed.stdout.split()[0] == "refused", sandboxed.stdout + sandboxed.stderr
    assert sandboxed.stdout.split()[1] in ("ENETUNREACH", "ECONNREFUSED"), sandboxed.stdout
    assert accepted == ["ping"]  # the unsandboxed child's connection only


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
        "import os, sys, time\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', {marker!r}])\n"
        "deadline = time.monotonic() + 20\n"
        "while time.monotonic() < deadline:  # until the escaped process runs\n"
        "    try:\n"
        f"        if {marker!r}.encode() in open(f'/proc/{{child}}/cmdline', 'rb').read():\n"
        "            print('escaped', flush=True)\n"
        "            break\n"
        "    except OSError:\n"
        "        pass\n"
        "    time.sleep(0.01)\n"
    )
    r = run_python(code, timeout_s=30)
    _assert_isolated(r)
    assert r.stdout.split() == ["escaped"], r.stdout + r.stderr  # it was running when the sandbox ended
    deadline = time.monotonic() + 10  # the sandbox's pid namespace is torn down as it ends
    while (survivors := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert survivors == []


def _processes_with(marker: str) -> list[str]:
    found = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(path)
        except OSError:
            pass
    return found


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
    """A second sandbox runs while a fork bomb is at its process limit. The bomb marks reaching the
    limit with a file in its own work dir (the host sees it) and stops once the host writes ``done``."""
    import threading

    marker = f"at-limit-{os.getpid()}-{time.monotonic_ns()}"
    bomb_code = (
        "import os, time\n"
        "while not os.path.exists('done'):\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        f"        open({marker!r}, 'w').close()\n"
        "        time.sleep(0.01)\n"
    )
    results = {}

    def bomb() -> None:
        results["bomb"] = run_python(bomb_code, timeout_s=120, max_procs=16)

    thread = threading.Thread(target=bomb)
    thread.start()
    pattern = os.path.join(tempfile.gettempdir(), "areal-sandbox-*", marker)
    deadline = time.monotonic() + 60
    while not (at_limit := glob.glob(pattern)) and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert at_limit, "the bomb never reached its process limit"
        r = run_python("import subprocess\nprint(subprocess.run(['/bin/echo', 'fine'], capture_output=True).stdout)",
                       max_procs=16)
        still_at_limit = bool(glob.glob(pattern)) and thread.is_alive()
    finally:
        for path in at_limit:
            open(os.path.join(os.path.dirname(path), "done"), "w").close()
        thread.join()
    assert r.ok and "fine" in r.stdout, r.stderr
    assert still_at_limit  # the bomb was still running, at its limit, all along
    assert results["bomb"].exit_code is not None and not results["bomb"].timed_out  # it stopped on "done"


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


def test_the_code_keeps_no_capability_and_cannot_gain_one() -> None:
    """The code runs in the interpreter that set the sandbox up (no second start-up), so nothing
    but the sandbox's own capset clears what the namespaces granted."""
    r = run_python("print(open('/proc/self/status').read())")
    _assert_isolated(r)
    status = dict(line.split(":\t", 1) for line in r.stdout.splitlines() if ":\t" in line)
    assert {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapAmb", "NoNewPrivs")} == {
        "CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapAmb": "0" * 16, "NoNewPrivs": "1"}


def test_the_code_runs_as_a_main_script_would() -> None:
    """``__name__``, ``sys.argv``, exit codes and an uncaught exception's report as ``python main.py``
    gives them; output written before the end reaches the result."""
    r = run_python("import sys\nprint(__name__, sys.argv, __file__)\nsys.stdout.write('unflushed')\nsys.exit(3)")
    assert (r.exit_code, r.stdout) == (3, "__main__ ['main.py'] main.py\nunflushed")
    r = run_python("print('before')\n\ndef f():\n    return 1 / 0\n\nf()\n")
    assert r.exit_code == 1 and r.stdout == "before\n"
    assert r.stderr.splitlines()[0] == "Traceback (most recent call last):"
    assert 'File "main.py", line 6, in <module>' in r.stderr and 'File "main.py", line 4, in f' in r.stderr
    assert "<string>" not in r.stderr and r.stderr.strip().endswith("ZeroDivisionError: division by zero")
    r = run_python("prin(3)")
    assert r.stderr.strip().splitlines()[-1] == "NameError: name 'prin' is not defined. Did you mean: 'print'?"
    assert run_python("raise KeyboardInterrupt").exit_code == 130


def test_installed_packages_only_when_asked() -> None:
    """The standard library always; site-packages (here: httpx, a dependency) with ``site_packages``."""
    code = "import json\ntry:\n    import httpx\n    print('httpx')\nexcept ImportError:\n    print('stdlib only')"
    assert run_python(code).stdout.strip() == "stdlib only"
    assert run_python(code, site_packages=True).stdout.strip() == "httpx"
