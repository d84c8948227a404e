"""pytest plugin (entry point `pytest11: dflash_parity`): the `dflash-parity check` front end in pytest.

A test that takes the `parity_lowering` fixture is parametrized over the selected lowerings
(`--parity-lowering NAME`, repeatable; default all registered, plugins from `--parity-plugin FILE.py`
included); `parity_check(lowering)` runs the sweep `check` runs for it (saved failures replayed first,
boundary cases, the drawn cases) and fails with the shrunk case's verdict. Every option of `check` is
an option here, spelled `--parity-...` (`parity.front.options`: written once for both front ends), and
`--parity-report DIR` writes the report `check` writes (parity.json, junit.xml, summary.md,
failures/*.json); `--parity-gate-baseline DIR` then gates it. Tests marked `parity_gpu` skip, with the
reason, where torch sees no CUDA device.

Hygiene: a suite that uses none of the fixtures and none of the options runs exactly as before. The
plugin adds only `--parity-*` options and the `parity_gpu` marker; it loads no hypothesis profile unless
`--parity-profile` is given or a parity fixture is used (then the `dflash-<profile>` profile), and pins
no pytest-xdist worker to a GPU unless the session uses the plugin. The old spellings `--lowering`,
`--plugin`, `--dflash-warmup` and the `gpu` marker work for one more release with a deprecation warning,
and only where no other plugin or conftest defines them (the `gpu` marker only in a session that uses
the plugin: another suite's unregistered `gpu` marker is never taken as ours).

Several GPUs (pytest-xdist, `pytest -n N`): worker `gwN` runs on GPU `N mod device_count`
(`parity.exec.gpus`), and each lowering's test is split into N shard items (`test[sdpa-shard1of4]`, ...):
item `j` judges the cases of the serial run whose draw index is `j` mod N (for a lowering that compiles:
those of every N-th compile family, in order of first appearance; `parity.engine.sweep.sharded_run_case`), so the
workers share every lowering's cases. Each worker sends its parts to the controller (`workeroutput`), which
merges them with the merge `check --jobs --shards` uses (`parity.exec.jobs.merge_lowering`) into one report and
one table in the terminal summary. Workers sharing a GPU take turns on it; `--parity-mps` runs them under CUDA
MPS (`parity.exec.mps`: a daemon already running, or one started before the workers and stopped at the end).

`--parity-warm-up` (or the ini option `parity_warm_up = true`): after collection, before the first test,
load every JIT kernel module the session's lowerings need (`parity.exec.warmup.warm_up`); the report is
printed in the terminal summary, also from pytest-xdist workers. A failed module never stops the session.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

import pytest

WARMUP_KEY = "dflash_warmup"
PARTS_KEY = "dflash_parity_parts"
FIXTURES = ("parity_lowering", "parity_check", "parity_device", "parity_policy", "parity_profile")
# Old spellings, registered only where free: (option, dest, config field, new spelling).
DEPRECATED_OPTIONS = (("--lowering", "parity_old_lowering", "lowerings", "--parity-lowering"),
                      ("--plugin", "parity_old_plugin", "plugins", "--parity-plugin"))
GPU_MARKER = "parity_gpu: needs a CUDA GPU (skipped with the reason where there is none)"
OLD_GPU_MARKER = "gpu: deprecated spelling of parity_gpu (dflash-parity)"


def pytest_addoption(parser: pytest.Parser) -> None:
    from parity.front.options import add_to_pytest

    g = parser.getgroup("dflash-parity", "dflash-parity (the options of `dflash-parity check`, as --parity-...)")
    add_to_pytest(g)
    g.addoption("--dflash-warmup", dest="parity_old_warm_up", action="store_true", default=None,
                help="deprecated spelling of --parity-warm-up")
    parser.addini("parity_warm_up", type="bool", default=False,
                  help="dflash-parity: warm up JIT kernel modules at session start (as --parity-warm-up)")
    parser.addini("dflash_warmup", type="bool", default=False, help="deprecated spelling of parity_warm_up")


def _option_taken(parser: pytest.Parser, name: str) -> bool:
    groups = [parser._anonymous, *parser._groups]  # what pytest itself checks for a clash
    return any(name in opt.names() for g in groups for opt in g.options)


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]):
    """Before the initial conftests are imported (they import torch): the bytecode cache where torch has none,
    only where `DFLASH_PARITY_PYCACHE` names its folder (`parity.exec.bytecode`; pytest-xdist's workers inherit it).
    After they registered their options: the old spellings, where still free."""
    from parity.exec import bytecode

    bytecode.cache_bytecode(chosen_only=True)
    yield
    owned = []
    for flag, dest, _, new in DEPRECATED_OPTIONS:
        if not _option_taken(parser, flag):
            parser.getgroup("dflash-parity").addoption(flag, dest=dest, action="append", default=[],
                                                       help=f"deprecated spelling of {new}")
            owned.append(flag)
    early_config.stash[_OWNED_OPTIONS] = owned


# ---- the session's state ----------------------------------------------------------------------------
_OWNED_OPTIONS = pytest.StashKey[list]()
_STATE = pytest.StashKey["_State"]()
_SHARD = pytest.StashKey[Any]()


class _State:
    """What the plugin knows about this pytest session (one per process; see the module docstring)."""

    def __init__(self, config: pytest.Config) -> None:
        self.pytest_config = config
        self.used = False
        self.check_config = None  # parity.front.config.CheckConfig, once asked for
        self.session = None  # parity.front.session.CheckSession, once a parity fixture runs (or a report is begun)
        self.parts: dict[tuple[str, Any], Any] = {}  # (lowering, shard item) -> LoweringReport of this process
        self.received: list[dict[str, Any]] = []  # parts sent by pytest-xdist workers
        self.warmups: list[tuple[str, dict]] = []
        self.held = contextlib.ExitStack()
        self.began = False
        self.data: dict[str, Any] | None = None  # the merged report data
        self.gate = None

    def config_(self):
        if self.check_config is None:
            self.check_config = _build_config(self.pytest_config)
        return self.check_config

    def session_(self):
        if self.session is None:
            from parity.front.session import CheckSession

            self.session = CheckSession(self.config_(), say=None, workers=_xdist_workers(self.pytest_config))
        return self.session


def _state(config: pytest.Config) -> _State:
    if _STATE not in config.stash:
        config.stash[_STATE] = _State(config)
    return config.stash[_STATE]


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _xdist_workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers run the session (1 without xdist)."""
    if _is_worker(config):
        return int(config.workerinput.get("workercount", 1))
    n = getattr(config.option, "numprocesses", None)
    return n if isinstance(n, int) and n > 0 and config.pluginmanager.hasplugin("dsession") else 1


def _old_spellings(config: pytest.Config) -> dict[str, Any]:
    """Values given by the old spellings, as config fields (each said once with a deprecation warning)."""
    extra: dict[str, Any] = {}
    for flag, dest, field, new in DEPRECATED_OPTIONS:
        values = config.getoption(dest, default=None) if flag in config.stash.get(_OWNED_OPTIONS, []) else None
        if values:
            extra[field] = list(values)
            config.issue_config_time_warning(pytest.PytestDeprecationWarning(
                f"dflash-parity: {flag} is deprecated, use {new} (the old spelling goes in the next release)"),
                stacklevel=2)
    if config.getoption("parity_old_warm_up"):
        extra["warm_up"] = True
        config.issue_config_time_warning(pytest.PytestDeprecationWarning(
            "dflash-parity: --dflash-warmup is deprecated, use --parity-warm-up"), stacklevel=2)
    elif config.getini("parity_warm_up") or config.getini("dflash_warmup"):
        extra["warm_up"] = True
    return extra


def _build_config(config: pytest.Config):
    """The session's `CheckConfig` from its `--parity-...` options; a bad value is a usage error naming it."""
    from parity.front.options import config_from_pytest

    try:
        cfg = config_from_pytest(config.getoption, _old_spellings(config))
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None
    if _xdist_workers(config) > 1 and cfg.isolate is False and cfg.jobs != 1:  # pragma: no cover (jobs is CLI-only)
        cfg = cfg.replace(jobs=1)
    return cfg


def _options_given(config: pytest.Config) -> list[str]:
    from parity.front.options import given_in_pytest

    given = given_in_pytest(config.getoption)
    given += [flag for flag, dest, _, _ in DEPRECATED_OPTIONS
              if flag in config.stash.get(_OWNED_OPTIONS, []) and config.getoption(dest, default=None)]
    if config.getoption("parity_old_warm_up"):
        given.append("--dflash-warmup")
    return given


# ---- configure: only what the session asks for ------------------------------------------------------
@pytest.hookimpl(trylast=True)  # after conftests and other plugins registered their markers
def pytest_configure(config: pytest.Config) -> None:
    markers = [line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")]
    config.addinivalue_line("markers", GPU_MARKER)
    # The old `gpu` marker is the plugin's only in a session that uses it, and only where another plugin's or
    # conftest's `gpu` is not registered (that one is left alone).
    config.stash[_OWNS_GPU] = "gpu" not in markers
    state = _state(config)
    if not _options_given(config):
        return
    if config.stash[_OWNS_GPU]:
        config.addinivalue_line("markers", OLD_GPU_MARKER)
    state.used = True
    cfg = state.config_()
    _use(config, profile_given=config.getoption("parity_profile") is not None)
    if cfg.device == "cuda" and not _cuda()[0]:
        # Asked for the GPU and there is none: every parity test would skip and the session exit 0.
        raise pytest.UsageError(f"--parity-device cuda: {_cuda()[1]} (drop the option to test on the CPU)")
    from oracle.errors import InvalidInput
    from parity.front.options import pytest_message

    try:
        state.session_().load(probe=cfg.isolate and not _is_worker(config))
    except (InvalidInput, ValueError) as err:  # a plugin file that does not import, a bad tolerance file
        raise pytest.UsageError(pytest_message(str(err))) from None
    if cfg.mps and not _is_worker(config):
        _start_mps(config, state)


def _start_mps(config: pytest.Config, state: "_State") -> None:
    """`--parity-mps` on the controller: the pytest-xdist workers sharing a GPU run under CUDA MPS
    (`parity.exec.mps`): the daemon settled and its pipe exported before xdist starts the workers (they inherit
    this environment); stopped, and the environment put back, when the session's held resources close."""
    from parity.exec.gpus import visible_gpus
    from parity.exec.mps import device_refusal, exported, mps_session, processes_per_gpu
    from parity.front.session import default_device

    workers = config.getoption("numprocesses", None)
    if not isinstance(workers, int) or workers < 2:
        raise pytest.UsageError("--parity-mps: shares one GPU among pytest-xdist workers: give -n N (N >= 2) too")
    why = device_refusal(state.config_().device or default_device())
    if why:
        raise pytest.UsageError(f"--parity-mps: {why}")
    tr = config.pluginmanager.get_plugin("terminalreporter")
    say = tr.write_line if tr is not None else (lambda line: print(line, file=sys.stderr))
    mps = state.held.enter_context(mps_session(processes_per_gpu(workers, visible_gpus()), say))
    state.held.enter_context(exported(mps))
    state.session_().mps_status = mps.status


_OWNS_GPU = pytest.StashKey[bool]()


def _use(config: pytest.Config, profile_given: bool = False) -> None:
    """The session uses the plugin: its hypothesis profile loaded, this xdist worker pinned to its GPU, the
    CUDA context watched (`parity.front.cuda_context`)."""
    state = _state(config)
    state.used = True
    if getattr(state, "_in_use", False):
        return
    state._in_use = True
    from parity.exec.shared_compiles import share_compiles

    share_compiles()  # xdist's workers start after this, and inherit it
    from hypothesis import settings as hyp_settings

    from strategies import PROFILES, profile_settings

    for name in PROFILES:
        hyp_settings.register_profile(f"dflash-{name}", profile_settings(name))
    hyp_settings.load_profile(f"dflash-{state.config_().profile}")
    from parity.front.cuda_context import CudaContextWatch  # a dead CUDA context named in later failures

    config.pluginmanager.register(CudaContextWatch(), "dflash_parity_cuda_context")
    if _is_worker(config):
        from parity.exec.gpus import pin_xdist_worker

        pin_xdist_worker(os.environ.get("PYTEST_XDIST_WORKER"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(f in getattr(item, "fixturenames", ()) for item in items for f in FIXTURES):
        _use(config)
    owns_gpu = config.stash.get(_OWNS_GPU, False) and _state(config).used
    marked = [item for item in items if "parity_gpu" in item.keywords or (owns_gpu and "gpu" in item.keywords)]
    if not marked:
        return
    from pytest import PytestDeprecationWarning

    ok, why = _cuda()
    for item in marked:
        if owns_gpu and item.get_closest_marker("gpu") is not None and item.get_closest_marker("parity_gpu") is None:
            item.warn(PytestDeprecationWarning("dflash-parity: the `gpu` marker is deprecated, use `parity_gpu`"))
        if not ok:
            item.add_marker(pytest.mark.skip(reason=why))


def _cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "needs a CUDA GPU; torch sees none on this machine"
    return True, ""


# ---- parametrization: lowerings, and shard items under xdist ----------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "parity_lowering" in metafunc.fixturenames:
        import lowerings

        config = metafunc.config
        names = list(_state(config).config_().lowerings) or lowerings.names()
        from parity.front.pytest_parts import lowering_params

        metafunc.parametrize("parity_lowering", lowering_params(names, _xdist_workers(config)), indirect=True)


# ---- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture
def parity_lowering(request: pytest.FixtureRequest):
    import lowerings

    request.node.stash[_SHARD] = (str(request.param), getattr(request.param, "shard", None))
    return lowerings.get(str(request.param))


@pytest.fixture(scope="session")
def parity_device(pytestconfig: pytest.Config) -> str:
    from parity.front.session import default_device

    return _state(pytestconfig).config_().device or default_device()


@pytest.fixture(scope="session")
def parity_policy(pytestconfig: pytest.Config):
    session = _state(pytestconfig).session_()
    session.load(probe=False)
    return session.policy


@pytest.fixture(scope="session")
def parity_profile(pytestconfig: pytest.Config) -> str:
    return _state(pytestconfig).config_().profile


@pytest.fixture
def parity_check(request: pytest.FixtureRequest, parity_device, parity_profile, pytestconfig):
    """`parity_check(lowering, max_examples=None, isolate=None, case_timeout=None, **case_fields)
    -> LoweringReport`: the sweep `dflash-parity check` runs (saved failures of `--parity-report` first,
    the lowering's boundary cases unless `case_fields` fix some, then the drawn cases); skips when the
    lowering cannot run here, fails with the shrunk case's verdict; the test's `parity_lse_checked` property
    (pytest's junit XML) is `false` for an output-only lowering. `isolate` (default: `--parity-isolate`)
    runs each case in a worker process (see `parity.exec.isolation`): a crash or a hang fails the test with the
    shrunk case instead of killing pytest (the lowering must then be registered by name in a
    `--parity-plugin` file or a built-in). Under pytest-xdist a `parity_lowering` test checks its shard
    item's share of the cases. The report is the session's (`--parity-report`, the terminal summary)."""
    state = _state(pytestconfig)
    _use(pytestconfig)

    def run(lowering, max_examples: int | None = None, isolate: bool | None = None, case_timeout: float | None = None,
            **fixed):
        from oracle.errors import InvalidInput
        from parity.front.options import pytest_message
        from parity.front.pytest_parts import failure_text, quiet_library_logs, record, work_dir
        from parity.front.session import compose

        session = state.session_()
        try:
            session.load(probe=False)
        except (InvalidInput, ValueError) as err:
            pytest.fail(pytest_message(str(err)), pytrace=False)
        ok, why = lowering.available(parity_device)
        if not ok:
            pytest.skip(f"{lowering.name} cannot run on {parity_device}: {why}")
        mine = request.node.stash.get(_SHARD, (None, None))
        item = mine[1] if mine[0] == lowering.name else None
        shard = compose(session.config.shard, item)
        where = work_dir(session.report_dir, lowering.name, item)
        try:
            with quiet_library_logs():
                rep = session.check(lowering, shard=shard, work_dir=where, warm=False, max_examples=max_examples,
                                    isolate=isolate, case_timeout=case_timeout, fixed=fixed)
        except InvalidInput as err:  # a saved failure file that cannot be read, a case that is bad input
            pytest.fail(pytest_message(str(err)), pytrace=False)
        record(state.parts, lowering.name, item, rep)
        # pytest's own junit XML (--junitxml): whether the LSE was judged (False: an output-only lowering)
        request.node.user_properties.append(("parity_lse_checked", "true" if rep.lse_checked else "false"))
        if rep.interrupted:  # SIGINT: the partial report is kept; the session stops
            raise KeyboardInterrupt
        if rep.status == "unavailable":
            pytest.skip(f"{lowering.name} cannot run on {parity_device}: {rep.reason}")
        if rep.status == "fail":
            pytest.fail(failure_text(rep, parity_device), pytrace=False)
        return rep

    return run


# ---- the session's report ---------------------------------------------------------------------------
def pytest_sessionstart(session: pytest.Session) -> None:
    """With `--parity-report`: the directory prepared, locked and marked in progress before any test (the
    controller's under pytest-xdist; workers write under its lock)."""
    config = session.config
    state = _state(config)
    if not state.used or _is_worker(config) or config.option.collectonly:
        return
    cs = state.session_()
    if cs.report_dir is None:
        return
    from oracle.errors import InvalidInput
    from parity.front.options import pytest_message

    try:
        state.held.enter_context(cs.holding_report_dir())
        cs.load(probe=False)
        cs.start_run()
    except (InvalidInput, ValueError) as err:
        state.held.close()
        raise pytest.UsageError(pytest_message(str(err))) from None
    state.began = True


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist controller: keep each worker's parity parts and warm-up report."""
    out = getattr(node, "workeroutput", {})
    state = _state(node.config)
    if out.get(PARTS_KEY):
        state.received += json.loads(out[PARTS_KEY])
    data = out.get(WARMUP_KEY)
    if data is not None:
        worker = getattr(getattr(node, "gateway", None), "id", "?")
        state.warmups.append((worker, data))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from parity.front.pytest_parts import merged_report, part_records

    config = session.config
    state = _state(config)
    if _is_worker(config):
        if state.parts:
            config.workeroutput[PARTS_KEY] = json.dumps(part_records(state.session, state.parts))
        return
    parts = (part_records(state.session, state.parts) if state.parts else []) + state.received
    if not parts and not state.began:
        return
    state.session_().load(probe=False)
    state.data, interrupted = merged_report(state.session, parts, _xdist_workers(config))
    if not state.began:  # no report directory: the merged table in the terminal summary only
        return
    try:
        state.data = state.session.write_parts(state.data, interrupted=interrupted)
        state.session.end()
        state.gate = state.session.gate()
    finally:
        state.held.close()
    if state.gate is not None and not state.gate.passed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None:
        state.held.close()
        if state.session is not None:
            state.session.close()


# ---- JIT warm-up ------------------------------------------------------------------------------------
def session_lowerings(items: list[pytest.Item], selected: list[str]) -> list[str]:
    """The lowerings a session will test: those its `parity_lowering` tests are parametrized over, plus
    `--parity-lowering` names; every registered lowering when neither names any."""
    import lowerings

    names: list[str] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("parity_lowering") if callspec is not None else None
        if isinstance(name, str) and str(name) not in names:
            names.append(str(name))
    for name in selected:
        if name not in names:
            names.append(name)
    return names or lowerings.names()


def warmup_enabled(config: pytest.Config) -> bool:
    """Whether the session warms up (`--parity-warm-up`, the ini option `parity_warm_up`, or the old spellings)."""
    return _state(config).config_().warm_up


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    state = _state(config)
    if not state.used or config.option.collectonly or not warmup_enabled(config):
        return
    import lowerings
    from parity.front.session import default_device
    from parity.exec.warmup import warm_up

    names = session_lowerings(session.items, list(state.config_().lowerings))
    tr = config.pluginmanager.get_plugin("terminalreporter")
    shown: dict[str, Any] = {"started": False, "head": ""}

    def progress(line: str) -> None:
        if tr is None:
            return
        if not shown["started"]:
            shown["started"] = True
            tr.write("\n")
        if line.endswith(" ..."):  # a run starts: its time follows on the same line
            tr.write(line, flush=True)
            shown["head"] = line
            return
        head, shown["head"] = shown["head"], ""
        tr.write((line[len(head):] if head and line.startswith(head) else line) + "\n", flush=True)

    chosen = []
    for n in names:
        try:
            chosen.append(lowerings.get(n))
        except Exception:  # an unknown --parity-lowering: the tests taking it report that themselves
            continue
    data = warm_up(chosen, None, state.config_().device or default_device(), progress).to_json()
    state.warmups.append(("", data))
    if _is_worker(config):  # a pytest-xdist worker: the controller prints it
        config.workeroutput[WARMUP_KEY] = data


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    if state.warmups:
        terminalreporter.write_sep("-", "dflash-parity JIT warm-up")
        for worker, data in sorted(state.warmups, key=lambda r: r[0]):
            prefix = f"[{worker}] " if worker else ""
            for line in data.get("lines", []):
                bad = line.startswith("could not load") or "FAILED" in line
                terminalreporter.write_line(prefix + line, red=bad)
    if state.data is not None and state.data.get("lowerings"):
        from parity.report.files import format_table, table_rows

        terminalreporter.write_sep("-", "dflash-parity")
        for line in format_table(table_rows(state.data)).splitlines():
            terminalreporter.write_line(line)
        if state.began:
            terminalreporter.write_line(f"report ({state.data.get('verdict')}) in {state.session.report_dir}/ "
                                        f"(parity.json, junit.xml, summary.md)")
    if state.gate is not None:
        terminalreporter.write_sep("-", "dflash-parity gate: " + ("pass" if state.gate.passed else "FAIL"))
        for line in state.gate.markdown.splitlines():
            terminalreporter.write_line(line, red=not state.gate.passed)
