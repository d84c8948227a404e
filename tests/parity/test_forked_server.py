"""`parity.exec.forked_server`: the isolated workers' fork server forked from a process that has imported torch and the
framework, where that is safe; a fresh interpreter otherwise. Each test runs in a fresh interpreter of its own
(pytest-xdist's workers run threads, and a process with threads must not fork the server)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import os, sys, time, signal
from parity.exec import isolation, forked_server
def server_pid():
    from multiprocessing import forkserver
    return forkserver._forkserver._forkserver_pid
def cmdline(pid):
    return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
"""


def _run(code: str, timeout: float = 120) -> str:
    res = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def test_the_server_is_a_fork_of_this_process_and_its_workers_run_cases():
    """The server runs the command a fresh one would (`multiprocessing.forkserver.main`) in a fork: its command
    line is this process's, not `python -c "from multiprocessing.forkserver import main ..."`. A worker forked
    from it runs a case, and a crash ends the worker, not the run (the isolated executor's whole contract)."""
    out = _run("""
        how = isolation.start_fork_server()
        pid = server_pid()
        print("HOW", how, "FORKED", cmdline(pid) == cmdline(os.getpid()))
        from oracle.case import Case
        from parity.engine.invocation import RunOptions
        ex = isolation.IsolatedExecutor(opts=RunOptions(device="cpu"))
        case = Case(context_lens=(5,), block_size=2, num_q_heads=2, num_kv_heads=1, head_dim=64, page_size=4,
                    pages=((0, 1),), num_pages=3, dtype="bfloat16")
        out = ex.run("sdpa", case)
        print("STATUS", out.status)
        ex.close()
    """)
    assert "HOW forked FORKED True" in out, out
    assert "STATUS pass" in out, out


def test_the_server_leaves_when_its_clients_are_gone_and_runs_none_of_their_exit_handlers(tmp_path):
    """The forked server holds no client's end of the "alive" pipe (every inherited descriptor closed, as `exec`
    would), so it exits once the process that started it has; and it exits by `os._exit`, so an `atexit`
    handler of that process runs once, in that process. Tried: without closing the inherited descriptors the
    server outlived its client; leaving by `sys.exit` ran the handler twice."""
    log = tmp_path / "atexit.log"
    out = _run(f"""
        import atexit
        atexit.register(lambda: open({str(log)!r}, "a").write(f"exit {{os.getpid()}}\\n"))
        print("HOW", isolation.start_fork_server(), "SERVER", server_pid())
    """)
    assert "HOW forked" in out, out
    server = int(out.split("SERVER")[1].split()[0])
    import os
    import time

    deadline = time.monotonic() + 20
    while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:
        try:  # a zombie of an exited parent is reaped by init: gone from /proc soon after
            if Path(f"/proc/{server}/stat").read_text().split()[2] == "Z":
                break
        except OSError:
            break
        time.sleep(0.05)
    alive = Path(f"/proc/{server}").exists() and Path(f"/proc/{server}/stat").read_text().split()[2] != "Z"
    if alive:
        os.kill(server, 9)
    assert not alive, "the forked fork server outlived the process that started it"
    assert log.read_text().count("exit ") == 1, log.read_text()


def test_a_worker_starts_with_a_fresh_interpreters_signal_handlers(tmp_path):
    """A worker's SIGINT raises KeyboardInterrupt (a fresh interpreter's handler) and its SIGTERM is the default,
    whatever handlers the process that forked the server had installed (a `check --jobs` child installs its own:
    parity.exec.interrupt). Tried: without resetting them in the server, the worker ran the parent's handlers."""
    (tmp_path / "handlers_probe.py").write_text(
        "import signal\n"
        "def report(conn, init):\n"
        "    conn.send([signal.getsignal(signal.SIGINT) is signal.default_int_handler,\n"
        "               signal.getsignal(signal.SIGTERM) == signal.SIG_DFL])\n")
    out = _run(f"""
        sys.path.insert(0, {str(tmp_path)!r})
        import handlers_probe
        signal.signal(signal.SIGINT, lambda *a: None)
        signal.signal(signal.SIGTERM, lambda *a: None)
        isolation.start_fork_server()
        proc, conn = isolation.start_process(isolation.worker_context(), handlers_probe.report, {{}}, "probe")
        print("HANDLERS", conn.recv(), forked_server.how)
        proc.join(30)
    """)
    assert "HANDLERS [True, True] forked" in out, out


def test_it_starts_a_fresh_interpreter_where_forking_is_not_safe():
    """A thread running, CUDA initialized (asked through `parity.exec.prefork_server.cuda_initialized`), a lowering in the
    registry that is not a built-in, or `DFLASH_PARITY_FORKED_SERVER=0`: the fresh interpreter, saying why."""
    out = _run("""
        import threading, lowerings
        from lowerings import registry
        stop = threading.Event()
        t = threading.Thread(target=stop.wait, daemon=True); t.start()
        print("THREADS", forked_server.forkable())
        stop.set(); t.join()
        import parity.exec.prefork_server as pf
        real = pf.cuda_initialized
        pf.cuda_initialized = lambda: True
        print("CUDA", forked_server.forkable())
        pf.cuda_initialized = real
        sdpa = lowerings.get("sdpa")
        registry.unregister("sdpa")
        print("REMOVED", forked_server.forkable())
        registry.register(sdpa)
        print("BACK", forked_server.forkable())
        import copy
        registry.register(copy.copy(sdpa), replace=True)
        print("REPLACED", forked_server.forkable())
        registry.register(sdpa, replace=True)
        os.environ["DFLASH_PARITY_FORKED_SERVER"] = "0"
        print("ENV", forked_server.forkable())
        how = isolation.start_fork_server()
        print("HOW", how, "FRESH", cmdline(server_pid()) != cmdline(os.getpid()))
    """)
    assert "THREADS 2 threads run in this process" in out, out
    assert "CUDA this process has initialized CUDA" in out, out
    assert "REMOVED the registry differs from the built-ins here (sdpa)" in out, out
    assert "BACK None" in out, out
    assert "REPLACED the registry differs from the built-ins here (sdpa)" in out, out
    assert "ENV DFLASH_PARITY_FORKED_SERVER=0" in out, out
    assert "HOW fresh: DFLASH_PARITY_FORKED_SERVER=0 FRESH True" in out, out


def test_a_jobs_child_forks_its_server_before_it_imports_a_plugin(tmp_path):
    """A `check --jobs` child starts the server before it loads `--plugin` files (the workers load them: a server
    forked after would hold them twice), so every child's server is a fork; the plugin's lowering is checked."""
    res = subprocess.run([sys.executable, "-m", "parity.front.cli", "check", "--device", "cpu", "--plugin",
                          str(ROOT / "examples" / "plugin_window_off_by_one.py"), "--lowering", "sdpa", "--lowering",
                          "my_windowed_merge", "--max-examples", "5", "--no-hardening", "--jobs", "2",
                          "--report", str(tmp_path / "r")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    said = res.stdout + res.stderr
    assert res.returncode == 1, said  # the plugin's lowering is the window off-by-one mutant: caught
    assert said.count("the isolated workers' fork server: forked from this process") == 2, said
    assert "my_windowed_merge  FAIL" in said, said


def test_a_dead_server_is_replaced_by_another_fork():
    """A server that died (killed) is found dead by `ensure_running` itself, which reaps it and launches another:
    forked again, and a worker runs. Tried: reaping it first in `forked_server.start` left `ensure_running` a pid
    already reaped (ChildProcessError)."""
    out = _run("""
        print("FIRST", isolation.start_fork_server(), isolation.start_fork_server())
        first = server_pid()
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if open(f"/proc/{first}/stat").read().split()[2] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.02)
        how = isolation.start_fork_server()
        print("AGAIN", how, server_pid() != first, cmdline(server_pid()) == cmdline(os.getpid()))
        from oracle.case import Case
        from parity.engine.invocation import RunOptions
        ex = isolation.IsolatedExecutor(opts=RunOptions(device="cpu"))
        case = Case(context_lens=(3,), block_size=1, num_q_heads=1, num_kv_heads=1, head_dim=64, page_size=4,
                    pages=((0,),), num_pages=2, dtype="bfloat16")
        print("STATUS", ex.run("sdpa", case).status)
        ex.close()
    """)
    assert "FIRST forked running" in out, out
    assert "AGAIN forked True True" in out, out
    assert "STATUS pass" in out, out
