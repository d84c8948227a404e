"""`--jobs-start prefork` (parity/exec/prefork.py): `--jobs` children forked from one process that imported once.

Each check fails when the prefork is wrong in the way it names: a report that differs from fresh
interpreters', an import that initialized CUDA let through, a child's death or CPU seconds lost, a prefork
that cannot start taking the run down with it."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from parity.exec import jobs, prefork

ROOT = Path(__file__).resolve().parents[2]
TIMING = ("seconds", "phase_seconds")  # the fields of an entry that time the run


def run_two_jobs(report: Path, capsys) -> tuple[int, str]:
    """`check` of sdpa and decode_rows, 2 draws each, in process, `--jobs 2` on CPU: (exit code, all it said).
    Without the hardening checks: these tests are about how the children start, and its profiler's first start
    (hundreds of modules: `test_the_preload_holds_...`) costs a fresh or a prefork-less child more than its cases."""
    from parity.front import cli

    code = cli.main(["check", "--lowering", "sdpa", "--lowering", "decode_rows", "--max-examples", "2",
                     "--no-hardening", "--no-isolate", "--device", "cpu", "--jobs", "2", "--report", str(report)])
    out = capsys.readouterr()
    return code, out.out + out.err


def _refuse(env: dict, why: str, module: str | None = None):
    """A fake `Prefork.start`'s refusal, ending the prefork the command's start-up launched early
    (`parity.front.startup`) as a real refusal ends it: that one would have been the prefork refusing. (Left to the
    command's end, it finished its imports for nothing: 5 s of CPU a run.)"""
    early = prefork.adopt_early(env)
    if early is not None:
        early.kill()
    raise prefork.PreforkError(why, module)


def _figures(report: Path) -> dict:
    """Each lowering's entry in `parity.json` without the fields that time the run."""
    data = json.loads((report / "parity.json").read_text())
    return {name: {k: v for k, v in entry.items() if k not in TIMING}
            for name, entry in data["lowerings"].items()}


def test_forked_children_write_the_report_fresh_interpreters_write(tmp_path, capsys):
    from parity.front import cli

    said = {}
    for how in ("spawn", "prefork"):
        code = cli.main(["check", "--lowering", "sdpa", "--lowering", "decode_rows", "--max-examples", "4",
                         "--no-isolate", "--device", "cpu", "--jobs", "2", "--jobs-start", how, "--report",
                         str(tmp_path / how)])
        out = capsys.readouterr()
        said[how] = out.out + out.err
        assert code == 0, said[how]
    assert "children forked from one process that imported" in said["prefork"], said["prefork"]
    assert "children forked" not in said["spawn"]
    assert _figures(tmp_path / "prefork") == _figures(tmp_path / "spawn")
    assert all(e["cases"] > 0 for e in _figures(tmp_path / "prefork").values())


def test_the_preload_holds_what_the_profilers_first_start_imports():
    """Run 65: the profiler's first start imported 893 modules (`torch._dynamo`, ...; 5.8 s on the H200, where
    they compile from source). After `PRELOAD`'s torch modules a first start (CPU activities here) imports
    none, so forked children do not pay it. Fails when the preload misses the set torch's profiler pulls in."""
    import subprocess

    code = ("import os, sys, importlib\n"
            "from parity.exec.prefork import PRELOAD\n"
            "[importlib.import_module(m) for m in PRELOAD if m.startswith('torch')]\n"
            "import torch.profiler as tp\n"
            "before = set(sys.modules)\n"
            "tp.profile(activities=[tp.ProfilerActivity.CPU]).__enter__()\n"
            "print(len(set(sys.modules) - before), sorted(set(sys.modules) - before)[:5], flush=True)\n"
            "os._exit(0)\n")  # no teardown: leaving a started profiler at exit can crash the interpreter
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[0] == "0", res.stdout


def test_an_import_that_initialized_cuda_refuses_the_prefork_naming_it():
    answers = iter([False, True])
    done, skipped, refusal = prefork.preload(["json", "os"], [], initialized=lambda: next(answers))
    assert done == ["json", "os"] and skipped == []
    assert refusal == ("importing os initialized CUDA, and a process forked after that cannot use the GPU")


def test_a_missing_optional_module_is_skipped_and_a_missing_required_one_refuses():
    done, skipped, refusal = prefork.preload(["json"], ["no_such_module_dflash"], initialized=lambda: False)
    assert (done, skipped, refusal) == (["json"], ["no_such_module_dflash"], None)
    _, _, refusal = prefork.preload(["no_such_module_dflash"], [], initialized=lambda: False)
    assert refusal.startswith("importing no_such_module_dflash failed: ModuleNotFoundError"), refusal


def test_the_cuda_probe_initializes_nothing_where_there_is_no_driver():
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        assert prefork.cuda_initialized() is None
    else:  # a GPU runner: this process has not touched CUDA by now, and asking must not change that
        assert prefork.cuda_initialized() in (False, True)


def test_a_prefork_that_cannot_start_leaves_the_run_to_fresh_interpreters(tmp_path, capsys, monkeypatch):
    class Refused:
        def __init__(self, preload=()):
            pass

        def start(self, env, exclude=()):
            _refuse(env, "importing flashinfer initialized CUDA, and a process forked after that cannot use the GPU")

    monkeypatch.setattr(jobs, "Prefork", Refused)
    code, said = run_two_jobs(tmp_path, capsys)
    assert code == 0, said
    assert ("[jobs] children start as fresh interpreters (--jobs-start spawn): the prefork process cannot fork "
            "them: importing flashinfer initialized CUDA") in said, said
    assert said.count(": done in ") == 2 and "and their prefork" not in said


def test_a_prefork_refused_by_one_module_starts_again_without_it(tmp_path, capsys, monkeypatch):
    """On the H200 importing inductor's compile_fx initialized CUDA (run 65): the prefork is refused naming the
    module, and one more starts without it (the children import it themselves); a second refusal gives up."""
    tries = []

    class RefusedOnce(prefork.Prefork):
        def start(self, env, timeout=prefork.READY_TIMEOUT, exclude=()):
            tries.append(list(exclude))
            if not exclude:
                _refuse(env, "importing torch._dynamo initialized CUDA, and a process forked after that cannot use "
                        "the GPU", "torch._dynamo")
            return super().start(env, timeout, exclude)

    monkeypatch.setattr(jobs, "Prefork", RefusedOnce)
    code, said = run_two_jobs(tmp_path, capsys)
    assert code == 0, said
    assert tries == [[], ["torch._dynamo"]]
    assert "[jobs] the prefork process starts again without torch._dynamo: importing torch._dynamo initialized" in said
    from parity.front.part import CHILD_PRELOAD
    assert f"children forked from one process that imported {len(CHILD_PRELOAD) - 1} modules once" in said, said  # all but the one

    class RefusedTwice(prefork.Prefork):
        def start(self, env, timeout=prefork.READY_TIMEOUT, exclude=()):
            _refuse(env, "importing torch initialized CUDA, ...", "torch")

    monkeypatch.setattr(jobs, "Prefork", RefusedTwice)
    code, said = run_two_jobs(tmp_path / "b", capsys)
    assert code == 0 and "children start as fresh interpreters (--jobs-start spawn)" in said, said


def test_the_prefork_leaves_out_the_modules_it_is_told_to(tmp_path):
    pf = prefork.Prefork().start(dict(os.environ), exclude=["torch._higher_order_ops.triton_kernel_wrap"])
    try:
        assert "torch._higher_order_ops.triton_kernel_wrap" not in pf.modules and "torch._dynamo" in pf.modules
    finally:
        pf.close()


def _log(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.log"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def started_prefork():
    """One prefork (the default preload) for the tests of what each child it forks gets: a start imports torch and
    the rest (4 s of CPU), and nothing these tests check is the prefork's own or left in it by a child."""
    pf = prefork.Prefork().start(dict(os.environ))
    try:
        yield pf
    finally:
        pf.close()


def test_a_forked_childs_exit_code_cpu_and_output_come_back(tmp_path, started_prefork):
    """A bad part spec: the child prints its usage error (stderr) and exits 2; its stdout goes to its log."""
    pf = started_prefork
    assert pf.ready_cpu > 0 and "torch" in pf.modules
    log = _log(tmp_path, "bad")
    child = pf.spawn([sys.executable, "-m", "parity.front.child", "--part", "{not json"], dict(os.environ), log)
    assert child.wait(60) == 2
    from parity.exec import pool

    assert pool.cpu_seconds(child) is not None and pool.cpu_seconds(child) >= 0
    log2 = _log(tmp_path, "usage")
    child2 = pf.spawn([sys.executable, "-m", "parity.front.child"], dict(os.environ), log2)
    assert child2.wait(60) == 2  # no --part: the usage line, exit 2 (EXIT_USAGE)


PLUGIN = ("import os, time\nfrom lowerings import register\nfrom lowerings.torch_emulation import Sdpa\n"
          "if os.environ.get('PROBE_OUT'):\n"
          "    open(os.environ['PROBE_OUT'], 'w').write(os.environ.get('DFLASH_PREFORK_PROBE', '-'))\n"
          "class P(Sdpa):\n    name = 'probe'\n"
          "    def run(self, inputs):\n        time.sleep(float(os.environ.get('PROBE_SLEEP', '0')))\n"
          "        return super().run(inputs)\n"
          "register(P())\n")


def _part_argv(tmp_path: Path, examples: int) -> list[str]:
    """The argv `parity.front.part.child_argv` gives a child checking the plugin lowering `probe` on cpu."""
    from parity.front.config import CheckConfig
    from parity.front.part import Part, child_argv

    plugin = tmp_path / "probe_plugin.py"
    plugin.write_text(PLUGIN)
    config = CheckConfig(lowerings=("probe",), plugins=(str(plugin),), device="cpu", isolate=False,
                         max_examples=examples, report=str(tmp_path / "r"), jobs=2, quiet=True)
    return child_argv(config, Part("probe"))


def test_a_forked_child_gets_its_own_environment_and_process_group(tmp_path, started_prefork):
    """`CUDA_VISIBLE_DEVICES` and the MPS pipe differ per child: the child's env is the one asked for, not
    the prefork's; it leads its own process group (a Ctrl-C at the terminal reaches the parent only)."""
    pf = started_prefork
    out = tmp_path / "seen"
    env = {**os.environ, "DFLASH_PREFORK_PROBE": "child-7", "PROBE_OUT": str(out), "PROBE_SLEEP": "0.01"}
    child = pf.spawn(_part_argv(tmp_path, 3), env, _log(tmp_path, "env"))
    deadline = time.monotonic() + 10
    while os.getpgid(child.pid) != child.pid and time.monotonic() < deadline:  # its setsid, just after the fork
        time.sleep(0.01)
    assert os.getpgid(child.pid) == child.pid
    assert child.wait(120) == 0, (tmp_path / "env.log").read_text()
    assert out.read_text() == "child-7"
    assert "probe" in (tmp_path / "env.log").read_text()  # its stdout (the part's table) went to its log


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_children_die_with_a_killed_prefork_and_the_run_hears_of_it(tmp_path):
    """A prefork killed under its children: they die with it (no orphan keeps the GPU), each is reported as
    killed, and the next spawn raises PreforkError (the run then starts fresh interpreters)."""
    pf = prefork.Prefork().start(dict(os.environ))
    try:
        out = tmp_path / "seen"
        slow = pf.spawn(_part_argv(tmp_path, 1000), {**os.environ, "PROBE_OUT": str(out), "PROBE_SLEEP": "1"},
                        _log(tmp_path, "s"))
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:  # its plugin is loaded: it is checking cases
            time.sleep(0.05)
        assert out.exists() and slow.poll() is None
        os.kill(pf.proc.pid, signal.SIGKILL)
        assert slow.wait(30) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while _alive(slow.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(slow.pid), "a child outlived its prefork"
        with pytest.raises(prefork.PreforkError, match="the prefork process ended"):
            pf.spawn(_part_argv(tmp_path, 1), dict(os.environ), _log(tmp_path, "t"))
    finally:
        pf.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# ---- children never outlive the run, started either way --------------------------------------------------
def _children_of(report: Path | None, parent: int) -> list[int]:
    """Pids of the `check --jobs` children writing into `report`: started as `parity.front.child --part SPEC`
    (`--jobs-start spawn`), or forked by the prefork (`python -m parity.exec.prefork`) that `parent` started
    (`report` None: the prefork's pid, if any)."""
    procs: dict[int, tuple[list[bytes], int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            procs[int(p.name)] = (cmd, ppid)
    preforks = {pid for pid, (cmd, ppid) in procs.items() if b"parity.exec.prefork" in cmd and ppid == parent}
    if report is None:
        return sorted(preforks)
    return [pid for pid, (cmd, ppid) in procs.items()
            if (b"--part" in cmd and any(str(report).encode() in arg for arg in cmd)) or ppid in preforks]


SLOW = ("import time\nfrom lowerings import register\nfrom lowerings.torch_emulation import Sdpa\n"
        "class P(Sdpa):\n    name = 'slow_a'\n"
        "    def run(self, inputs):\n        time.sleep(0.2)\n        return super().run(inputs)\n"
        "register(P())\nclass Q(P):\n    name = 'slow_b'\nregister(Q())\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["prefork", "spawn"])
def test_jobs_children_do_not_outlive_a_sigterm_to_the_parent(tmp_path, how):
    import subprocess

    plugin = tmp_path / "slow.py"
    plugin.write_text(SLOW)
    report = tmp_path / "r"
    parent = subprocess.Popen([sys.executable, "-m", "parity.front.cli", "check", "--plugin", str(plugin), "--lowering",
                               "slow_a", "--lowering", "slow_b", "--jobs", "2", "--jobs-start", how, "--no-isolate",
                               "--max-examples", "1000", "--device", "cpu", "--quiet", "--report", str(report)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(_children_of(report, parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        children = _children_of(report, parent.pid)
        assert len(children) == 2, children
        preforks = _children_of(None, parent.pid)
        assert len(preforks) == (how == "prefork"), preforks
        children += preforks  # the prefork must not outlive the run either
        parent.send_signal(signal.SIGTERM)
        parent.wait(30)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = [pid for pid in children if _alive(pid)]
        assert not alive, f"children {alive} outlived their parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in _children_of(report, parent.pid):
            os.kill(pid, signal.SIGKILL)
