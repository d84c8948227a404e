"""JIT warm-up (parity/exec/warmup.py) and its pytest wiring (`--parity-warm-up`, ini `parity_warm_up`; the old
`--dflash-warmup`, ini `dflash_warmup`), on a CPU with fake lowerings: plain objects following the protocol."""

from __future__ import annotations

import math
import time
import types

import pytest
import torch

from lowerings.protocol import LoweringResult
from parity.front import pytest_plugin as plug
from parity.exec.warmup import Variant, plan_warmup, tiny_case, warm_up
from strategies import Limits
from tests.plugin_runs import assert_outcomes, plugin_args, runpytest

pytest_plugins = ["pytester"]

SMALL = Limits(dtypes=("bfloat16",), kv_dtypes=("same",), head_dims=(64,))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Fake:
    """A lowering following the protocol; `run` costs `cost` seconds of `clock` (or sleeps `sleep`)."""

    devices = ("cpu", "cuda")
    lse_base = math.e
    deterministic = True
    max_compiles = None

    def __init__(self, name, *, clock=None, cost=0.0, sleep=0.0, fail=None, windows=True, ok=True, limits=SMALL):
        self.name, self.clock, self.cost, self.sleep, self.fail = name, clock, cost, sleep, fail
        self.windows, self.ok, self.limits = windows, ok, limits
        self.calls: list = []

    def available(self, device):
        return (True, "") if self.ok else (False, "needs a GPU it does not have")

    def supports(self, case):
        return None if self.windows or case.window[0] == -1 else "no sliding windows"

    def expected_calls(self, case):
        return {}

    def case_limits(self, device):
        return self.limits

    def run(self, inputs):
        self.calls.append(inputs.case)
        if self.clock is not None:
            self.clock.now += self.cost
        if self.sleep:
            time.sleep(self.sleep)
        if self.fail:
            raise RuntimeError(self.fail)
        return LoweringResult(out=torch.zeros_like(inputs.q), lse=None)


class FakeModules(Fake):
    """A lowering that names the JIT modules a case loads (keys shared across lowerings de-duplicate)."""

    def __init__(self, name, modules, **kw):
        super().__init__(name, **kw)
        self.modules = modules

    def jit_modules(self, case):
        return self.modules(case)


def win(case) -> str:
    return "window" if case.window[0] != -1 else "no-window"


# --------------------------------------------------------------------------------------------------
# warm_up
# --------------------------------------------------------------------------------------------------


def test_progress_lines_and_timing():
    clock = FakeClock()
    a = Fake("fake_a", clock=clock, cost=94.1)
    lines: list[str] = []
    rep = warm_up([a], None, "cpu", lines.append, clock=clock)
    # One run per (bf16, D=64, window off/on); the B=33 form has the same key: de-duplicated.
    assert lines == [
        "warm-up 1/2: fake_a bf16 D=64 no-window ...",
        "warm-up 1/2: fake_a bf16 D=64 no-window ... 94.1 s",
        "warm-up 2/2: fake_a bf16 D=64 window ...",
        "warm-up 2/2: fake_a bf16 D=64 window ... 94.1 s",
    ]
    assert [u.seconds for u in rep.units] == [pytest.approx(94.1), pytest.approx(94.1)]
    assert rep.seconds == pytest.approx(188.2) and rep.ok and rep.deduplicated == 2
    assert len(a.calls) == 2 and [c.window[0] != -1 for c in a.calls] == [False, True]
    assert rep.lines()[-1].startswith("warm-up on cpu: 2/2 runs, 2 module(s) loaded in 188.2 s")


def test_real_clock_captures_the_time():
    a = Fake("slow", sleep=0.05, windows=False)
    rep = warm_up([a], None, "cpu", None)
    assert len(rep.units) == 1 and rep.units[0].seconds >= 0.05
    assert rep.units[0].line().startswith("warm-up 1/1: slow bf16 D=64 no-window ... ")


def test_module_keys_deduplicate_across_lowerings():
    ctx = FakeModules("ctx", lambda c: ("page", f"fa2 {win(c)}"))
    rows = FakeModules("rows", lambda c: ("page", "fa2 no-window" if c.batch_size > 32 else "decode no-window"),
                       windows=False)
    tc = FakeModules("rows_tc", lambda c: ("page", "fa2 no-window"), windows=False)
    eager = FakeModules("merge_eager", lambda c: ())  # loads nothing of its own: nothing to warm
    units, not_warmed, skipped = plan_warmup([ctx, rows, tc, eager], SMALL, "cpu")
    assert [(u.name, u.variant.window, u.keys, u.case.batch_size) for u in units] == [
        ("ctx", False, ("page", "fa2 no-window"), 1),
        ("ctx", True, ("fa2 window",), 1),
        ("rows", False, ("decode no-window",), 1),
    ]
    assert not_warmed == [] and skipped == 5  # ctx B=33 x2, rows B=33 (fa2 warm), rows_tc x2
    rep = warm_up([ctx, rows, tc, eager], SMALL, "cpu", None)
    assert (len(ctx.calls), len(rows.calls), len(tc.calls), len(eager.calls)) == (2, 1, 0, 0)
    assert rep.deduplicated == 5 and "5 run(s) skipped, their modules already warm" in rep.lines()[-1]


def test_a_failing_module_is_reported_and_the_warmup_goes_on():
    bad = FakeModules("bad", lambda c: (f"fa3 {win(c)}",), fail="nvcc exited with 1\nlong build log ...")
    good = Fake("good", windows=False)
    lines: list[str] = []
    rep = warm_up([bad, good], None, "cpu", lines.append)
    assert [u.name for u in rep.units] == ["bad", "bad", "good"] and len(good.calls) == 1
    assert not rep.ok and len(rep.failures) == 2
    assert "warm-up 1/3: bad bf16 D=64 no-window ... could not load: fa3 no-window: RuntimeError: nvcc exited " \
           "with 1 (test_warmup.py:" in lines[1]
    assert "long build log" not in "\n".join(lines)  # the first line only
    text = "\n".join(rep.lines())
    assert "could not load: fa3 window: RuntimeError: nvcc exited with 1" in text
    assert text.splitlines()[-1].endswith("2 FAILED to load")
    assert lines[-1].startswith("warm-up 3/3: good bf16 D=64 no-window ... ")


def test_unavailable_and_unsupported_lowerings_are_reported():
    gone = Fake("gone", ok=False)
    never = Fake("never", limits=Limits(dtypes=("bfloat16",), kv_dtypes=("same",), head_dims=(64,)))
    never.supports = lambda case: "nothing at all"
    lines: list[str] = []
    rep = warm_up([gone, never], None, "cpu", lines.append)
    assert rep.units == [] and rep.ok
    assert rep.not_warmed == [("gone", "cannot run on cpu: needs a GPU it does not have"),
                              ("never", "supports none of the warm-up variants (its limits' dtypes, kv dtypes, "
                                        "head dims, window on/off)")]
    assert lines == [f"warm-up: not warmed: {n}: {w}" for n, w in rep.not_warmed]


def test_cases_or_limits_forms():
    a = Fake("a", windows=False)
    # Explicit cases: their variants, whatever the lowering's own limits say.
    case = tiny_case(Variant("float16", "float16", 128, False), "causal", None)
    units, _, _ = plan_warmup([a], [case, case], "cpu")
    assert [u.variant for u in units] == [Variant("float16", "float16", 128, False)]
    # One Limits for all, and a dict by lowering name (others keep their own limits).
    two = Limits(dtypes=("bfloat16", "float16"), kv_dtypes=("same",), head_dims=(64,))
    units, _, _ = plan_warmup([a], two, "cpu")
    assert [u.variant.dtype for u in units] == ["bfloat16", "float16"]
    b = Fake("b", windows=False)
    units, _, _ = plan_warmup([a, b], {"a": two}, "cpu")
    assert [(u.name, u.variant.dtype) for u in units] == [("a", "bfloat16"), ("a", "float16"), ("b", "bfloat16")]


def test_flashinfer_adapters_plan_one_run_per_module(monkeypatch):
    from lowerings import flashinfer as fp

    adapters = [a for a in fp.adapters() if not a.name.startswith("trtllm")]
    for a in adapters:
        monkeypatch.setattr(a, "available", lambda device: (True, ""))
    narrow = Limits(dtypes=("bfloat16",), kv_dtypes=("same",), head_dims=(128,))  # --limit: bf16, D=128 only
    units, not_warmed, skipped = plan_warmup(adapters, narrow, "cuda")
    got = [(u.name, u.variant.describe(), u.keys) for u in units]
    page = fp.M_PAGE
    assert got == [
        ("context[flashinfer-fa2]", "bf16 D=128 no-window", (page, "flashinfer fa2 bf16 D=128 no-window")),
        ("context[flashinfer-fa2]", "bf16 D=128 window", ("flashinfer fa2 bf16 D=128 window",)),
        ("context[flashinfer-fa3]", "bf16 D=128 no-window", ("flashinfer fa3 bf16 D=128 no-window",)),
        ("context[flashinfer-fa3]", "bf16 D=128 window", ("flashinfer fa3 bf16 D=128 window",)),
        ("decode_rows[flashinfer]", "bf16 D=128 no-window", ("flashinfer decode bf16 D=128 no-window",)),
        ("windowed_merge[flashinfer-eager]", "bf16 D=128 window", ("flashinfer decode bf16 D=128 window",)),
        ("windowed_merge[flashinfer-compiled]", "bf16 D=128 no-window", ("torch.compile merge_unrolled (inductor)",)),
        ("windowed_merge[flashinfer-triton]", "bf16 D=128 no-window", ("triton merge_future_block_keys D=128",)),
        ("windowed_merge[flashinfer-merge_state]", "bf16 D=128 no-window", (fp.M_CASCADE,)),
    ]
    assert not_warmed == [] and skipped > 0


def test_flashinfer_default_limits_warm_fp8_fp16_and_head_dim_64(monkeypatch):
    """The adapters' own CUDA limits (case_limits: bf16/fp16, bf16/fp16/fp8 KV, D = 64 and 128): the warm-up
    loads every module those cases need, fp8 decode and fa2 prefill modules among them, and no fp8 fa3 one
    (flashinfer's fa3 has no bf16/fp16-query x fp8-KV kernel; fa3 declines those cases)."""
    from lowerings import flashinfer as fp

    adapters = [a for a in fp.adapters() if not a.name.startswith("trtllm")]
    for a in adapters:
        monkeypatch.setattr(a, "available", lambda device: (True, ""))
    units, not_warmed, _ = plan_warmup(adapters, None, "cuda")
    keys = {k for u in units for k in u.keys}
    for kernel in ("decode", "fa2"):
        for dt in ("bf16", "fp16", "bf16/fp8", "fp16/fp8"):
            for d in (64, 128):
                for w in ("window", "no-window"):
                    assert f"flashinfer {kernel} {dt} D={d} {w}" in keys, (kernel, dt, d, w)
    assert not any(k.startswith("flashinfer fa3") and "fp8" in k for k in keys)
    assert {f"flashinfer fa3 {dt} D={d} {w}" for dt in ("bf16", "fp16") for d in (64, 128)
            for w in ("window", "no-window")} <= keys
    assert not_warmed == []


# --------------------------------------------------------------------------------------------------
# pytest plugin helpers
# --------------------------------------------------------------------------------------------------


def test_session_lowerings():
    def item(name):
        return types.SimpleNamespace(callspec=types.SimpleNamespace(params={"parity_lowering": name}))

    items = [item("b"), item("a"), item("b"), types.SimpleNamespace(), item(None)]
    assert plug.session_lowerings(items, ["c", "a"]) == ["b", "a", "c"]
    import lowerings
    assert plug.session_lowerings([types.SimpleNamespace()], []) == lowerings.names()


# --------------------------------------------------------------------------------------------------
# The plugin wiring, as another repository sees it (subprocess: the installed entry point)
# --------------------------------------------------------------------------------------------------

PLUGIN = '''
import math, time
import torch
from lowerings import LoweringResult, register
from strategies import Limits


class Fake:
    devices = ("cpu",)
    lse_base = math.e
    deterministic = True
    max_compiles = None

    def __init__(self, name, fail=False):
        self.name, self.fail = name, fail

    def available(self, device):
        return (True, "")

    def supports(self, case):
        return None if case.window[0] == -1 else "no windows"

    def expected_calls(self, case):
        return {}

    def case_limits(self, device):
        return Limits(dtypes=("bfloat16",), kv_dtypes=("same",), head_dims=(64,))

    def jit_modules(self, case):
        return (f"module of {self.name}",)

    def run(self, inputs):
        time.sleep(0.02)
        if self.fail:
            raise RuntimeError("nvcc fatal: cannot build " + self.name + "\\nthe rest of the log")
        return LoweringResult(out=torch.zeros_like(inputs.q), lse=None)


register(Fake("warm_ok"))
register(Fake("warm_bad", fail=True))
'''

TESTS = '''
def test_lowering(parity_lowering):
    assert parity_lowering.name.startswith("warm_")
'''


def test_plugin_option_warms_up_before_the_tests(pytester):
    pytester.makepyfile(plugin_fakes=PLUGIN, test_other_repo=TESTS)
    res = runpytest(pytester, "--parity-plugin", "plugin_fakes.py", "--parity-lowering", "warm_ok", "--parity-lowering",
                    "warm_bad", "--parity-device", "cpu", "--parity-warm-up", "-p", "no:cacheprovider")
    assert_outcomes(res, passed=2)
    out = res.stdout.str()
    # Progress before the first test, then the report in the terminal summary.
    assert out.index("warm-up 1/2: warm_ok bf16 D=64 no-window ...") < out.index("test_other_repo.py")
    res.stdout.fnmatch_lines([
        "*dflash-parity JIT warm-up*",
        "warm-up 1/2: warm_ok bf16 D=64 no-window ... *s",
        "warm-up 2/2: warm_bad bf16 D=64 no-window ... could not load: module of warm_bad: RuntimeError: "
        "nvcc fatal: cannot build warm_bad*",
        "could not load: module of warm_bad: RuntimeError: nvcc fatal: cannot build warm_bad*",
        "warm-up on cpu: 1/2 runs, 1 module(s) loaded in *1 FAILED to load",
    ])
    assert "the rest of the log" not in out


def test_plugin_option_and_ini_are_registered(pytester):
    import warnings

    load = plugin_args()  # the entry point, or -p where the package is not installed

    def enabled(*args):
        cfg = pytester.parseconfig(*load, *args, "-p", "no:cacheprovider")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the old spellings' deprecation warnings
            return plug.warmup_enabled(cfg)

    assert enabled("--parity-warm-up") and enabled("--dflash-warmup") and not enabled()
    pytester.makeini("[pytest]\nparity_warm_up = true\n")
    assert enabled()
    pytester.makeini("[pytest]\ndflash_warmup = true\n")
    assert enabled()


def _config(**settings):
    """A pytest config as the plugin sees it, its session already using the plugin with these settings."""
    from parity.front.config import CheckConfig

    cfg = types.SimpleNamespace(option=types.SimpleNamespace(collectonly=False), stash=pytest.Stash(),
                                pluginmanager=types.SimpleNamespace(get_plugin=lambda name: None))
    state = plug.ps.state(cfg)
    state.used = True
    state.check_config = CheckConfig(**{"warm_up": True, "device": "cpu", "report": None, **settings})
    return cfg


def test_xdist_worker_reports_through_workeroutput_and_the_controller_prints_it(monkeypatch):
    import lowerings

    fakes = {"ok": Fake("ok", windows=False), "bad": Fake("bad", windows=False, fail="cannot load\nmore")}
    monkeypatch.setattr(lowerings, "get", lambda name: fakes[name])
    # Worker side: collection finished, the warm-up runs, its report goes into workeroutput.
    worker = _config(lowerings=("ok", "bad"))
    worker.workeroutput, worker.workerinput = {}, {"workerid": "gw0", "workercount": 2}
    plug.pytest_collection_finish(types.SimpleNamespace(config=worker, items=[]))
    data = worker.workeroutput[plug.WARMUP_KEY]
    assert data["device"] == "cpu" and [u["lowering"] for u in data["units"]] == ["ok", "bad"]
    assert len(fakes["ok"].calls) == 1
    # Controller side: the node goes down with its workeroutput; the summary prints every worker's lines.
    controller = _config()
    for wid in ("gw1", "gw0"):
        node = types.SimpleNamespace(workeroutput={plug.WARMUP_KEY: data}, gateway=types.SimpleNamespace(id=wid),
                                     config=controller)
        plug.pytest_testnodedown(node, None)
    plug.pytest_testnodedown(types.SimpleNamespace(workeroutput={}, config=controller), None)  # no report
    written: list[tuple[str, bool]] = []
    tr = types.SimpleNamespace(write_sep=lambda sep, title: written.append((title, False)),
                               write_line=lambda line, red=False: written.append((line, red)))
    plug.pytest_terminal_summary(tr, 0, controller)
    assert written[0] == ("dflash-parity JIT warm-up", False)
    lines = [w[0] for w in written[1:]]
    assert lines[0].startswith("[gw0] warm-up 1/2: ok bf16 D=64 no-window ... ")
    assert any(line.startswith("[gw1] could not load: bad bf16 D=64 no-window: RuntimeError: cannot load")
               and red for line, red in written)
    per_worker = [sum(1 for line in lines if line.startswith(f"[{w}] ")) for w in ("gw0", "gw1")]
    assert per_worker[0] == per_worker[1] == len(data["lines"])


def test_collect_only_and_disabled_sessions_do_not_warm_up(monkeypatch):
    import lowerings

    monkeypatch.setattr(lowerings, "get", lambda name: pytest.fail("nothing may be warmed"))
    cfg = _config(lowerings=("ok",))
    cfg.option.collectonly = True
    plug.pytest_collection_finish(types.SimpleNamespace(config=cfg, items=[]))
    cfg = _config(lowerings=("ok",), warm_up=False)
    plug.pytest_collection_finish(types.SimpleNamespace(config=cfg, items=[]))
    assert plug.ps.state(cfg).warmups == []


NARROW_PLUGIN = '''
from lowerings import register
from lowerings.torch_emulation import DecodeRows
from strategies import Limits


class Narrow(DecodeRows):
    """decode_rows limited to one warm-up variant (bf16, D=64); `broken` raises like a failed build."""
    def __init__(self, name, broken=False):
        super().__init__()
        self.name, self.broken = name, broken
    def case_limits(self, device):
        return Limits(dtypes=("bfloat16",), kv_dtypes=("same",), head_dims=(64,))
    def run(self, inputs):
        if self.broken:
            raise RuntimeError("nvcc exited with 1")
        return super().run(inputs)


register(Narrow("narrow_ok"))
register(Narrow("narrow_broken", broken=True))
'''


@pytest.mark.usefixtures("restore_registry")  # the plugin registers its lowerings here
def test_warmup_command_runs_units_side_by_side(tmp_path, capsys):
    """`python -m parity.exec.warmup --jobs 2`: one process per unit, each line reported, exit 1 on a failure."""
    from parity.exec import warmup

    plugin = tmp_path / "narrow.py"
    plugin.write_text(NARROW_PLUGIN)
    code = warmup.main(["--device", "cpu", "--jobs", "2", "--plugin", str(plugin), "narrow_ok", "narrow_broken"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "warm-up 1/2: narrow_ok bf16 D=64 no-window ... " in out and "(started)" in out
    assert "warm-up 2/2: narrow_broken bf16 D=64 no-window ... could not load: " in out
    assert "RuntimeError: nvcc exited with 1" in out
    assert out.strip().splitlines()[-1].startswith("warm-up on cpu: 2 unit(s) in 2 processes") \
        and out.strip().endswith("1 FAILED to load")


@pytest.mark.usefixtures("restore_registry")  # the plugin registers its lowerings here
def test_warmup_command_widens_like_check(tmp_path, capsys):
    """`--limit` widens the lowering's own limits (bf16, D=64; here to fp16 as well, and to D=128), in the plan and
    in the `--jobs` children that each run one unit of it (each child's own line names its unit: a child that
    planned without the limits would run bf16 D=64, or find no unit 2)."""
    import re

    from parity.exec import warmup

    plugin = tmp_path / "narrow.py"
    plugin.write_text(NARROW_PLUGIN)
    # two units, so two children (a process each): both fields widened at once
    code = warmup.main(["--device", "cpu", "--jobs", "2", "--plugin", str(plugin), "--limit", "dtypes=bfloat16,float16",
                        "--limit", "head_dims=128", "narrow_ok"])
    out = capsys.readouterr().out
    assert code == 0, out
    for variant in ("bf16 D=128", "fp16 D=128"):
        assert re.search(rf"^warm-up [12]/2: narrow_ok {variant} no-window \.\.\. [\d.]+ s$", out, re.M), (variant, out)
    assert "D=64" not in out, out


def test_warmup_command_names_a_bad_limit(capsys):
    from parity.exec import warmup

    with pytest.raises(SystemExit) as exit_:
        warmup.main(["--device", "cpu", "--limit", "dtypes=fp16", "decode_rows"])
    assert exit_.value.code == 2 and "Limits.dtypes: one or more of bfloat16, float16, got ('fp16',)" in capsys.readouterr().err
