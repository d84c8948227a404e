"""`parity.front.cuda_context`: a dead CUDA context is named in the report of the test during which it died and of
every later failure in that process, on the CPU with a stand-in for torch.cuda (a pytester session)."""

from __future__ import annotations

import torch

from parity.front.cuda_context import CudaContextWatch, context_error
from tests.plugin_runs import assert_outcomes, runpytest

pytest_plugins = ["pytester"]

# The inner session's torch.cuda: initialized, and its synchronize raising once a test "faulted".
CONFTEST = '''
import torch

DEAD = []
torch.cuda.is_initialized = lambda: True


def _synchronize(*args, **kwargs):
    if DEAD:
        raise RuntimeError("CUDA error: device-side assert triggered\\nmore lines")


torch.cuda.synchronize = _synchronize
'''

TESTS = '''
from conftest import DEAD


def test_a_before(USES):
    pass


def test_b_faults(USES):
    DEAD.append(1)
    assert False, "the kernel's own failure"


def test_c_later_fails(USES):
    assert False, "an unrelated line"


def test_d_later_passes(USES):
    pass
'''


def _run(pytester, uses: str):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_ctx=TESTS.replace("USES", uses))
    return runpytest(pytester, "-p", "no:cacheprovider")


def test_the_test_that_killed_the_context_is_named_in_every_later_failure(pytester):
    res = _run(pytester, "parity_device")  # a parity fixture: the session uses the plugin
    assert_outcomes(res, passed=2, failed=2)
    out = res.stdout.str()
    assert "dflash-parity: CUDA context" in out
    assert ("the CUDA context of this process died during this test (RuntimeError: CUDA error: device-side "
            "assert triggered)") in out
    assert ("already dead when this test started: it died during test_ctx.py::test_b_faults (RuntimeError: "
            "CUDA error: device-side assert triggered)") in out
    assert out.count("dflash-parity: CUDA context") == 2  # the two failures; nothing on the passing tests


def test_a_suite_that_does_not_use_the_plugin_is_left_alone(pytester):
    res = _run(pytester, "tmp_path")
    assert_outcomes(res, passed=2, failed=2)
    assert "CUDA context" not in res.stdout.str()


def test_the_probe_never_initializes_cuda_and_a_recovered_probe_is_forgotten():
    """On a process that made no CUDA call the probe says nothing (and initializes nothing); a context seen
    dead and then alive again was not dead (a stand-in), and is not blamed for later failures."""
    before = torch.cuda.is_initialized()
    assert context_error() is None or before
    assert torch.cuda.is_initialized() == before
    answers = iter(["RuntimeError: boom", None, None, None])
    watch = CudaContextWatch(probe=lambda: next(answers))

    class Item:
        nodeid = "t.py::test_later"

    watch._check("during t.py::test_x", "t.py::test_x")
    assert watch.died == "during t.py::test_x"
    watch.pytest_runtest_setup(Item())
    assert watch.died is None and "t.py::test_later" not in watch.dead_before
