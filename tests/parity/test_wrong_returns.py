"""Issue 49, item 4: every crash is the lowering's own. A hook answering the wrong type, and a `run()` result with a
tensor on the wrong device (`meta`), of the wrong shape, dtype or type, or a malformed partial, fail that lowering
with a message naming the hook or the field and what was expected; the lowerings after it are checked in full.

Before, an output or LSE on `meta`, `expected_calls()` returning None, `case_limits()` returning a dict, an
unhashable `compile_family()`, partials that are not a dict, ... raised a traceback out of the judge and ended the
run (the later lowerings never checked, the finished ones only in `parity.partial.json`); `supports()` returning
True or False was read as a reason or as "supported", `available()` returning `(1, "")` as available, a partial's
`lse_base` 10 as natural log, and a malformed `dispatch_boundaries()` or partial window was "bad input" (exit 2).

One `check` runs every row's lowering (in process, for speed), `context` after them, and each row is read from its
report; the rows that crashed inside the isolated worker before (a `WorkerError` that ended the run) run again
isolated. Each checker of `parity.engine.answers` is also shown to accept what the protocol allows.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import lowerings
from lowerings import registry
from parity.engine import answers
from parity.engine.hardening import kernel_name_failures
from parity.exec.hooks import HookFailure
from parity.exec.warmup import warm_up_lowering
from strategies import limit_overrides, limits_for
from tests.cli_runs import run
from tests.parity.test_bad_inputs import GOOD, QUICK, quick_cases, write

HEAD = """import math, torch
from lowerings import register
from lowerings.protocol import LoweringResult, Partial
from lowerings.torch_emulation import Sdpa
"""


def _hook(name: str, args: str, value: str) -> str:
    return f"    def {name}(self{', ' if args else ''}{args}):\n        return {value}\n"


def _result(expr: str) -> str:
    return f"    def run(self, inputs):\n        r = super().run(inputs)\n        return {expr}\n"


SUPPORTS = "expected None (supported) or the reason it is not (a non-empty string)"
CALLS = "expected a dict {kernel call name (str): count (int >= 0)}"
FAMILY = "expected a tuple of hashable values (the shape family"
KFAMS = "expected a dict {call (str): kernel-name substring (a non-empty str)}"
PART = "LoweringResult(r.out, r.lse, {{'a': Partial({})}})"

# (row, method(s) overriding the sdpa yardstick's, how the lowering's failure reads)
HOOK_ROWS = [
    ("available_int", _hook("available", "device", "(1, '')"), "available() returned (1, ''), expected (bool, str)"),
    ("available_none", _hook("available", "device", "None"), "available() returned None, expected (bool, str)"),
    ("supports_true", _hook("supports", "case", "True"), f"supports() returned True, {SUPPORTS}"),
    ("supports_false", _hook("supports", "case", "False"), f"supports() returned False, {SUPPORTS}"),
    ("supports_empty", _hook("supports", "case", "''"), f"supports() returned '', {SUPPORTS}"),
    ("supports_list", _hook("supports", "case", "['no']"), f"supports() returned ['no'], {SUPPORTS}"),
    ("calls_none", _hook("expected_calls", "case", "None"), f"expected_calls() returned None, {CALLS}"),
    ("calls_list", _hook("expected_calls", "case", "[]"), f"expected_calls() returned [], {CALLS}"),
    ("calls_str_count", _hook("expected_calls", "case", "{'torch.sdpa': '1'}"),
     f"expected_calls() returned {{'torch.sdpa': '1'}}, {CALLS}"),
    ("calls_negative", _hook("expected_calls", "case", "{'torch.sdpa': -1}"),
     f"expected_calls() returned {{'torch.sdpa': -1}}, {CALLS}"),
    ("limits_str", _hook("case_limits", "device", "'abc'"),
     "case_limits() returned 'abc', expected None or a strategies.Limits"),
    ("limits_dict", _hook("case_limits", "device", "{'max_batch': 2}"),
     "case_limits() returned {'max_batch': 2}, expected None or a strategies.Limits"),
    ("boundaries_none", _hook("dispatch_boundaries", "", "None"),
     "dispatch_boundaries() returned None, expected a dict {field: (int, ...)} with fields in"),
    ("boundaries_str", _hook("dispatch_boundaries", "", "{'batch_size': 'a'}"),
     "dispatch_boundaries() returned {'batch_size': 'a'}, expected for batch_size: one or more integers >= 1"),
    ("family_none", _hook("compile_family", "case", "None"), f"compile_family() returned None, {FAMILY}"),
    ("family_unhashable", _hook("compile_family", "case", "([1],)"), f"compile_family() returned ([1],), {FAMILY}"),
    ("kernel_families_none", _hook("kernel_families", "case", "None"), f"kernel_families() returned None, {KFAMS}"),
]
RESULT_ROWS = [
    ("run_tuple", _result("(r.out, r.lse)"), "run_tuple.run returned tuple, expected LoweringResult"),
    ("out_meta", _result("LoweringResult(r.out.to('meta'), r.lse)"),
     "out_meta: out is on device meta, expected the inputs' device cpu"),
    ("lse_meta", _result("LoweringResult(r.out, r.lse.to('meta'))"),
     "lse_meta: lse is on device meta, expected the inputs' device cpu"),
    ("out_numpy", _result("LoweringResult(r.out.float().numpy(), r.lse)"),
     "out_numpy: out is of type ndarray, expected a torch.Tensor"),
    ("out_shape", _result("LoweringResult(r.out[..., :1], r.lse)"), "out_shape: out has shape ("),
    ("out_sparse", _result("LoweringResult(r.out.to_sparse(), r.lse)"),
     "out_sparse: out has layout torch.sparse_coo, expected a dense (strided) tensor"),
    ("lse_int", _result("LoweringResult(r.out, r.lse.long())"),
     "lse_int: lse has dtype torch.int64, expected a floating-point dtype"),
    ("lse_float", _result("LoweringResult(r.out, 1.0)"), "lse_float: lse is of type float, expected a torch.Tensor"),
    ("lse_shape", _result("LoweringResult(r.out, r.lse[..., None])"), "lse_shape: lse has shape"),
    ("partials_none", _result("LoweringResult(r.out, r.lse, None)"),
     "partials_none: partials is of type NoneType, expected a dict {name: Partial}"),
    ("partial_str", _result("LoweringResult(r.out, r.lse, {'a': 'x'})"),
     "partial_str: partials['a'] is of type str, expected a lowerings.protocol.Partial"),
    ("partial_meta", _result(PART.format("r.out.to('meta'), r.lse, math.e")),
     "partial_meta: partials['a'].out is on device meta, expected the inputs' device cpu"),
    ("partial_base", _result(PART.format("r.out, r.lse, 10.0")),
     "partial_base: partials['a'].lse_base is 10.0, expected math.e or 2.0"),
    ("partial_window", _result(PART.format("r.out, r.lse, math.e, window='x'")),
     "partial_window: partials['a'].window is 'x', expected None or a pair (left, right) of integers >= -1"),
    ("partial_mask", _result(PART.format("r.out, r.lse, math.e, key_mask=torch.ones(1)")),
     "partial_mask: partials['a'].key_mask is a torch.float32 tensor on cpu, expected a boolean tensor"),
]
# The rows that crashed in the isolated worker before (a WorkerError ended the run), checked isolated too.
ISOLATED = ("out_meta", "lse_meta", "calls_none", "kernel_families_none", "partials_none")
TINY = limit_overrides([QUICK[i + 1] for i, a in enumerate(QUICK) if a == "--limit"])


def plugin_text(rows) -> str:
    out = [HEAD]
    for name, body, _ in rows:
        out.append(f"class P_{name}(Sdpa):\n    name = {name!r}\n{body}\n\nregister(P_{name}())\n\n")
    return "".join(out)


def checked(tmp_path_factory, rows, isolated: bool) -> dict:
    """One `check` of every row's lowering, then `context`: the exit code and the report."""
    t = tmp_path_factory.mktemp("wrong_returns")
    plugin = write(t / "wrong_returns.py", plugin_text(rows))
    argv = ["check", "--plugin", plugin, *[a for name, _, _ in rows for a in ("--lowering", name)],
            "--lowering", "context", "--report", t / "r", *QUICK, "--draw-ahead", "off"]
    with registry.restored():
        code, out, err = run(argv + ([] if isolated else ["--no-isolate"]))
    assert "Traceback" not in out + err, out + err
    return {"code": code, "out": out + err, "report": json.loads((t / "r" / "parity.json").read_text())}


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    return checked(tmp_path_factory, HOOK_ROWS + RESULT_ROWS, isolated=False)


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    return checked(tmp_path_factory, [r for r in HOOK_ROWS + RESULT_ROWS if r[0] in ISOLATED], isolated=True)


def _failure_of(report: dict, name: str) -> str:
    """The lowering's first failure: its note (a hook's answer) or its first failing case's first message."""
    v = report["lowerings"][name]
    assert v["status"] == "fail", (name, v)
    return v["failures"][0]["failures"][0] if v["failures"] else v["notes"][0]


def _next_lowering_checked(run_: dict) -> None:
    assert run_["code"] == 1, run_["out"]
    ctx = run_["report"]["lowerings"]["context"]
    assert ctx["status"] == "pass" and ctx["cases"] == quick_cases("context"), ctx


@pytest.mark.parametrize("name", ISOLATED)
def test_a_wrong_result_fails_its_lowering_only_in_the_isolated_worker_too(isolated, name):
    message = next(m for n, _, m in HOOK_ROWS + RESULT_ROWS if n == name)
    assert _failure_of(isolated["report"], name).startswith(message), _failure_of(isolated["report"], name)
    assert "WorkerError" not in isolated["out"]
    _next_lowering_checked(isolated)


@pytest.mark.parametrize("name,message", [(r[0], r[2]) for r in HOOK_ROWS + RESULT_ROWS],
                         ids=[r[0] for r in HOOK_ROWS + RESULT_ROWS])
def test_a_wrong_answer_or_result_fails_its_lowering_only(in_process, name, message):
    assert _failure_of(in_process["report"], name).startswith(message), _failure_of(in_process["report"], name)
    _next_lowering_checked(in_process)


def test_an_error_no_check_foresaw_fails_its_lowering_only(tmp_path, monkeypatch):
    """The last line of defence: an exception from the framework itself while checking one lowering (here planted
    in the judge) fails that lowering, named, and the run goes on; bad input still ends it with exit 2."""
    from parity.engine import case_run

    real = case_run.judge_result

    def judge(lowering, *args, **kwargs):
        if lowering.name == "sdpa":
            raise RuntimeError("a judge that trips")
        return real(lowering, *args, **kwargs)

    monkeypatch.setattr(case_run, "judge_result", judge)
    code, out, err = run(["check", "--lowering", "sdpa", "--lowering", "context", "--report", tmp_path, "--no-isolate",
                          *QUICK])
    assert code == 1 and "Traceback" not in out + err, out + err
    data = json.loads((tmp_path / "parity.json").read_text())
    assert data["lowerings"]["sdpa"]["notes"][0].startswith(
        "the check of this lowering stopped on an error the framework did not foresee, after 0 case(s): "
        "RuntimeError: a judge that trips ("), data["lowerings"]["sdpa"]["notes"]
    assert data["lowerings"]["context"]["status"] == "pass"
    assert data["lowerings"]["context"]["cases"] == quick_cases("context")


def test_forbidden_kernel_families_of_the_wrong_type_is_the_lowerings_failure():
    """`forbidden_kernel_families` is read on CUDA only (a profiled case): its answer is checked all the same."""
    class Bad(type(lowerings.get("sdpa"))):
        name = "bad_forbidden"

        def kernel_families(self, case):
            return {"torch.sdpa": "sdpa"}

        def forbidden_kernel_families(self, case):
            return {"fa2": ""}  # an empty substring matches every kernel: a check that cannot fail

    with pytest.raises(HookFailure, match=r"forbidden_kernel_families\(\) returned \{'fa2': ''\}, expected a dict"):
        kernel_name_failures(Bad(), GOOD, ["sdpa_kernel"])


def test_jit_modules_of_the_wrong_type_is_the_lowerings_failure():
    """`jit_modules` is read by the warm-up (`--warm-up`), which `check` runs before the lowering's cases: a hook
    failure there fails the lowering (`parity.front.session.CheckSession.check`)."""
    class Bad(type(lowerings.get("sdpa"))):
        name = "bad_jit_modules"

        def jit_modules(self, case):
            return 5

    with pytest.raises(HookFailure, match=r"jit_modules\(\) returned 5, expected a tuple of module keys"):
        warm_up_lowering(Bad(), "cpu", None, limits_for(lowerings.get("sdpa"), "cpu", overrides=TINY))


@pytest.mark.parametrize("checker,good,bad", [
    (answers.supports_answer, [None, "too long"], [True, False, "", 0, ["x"]]),
    (answers.available_answer, [(True, ""), [False, "no GPU"]], [(1, ""), ("yes", ""), (True,), None, (True, None)]),
    (answers.expected_calls_answer, [{}, {"k": 0}, {"k": 2}], [None, [], {"k": "1"}, {"k": -1}, {"k": True}, {"": 1}]),
    (answers.compile_family_answer, [(), (1, "a", (2, 3)), [1, 2]], [None, 5, ([1],), ({},)]),
    (answers.kernel_families_answer, [{}, {"k": "sub"}], [None, {"k": ""}, {"k": 1}, [("k", "s")]]),
    (answers.jit_modules_answer, [(), ("m",), ["m", "n"]], [None, "m", (1,), ("",)]),
])
def test_each_answer_checker_accepts_the_protocol_and_refuses_the_rest(checker, good, bad):
    assert [checker(v) for v in good] == [None] * len(good)
    assert all(isinstance(checker(v), str) for v in bad), [(v, checker(v)) for v in bad]


def test_a_result_the_judge_can_read_passes_the_result_check():
    """The check refuses nothing the protocol allows: a correct result with a partial over a window, a right
    bound and a key mask broadcastable to [B, K, Hq, T]."""
    from lowerings.protocol import LoweringResult, Partial
    from oracle.inputs import materialize

    lw = lowerings.get("sdpa")
    inputs = materialize(GOOD, "cpu")
    r = lw.run(inputs)
    mask = torch.ones(1, 1, 1, GOOD.max_keys, dtype=torch.bool)
    res = LoweringResult(r.out, r.lse, {"b": Partial(r.out, r.lse, math.e, window=(2, 0), future_block_keys_right=1,
                                                     key_mask=mask),
                                        "c": Partial(r.out.float(), r.lse.double(), 2.0)})
    assert answers.result_problem(lw, inputs, res) is None
    assert answers.result_problem(lw, inputs, LoweringResult(r.out, r.lse)) is None
