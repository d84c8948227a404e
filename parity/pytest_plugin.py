"""pytest plugin (entry point `pytest11: dflash_parity`): options, fixtures, profiles, the gpu marker.

Any test that takes the `parity_lowering` fixture is parametrized over the selected lowerings
(`--lowering NAME`, repeatable; default all registered, plugins from `--plugin FILE.py` included);
`parity_check(lowering)` runs the hypothesis sweep for it and fails with the shrunk case's verdict.
Tests marked `gpu` skip, with the reason, where torch sees no CUDA device.

GPU runners:

- `--dflash-warmup` (or the ini option `dflash_warmup = true`): after collection, before the first test,
  load every JIT kernel module the session's lowerings need (`parity.warmup.warm_up`), one tiny case per
  distinct module, with progress lines; the report (times, and "could not load: <module>: <error>" for
  a module that failed) is printed in the terminal summary, also from pytest-xdist workers. A failed
  module never stops the session.
- Under pytest-xdist, worker `gwN` runs on `cuda:(N mod device_count)` (`torch.cuda.set_device`; its
  child processes get `CUDA_VISIBLE_DEVICES` narrowed to that GPU). `DFLASH_NO_GPU_PIN=1` turns it off.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

WARMUP_KEY = "dflash_warmup"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("dflash-parity")
    g.addoption("--lowering", action="append", default=[], metavar="NAME", help="lowering(s) to check (default: all)")
    g.addoption("--plugin", action="append", default=[], metavar="FILE.py", help="file(s) that register lowerings")
    g.addoption("--parity-device", default=None, choices=("cpu", "cuda"), help="device (default: cuda if available)")
    g.addoption("--parity-profile", default=None, choices=("dev", "ci", "gpu", "nightly", "scale"),
                help="hypothesis profile (default: ci when CI is set, else dev)")
    g.addoption("--parity-max-examples", type=int, default=None, help="cases per lowering")
    g.addoption("--parity-tolerances", default=None, metavar="TOML", help="tolerance policy file")
    g.addoption("--parity-limit", action="append", default=[], metavar="FIELD=V[,V...]",
                help="as `dflash-parity check --limit`: widen or narrow every checked lowering's drawn shapes")
    g.addoption("--dflash-warmup", action="store_true", default=None,
                help="load the JIT kernel modules of the session's lowerings once before the first test "
                     "(progress, then a report in the terminal summary)")
    parser.addini("dflash_warmup", type="bool", default=False,
                  help="dflash-parity: warm up JIT kernel modules at session start (as --dflash-warmup)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--parity-device") == "cuda" and not _cuda()[0]:
        # Asked for the GPU and there is none: every parity test would skip and the session exit 0.
        raise pytest.UsageError(f"--parity-device cuda: {_cuda()[1]} (drop the option to test on the CPU)")
    _limit_overrides(config)  # a bad --parity-limit is a usage error at once, not a failure of every test
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped with the reason where there is none)")
    config.addinivalue_line("markers", "slow: long sweeps, not part of the CI suite")
    from hypothesis import settings as hyp_settings

    from strategies import PROFILES, profile_settings

    for name in PROFILES:
        hyp_settings.register_profile(f"dflash-{name}", profile_settings(name))
    prof = config.getoption("--parity-profile") or ("ci" if os.environ.get("CI") else "dev")
    hyp_settings.load_profile(f"dflash-{prof}")
    import lowerings

    for path in config.getoption("--plugin"):
        lowerings.load_plugin(path)
    config.stash[_REPORTS] = []
    if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("DFLASH_NO_GPU_PIN"):
        pin_xdist_worker_gpu(os.environ["PYTEST_XDIST_WORKER"])


# ---- one GPU per pytest-xdist worker ------------------------------------------------------------------
def xdist_gpu_index(worker_id: str | None, device_count: int) -> int | None:
    """The GPU of pytest-xdist worker `gwN`: `N mod device_count`; None outside xdist (no or another id)
    or without a GPU."""
    if not worker_id or not worker_id.startswith("gw") or device_count < 1:
        return None
    try:
        n = int(worker_id[2:])
    except ValueError:
        return None
    return n % device_count if n >= 0 else None


def narrowed_visible_devices(visible: str | None, index: int, device_count: int) -> str:
    """`CUDA_VISIBLE_DEVICES` for a child of a worker pinned to `index`: that one entry of the parent's
    list (ids, UUIDs or MIG names), or the plain index when the parent had none."""
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible else []
    if len(entries) == device_count and 0 <= index < len(entries):
        return entries[index]
    return str(index)


def pin_xdist_worker_gpu(worker_id: str | None) -> int | None:
    """Pin this xdist worker to its GPU (`torch.cuda.set_device`) when the machine has more than one;
    child processes (isolated case runners) inherit a `CUDA_VISIBLE_DEVICES` naming that GPU only.
    Returns the index, or None when nothing was pinned."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    index = xdist_gpu_index(worker_id, count)
    if index is None or count < 2:
        return None
    torch.cuda.set_device(index)  # initializes CUDA with the parent's view before the variable changes
    os.environ["CUDA_VISIBLE_DEVICES"] = narrowed_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"),
                                                                  index, count)
    return index


# ---- JIT warm-up --------------------------------------------------------------------------------------
_REPORTS = pytest.StashKey[list]()


def warmup_enabled(config: pytest.Config) -> bool:
    opt = config.getoption("--dflash-warmup")
    return bool(opt) if opt is not None else bool(config.getini("dflash_warmup"))


def session_lowerings(items: list[pytest.Item], selected: list[str]) -> list[str]:
    """The lowerings a session will test: those its `parity_lowering` tests are parametrized over, plus
    `--lowering` names; every registered lowering when neither names any."""
    import lowerings

    names: list[str] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("parity_lowering") if callspec is not None else None
        if isinstance(name, str) and name not in names:
            names.append(name)
    for name in selected:
        if name not in names:
            names.append(name)
    return names or lowerings.names()


def _session_device(config: pytest.Config) -> str:
    return config.getoption("--parity-device") or ("cuda" if _cuda()[0] else "cpu")


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    if not warmup_enabled(config) or config.option.collectonly:
        return
    import lowerings
    from parity.warmup import warm_up

    names = session_lowerings(session.items, config.getoption("--lowering"))
    tr = config.pluginmanager.get_plugin("terminalreporter")
    state: dict[str, Any] = {"started": False, "head": ""}

    def progress(line: str) -> None:
        if tr is None:
            return
        if not state["started"]:
            state["started"] = True
            tr.write("\n")
        if line.endswith(" ..."):  # a run starts: its time follows on the same line
            tr.write(line, flush=True)
            state["head"] = line
            return
        head, state["head"] = state["head"], ""
        tr.write((line[len(head):] if head and line.startswith(head) else line) + "\n", flush=True)

    chosen = []
    for n in names:
        try:
            chosen.append(lowerings.get(n))
        except Exception:  # an unknown --lowering: the tests taking it report that themselves
            continue
    report = warm_up(chosen, None, _session_device(config), progress)
    data = report.to_json()
    config.stash[_REPORTS].append(("", data))
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: the controller prints it
        config.workeroutput[WARMUP_KEY] = data


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist controller: keep each worker's warm-up report for the terminal summary."""
    data = getattr(node, "workeroutput", {}).get(WARMUP_KEY)
    if data is not None:
        worker = getattr(getattr(node, "gateway", None), "id", "?")
        node.config.stash.setdefault(_REPORTS, []).append((worker, data))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    reports = config.stash.get(_REPORTS, [])
    if not reports:
        return
    terminalreporter.write_sep("-", "dflash-parity JIT warm-up")
    for worker, data in sorted(reports, key=lambda r: r[0]):
        prefix = f"[{worker}] " if worker else ""
        for line in data.get("lines", []):
            bad = line.startswith("could not load") or "FAILED" in line
            terminalreporter.write_line(prefix + line, red=bad)


def _cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "needs a CUDA GPU; torch sees none on this machine"
    return True, ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ok, why = _cuda()
    if ok:
        return
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "parity_lowering" in metafunc.fixturenames:
        import lowerings

        names = metafunc.config.getoption("--lowering") or lowerings.names()
        metafunc.parametrize("parity_lowering", names, indirect=True)


@pytest.fixture
def parity_lowering(request: pytest.FixtureRequest):
    import lowerings

    return lowerings.get(request.param)


@pytest.fixture(scope="session")
def parity_device(pytestconfig: pytest.Config) -> str:
    dev = pytestconfig.getoption("--parity-device")
    if dev:
        return dev
    return "cuda" if _cuda()[0] else "cpu"


@pytest.fixture(scope="session")
def parity_policy(pytestconfig: pytest.Config):
    from parity import policy

    return policy.load(pytestconfig.getoption("--parity-tolerances"))


@pytest.fixture(scope="session")
def parity_profile(pytestconfig: pytest.Config) -> str:
    return pytestconfig.getoption("--parity-profile") or ("ci" if os.environ.get("CI") else "dev")


def _limit_overrides(config: pytest.Config) -> dict[str, Any]:
    """`--parity-limit` as `strategies.Limits` field overrides; a bad one is a usage error naming it."""
    from strategies import limit_overrides

    try:
        return limit_overrides(config.getoption("--parity-limit"))
    except ValueError as err:
        raise pytest.UsageError(str(err).replace("--limit", "--parity-limit", 1)) from None


@pytest.fixture
def parity_check(parity_device, parity_policy, parity_profile, pytestconfig):
    """`parity_check(lowering, max_examples=None, isolate=False, case_timeout=None, **case_fields)
    -> LoweringReport`: the sweep `dflash-parity check` runs (the lowering's limits with the device's
    production defaults, its boundary cases first unless `case_fields` fix some); skips when the lowering cannot run here,
    fails with the shrunk case's verdict. `isolate=True` runs each case in a worker process (see
    `parity.isolation`): a crash or a hang fails the test with the shrunk case instead of killing pytest
    (the lowering must then be registered by name in a `--plugin` file or a built-in)."""
    import lowerings
    from parity.hooks import HookFailure
    from parity.runner import RunOptions, check_lowering
    from strategies import PROFILES, check_cases, profile_settings

    def run(lowering, max_examples: int | None = None, isolate: bool = False, case_timeout: float | None = None,
            **fixed):
        ok, why = lowering.available(parity_device)
        if not ok:
            pytest.skip(f"{lowering.name} cannot run on {parity_device}: {why}")
        try:  # its case_limits, dispatch_boundaries and supports hooks (the boundary cases), under the watchdog
            plan = check_cases(lowering, parity_device, profile=parity_profile, overrides=_limit_overrides(pytestconfig),
                               **fixed)
        except HookFailure as hf:  # a BaseException: failed here, as check_lowering fails it, not the session
            pytest.fail(f"{lowering.name} failed parity on {parity_device}: {hf.message}", pytrace=False)
        s = profile_settings(parity_profile, max_examples=max_examples or pytestconfig.getoption("--parity-max-examples"))
        opts = RunOptions(device=parity_device)
        executor = None
        if isolate:
            from parity.isolation import DEFAULT_CASE_TIMEOUT, IsolatedExecutor
            executor = IsolatedExecutor(plugins=pytestconfig.getoption("--plugin"),
                                        tolerances=pytestconfig.getoption("--parity-tolerances"), opts=opts,
                                        case_timeout=case_timeout or DEFAULT_CASE_TIMEOUT)
        try:
            rep = check_lowering(lowering, parity_policy, strategy=plan.strategy, boundaries=plan.boundaries,
                                 settings=s, opts=opts, yardstick=lowerings.get("sdpa"),
                                 target=PROFILES[parity_profile].target, executor=executor,
                                 flaky_runs=PROFILES[parity_profile].flaky_runs)
        finally:
            if executor is not None:
                executor.close()
        if rep.status == "fail":
            lines = [f"{lowering.name} failed parity on {parity_device}:"] + [f"  {n}" for n in rep.extra]
            for f in rep.failures:
                lines.append(f"  shrunk case: {f.outcome.case.short()}")
                lines += [f"    - {m}" for m in f.outcome.failures]
                lines.append(f"    case JSON: {f.outcome.case.to_json(indent=None)}")
            pytest.fail("\n".join(lines), pytrace=False)
        return rep

    return run
