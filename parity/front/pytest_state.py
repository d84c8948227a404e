"""The pytest plugin's state: one `State` per pytest process (its `CheckConfig`, its `CheckSession`, the parts it
checked or received), how the session was asked for (`--parity-...` options, their deprecated spellings, the ini
options), and whether this process is a pytest-xdist worker.

Public: `State`, `state`, `is_worker`, `xdist_workers`, `build_config`, `options_given`, `DEPRECATED_OPTIONS`,
`OWNED_OPTIONS`, `SHARD`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

# Old spellings, registered only where free: (option, dest, config field, new spelling).
DEPRECATED_OPTIONS = (("--lowering", "parity_old_lowering", "lowerings", "--parity-lowering"),
                      ("--plugin", "parity_old_plugin", "plugins", "--parity-plugin"))

OWNED_OPTIONS = pytest.StashKey[list]()
STATE_KEY = pytest.StashKey["State"]()
SHARD = pytest.StashKey[Any]()


class State:
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
            self.check_config = build_config(self.pytest_config)
        return self.check_config

    def session_(self):
        if self.session is None:
            from parity.front.session import CheckSession

            self.session = CheckSession(self.config_(), say=None, workers=xdist_workers(self.pytest_config))
        return self.session


def state(config: pytest.Config) -> State:
    if STATE_KEY not in config.stash:
        config.stash[STATE_KEY] = State(config)
    return config.stash[STATE_KEY]


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def xdist_workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers run the session (1 without xdist)."""
    if is_worker(config):
        return int(config.workerinput.get("workercount", 1))
    n = getattr(config.option, "numprocesses", None)
    return n if isinstance(n, int) and n > 0 and config.pluginmanager.hasplugin("dsession") else 1


def old_spellings(config: pytest.Config) -> dict[str, Any]:
    """Values given by the old spellings, as config fields (each said once with a deprecation warning)."""
    extra: dict[str, Any] = {}
    for flag, dest, field, new in DEPRECATED_OPTIONS:
        values = config.getoption(dest, default=None) if flag in config.stash.get(OWNED_OPTIONS, []) else None
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


def build_config(config: pytest.Config):
    """The session's `CheckConfig` from its `--parity-...` options; a bad value is a usage error naming it."""
    from parity.front.options import config_from_pytest

    try:
        cfg = config_from_pytest(config.getoption, old_spellings(config))
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None
    if xdist_workers(config) > 1 and cfg.isolate is False and cfg.jobs != 1:  # pragma: no cover (jobs is CLI-only)
        cfg = cfg.replace(jobs=1)
    return cfg


def options_given(config: pytest.Config) -> list[str]:
    from parity.front.options import given_in_pytest

    given = given_in_pytest(config.getoption)
    given += [flag for flag, dest, _, _ in DEPRECATED_OPTIONS
              if flag in config.stash.get(OWNED_OPTIONS, []) and config.getoption(dest, default=None)]
    if config.getoption("parity_old_warm_up"):
        given.append("--dflash-warmup")
    return given


# ---- configure: only what the session asks for ------------------------------------------------------
