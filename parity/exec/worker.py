"""The isolated worker: the process side of `parity.exec.isolation.IsolatedExecutor`.

`worker_main(conn, init)` starts the worker from `init` (the parent's plugin files, tolerance file, run options,
yardstick, threads, CUDA device, hook timeout), installs the process machinery's port implementations
(`parity.exec.ports_impl`: the hook watchdog), answers `{"ready"}`, then serves one request at a time: a case
(`{"outcome"}`), a flakiness probe (`{"probe"}`), a history case's call (`{"done"}`) or a lowering's hook
(`{"value"}`), each answer with the worker's CPU seconds so far (`cpu_s`). A lowering's hook that raises, exits or
hangs answers `{"hook_failure"}`; the framework's own error `{"error", "traceback"}`. After a case on CUDA the
context is checked (`context_lost`): a faulted one answers `context_lost` and the worker exits.

Public: `worker_main`, `context_lost`.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
import traceback
from typing import Any

from oracle.case import Case
from parity.exec import hooks, ports_impl
from parity.exec.hooks import HookFailure
from parity.exec.leftovers import own_group
from parity.exec.worker_process import die_with_parent
from parity.engine.invocation import RunOptions
from parity.engine.yardstick import get as get_yardstick


def context_lost(device: str) -> str | None:
    """In a worker, after a case: None while the device is usable; else the error that says it is not. A
    CUDA fault (an illegal address, a device-side assert) is sticky: every later call of the process fails,
    the framework's own included, so the worker must be replaced before the next case. Synchronizing here
    also makes an asynchronous fault show up in the case that launched it, not in the next one (a 32-bit offset
    past 2**31 elements, then `WorkerError` on the next, smallest case)."""
    if device != "cuda":
        return None
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001  (any error here means the context is unusable)
        return f"{type(err).__name__}: {err}".splitlines()[0]
    return None


def _start(init: dict[str, Any]) -> tuple[RunOptions, Any, Any]:
    """The worker's start-up from `init`: (run options, policy, yardstick)."""
    import torch

    torch.set_num_threads(int(init["num_threads"]))
    import lowerings
    from parity.engine import policy as policy_mod

    lowerings.names()
    ports_impl.install()  # the hooks that run_case asks go through the watchdog here too
    hooks.set_timeout(init["hook_timeout"])  # this process's bound for every hook it calls
    for path in init["plugins"]:
        hooks.load_plugin(path)
    pol = policy_mod.load(init["tolerances"], allow_loose_bounds=True)  # the parent checked its ceilings
    opts = RunOptions.from_dict(init["opts"])
    if opts.device == "cuda" and init.get("cuda_device") is not None:
        torch.cuda.set_device(int(init["cuda_device"]))
    yard = get_yardstick(init["yardstick"]) if init.get("yardstick") else None
    return opts, pol, yard


def worker_main(conn, init: dict[str, Any]) -> None:
    """The worker loop: start-up from `init`, then one request at a time (see the module docstring)."""
    die_with_parent()
    own_group()  # what a lowering starts here is stopped with the worker (`parity.exec.leftovers`)
    for p in reversed(init.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        opts, pol, yard = _start(init)
    except BaseException as err:  # noqa: BLE001  (reported to the parent, which raises it)
        conn.send({"error": f"worker start-up failed: {type(err).__name__}: {err}"})
        return
    conn.send({"ready": True, "pid": os.getpid()})
    _serve(conn, opts, pol, yard)


def _hook_answer(lowering: Any, hook: str, args: tuple) -> dict[str, Any]:
    """`{"value": ...}`, or `{"hook_failure": ...}` when the hook raised or exited or its answer cannot be sent."""
    value = hooks.call_here(lowering, hook, args, 0.0)
    try:
        pickle.dumps(value)
    except Exception as err:  # noqa: BLE001  (whatever a plugin's object raises when pickled)
        raise HookFailure(lowering.name, hook, f"{hook}() returned a {type(value).__name__} that cannot be sent "
                                               f"from the isolated worker ({type(err).__name__}: {err})") from None
    return {"value": value}


def _answer(msg: dict[str, Any], opts: RunOptions, pol: Any, yard: Any) -> dict[str, Any]:
    """The answer to one request (see the module docstring)."""
    import lowerings
    from parity.engine.case_run import run_case
    from parity.engine.flakiness import leave_state, probe

    lw = lowerings.get(msg["lowering"])
    if "hook" in msg:  # asked by the parent, which bounds it (`IsolatedExecutor.hook`): unbounded here
        return _hook_answer(lw, msg["hook"], tuple(msg["args"]))
    case = Case.from_json_dict(msg["case"], source="parent")
    if msg.get("leave_state"):  # parity.engine.flakiness: a history case's call, for the state it leaves
        leave_state(lw, case, opts)
        return {"done": True}
    if "probe" in msg:  # parity.engine.flakiness: identical runs compared bit for bit, here where the tensors are
        hist = [Case.from_json_dict(h, source="parent") for h in msg["probe"].get("history", [])]
        return {"probe": probe(lw, case, opts, int(msg["probe"]["runs"]), hist).to_json()}
    return {"outcome": run_case(lw, case, pol, opts, yard).to_json()}


def _serve(conn, opts: RunOptions, pol: Any, yard: Any) -> None:
    """The worker's requests, one at a time, until the parent sends None or goes away."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if msg is None:
            return
        try:
            answer = _answer(msg, opts, pol, yard)
        except HookFailure as hf:  # the lowering's hook raised, exited or hung: its failure, said by the parent
            answer = {"hook_failure": hf.to_json()}
        except Exception as err:  # the framework raised (run_case turns the lowering's own errors into failures)
            answer = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        lost = None if "hook" in msg else context_lost(opts.device)
        if lost:
            answer["context_lost"] = lost
        answer["cpu_s"] = time.process_time()
        conn.send(answer)
        if lost:  # a faulted CUDA context fails every later call: this worker is done
            return
