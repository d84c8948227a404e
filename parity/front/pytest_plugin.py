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
merges them with the merge `check --jobs --shards` uses (`parity.front.parts.merge_lowering`) into one report and
one table in the terminal summary. Workers sharing a GPU take turns on it; `--parity-mps` runs them under CUDA
MPS (`parity.exec.mps`: a daemon already running, or one started before the workers and stopped at the end).

`--parity-warm-up` (or the ini option `parity_warm_up = true`): after collection, before the first test,
load every JIT kernel module the session's lowerings need (`parity.front.pytest_warmup`); the report is
printed in the terminal summary, also from pytest-xdist workers. A failed module never stops the session.

The plugin's state (one per pytest process) is `parity.front.pytest_state`'s; its report parts
`parity.front.pytest_parts`'.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

import pytest

from parity.front import pytest_state as ps
from parity.front.pytest_warmup import (  # noqa: F401  (the plugin's hooks and public names)
    WARMUP_KEY, pytest_collection_finish, pytest_terminal_summary, session_lowerings, warmup_enabled)

PARTS_KEY = "dflash_parity_parts"
FIXTURES = ("parity_lowering", "parity_check", "parity_device", "parity_policy", "parity_profile")
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
    """Before the initial conftests are imported (they import torch): the bytecode cache where
    `DFLASH_PARITY_PYCACHE` names its folder (`parity.front.startup.pycache_where_asked`; pytest-xdist's workers
    inherit it). After they registered their options: the old spellings, where still free."""
    from parity.front.startup import pycache_where_asked

    pycache_where_asked()
    yield
    owned = []
    for flag, dest, _, new in ps.DEPRECATED_OPTIONS:
        if not _option_taken(parser, flag):
            parser.getgroup("dflash-parity").addoption(flag, dest=dest, action="append", default=[],
                                                       help=f"deprecated spelling of {new}")
            owned.append(flag)
    early_config.stash[ps.OWNED_OPTIONS] = owned


# ---- the session's state ----------------------------------------------------------------------------
@pytest.hookimpl(trylast=True)  # after conftests and other plugins registered their markers
def pytest_configure(config: pytest.Config) -> None:
    markers = [line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")]
    config.addinivalue_line("markers", GPU_MARKER)
    # The old `gpu` marker is the plugin's only in a session that uses it, and only where another plugin's or
    # conftest's `gpu` is not registered (that one is left alone).
    config.stash[_OWNS_GPU] = "gpu" not in markers
    state = ps.state(config)
    if not ps.options_given(config):
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
        state.session_().load(probe=cfg.isolate and not ps.is_worker(config))
    except (InvalidInput, ValueError) as err:  # a plugin file that does not import, a bad tolerance file
        raise pytest.UsageError(pytest_message(str(err))) from None
    if cfg.mps and not ps.is_worker(config):
        _start_mps(config, state)


def _start_mps(config: pytest.Config, state: "ps.State") -> None:
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
    """The session uses the plugin: the front ends' start-up (`parity.front.startup.start`: the shared compile
    cache, the ports), its hypothesis profile loaded, this xdist worker pinned to its GPU, the CUDA context watched
    (`parity.front.cuda_context`)."""
    state = ps.state(config)
    state.used = True
    if getattr(state, "_in_use", False):
        return
    state._in_use = True
    from parity.front import startup

    state.held.callback(startup.start().close)  # xdist's workers start after this, and inherit it
    from hypothesis import settings as hyp_settings

    from strategies import PROFILES, profile_settings

    for name in PROFILES:
        hyp_settings.register_profile(f"dflash-{name}", profile_settings(name))
    hyp_settings.load_profile(f"dflash-{state.config_().profile}")
    from parity.front.cuda_context import CudaContextWatch  # a dead CUDA context named in later failures

    config.pluginmanager.register(CudaContextWatch(), "dflash_parity_cuda_context")
    if ps.is_worker(config):
        from parity.exec.gpus import pin_xdist_worker

        pin_xdist_worker(os.environ.get("PYTEST_XDIST_WORKER"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(f in getattr(item, "fixturenames", ()) for item in items for f in FIXTURES):
        _use(config)
    owns_gpu = config.stash.get(_OWNS_GPU, False) and ps.state(config).used
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
        names = list(ps.state(config).config_().lowerings) or lowerings.names()
        from parity.front.pytest_parts import lowering_params

        metafunc.parametrize("parity_lowering", lowering_params(names, ps.xdist_workers(config)), indirect=True)


# ---- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture
def parity_lowering(request: pytest.FixtureRequest):
    import lowerings

    request.node.stash[ps.SHARD] = (str(request.param), getattr(request.param, "shard", None))
    return lowerings.get(str(request.param))


@pytest.fixture(scope="session")
def parity_device(pytestconfig: pytest.Config) -> str:
    from parity.front.session import default_device

    return ps.state(pytestconfig).config_().device or default_device()


@pytest.fixture(scope="session")
def parity_policy(pytestconfig: pytest.Config):
    session = ps.state(pytestconfig).session_()
    session.load(probe=False)
    return session.policy


@pytest.fixture(scope="session")
def parity_profile(pytestconfig: pytest.Config) -> str:
    return ps.state(pytestconfig).config_().profile


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
    state = ps.state(pytestconfig)
    _use(pytestconfig)

    def run(lowering, max_examples: int | None = None, isolate: bool | None = None, case_timeout: float | None = None,
            **fixed):
        from oracle.errors import InvalidInput
        from parity.front.options import pytest_message
        from parity.front.pytest_parts import failure_text, quiet_library_logs, record, work_dir
        from parity.front.part import compose
        from parity.front.session import Asked

        session = state.session_()
        try:
            session.load(probe=False)
        except (InvalidInput, ValueError) as err:
            pytest.fail(pytest_message(str(err)), pytrace=False)
        ok, why = lowering.available(parity_device)
        if not ok:
            pytest.skip(f"{lowering.name} cannot run on {parity_device}: {why}")
        mine = request.node.stash.get(ps.SHARD, (None, None))
        item = mine[1] if mine[0] == lowering.name else None
        shard = compose(session.config.shard, item)
        where = work_dir(session.report_dir, lowering.name, item)
        try:
            with quiet_library_logs():
                rep = session.check(lowering, shard=shard, work_dir=where, asked=Asked(
                    warm=False, max_examples=max_examples, isolate=isolate, case_timeout=case_timeout, fixed=fixed))
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
    state = ps.state(config)
    if not state.used or ps.is_worker(config) or config.option.collectonly:
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
    state = ps.state(node.config)
    if out.get(PARTS_KEY):
        state.received += json.loads(out[PARTS_KEY])
    data = out.get(WARMUP_KEY)
    if data is not None:
        worker = getattr(getattr(node, "gateway", None), "id", "?")
        state.warmups.append((worker, data))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from parity.front.pytest_parts import merged_report, part_records

    config = session.config
    state = ps.state(config)
    if ps.is_worker(config):
        if state.parts:
            config.workeroutput[PARTS_KEY] = json.dumps(part_records(state.session, state.parts))
        return
    parts = (part_records(state.session, state.parts) if state.parts else []) + state.received
    if not parts and not state.began:
        return
    state.session_().load(probe=False)
    state.data, interrupted = merged_report(state.session, parts, ps.xdist_workers(config))
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
    state = config.stash.get(ps.STATE_KEY, None)
    if state is not None:
        state.held.close()
        if state.session is not None:
            state.session.close()


# ---- JIT warm-up ------------------------------------------------------------------------------------
