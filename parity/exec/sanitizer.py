"""Replay one case under PyTorch's CUDA stream sanitizer (CSAN, `torch.cuda._sanitizer`) in a fresh process.

Enabling CSAN is process-wide (a dispatch mode over every later torch op, set up when torch is imported with
`TORCH_CUDA_SANITIZER` in the environment), so `replay` starts a subprocess:

    TORCH_CUDA_SANITIZER=1 python -m parity.exec.sanitizer --lowering NAME --cases FILE.json [--plugin P.py]...

`FILE.json` holds `{"case": CASE, "history": CASE|null}`. The subprocess builds the case's inputs, calls the
lowering (after one call on the history case, when the failure depends on it), then reads everything it
returned on the current stream, as the judge does, and synchronizes. CSAN raises `CUDASanitizerErrors` at
the first access to a tensor that another stream wrote or read without synchronization; the subprocess
prints each error (the tensor, both streams, both kernels, each with its stack) between markers and exits
3; nothing found: exit 0. `replay` returns the report as text, headed by `FOUND`, `NOTHING` or
`COULD_NOT`, the format the engine reads (`parity.engine.sanitizer_report`: its `summary_line` makes the one line
attached to the failure's messages). `replay`, its plugins bound, is the engine's sanitizer port
(`parity.engine.ports.SanitizerReplay`), given to `check_lowering` by the session on CUDA.

CSAN sees accesses made through PyTorch (tensor arguments of torch ops and of custom ops registered with
torch.library, stream and event calls): a race inside one kernel, or on memory a library allocates
itself, is not seen. On a CPU (`--device cpu`, the tests) it runs the same plumbing; torch finds nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from oracle.case import Case
from parity.engine.sanitizer_report import COULD_NOT, FOUND, NOTHING, SEES, summary_line  # noqa: F401  (public here too)

BEGIN, END = "--- dflash-parity sanitizer report ---", "--- end of report ---"
EXIT_FOUND = 3


def replay(lowering: str, case: Case, history: Case | None = None, *, plugins: Sequence[str] = (),
           device: str = "cuda", timeout: float = 600.0, python: str = sys.executable) -> str:
    """The sanitizer's report on `case` (after `history`), from a fresh process (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="dflash-parity-csan-") as tmp:
        path = Path(tmp) / "cases.json"
        path.write_text(json.dumps({"case": case.to_json_dict(),
                                    "history": history.to_json_dict() if history is not None else None}))
        cmd = [python, "-m", "parity.exec.sanitizer", "--lowering", lowering, "--cases", str(path), "--device", device]
        for p in plugins:
            cmd += ["--plugin", str(Path(p).resolve())]
        try:
            proc = subprocess.run(cmd, env=replay_env(device), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"{COULD_NOT}: no answer within {timeout:g} s"
    return parse_output(proc.returncode, proc.stdout, proc.stderr)


def replay_env(device: str) -> dict[str, str]:
    """The subprocess's environment: `TORCH_CUDA_SANITIZER=1` on CUDA (torch enables CSAN as it is imported;
    a CPU build cannot), `DFLASH_PARITY_SANITIZER=1` always (what a test's fake sanitizer looks for), and this
    process's import path."""
    env = dict(os.environ, DFLASH_PARITY_SANITIZER="1")
    env.pop("TORCH_CUDA_SANITIZER", None)
    if device == "cuda":
        env["TORCH_CUDA_SANITIZER"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def parse_output(code: int, stdout: str, stderr: str) -> str:
    """The report text from the subprocess's exit code and output."""
    if BEGIN in stdout and END in stdout:
        body = stdout.split(BEGIN, 1)[1].split(END, 1)[0].strip()
        if code == EXIT_FOUND:
            return f"{FOUND}:\n{body}"
    if code == 0:
        return f"{NOTHING} ({SEES})"
    tail = " | ".join((stderr or stdout).strip().splitlines()[-6:])
    return f"{COULD_NOT}: the replay exited with code {code}: {tail[:600]}"


def _read_all(result) -> None:
    """Read every tensor the lowering returned on the current stream, as the judge does."""
    from parity.engine.result_bits import result_parts

    for t in result_parts(result).values():
        if t is not None:
            t.float().sum().item()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.exec.sanitizer", description="replay a case under CSAN")
    p.add_argument("--lowering", required=True)
    p.add_argument("--cases", required=True, metavar="FILE.json", help='{"case": CASE, "history": CASE|null}')
    p.add_argument("--plugin", action="append", default=[])
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    args = p.parse_args(argv)
    import torch

    import lowerings
    from parity.engine.invocation import RunOptions, prepare_inputs

    for plugin in args.plugin:
        lowerings.load_plugin(plugin)
    lw = lowerings.get(args.lowering)
    data = json.loads(Path(args.cases).read_text())
    opts = RunOptions(device=args.device)
    runs = [Case.from_json_dict(data["history"], source="history")] if data.get("history") else []
    runs.append(Case.from_json_dict(data["case"], source=args.cases))
    try:
        for case in runs:
            inputs, _ = prepare_inputs(lw, case, opts)
            _read_all(lw.run(inputs))
        if args.device == "cuda":
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001  (CSAN's error, or the lowering's own)
        errors = getattr(err, "errors", None)
        if type(err).__name__ != "CUDASanitizerErrors" or not errors:
            raise
        print(BEGIN)
        print("\n".join(str(e) for e in errors))
        print(END, flush=True)
        return EXIT_FOUND
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
