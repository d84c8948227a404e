"""`check --jobs N --mps` (parity/exec/mps.py): a private CUDA MPS daemon started, probed and stopped around the
children; a daemon already running used and left alone; every failure a line that says why, the run going on
without MPS. The daemon here is a fake `nvidia-cuda-mps-control` on PATH that logs what it was asked."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from oracle.errors import InvalidInput
from parity.front import cli
from parity.exec import jobs, mps
from parity.front import controller
from parity.front.config import CheckConfig
from tests.plugin_runs import not_an_xdist_worker, plugin_args

pytest_plugins = ["pytester"]

FAKE = """#!{python}
import os, sys
log = os.environ["FAKE_MPS_LOG"]
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
if sys.argv[1:] == ["-d"]:
    open(log, "a").write("start " + pipe + "\\n")
    code = int(os.environ.get("FAKE_MPS_EXIT", "0"))
    if code:
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(code)
    logs = os.environ.get("CUDA_MPS_LOG_DIRECTORY")
    if logs:
        open(os.path.join(logs, "control.log"), "w").write("[INFO] Starting control daemon\\n")
    open(os.path.join(pipe, "control"), "w").close()
else:
    cmd = sys.stdin.read().strip()
    open(log, "a").write(cmd + " " + pipe + "\\n")
    if cmd == "quit":
        os.remove(os.path.join(pipe, "control"))
"""
# The probe sees the daemon's pipe through the environment it is given, as a CUDA client would.
PROBE_OK = [sys.executable, "-c", "import os, sys; "
            "sys.exit(0 if os.path.exists(os.path.join(os.environ['CUDA_MPS_PIPE_DIRECTORY'], 'control')) else 3)"]
PROBE_FAILS = [sys.executable, "-c", "import sys; print('cudaErrorMpsConnectionFailed', file=sys.stderr); sys.exit(1)"]


@pytest.fixture
def fake_daemon(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / mps.CONTROL
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "daemon.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-daemon-here"))
    return log


def _lines(log: Path) -> list[str]:
    return log.read_text().split()


def test_a_private_daemon_is_started_probed_and_stopped(fake_daemon):
    said: list[str] = []
    with mps.mps_session(16, said.append, probe=PROBE_OK) as state:
        pipe = state.env["CUDA_MPS_PIPE_DIRECTORY"]
        assert state.on and state.status == "started for this run (16 processes)"
        assert os.path.exists(os.path.join(pipe, "control"))  # running while the children run
        assert state.env["CUDA_MPS_LOG_DIRECTORY"].startswith(str(Path(pipe).parent))
        assert _lines(fake_daemon) == ["start", pipe]
    assert _lines(fake_daemon) == ["start", pipe, "quit", pipe]
    assert not Path(pipe).parent.exists()  # its temporary directory removed
    assert "started a CUDA MPS daemon" in said[0] and "stopped" in said[-1]


def test_the_daemon_is_stopped_when_the_run_raises(fake_daemon):
    with pytest.raises(KeyboardInterrupt):
        with mps.mps_session(4, lambda line: None, probe=PROBE_OK) as state:
            raise KeyboardInterrupt
    assert _lines(fake_daemon)[-2:] == ["quit", state.env["CUDA_MPS_PIPE_DIRECTORY"]]


def test_a_daemon_already_running_is_used_and_left_running(fake_daemon, tmp_path, monkeypatch):
    pipe = tmp_path / "system-mps"
    pipe.mkdir()
    (pipe / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    with mps.mps_session(8, lambda line: None, probe=PROBE_FAILS) as state:
        assert state.on and state.env == {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
        assert state.status == f"already running ({pipe})"
    assert _lines(fake_daemon) == []  # never started, never told to quit
    assert (pipe / "control").exists()


@pytest.mark.parametrize("how, expect, stopped", [
    ("not on PATH", "nvidia-cuda-mps-control is not on PATH (it comes with the NVIDIA driver's utilities)", False),
    ("refuses to start", "nvidia-cuda-mps-control -d exited 1: An instance of this daemon is already running", False),
    ("probe fails", "a CUDA context through it failed (exit 1: cudaErrorMpsConnectionFailed) (its log: [INFO] "
                    "Starting control daemon)", True),
])
def test_without_mps_the_run_goes_on_saying_why(fake_daemon, monkeypatch, how, expect, stopped):
    if how == "not on PATH":
        monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                                   if not Path(p, mps.CONTROL).exists()))
    if how == "refuses to start":
        monkeypatch.setenv("FAKE_MPS_EXIT", "1")
    said: list[str] = []
    with mps.mps_session(16, said.append, probe=PROBE_FAILS if how == "probe fails" else PROBE_OK) as state:
        assert not state.on and state.env == {}
        assert state.status == f"not used: {expect}"
        assert ("quit" in _lines(fake_daemon)) is stopped  # a daemon that started is stopped before the run
    assert said == [f"[mps] --mps: {expect}; the 16 processes run without MPS, taking turns on the GPU"]
    assert _lines(fake_daemon).count("quit") == int(stopped)  # once


def test_the_hint_names_mps_only_where_processes_share_a_gpu_without_it(tmp_path):
    none = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    assert "--mps" in mps.mps_hint(2, none) and "1.57x" in mps.mps_hint(16, none)
    assert mps.mps_hint(1, none) is None
    (tmp_path / "control").touch()
    assert mps.mps_hint(16, none) is None


def test_jobs_records_the_mps_status_in_the_report_settings(fake_daemon, monkeypatch):
    monkeypatch.setattr(mps, "PROBE", PROBE_OK)
    said: list[str] = []
    session = SimpleNamespace(config=SimpleNamespace(mps=True), device="cuda", say=said.append,
                              header={"settings": {}})
    with controller._mps_for(session, 16) as state:
        assert state.env["CUDA_MPS_PIPE_DIRECTORY"]
    assert session.header["settings"]["mps"] == "started for this run (16 processes)"
    plain = SimpleNamespace(config=SimpleNamespace(mps=False), device="cuda", say=said.append, header=None)
    with controller._mps_for(plain, 16) as state:
        assert state.env == {}
    assert said[-1].startswith("[jobs] note: 16 processes share the GPU without CUDA MPS")
    n = len(said)
    with controller._mps_for(SimpleNamespace(config=plain.config, device="cpu", say=said.append, header=None), 16):
        pass
    assert len(said) == n  # no note on the CPU


def test_mps_needs_jobs_and_a_gpu(tmp_path, capsys):
    with pytest.raises(InvalidInput, match=r"^--mps: .*needs --device cuda, got cpu"):
        CheckConfig(mps=True, jobs=2, device="cpu")
    code = cli.main(["check", "--device", "cpu", "--jobs", "2", "--mps", "--lowering", "sdpa", "--report",
                     str(tmp_path / "r")])
    assert code == 2 and "--mps: shares a GPU among processes (CUDA MPS): it needs --device cuda" \
        in capsys.readouterr().err
    if not torch.cuda.is_available():  # the device resolved at run time, not given
        code = cli.main(["check", "--jobs", "2", "--mps", "--lowering", "sdpa", "--report", str(tmp_path / "r")])
        assert code == 2 and "--mps: shares a GPU among processes (CUDA MPS): it needs the cuda device, and this " \
            "run is on cpu" in capsys.readouterr().err
    code = cli.main(["check", "--mps", "--lowering", "sdpa", "--report", str(tmp_path / "r")])
    assert code == 2 and "--mps: shares one GPU among the --jobs processes: give --jobs N (N >= 2) too" \
        in capsys.readouterr().err


def test_the_children_get_the_daemons_pipe_over_their_own(tmp_path):
    env = jobs.child_env(4, environ={"CUDA_MPS_PIPE_DIRECTORY": "/elsewhere", "PATH": "/bin"}, cpus=8,
                         mps={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")})
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "pipe") and env["PATH"] == "/bin"
    assert env["OMP_NUM_THREADS"] == "2"
    assert jobs.child_env(4, environ={"CUDA_MPS_PIPE_DIRECTORY": "/elsewhere"}, cpus=8)["CUDA_MPS_PIPE_DIRECTORY"] \
        == "/elsewhere"


def test_exported_sets_the_pipe_for_the_block_and_puts_back_what_was_there(monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/users/own")
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    state = mps.MpsState({"CUDA_MPS_PIPE_DIRECTORY": "/run/pipe", "CUDA_MPS_LOG_DIRECTORY": "/run/log"}, "started")
    with mps.exported(state):
        assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == "/run/pipe" and os.environ["CUDA_MPS_LOG_DIRECTORY"] == "/run/log"
    assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == "/users/own" and "CUDA_MPS_LOG_DIRECTORY" not in os.environ


def test_pytest_mps_needs_xdist_workers_and_a_gpu(pytester):
    """Usage errors, decided before any test runs: in process (a pytest subprocess costs its imports, seconds)."""
    pytester.makepyfile("def test_nothing():\n    pass\n")
    with not_an_xdist_worker():
        res = pytester.runpytest_inprocess(*plugin_args(), "--parity-mps", "-p", "no:cacheprovider")
        assert res.ret == pytest.ExitCode.USAGE_ERROR, res.stderr.str()
        res.stderr.fnmatch_lines(["*--parity-mps: shares one GPU among pytest-xdist workers: give -n N (N >= 2) too*"])
        res = pytester.runpytest_inprocess(*plugin_args(), "--parity-mps", "--parity-device", "cpu", "-p",
                                           "no:cacheprovider")
        assert res.ret == pytest.ExitCode.USAGE_ERROR, res.stderr.str()
        res.stderr.fnmatch_lines(["*--parity-mps: *needs --parity-device cuda, got cpu*"])


def test_pytest_controller_exports_the_daemon_to_its_workers_until_the_session_closes(fake_daemon, monkeypatch):
    """`--parity-mps -n 4` on the controller (the GPU faked): the daemon started before xdist starts the
    workers, its pipe in the environment they inherit, the status in the report's settings; all undone when
    the session's held resources close (sessionfinish / unconfigure)."""
    import contextlib

    from parity.front import pytest_plugin

    monkeypatch.setattr(mps, "PROBE", PROBE_OK)
    own = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    session = SimpleNamespace(mps_status=None)
    state = SimpleNamespace(config_=lambda: SimpleNamespace(device="cuda"), held=contextlib.ExitStack(),
                            session_=lambda: session)
    said: list[str] = []
    config = SimpleNamespace(getoption=lambda name, default=None: 4 if name == "numprocesses" else default,
                             pluginmanager=SimpleNamespace(get_plugin=lambda name: SimpleNamespace(write_line=said.append)))
    pytest_plugin._start_mps(config, state)
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    assert pipe != own and os.path.exists(os.path.join(pipe, "control"))
    assert session.mps_status == "started for this run (4 processes)" and "started a CUDA MPS daemon" in said[0]
    state.held.close()
    assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == own and _lines(fake_daemon)[-2:] == ["quit", pipe]


def test_the_summary_settings_line_says_what_mps_did():
    from parity.report.files import settings_line

    data = {"settings": {"seed": 3, "max_examples": 10, "hardening": True, "isolation": True}}
    assert "MPS" not in settings_line(data)
    data["settings"]["mps"] = "not used: nvidia-cuda-mps-control is not on PATH"
    assert "; CUDA MPS not used: nvidia-cuda-mps-control is not on PATH;" in settings_line(data)


def test_one_process_per_gpu_starts_nothing(fake_daemon):
    said: list[str] = []
    with mps.mps_session(1, said.append, probe=PROBE_OK) as state:
        assert state.env == {} and state.status == "not used: one process per GPU: nothing to share"
    assert _lines(fake_daemon) == [] and said == ["[mps] --mps: one process per GPU: nothing to share"]


def test_processes_per_gpu_is_the_most_that_share_one():
    assert [mps.processes_per_gpu(n, g) for n, g in ((16, 0), (16, 1), (16, 2), (5, 2), (2, 4))] == [16, 16, 8, 3, 1]


def test_the_real_probe_fails_where_no_cuda_context_can_be_made_and_says_why():
    """`mps.PROBE` itself (the driver API through ctypes, no torch): where libcuda cannot be loaded it exits
    non-zero naming it, so `mps_session` says why and runs without MPS; where it can (a GPU runner, no daemon in
    the way) it makes a context and exits 0. Pointed at a pipe directory with no daemon, the driver falls back to
    a plain context, so a GPU runner shows the probe's success path only."""
    import ctypes
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    res = subprocess.run(mps.PROBE, env=env, capture_output=True, text=True, timeout=120)
    try:
        ctypes.CDLL("libcuda.so.1")
        has_driver = torch.cuda.is_available()
    except OSError:
        has_driver = False
    if has_driver:
        assert res.returncode == 0, res.stderr
    else:
        assert res.returncode != 0 and "libcuda" in mps._last_line(res.stderr) + res.stderr, res.stderr


def test_a_probe_failure_of_the_driver_api_is_named_by_its_error():
    """The probe's own error path: a failing driver call exits naming the call and the CUDA error."""
    import subprocess

    src = mps.PROBE[-1].replace('ctypes.CDLL("libcuda.so.1")', "FakeCuda()")
    src = ("class FakeCuda:\n"
           "    def cuInit(self, flags): return 999\n"
           "    def cuGetErrorName(self, rc, out):\n"
           "        import ctypes; out._obj.value = b'CUDA_ERROR_UNKNOWN'\n"
           "    def __getattr__(self, name): return lambda *a: 0\n") + src
    res = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "cuInit: CUDA_ERROR_UNKNOWN (999)" in res.stderr, res.stderr
