"""Wires the dflash-parity pytest plugin in for this repository (installed users get it through the
`pytest11` entry point). Triton kernels run under the interpreter where there is no GPU; that must be
decided before any kernel is decorated, hence here, first."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowerings import ensure_interpreter_on_cpu  # noqa: E402

ensure_interpreter_on_cpu()

try:  # installed: the entry point already registered the plugin
    import importlib.metadata as _md

    _installed = any(ep.value == "parity.front.pytest_plugin" for ep in _md.entry_points(group="pytest11"))
except Exception:  # pragma: no cover
    _installed = False
if not _installed:
    pytest_plugins = ["parity.front.pytest_plugin"]


def pytest_configure(config):
    # Under pytest-xdist each worker gets one intra-op thread: two workers on two cores, no oversubscription.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
    # This suite's own hypothesis tests run under the project's profile (derandomized in CI), whichever tests
    # are selected; the plugin loads one only for a session that uses it.
    from hypothesis import settings

    from strategies import profile_settings

    name = config.getoption("parity_profile", default=None) or ("ci" if os.environ.get("CI") else "dev")
    settings.register_profile(f"dflash-{name}", profile_settings(name))
    settings.load_profile(f"dflash-{name}")
