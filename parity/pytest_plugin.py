"""pytest plugin (entry point `pytest11: dflash_parity`): options, fixtures, profiles, the gpu marker.

Any test that takes the `parity_lowering` fixture is parametrized over the selected lowerings
(`--lowering NAME`, repeatable; default all registered, plugins from `--plugin FILE.py` included);
`parity_check(lowering)` runs the hypothesis sweep for it and fails with the shrunk case's verdict.
Tests marked `gpu` skip, with the reason, where torch sees no CUDA device.
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("dflash-parity")
    g.addoption("--lowering", action="append", default=[], metavar="NAME", help="lowering(s) to check (default: all)")
    g.addoption("--plugin", action="append", default=[], metavar="FILE.py", help="file(s) that register lowerings")
    g.addoption("--parity-device", default=None, choices=("cpu", "cuda"), help="device (default: cuda if available)")
    g.addoption("--parity-profile", default=None, choices=("dev", "ci", "gpu", "nightly"),
                help="hypothesis profile (default: ci when CI is set, else dev)")
    g.addoption("--parity-max-examples", type=int, default=None, help="cases per lowering")
    g.addoption("--parity-tolerances", default=None, metavar="TOML", help="tolerance policy file")


def pytest_configure(config: pytest.Config) -> None:
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


@pytest.fixture
def parity_check(parity_device, parity_policy, parity_profile, pytestconfig):
    """`parity_check(lowering, max_examples=None, isolate=False, case_timeout=None, **case_fields)
    -> LoweringReport`: the sweep `dflash-parity check` runs; skips when the lowering cannot run here,
    fails with the shrunk case's verdict. `isolate=True` runs each case in a worker process (see
    `parity.isolation`): a crash or a hang fails the test with the shrunk case instead of killing pytest
    (the lowering must then be registered by name in a `--plugin` file or a built-in)."""
    import lowerings
    from parity.runner import RunOptions, check_lowering
    from strategies import PROFILES, cases, profile_settings

    def run(lowering, max_examples: int | None = None, isolate: bool = False, case_timeout: float | None = None,
            **fixed):
        ok, why = lowering.available(parity_device)
        if not ok:
            pytest.skip(f"{lowering.name} cannot run on {parity_device}: {why}")
        limits = lowering.case_limits(parity_device) if callable(getattr(lowering, "case_limits", None)) else None
        s = profile_settings(parity_profile, max_examples=max_examples or pytestconfig.getoption("--parity-max-examples"))
        opts = RunOptions(device=parity_device)
        executor = None
        if isolate:
            from parity.isolation import DEFAULT_CASE_TIMEOUT, IsolatedExecutor
            executor = IsolatedExecutor(plugins=pytestconfig.getoption("--plugin"),
                                        tolerances=pytestconfig.getoption("--parity-tolerances"), opts=opts,
                                        case_timeout=case_timeout or DEFAULT_CASE_TIMEOUT)
        try:
            rep = check_lowering(lowering, parity_policy, strategy=cases(lowering, limits=limits, **fixed), settings=s,
                                 opts=opts, yardstick=lowerings.get("sdpa"), target=PROFILES[parity_profile].target,
                                 executor=executor)
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
