"""The pytest plugin's JIT warm-up (`--parity-warm-up`, the ini option `parity_warm_up`) and its terminal summary.

After collection, before the first test: every JIT kernel module the session's lowerings need is loaded
(`parity.exec.warmup.warm_up`); its report is printed in the terminal summary, also from pytest-xdist workers (sent to
the controller as `WARMUP_KEY`). A failed module never stops the session. The summary also holds the session's
merged table, where its report went, and its gate.

Public: `session_lowerings`, `warmup_enabled`, `pytest_collection_finish`, `pytest_terminal_summary`, `WARMUP_KEY`.
"""

from __future__ import annotations

from typing import Any

import pytest

from parity.front import pytest_state as ps

WARMUP_KEY = "dflash_warmup"


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
    return ps.state(config).config_().warm_up


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    state = ps.state(config)
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
    if ps.is_worker(config):  # a pytest-xdist worker: the controller prints it
        config.workeroutput[WARMUP_KEY] = data


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(ps.STATE_KEY, None)
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
