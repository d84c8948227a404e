"""The prefork process: `python -m parity.exec.prefork` (see `parity.exec.prefork` for the protocol).

It imports the modules it is given (`--preload`, default `PRELOAD`: torch and its profiler's modules, triton,
hypothesis and the framework below the front ends), checks after each that CUDA is still untouched
(`cuda_initialized`), says ready, and forks a child per request. A child becomes what `python -m MODULE ARGS...`
would be: its own session and process group, its environment, its working directory, its stdout in its log, the
signal handlers of a fresh interpreter; it runs `MODULE.main(ARGS)` (the module run that way defines
`main(argv) -> int`, which its `__main__` block calls too) and exits with its code.

Public: `PRELOAD`, `OPTIONAL`, `cuda_initialized`, `preload`, `serve`.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
import time
from typing import Any, Callable, Sequence

from parity.exec.leftovers import stop_stray_children
from parity.exec.pool import die_with_parent

# what every child imports before its first case (a front end adds its own modules: `Prefork(preload=...)`);
# OPTIONAL ones are skipped where not installed. `torch._dynamo` and `triton_kernel_wrap` are what the profiler's
# first start imports; `torch._inductor.compile_fx` and flashinfer initialize CUDA at import on some GPU images: not
# preloaded (docs/cli.md, `--jobs-start`).
PRELOAD = ("numpy", "torch", "torch.profiler", "torch._dynamo", "torch._higher_order_ops.triton_kernel_wrap", "triton",
           "hypothesis", "oracle", "strategies", "lowerings", "lowerings.builtins", "parity.engine.sweep",
           "parity.engine.runner", "parity.engine.case_run", "parity.exec.isolation")
OPTIONAL: tuple[str, ...] = ()
_CUDA_ERROR_NOT_INITIALIZED = 3


def cuda_initialized() -> bool | None:
    """Whether this process has initialized the CUDA driver (`cuInit`), asked without initializing it: True,
    False, or None where there is no driver (`libcuda` cannot be loaded: nothing to protect)."""
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int(0)
    return int(libcuda.cuDeviceGetCount(ctypes.byref(count))) != _CUDA_ERROR_NOT_INITIALIZED


# ---- the prefork process ------------------------------------------------------------------------------
_REPLIES = 1  # the fd of the prefork's replies (`serve` moves them off fd 1, which then goes to stderr)


def _send(obj: dict[str, Any]) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(_REPLIES, data):]


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def preload(modules: Sequence[str], optional: Sequence[str],
            initialized: Callable[[], bool | None] = cuda_initialized) -> tuple[list[str], list[str], str | None]:
    """Import `modules` then `optional` (skipped when not installed); (imported, skipped, refusal): the refusal
    names the first import after which CUDA was initialized (that module is the last of `imported`)."""
    done, skipped = [], []
    for name in [*modules, *optional]:
        try:
            importlib.import_module(name)
        except ImportError as err:
            if name not in optional:
                return done, skipped, f"importing {name} failed: {type(err).__name__}: {err}"
            skipped.append(name)
            continue
        done.append(name)
        if initialized():
            return done, skipped, (f"importing {name} initialized CUDA, and a process forked after that cannot use "
                                   f"the GPU")
    return done, skipped, None


def _child(req: dict[str, Any], server: int) -> None:
    """In the forked child: become what `python -m MODULE ARGS...` would be (`MODULE.main(ARGS)`), run it, exit."""
    code = 1
    try:
        os.close(_REPLIES)
        os.setsid()  # its own session and process group, as `parity.exec.pool.child_kwargs` gives a spawned child
        die_with_parent(server)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        os.dup2(log, 1)
        os.close(log)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        module = importlib.import_module(req["module"])
        sys.argv = [module.__file__, *req["args"]]
        code = module.main(list(req["args"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001  (anything: the log says what, the exit code says failed)
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        stop_stray_children()  # what plugin code started here (`--no-isolate`, an import) ends with the child
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)


def _reap() -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send({"exited": pid, "code": os.waitstatus_to_exitcode(status), "cpu": usage.ru_utime + usage.ru_stime})


def serve() -> int:
    """`python -m parity.exec.prefork [--preload M,...] [--exclude M,...]`: import, say ready (or refused), then fork
    a child per request line."""
    import gc

    global _REPLIES
    _REPLIES = os.dup(1)
    os.dup2(2, 1)  # what an import prints goes to stderr, never into the replies
    t0, c0 = time.perf_counter(), _cpu()
    from lowerings import interpret_where_no_gpu  # here, not at import: a parent launching the prefork imports none

    interpret_where_no_gpu()  # before torch._dynamo imports triton.language (no CUDA touched)
    exclude = set(_argument("--exclude").split(",")) - {""}
    modules = _argument("--preload").split(",") if "--preload" in sys.argv else list(PRELOAD)
    done, skipped, refusal = preload([m for m in modules if m and m not in exclude],
                                     [m for m in OPTIONAL if m not in exclude])
    sys.stdout.flush()
    if refusal:
        _send({"refused": refusal, "module": done[-1] if "initialized CUDA" in refusal else None})
        return 0
    gc.collect()
    gc.freeze()  # the imports' objects stay out of the children's collections: fewer copied pages
    _send({"ready": True, "seconds": round(time.perf_counter() - t0, 3), "cpu": round(_cpu() - c0, 3),
           "modules": done, "skipped": skipped})
    server, buf = os.getpid(), b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        if readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break  # the parent closed its end (or ended)
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req, server)
                _send({"started": req["id"], "pid": pid})
        _reap()
    while True:  # the parent is done: wait for any child still running (it was stopped), then leave
        try:
            os.wait4(-1, 0)
        except ChildProcessError:
            return 0


def _argument(flag: str) -> str:
    """The value after `flag` on this process's command line ('' without one)."""
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv[:-1] else ""

