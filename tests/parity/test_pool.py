"""`parity.exec.pool`: each ended child's exit code and its CPU seconds (`cpu_seconds`), what `check --jobs` prints
per job ("done in 23.8 s, 21.0 s of CPU"): a job whose CPU time is near its wall time waits on nothing but
the cores."""

from __future__ import annotations

import subprocess
import sys

from parity.exec import pool

BURN = "import time, sys\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\nsys.exit(3)"
SLEEP = "import time; time.sleep(0.4)"


def test_the_pool_keeps_each_childs_exit_code_and_cpu_seconds():
    procs, ended = {}, {}

    def start(task: str) -> subprocess.Popen:
        procs[task] = subprocess.Popen([sys.executable, "-c", BURN if task == "burn" else SLEEP], **pool.child_kwargs())
        return procs[task]

    def done(task: str, code: int, seconds: float) -> None:
        ended[task] = (code, seconds, pool.cpu_seconds(procs[task]))

    assert pool.run_pool(["burn", "sleep"], start, 2, done, poll=0.02) is False
    code, seconds, cpu = ended["burn"]
    # Its wall time starts when `start` returns: on a loaded machine the parent may wait for a core while the child
    # already burns (measured: 0.47 s of CPU in 0.42 s of wall, three pytest workers on two cores).
    assert code == 3 and cpu is not None and 0.35 <= cpu <= seconds + 0.2
    code, seconds, cpu = ended["sleep"]
    assert code == 0 and cpu is not None and cpu < 0.3 and seconds >= 0.4


def test_a_child_reaped_elsewhere_has_no_cpu_seconds():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert pool.cpu_seconds(proc) is None


def test_the_cpu_line_gives_the_sum_the_share_and_the_floor():
    from parity.exec.jobs import cpu_line

    line = cpu_line([18.0, 34.7, 30.0], 35.7, 16)
    assert line == "3 process(es) used 82.7 s of CPU in 35.7 s: 14% of 16 cores; 5.2 s at best on these cores"
    assert cpu_line([], 10.0, 16) == "" and cpu_line([1.0], 0.0, 16) == ""
    with_prefork = cpu_line([18.0, 34.7], 35.7, 16, prefork=4.3)  # the prefork's imports count too
    assert with_prefork.startswith("2 process(es) and their prefork used 57.0 s of CPU in 35.7 s"), with_prefork


def test_a_jobs_run_prints_each_childs_cpu_seconds_and_their_sum(tmp_path, capsys):
    from parity.front import cli

    code = cli.main(["check", "--lowering", "sdpa", "--lowering", "decode_rows", "--max-examples", "3", "--no-isolate",
                     "--device", "cpu", "--jobs", "2", "--report", str(tmp_path)])
    out = capsys.readouterr()
    said = out.out + out.err
    assert code == 0, said
    import re
    assert len(re.findall(r"\[jobs\] \S+: done in [\d.]+ s, [\d.]+ s of CPU \(exit 0", said)) == 2, said
    assert re.search(r"\[jobs\] 2 process\(es\) and their prefork used [\d.]+ s of CPU in [\d.]+ s: \d+% of \d+ cores; "
                     r"[\d.]+ s at best", said)


def test_an_isolated_jobs_run_counts_its_workers_cpu(tmp_path, capsys):
    """Isolated workers are a fork server's children, not the check child's: the child writes their CPU
    seconds next to its part and the parent adds them (else an isolated run looked idle: 7 s of CPU in a
    60 s job, H200 run 63)."""
    from parity.front import cli

    code = cli.main(["check", "--lowering", "sdpa", "--lowering", "decode_rows", "--max-examples", "3",
                     "--device", "cpu", "--jobs", "2", "--report", str(tmp_path)])
    out = capsys.readouterr()
    said = out.out + out.err
    assert code == 0, said
    import re
    found = re.findall(r"done in [\d.]+ s, ([\d.]+) s of CPU \(([\d.]+) s in isolated workers\)", said)
    assert len(found) == 2 and all(float(total) >= float(workers) > 0 for total, workers in found), said


def test_an_isolated_check_launches_its_fork_server_before_the_warm_up(tmp_path):
    """The isolated workers' fork server imports torch and the framework (8 s on the H200's image without a
    bytecode cache, session 20): launched when a lowering's check begins, those imports overlap the planning
    and the JIT warm-up instead of following them (it was launched by the first `available()`, after both).
    Tried: without `start_fork_server` in `CheckSession.check` the server is not running at the warm-up."""
    import subprocess
    import sys
    from pathlib import Path

    code = f"""
import multiprocessing.forkserver as fs
from parity.front import cli
from parity.exec import warmup
seen = []
real = warmup.warm_up_lowering
def warm_up(*args, **kw):
    server = getattr(fs, "_forkserver", None)
    seen.append(getattr(server, "_forkserver_pid", None) is not None)
    return real(*args, **kw)
warmup.warm_up_lowering = warm_up
code = cli.main(["check", "--device", "cpu", "--lowering", "sdpa", "--max-examples", "2", "--warm-up",
                 "--no-hardening", "--quiet", "--report", {str(tmp_path / "r")!r}])
print("RESULT", code, seen)
"""
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert "RESULT 0 [True]" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]


def test_a_zombie_is_not_alive():
    """`process_alive`: a child that exited and is not reaped yet (a zombie) is dead; the memory ledger and the
    shards' shared drawer count on it (a signal 0 alone takes a zombie for alive)."""
    import os
    import time

    from parity.exec.pool import process_alive

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not process_alive(pid)
        os.kill(pid, 0)  # still there for a signal: a zombie
    finally:
        os.waitpid(pid, 0)
    assert process_alive(os.getpid())
