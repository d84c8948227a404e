"""Interrupts (SIGINT, SIGTERM, SIGHUP: parity/exec/interrupt.py): a check stopped at once keeps its report, the
interrupted lowering failed as a partial run; a repeated signal is one interrupt; a swallowed one is raised
again between cases; a `--jobs` parent keeps the merged report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parity.front import cli
from parity.exec import interrupt

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py


def test_an_interrupted_check_keeps_what_ran(tmp_path):
    """SIGINT (KeyboardInterrupt) during a lowering's cases: its report keeps the cases that ran and
    fails as a partial run; `check` writes the report and exits 130 (as a --jobs child does for its part)."""
    import lowerings
    from parity.engine import policy
    from parity.engine.runner import RunOptions, check_lowering
    from strategies import cases, profile_settings

    seen = []

    def progress(report, outcome):
        seen.append(outcome)
        if len(seen) == 3:
            raise KeyboardInterrupt

    lw = lowerings.get("decode_rows")
    rep = check_lowering(lw, policy.load(None), strategy=cases(lw), settings=profile_settings("ci", max_examples=50),
                         opts=RunOptions(), progress=progress)
    assert rep.interrupted and rep.status == "fail" and rep.cases == 3
    assert rep.extra == ["interrupted after 3 case(s): a partial run, not a verdict"]


def test_interrupted_during_the_warm_up_still_writes_the_report(tmp_path, monkeypatch, capsys):
    def stop(*a, **k):
        raise KeyboardInterrupt

    from parity.exec import warmup

    monkeypatch.setattr(warmup, "warm_up_lowering", stop)
    code = cli.main(["check", "--warm-up", "--lowering", "decode_rows", "--lowering", "sdpa", "--device", "cpu",
                     "--no-isolate", "--quiet", "--report", str(tmp_path)])
    assert code == 130
    data = json.loads((tmp_path / "parity.json").read_text())
    assert list(data["lowerings"]) == ["decode_rows"]
    v = data["lowerings"]["decode_rows"]
    assert v["status"] == "fail" and "during the JIT warm-up" in v["notes"][0]


def test_a_repeated_sigint_is_one_interrupt():
    """coreutils `timeout -s INT` signals the command and its process group: two SIGINTs at once are one
    interrupt; one after the window is a second."""
    now = [100.0]
    handler = interrupt.SigintOnce(window=1.0, clock=lambda: now[0])
    with pytest.raises(KeyboardInterrupt):
        handler(2, None)
    assert handler.hit
    now[0] += 0.01
    assert handler(2, None) is None
    now[0] += 2.0
    with pytest.raises(KeyboardInterrupt):
        handler(2, None)


def test_jobs_parent_keeps_the_report_through_a_double_sigint(tmp_path):
    """SIGINT twice, 0.2 s apart, to a `check --jobs` parent (as `timeout -s INT` sent it on a loaded
    H200 host, run 12): the second is the same interrupt, the children write their partial parts and the
    merged report is written; exit 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import threading

    report = tmp_path / "rep"
    proc = subprocess.Popen([sys.executable, "-m", "parity.front.cli", "check", "--lowering", "decode_rows", "--lowering",
                             "sdpa", "--max-examples", "5000", "--no-isolate", "--device", "cpu", "--jobs", "2",
                             "--report", str(report)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    # until both children have judged a case (each prints its first progress line at once; its start-up line,
    # "  NAME: its cases start ...", comes before its first case and is not one)
    while time.monotonic() < deadline and not all(
            any(ln.startswith(f"  {n}: ") and " cases, " in ln for ln in list(lines)) for n in ("decode_rows", "sdpa")):
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.2)  # the second lands while the first is handled (two at once would coalesce into one)
    os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    out = "".join(lines)
    assert proc.returncode == 130, out
    data = json.loads((report / "parity.json").read_text())
    for name in ("decode_rows", "sdpa"):
        v = data["lowerings"][name]
        assert v["status"] == "fail" and any("interrupted after" in n for n in v["notes"]), \
            f"{name}: {v['notes']}\n--- the parent's output ---\n{out}"  # a string: shown whole, not cut
    assert "interrupted again" not in out


def test_a_swallowed_sigint_still_stops_the_check():
    """A KeyboardInterrupt raised inside a gc callback is printed and dropped by Python (seen on CPU: the
    check went on until its parent killed it); the recorded interrupt stops the run before the next case."""
    import lowerings
    from parity.engine import policy
    from parity.engine.runner import RunOptions, check_lowering
    from strategies import cases, profile_settings

    seen = []

    def progress(report, outcome):
        seen.append(outcome)
        if len(seen) == 3:
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:  # swallowed, as an "Exception ignored in: gc_callback" is
                pass

    import signal

    lw = lowerings.get("decode_rows")
    with interrupt.installed(force=True):  # the engine's stop request reads the handler for the block
        rep = check_lowering(lw, policy.load(None), strategy=cases(lw), settings=profile_settings("ci", max_examples=50),
                             opts=RunOptions(), progress=progress)
    assert rep.interrupted and rep.cases == 3 and len(seen) == 3
    assert not interrupt.requested()  # the handler is gone with the block


def test_the_engine_reads_a_stop_through_its_port():
    """The stop request port: the engine's pure default is a flag nothing raises by itself; raised, the sweep
    stops before its next case as it does for a swallowed SIGINT; the process machinery's reads the handler."""
    import lowerings
    from parity.engine import policy, ports
    from parity.engine.runner import RunOptions, check_lowering
    from strategies import cases, profile_settings

    flag = ports.StopFlag()
    seen = []

    def progress(report, outcome):
        seen.append(outcome)
        if len(seen) == 2:
            flag.request()

    lw = lowerings.get("decode_rows")
    with ports.installed(stop=flag):
        assert not ports.stop_requested()
        rep = check_lowering(lw, policy.load(None), strategy=cases(lw), settings=profile_settings("ci", max_examples=50),
                             opts=RunOptions(), progress=progress)
        assert ports.stop_requested()
    assert rep.interrupted and rep.cases == 2 and len(seen) == 2
    assert not ports.stop_requested()  # the default back after the block
    assert interrupt.SignalStop().requested() is False  # no handler installed: nothing seen
    outside = ports.current().stop
    with interrupt.installed(force=True):
        assert isinstance(ports.current().stop, interrupt.SignalStop)
    assert ports.current().stop is outside


def test_an_interrupt_while_shrinking_keeps_the_smallest_failure_found(tmp_path):
    """SIGINT after hypothesis found a failure, while it shrinks it (each try a judged case): the report keeps the
    smallest failing case seen so far, marked not shrunk, and says why (H200 run 39 lost every shard's failure
    this way: 0 failures reported of 947 failing cases judged, the run stopped by its time limit)."""
    import lowerings
    from parity.engine import policy
    from parity.engine.runner import RunOptions, check_lowering
    from strategies import cases, profile_settings

    failing = []

    def progress(report, outcome):
        if outcome.status == "fail":
            failing.append(outcome)
            if len(failing) == 4:  # the first failure and three shrink steps: then the interrupt
                raise KeyboardInterrupt

    from lowerings import registry

    registry.load_plugin(str(ROOT / "examples" / "plugin_window_off_by_one.py"))  # a window one key too wide
    lw = lowerings.get("my_windowed_merge")
    rep = check_lowering(lw, policy.load(None), strategy=cases(lw), settings=profile_settings("ci", max_examples=60),
                         opts=RunOptions(), progress=progress)
    assert rep.interrupted and rep.status == "fail" and len(failing) == 4
    assert len(rep.failures) == 1 and not rep.failures[0].shrunk
    from parity.engine import flakiness as fl
    assert fl.case_size(rep.failures[0].outcome.case) == min(fl.case_size(o.case) for o in failing)
    assert rep.extra[-1].startswith("interrupted while shrinking a failure: the smallest failing case found so far")
    # Interrupted, but a case failed: a failure in the table and the summary, not "interrupted".
    from parity.report.files import summary_md, table_rows, to_json
    data = to_json([rep], device="cpu", profile="ci", tolerances="t")
    assert table_rows(data)[1][1] == "FAIL"
    assert "## `my_windowed_merge` failed" in summary_md(data) and "` interrupted" not in summary_md(data)


def _decode_rows_check(report, preexec):
    """`check --lowering decode_rows` (CPU, in process) in a subprocess started through `preexec`, once it has
    judged its first case: `(proc, lines, reader)`, its output collected in `lines` by `reader`."""
    import subprocess
    import sys
    import threading
    import time

    proc = subprocess.Popen([sys.executable, "-m", "parity.front.cli", "check", "--lowering", "decode_rows",
                             "--max-examples", "5000", "--no-isolate", "--device", "cpu", "--report", str(report)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=preexec)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(ln.startswith("  decode_rows: ") for ln in list(lines)):
        time.sleep(0.1)
    return proc, lines, reader


def test_a_check_started_with_sigint_ignored_says_so_and_stops_on_sigterm(tmp_path):
    """A script's background job (and, on the H200, the command the device runs) starts with SIGINT ignored;
    an ignored signal stays ignored (`parity.exec.interrupt`), so `timeout -s INT` did not stop a single-process
    check there and the kill that followed lost its report (runs 40-41). The check says so at its start, and
    SIGTERM stops it with its report written (exit 143)."""
    import os
    import signal
    import time

    from parity.exec import interrupt

    assert interrupt.ignored_sigint_notice() is None  # SIGINT handled here (pytest's process): no notice
    report = tmp_path / "rep"
    proc, lines, reader = _decode_rows_check(report, lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    os.kill(proc.pid, signal.SIGINT)  # ignored: the check goes on
    time.sleep(1.0)
    assert proc.poll() is None, "".join(lines)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    out = "".join(lines)
    assert "SIGINT is ignored in this process" in out and "SIGTERM" in out, out
    assert proc.returncode == 143, out
    v = json.loads((report / "parity.json").read_text())["lowerings"]["decode_rows"]
    assert v["status"] == "fail" and any("interrupted after" in n for n in v["notes"]), (v["notes"], out)
    # The table says what it was: interrupted with nothing failed, the worst figures of what ran (not "FAIL", "-").
    assert v["interrupted"] is True and not v["failures"]
    row = next(ln for ln in out.splitlines() if ln.startswith("decode_rows "))
    assert row.split()[1] == "INTERRUPTED" and f"{v['worst_margin']:.2f}" in row, row
    summary = (report / "summary.md").read_text()
    assert "| decode_rows | INTERRUPTED |" in summary.replace("  ", " ")
    assert "## `decode_rows` interrupted" in summary and "## `decode_rows` failed" not in summary


def test_the_table_names_an_interruption_and_keeps_a_failure_a_failure():
    """`table_rows`: interrupted with no failure -> INTERRUPTED and the worst figures of what ran; interrupted
    after a failure -> FAIL with the failing case's figures; an entry from before the field -> FAIL."""
    from parity.report.files import table_rows

    base = {"status": "fail", "cases": 40, "judged": 40, "unsupported": 0, "failures": [], "worst_ulp": 1.5,
            "worst_rel_l2": 3e-3, "worst_margin": 0.4, "calls_checked": 40, "max_compiles": None, "interrupted": True}
    failed = dict(base, failures=[{"figures": {"out_ulp": 9.0, "out_rel_l2": 0.02, "margin": 1.1}}])
    old = {k: x for k, x in base.items() if k != "interrupted"}
    rows = table_rows({"lowerings": {"a": base, "b": failed, "c": old}})
    assert rows[1][1:3] == ["INTERRUPTED", "40"] and rows[1][5:8] == ["1.50", "3.00e-03", "0.40"]
    assert rows[2][1] == "FAIL" and rows[2][5:8] == ["9.00", "2.00e-02", "1.10"]
    assert rows[3][1] == "FAIL" and rows[3][5:8] == ["-", "-", "-"]


def test_a_sigint_inherited_blocked_is_unblocked_while_the_check_runs(tmp_path):
    """The H200 machine's shell blocks SIGINT (its mask, inherited by every process it starts: run 43), so a
    `timeout -s INT` limit never reached a single-process check and the kill after it lost the report (run
    40). `installed()` unblocks the signals it handles, and restores the mask after; a check started with
    SIGINT blocked stops on SIGINT with its report written (exit 130)."""
    import os
    import signal

    from parity.exec import interrupt

    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with interrupt.installed():
            assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # as it was given
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)

    report = tmp_path / "rep"
    proc, lines, reader = _decode_rows_check(report, lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}))
    os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    out = "".join(lines)
    assert proc.returncode == 130, out
    v = json.loads((report / "parity.json").read_text())["lowerings"]["decode_rows"]
    assert v["status"] == "fail" and any("interrupted after" in n for n in v["notes"]), (v["notes"], out)


@pytest.mark.parametrize("where", ["ConjectureRunner", "given"])
def test_an_interrupt_between_or_inside_hypothesis_set_up_still_writes_the_partial_report(tmp_path, monkeypatch,
                                                                                          capsys, where):
    """SIGINT landing after the boundary cases, while hypothesis's search is set up (`given`), escaped the
    check and a `--jobs` child exited 130 without its partial report; landing inside hypothesis's own set-up
    (before it has its runner) it came back as hypothesis's AssertionError and the child exited 1 (3 runs in
    50 and 2 in 18 under load, `test_sigterm_and_sighup_are_handled_as_sigint`). Either way it is the
    interrupt: exit 130, the lowering interrupted after its boundary cases, the report written."""
    import json
    import os
    import signal

    import hypothesis.core

    from parity.engine import search
    from parity.front import cli

    module = hypothesis.core if where == "ConjectureRunner" else search  # `given` as the search calls it
    real = getattr(module, where)

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the handler raises KeyboardInterrupt here
        return real(*args, **kwargs)

    monkeypatch.setattr(module, where, interrupted)
    code = cli.main(["check", "--lowering", "sdpa", "--max-examples", "5", "--no-isolate", "--device", "cpu",
                     "--report", str(tmp_path)])
    said = capsys.readouterr()
    assert code == 130, said.out + said.err
    notes = json.loads((tmp_path / "parity.json").read_text())["lowerings"]["sdpa"]["notes"]
    assert any(n.startswith("interrupted after ") for n in notes), notes
