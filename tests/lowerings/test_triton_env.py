"""Triton's interpreter decided before anything imports `triton.language` (`lowerings._triton_env`).

`torch._dynamo` imports `triton.language`; where that came before `TRITON_INTERPRET` was set, Triton's helpers
(`tl.zeros`, ...) were decorated as compiled-mode functions and every case of an interpreted kernel failed with
"Cannot call @triton.jit'd outside of the scope of a kernel": hybrid_paged after windowed_merge[compiled] in one
CPU process, and in every `check --jobs --no-isolate` child on CPU (the prefork preloads torch._dynamo). A false
alarm on a correct lowering. The test session sets TRITON_INTERPRET itself (conftest.py), which hid it: each check
here runs in a fresh process without it. Where no GPU is possible, no CUDA is touched to decide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lowerings import _triton_env
from tests.devices import TRITON_COMPILED

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(TRITON_COMPILED, reason="the interpreter's order of imports matters only without a GPU")


def _run(args: list[str], tmp_path: Path, code: str | None = None) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    report = tmp_path / "report"
    argv = ["check", "--device", "cpu", "--max-examples", "3", "--no-hardening", "--quiet", "--report", str(report),
            *args]
    if code is None:
        cmd = [sys.executable, "-m", "parity.front.cli", *argv]
    else:  # something of the caller's imported first
        cmd = [sys.executable, "-c", f"{code}\nfrom parity import cli\nraise SystemExit(cli.main({argv!r}))"]
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    data = json.loads((report / "parity.json").read_text()) if (report / "parity.json").is_file() else {}
    return res.returncode, {name: e for name, e in data.get("lowerings", {}).items()} or {"stderr": res.stderr}


def test_an_interpreted_kernel_after_a_torch_compile_in_one_process_passes(tmp_path):
    code, lowerings = _run(["--lowering", "windowed_merge[compiled]", "--lowering", "hybrid_paged",
                            "--no-isolate"], tmp_path)
    assert code == 0 and lowerings["hybrid_paged"]["status"] == "pass", lowerings


def test_forked_jobs_children_run_interpreted_kernels(tmp_path):
    code, lowerings = _run(["--lowering", "hybrid_paged", "--lowering", "sdpa", "--jobs", "2", "--no-isolate"],
                           tmp_path)
    assert code == 0 and lowerings["hybrid_paged"]["status"] == "pass", lowerings


def test_triton_imported_too_early_by_the_caller_makes_the_kernels_unavailable_not_failing(tmp_path):
    code, lowerings = _run(["--lowering", "hybrid_paged", "--lowering", "sdpa", "--no-isolate"], tmp_path,
                           code="import torch._dynamo  # imports triton.language")
    hybrid = lowerings["hybrid_paged"]
    assert code == 0 and hybrid["status"] == "unavailable", lowerings
    assert "imported in this process before TRITON_INTERPRET was set" in hybrid["reason"]


@pytest.mark.parametrize("visible, driver, expected", [("", True, True), ("-1", True, True), (None, False, True),
                                                       ("0", True, False), (None, True, False)])
def test_no_gpu_is_decided_without_touching_cuda(monkeypatch, visible, driver, expected):
    import ctypes

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)

    def cdll(name):
        if not driver:
            raise OSError(f"{name}: cannot open shared object file")
        return object()

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    assert _triton_env.no_gpu_here() is expected
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _triton_env.interpret_where_no_gpu()
    assert (os.environ.get("TRITON_INTERPRET") == "1") is expected
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the user's choice is never overridden
    _triton_env.interpret_where_no_gpu()
    assert os.environ["TRITON_INTERPRET"] == "0"
