"""Issue 49, item 3: a run ends when its work ends, whatever plugin code leaves behind.

Each test runs `check` as a CI step would, a process of its own with its output to pipes read to the end
(`communicate`, with a deadline), and then finds nothing of it still running. Before:

- a non-daemon thread a plugin starts at import (or in `run()` under `--no-isolate`): `check` printed its table,
  wrote its report and never exited;
- a `run()` that forks, or starts a `sleep`: the processes outlived `check` and held its output open, so the
  reader never saw the end of it;
- a `supports()` spinning in C code (one long `sum(range(...))`, which holds the interpreter: no signal handler
  runs) ran past `--hook-timeout`, and SIGTERM did not stop the run (only SIGKILL did, with no report).

Each run is its own session (`start_new_session`): whatever is left of it is killed after the test, pass or fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lowerings
from parity.exec import draw_ahead, hooks
from tests.parity.test_bad_inputs import GOOD, QUICK, quick_cases, write

ROOT = Path(__file__).resolve().parents[2]
ENDS_WITHIN = 60.0  # seconds; the runs take a few
HEAD = ("import os, subprocess, sys, threading, time\nfrom lowerings import register\n"
        "from lowerings.torch_emulation import Sdpa\n")


def plugin(tmp_path: Path, name: str, body: str, tail: str = "") -> Path:
    """A plugin registering `name`: the sdpa yardstick with `body` (methods) overriding its hooks."""
    return write(tmp_path / f"{name}.py", HEAD + f"class P(Sdpa):\n    name = {name!r}\n{body}\n{tail}register(P())\n")


def _session(sid: int) -> list[int]:
    """The live (not zombie) processes of session `sid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            rest = Path(f"/proc/{entry}/stat").read_text().rpartition(") ")[2].split()
            if rest[0] != "Z" and int(rest[3]) == sid:
                out.append(int(entry))
    return out


def _kill_session(sid: int) -> None:
    for pid in _session(sid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def check_process(*argv, env: dict[str, str] | None = None):
    """`python -m parity.front.cli check ...` in a session of its own, its output to pipes; killed with whatever it
    left when the block ends."""
    proc = subprocess.Popen([sys.executable, "-m", "parity.front.cli", "check", *map(str, argv)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    try:
        yield proc
    finally:
        _kill_session(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)


def ended(proc: subprocess.Popen) -> tuple[int, str, str]:
    """Read the run's output to the end and its exit code; fails when that does not happen within `ENDS_WITHIN`
    seconds (the run did not end, or what it left holds its output open), or when a process of its session
    outlives it by more than a few seconds."""
    try:
        out, err = proc.communicate(timeout=ENDS_WITHIN)
    except subprocess.TimeoutExpired:
        state = "still running" if proc.poll() is None else f"exited {proc.returncode}, its output still held open"
        pytest.fail(f"check did not end within {ENDS_WITHIN:g} s ({state}; session {_session(proc.pid)})")
    deadline = time.monotonic() + 5  # its fork server and resource tracker follow it out
    while _session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _session(proc.pid), f"processes of the run outlived it: {_session(proc.pid)}"
    return proc.returncode, out, err


def report(path: Path) -> dict:
    return json.loads((path / "parity.json").read_text())


# ---- threads ------------------------------------------------------------------------------------------------

def test_a_thread_started_at_import_does_not_keep_check_from_ending(tmp_path):
    """The lowering fails (its LSE dropped): the exit code stays 1, and the note names the thread."""
    p = plugin(tmp_path, "p_thread_import", "    def run(self, inputs):\n        r = super().run(inputs)\n"
                                            "        r.lse = None\n        return r\n",
               tail="threading.Thread(target=lambda: time.sleep(3600), name='plugin-sleeper').start()\n")
    with check_process("--plugin", p, "--lowering", "p_thread_import", "--report", tmp_path / "r", *QUICK) as proc:
        code, out, err = ended(proc)
    assert code == 1, out + err
    assert report(tmp_path / "r")["lowerings"]["p_thread_import"]["status"] == "fail"
    note = [ln for ln in err.splitlines() if "thread(s) running after the report" in ln]
    assert note and "'plugin-sleeper' (at p_thread_import.py:" in note[0] and "exit code 1" in note[0], err


def test_a_thread_started_in_run_under_no_isolate_does_not_keep_check_from_ending(tmp_path):
    p = plugin(tmp_path, "p_thread_run", "    def run(self, inputs):\n"
                                         "        if not getattr(P, 'started', False):\n            P.started = True\n"
                                         "            threading.Thread(target=time.sleep, args=(3600,), name='run-sleeper')"
                                         ".start()\n        return super().run(inputs)\n")
    with check_process("--plugin", p, "--lowering", "p_thread_run", "--report", tmp_path / "r", "--no-isolate",
                       *QUICK) as proc:
        code, out, err = ended(proc)
    assert code == 0, out + err
    assert report(tmp_path / "r")["lowerings"]["p_thread_run"]["cases"] == quick_cases("sdpa")
    assert "plugin code left 1 thread(s) running after the report ('run-sleeper'" in err, err
    assert "exit code 0" in err


# ---- processes ----------------------------------------------------------------------------------------------

LEAVES = {
    "fork": "        if os.fork() == 0:\n            time.sleep(3600)\n            os._exit(0)\n",
    "sleep": "        subprocess.Popen(['sleep', '3600'])\n",
}


@pytest.mark.parametrize("what", sorted(LEAVES))
def test_what_run_leaves_in_the_isolated_worker_ends_with_it(tmp_path, what):
    """The worker leads its own process group, killed with it: nothing holds the output open once check exits."""
    name = f"p_{what}"
    p = plugin(tmp_path, name, "    def run(self, inputs):\n" + LEAVES[what] + "        return super().run(inputs)\n")
    with check_process("--plugin", p, "--lowering", name, "--report", tmp_path / "r", *QUICK) as proc:
        code, out, err = ended(proc)
    assert code == 0, out + err
    assert report(tmp_path / "r")["lowerings"][name]["cases"] == quick_cases("sdpa")
    assert "left running" not in err  # killed with the worker; the fork server and the like are no strays


def test_what_run_leaves_under_no_isolate_is_stopped_and_named(tmp_path):
    p = plugin(tmp_path, "p_leaves", "    def run(self, inputs):\n" + LEAVES["fork"] + LEAVES["sleep"]
               + "        return super().run(inputs)\n")
    with check_process("--plugin", p, "--lowering", "p_leaves", "--report", tmp_path / "r", "--no-isolate",
                       *QUICK) as proc:
        code, out, err = ended(proc)
    assert code == 0, out + err
    note = [ln for ln in err.splitlines() if "process(es) a lowering's or plugin's code left running: " in ln]
    assert note and note[0].startswith("dflash-parity: note: stopped ") and "sleep (pid " in note[0], err


# ---- a hook spinning in C code --------------------------------------------------------------------------------

SPINS = ("    def supports(self, case):\n        open(os.environ['SPIN_MARK'], 'w').close()\n"
         "        sum(range(10 ** 12))  # one call in C: no signal handler runs until it returns\n")


def test_sigterm_stops_a_run_whose_supports_spins_in_c_code_and_keeps_its_report(tmp_path):
    p = plugin(tmp_path, "p_spins", SPINS)
    mark = tmp_path / "spinning"
    with check_process("--plugin", p, "--lowering", "context", "--lowering", "p_spins", "--lowering", "sdpa",
                       "--report", tmp_path / "r", *QUICK, env={"SPIN_MARK": str(mark)}) as proc:
        deadline = time.monotonic() + ENDS_WITHIN
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), "the plugin's supports() never ran"
        time.sleep(0.3)  # inside the sum
        proc.send_signal(signal.SIGTERM)
        code, out, err = ended(proc)
    assert code == 143, out + err
    data = report(tmp_path / "r")
    assert data["verdict"] == "interrupted"
    assert data["lowerings"]["context"]["status"] == "pass"
    assert data["lowerings"]["context"]["cases"] == quick_cases("context")
    spun = data["lowerings"]["p_spins"]
    assert spun["status"] == "fail" and "interrupted" in spun["notes"][0] and "not a verdict" in spun["notes"][0]
    assert "sdpa" not in data["lowerings"]


def test_a_supports_spinning_in_c_code_past_the_hook_timeout_is_killed_and_fails_its_lowering(tmp_path):
    p = plugin(tmp_path, "p_spins", SPINS)
    t0 = time.monotonic()
    with check_process("--plugin", p, "--lowering", "p_spins", "--lowering", "context", "--report", tmp_path / "r",
                       *QUICK, env={"SPIN_MARK": str(tmp_path / "spinning")}) as proc:
        code, out, err = ended(proc)
    assert code == 1, out + err
    assert time.monotonic() - t0 < ENDS_WITHIN
    data = report(tmp_path / "r")
    assert data["lowerings"]["p_spins"]["notes"][0].startswith(
        "supports() did not answer within 1 s (stopped: its isolated worker was killed"), data["lowerings"]["p_spins"]
    assert data["lowerings"]["context"]["status"] == "pass"
    assert data["lowerings"]["context"]["cases"] == quick_cases("context")


def test_a_drawer_stuck_in_a_hook_in_c_code_ends_itself():
    """The draw-ahead drawer (a fork of the check) calls a plugin's hooks itself: one stuck in C code past its
    bound ends the drawer, so the judge reads the end of its draws and asks the hook in its own worker."""
    class Spins(type(lowerings.get("sdpa"))):
        name = "spins"

        def supports(self, case):
            sum(range(10 ** 12))

    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the drawer's way of calling a plugin's hook
        try:
            hooks.answer_with(draw_ahead._exits_when_stuck, ["spins"])
            hooks.call(Spins(), "supports", GOOD, seconds=0.5)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the stuck drawer did not end")
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1  # faulthandler's exit, past the bound and its grace
    assert 0.5 + draw_ahead.STUCK_GRACE <= time.monotonic() - t0 < 20
