"""CUDA MPS for `check --jobs N --mps`: the side-by-side processes share one GPU context instead of taking turns.

Without MPS, the kernels of different processes on one GPU do not run at once: the GPU time-slices between
their contexts. Under MPS the same 16-process sweep judged 1.57 times the cases in the same time, none failing in
either (docs/gpu/2026-12-03-h200-session15.md).

`mps_session(device, processes, say)` is a context manager around the children's lifetime:
- an MPS control daemon already reachable (its `control` pipe in `$CUDA_MPS_PIPE_DIRECTORY`, default
  `/tmp/nvidia-mps`) is used as it is, and left running;
- else a private one is started (`nvidia-cuda-mps-control -d`, its pipe and log directories in a new
  temporary directory), a child process is shown to create a CUDA context through it (`PROBE`, 120 s at
  most), and it is stopped (`quit`) when the block ends, an interrupt included;
- where that fails (no `nvidia-cuda-mps-control` on PATH, the daemon refuses to start, the probe fails) the run
  goes on without MPS, saying why: MPS changes how fast cases run, never what a case computes or how it
  is judged.
It yields an `MpsState`: `env` (the entries each child's environment gets) and `status` (one line, recorded in
the report's `settings.mps`). Nothing here changes a setting of the GPU.

`mps_hint(processes)`: the note `check --jobs` prints on CUDA when several processes share a GPU without MPS.
`exported(state)`: `state.env` set in this process's environment for the block (pytest-xdist workers, started
by the controller after its `pytest_configure`, inherit it), the earlier values put back after.

Public: `MpsState`, `mps_session`, `exported`, `reachable_daemon`, `mps_hint`, `processes_per_gpu`,
`device_refusal`, `CONTROL`, `PROBE`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
# A child creates a CUDA context through the daemon and allocates in it: an MPS server that cannot start shows
# here, not as every check child failing its first case. Through the driver API (libcuda, ctypes), not torch:
# importing torch made the probe seconds of every `--mps` run's start, before any check child started.
_PROBE_SOURCE = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def ok(what, rc):
    if rc:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        sys.exit(f"{what}: {(name.value or b'?').decode()} ({rc})")
ok("cuInit", cuda.cuInit(0))
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
ok("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
ok("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
ok("cuCtxSetCurrent", cuda.cuCtxSetCurrent(ctx))
ok("cuMemAlloc", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)))
ok("cuCtxSynchronize", cuda.cuCtxSynchronize())
ok("cuMemFree", cuda.cuMemFree_v2(ctypes.c_uint64(ptr.value)))
"""
PROBE = [sys.executable, "-c", _PROBE_SOURCE]
PROBE_SECONDS = 120.0
MEASURED = "1.57x the cases in the same time on one GPU (docs/gpu/2026-12-03-h200-session15.md)"


@dataclass(frozen=True)
class MpsState:
    """`env`: entries for each child's environment (empty: the children keep this one's); `status`: what was
    done, one line for the report (`settings.mps`)."""

    env: dict[str, str] = field(default_factory=dict)
    status: str = "off"

    @property
    def on(self) -> bool:
        return self.status.startswith(("started", "already running"))


def processes_per_gpu(processes: int, gpus: int) -> int:
    """The most of `processes` that share one of `gpus` GPUs when spread round-robin (all of them on 0 or 1 GPU)."""
    return -(-processes // max(1, gpus))


def device_refusal(device: str) -> str | None:
    """Why `--mps` cannot apply to a run on `device` (None on cuda)."""
    if device == "cuda":
        return None
    return f"shares a GPU among processes (CUDA MPS): it needs the cuda device, and this run is on {device}"


def reachable_daemon(environ: dict[str, str] | None = None) -> str | None:
    """The pipe directory of an MPS control daemon this environment reaches (its `control` pipe exists), or None."""
    env = os.environ if environ is None else environ
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIRECTORY
    return pipe if os.path.exists(os.path.join(pipe, "control")) else None


def mps_hint(processes: int, environ: dict[str, str] | None = None) -> str | None:
    """The note for `processes` check processes sharing one GPU without MPS (None when MPS is reachable or
    there is one process)."""
    if processes < 2 or reachable_daemon(environ) is not None:
        return None
    return (f"note: {processes} processes share the GPU without CUDA MPS, so their kernels take turns; --mps "
            f"runs them in one shared context ({MEASURED})")


def _control(args: list[str], env: dict[str, str], stdin: str | None = None, timeout: float = 30.0):
    return subprocess.run([CONTROL, *args], env=env, input=stdin, capture_output=True, text=True, timeout=timeout)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output"


def _daemon_log(log_dir: Path) -> str:
    """The last line the daemon or its server logged (`control.log`, `server.log`), or ""."""
    for name in ("server.log", "control.log"):
        try:
            text = (log_dir / name).read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            return _last_line(text)
    return ""


@contextlib.contextmanager
def mps_session(processes: int, say: Callable[[str], None], *, probe: list[str] | None = None,
                probe_seconds: float = PROBE_SECONDS) -> Iterator[MpsState]:
    """MPS for `processes` child processes on CUDA (see the module docstring); yields an `MpsState`."""
    if processes < 2:
        why = "one process per GPU: nothing to share"
        say(f"[mps] --mps: {why}")
        yield MpsState({}, f"not used: {why}")
        return
    here = reachable_daemon()
    if here is not None:
        say(f"[mps] using the CUDA MPS daemon already running (pipe directory {here}); it is left running")
        yield MpsState({"CUDA_MPS_PIPE_DIRECTORY": here}, f"already running ({here})")
        return
    if shutil.which(CONTROL) is None:
        why = f"{CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities)"
        say(f"[mps] --mps: {why}; the {processes} processes run without MPS, taking turns on the GPU")
        yield MpsState({}, f"not used: {why}")
        return
    root = Path(tempfile.mkdtemp(prefix="dflash-mps-"))
    env_add = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
    for d in env_add.values():
        os.makedirs(d, exist_ok=True)
    env = {**os.environ, **env_add}
    state, started, t0 = None, False, time.perf_counter()
    try:
        try:
            res = _control(["-d"], env)
            started = res.returncode == 0
            why = None if started else f"{CONTROL} -d exited {res.returncode}: {_last_line(res.stderr or res.stdout)}"
        except (OSError, subprocess.TimeoutExpired) as err:
            why = f"{CONTROL} -d failed: {err}"
        if why is None:
            try:
                res = subprocess.run(probe or PROBE, env=env, capture_output=True, text=True, timeout=probe_seconds)
                if res.returncode != 0:
                    why = f"a CUDA context through it failed (exit {res.returncode}: {_last_line(res.stderr)})"
            except (OSError, subprocess.TimeoutExpired) as err:
                why = f"a CUDA context through it failed: {err}"
        if why is not None:
            log = _daemon_log(root / "log")
            if log:
                why += f" (its log: {log})"
            if started:  # stopped now, not after the run it does not serve
                started = False
                _stop(env, say)
            say(f"[mps] --mps: {why}; the {processes} processes run without MPS, taking turns on the GPU")
            state = MpsState({}, f"not used: {why}")
        else:
            say(f"[mps] started a CUDA MPS daemon for this run (pipe directory {env_add['CUDA_MPS_PIPE_DIRECTORY']}, "
                f"{time.perf_counter() - t0:.1f} s with the probe); it is stopped at the end")
            state = MpsState(env_add, f"started for this run ({processes} processes)")
        yield state
    finally:
        if started:
            if _stop(env, say):
                say("[mps] stopped the CUDA MPS daemon of this run")
        shutil.rmtree(root, ignore_errors=True)


def _stop(env: dict[str, str], say: Callable[[str], None]) -> bool:
    """`quit` to the daemon of `env`'s pipe directory; False, with the command to do it by hand said, if that failed."""
    try:
        _control([], env, stdin="quit\n")
        return True
    except (OSError, subprocess.TimeoutExpired) as err:
        say(f"[mps] could not stop the MPS daemon of this run ({err}); stop it with "
            f"`echo quit | CUDA_MPS_PIPE_DIRECTORY={env['CUDA_MPS_PIPE_DIRECTORY']} {CONTROL}`")
        return False


@contextlib.contextmanager
def exported(state: MpsState) -> Iterator[MpsState]:
    """`state.env` in `os.environ` for the block; each entry's earlier value (or its absence) restored after."""
    before = {k: os.environ.get(k) for k in state.env}
    os.environ.update(state.env)
    try:
        yield state
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
