"""The bad-input table (issue 17, items 5-7): plugin hooks that raise, exit, loop or crash; malformed,
special and absurd case files and planted failure files; report directories that are unwritable, full,
locked or linked out of; failure artifacts that must stand on their own.

Each row is the exact adversarial input, the exit code and the first line of the message. `main()` runs
in process (fast). Hook hangs use `--hook-timeout 1`. (`--jobs` children under a SIGTERM to their parent:
`test_prefork.py`.)
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

import lowerings
from lowerings import registry
from oracle import Case
from parity.report import files as report_mod, directory as report_dir_mod
from strategies import check_cases, limit_overrides
from tests.cli_runs import run

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py

GOOD = Case(context_lens=(5,), block_size=2, num_q_heads=2, num_kv_heads=1, head_dim=16, page_size=4,
            pages=((0, 1),), num_pages=3)
QUICK = ["--max-examples", "3", "--device", "cpu", "--quiet", "--hook-timeout", "1", "--limit", "max_batch=2",
         "--limit", "max_context=20", "--limit", "head_dims=64", "--limit", "max_production_context=0"]
# tiny cases: the rows are about the hooks


def quick_cases(name: str) -> int:
    """The cases a QUICK check of built-in lowering `name` runs: its boundary cases, then 3 drawn."""
    overrides = limit_overrides([QUICK[i + 1] for i, a in enumerate(QUICK) if a == "--limit"])
    return 3 + len(check_cases(lowerings.get(name), "cpu", profile="ci", overrides=overrides).boundaries)


HEAD = "import os, signal, sys, time\nfrom lowerings import register\nfrom lowerings.torch_emulation import Sdpa\n"


def plugin_text(name: str, body: str) -> str:
    """A plugin registering `name`: the sdpa yardstick with `body` (methods) overriding its hooks."""
    return HEAD + f"class P(Sdpa):\n    name = {name!r}\n" + body + "register(P())\n"


SUPPORTS_LOOPS = "    def supports(self, case):\n        while True:\n            pass\n"
SUPPORTS_RAISES = "    def supports(self, case):\n        raise ValueError('no batches')\n"
SUPPORTS_EXITS = "    def supports(self, case):\n        sys.exit(0)\n"
SUPPORTS_SLEEPS = "    def supports(self, case):\n        time.sleep(3600)\n"
AVAILABLE_LOOPS = "    def available(self, device):\n        while True:\n            time.sleep(0.01)\n"
AVAILABLE_RAISES = "    def available(self, device):\n        raise RuntimeError('no driver')\n"
AVAILABLE_SEGFAULTS = "    def available(self, device):\n        os.kill(os.getpid(), signal.SIGSEGV)\n"
AVAILABLE_GARBAGE = "    def available(self, device):\n        return 'yes'\n"
EXPECTED_RAISES = "    def expected_calls(self, case):\n        return {}['torch.sdpa']\n"
EXPECTED_LOOPS = "    def expected_calls(self, case):\n        while True:\n            pass\n"
EXPECTED_SEGFAULTS = ("    def expected_calls(self, case):\n        if max(case.context_lens) > case.page_size:\n"
                      "            os.kill(os.getpid(), signal.SIGSEGV)\n        return super().expected_calls(case)\n")
CASE_LIMITS_RAISES = "    def case_limits(self, device):\n        raise TypeError('limits?')\n"
DISPATCH_RAISES = "    def dispatch_boundaries(self):\n        raise KeyError('threshold')\n"
DISPATCH_LOOPS = "    def dispatch_boundaries(self):\n        while True:\n            pass\n"
RUN_RAISES_IN_TORCH = ("    def run(self, inputs):\n        return helper(inputs)\n\n\n"
                       "def helper(inputs):\n    import torch\n    return torch.einsum('ij,jk->ik', inputs.q, inputs.q)\n\n\n")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def case_dict(**changes) -> dict:
    d = GOOD.to_json_dict()
    d.update(changes)
    return d


def failure_text(lowering: str = "sdpa", **changes) -> str:
    return json.dumps({"lowering": lowering, "device": "cpu", "case": case_dict(**changes)})


def big_batch_text(b: int) -> str:
    """A failure file of `b` empty requests of one page each (built as text: json.dumps takes seconds)."""
    lens, pages = "[" + ",".join(["0"] * b) + "]", "[" + ",".join(f"[{i}]" for i in range(b)) + "]"
    return (failure_text(context_lens="LENS", pages="PAGES", num_pages=b + 1, batch_size=b)
            .replace('"LENS"', lens).replace('"PAGES"', pages))


# ---- item 5: every plugin hook is bounded and contained ---------------------------------------------------

@dataclass(frozen=True)
class HookRow:
    id: str
    body: str
    isolated: bool  # False: --no-isolate (the hook runs here either way, or the row needs no worker)
    first_line: str  # how the lowering's note starts (after "<name>: ")
    case_recorded: bool  # the case the hook failed on is saved as a (not shrunk) failure file
    extra: tuple = ()  # more options for check


HOOK_ROWS = [
    HookRow("supports loops", SUPPORTS_LOOPS, False, "supports() did not answer within 1 s", True),
    HookRow("supports sleeps", SUPPORTS_SLEEPS, False, "supports() did not answer within 1 s", True),
    HookRow("supports raises", SUPPORTS_RAISES, False, "supports() raised ValueError: no batches (p_", True),
    HookRow("supports sys.exit(0)", SUPPORTS_EXITS, False, "supports() raised SystemExit 0 (p_", True),
    HookRow("supports loops, isolated", SUPPORTS_LOOPS, True, "supports() did not answer within 1 s", True),
    HookRow("supports loops, --warm-up", SUPPORTS_LOOPS, False, "supports() did not answer within 1 s", True,
            ("--warm-up",)),
    HookRow("available loops", AVAILABLE_LOOPS, False, "available() did not answer within 1 s", False),
    HookRow("available loops, isolated", AVAILABLE_LOOPS, True, "available() did not answer within 1 s", False),
    HookRow("available raises", AVAILABLE_RAISES, False, "available() raised RuntimeError: no driver (p_", False),
    HookRow("available segfaults, isolated", AVAILABLE_SEGFAULTS, True,
            "available() crashed the isolated worker: killed by SIGSEGV (signal 11)", False),
    HookRow("available returns garbage", AVAILABLE_GARBAGE, False, "available() returned 'yes', expected (bool, str)",
            False),
    HookRow("available returns garbage, isolated", AVAILABLE_GARBAGE, True,
            "available() returned 'yes', expected (bool, str)", False),
    HookRow("expected_calls raises, isolated", EXPECTED_RAISES, True, "expected_calls() raised KeyError: 'torch.sdpa'",
            True),
    HookRow("expected_calls loops, isolated", EXPECTED_LOOPS, True, "expected_calls() did not answer within 1 s", True),
    HookRow("case_limits raises", CASE_LIMITS_RAISES, False, "case_limits() raised TypeError: limits? (p_", False),
    HookRow("dispatch_boundaries raises", DISPATCH_RAISES, False,
            "dispatch_boundaries() raised KeyError: 'threshold' (p_", False),
    HookRow("dispatch_boundaries loops", DISPATCH_LOOPS, False, "dispatch_boundaries() did not answer within 1 s", False),
]


@pytest.mark.parametrize("row", HOOK_ROWS, ids=[r.id for r in HOOK_ROWS])
def test_a_failing_hook_fails_its_lowering_only(tmp_path, row):
    name = "p_" + row.id.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
    plugin = write(tmp_path / f"{name}.py", plugin_text(name, row.body))
    report = tmp_path / "r"
    t0 = time.perf_counter()
    code, out, err = run(["check", "--plugin", plugin, "--lowering", "sdpa", "--lowering", name, "--lowering",
                          "context", "--report", report, *QUICK, *row.extra] + ([] if row.isolated else ["--no-isolate"]))
    # The loop is cut after the 1 s hook timeout, not waited on: well under a minute for the three lowerings
    # (30 s was too tight for a loaded GPU runner's xdist worker: 30.2 s, docs/gpu/2026-12-01-h200-session7.md).
    assert time.perf_counter() - t0 < 60
    assert code == 1, out + err
    assert "Traceback" not in out + err
    notes = [ln for ln in out.splitlines() if ln.startswith(f"{name}: ")]
    assert notes and notes[0].startswith(f"{name}: {row.first_line}"), out
    data = json.loads((report / "parity.json").read_text())
    v = data["lowerings"][name]
    assert v["status"] == "fail"
    # the lowerings before and after it were checked in full
    for other in ("sdpa", "context"):
        assert data["lowerings"][other]["status"] == "pass" and data["lowerings"][other]["cases"] == quick_cases(other)
    if row.case_recorded:
        saved = json.loads((report / "failures" / f"{name}-1.json").read_text())
        assert saved["failures"][0].startswith(row.first_line) and not saved["shrunk"]
        Case.from_json_dict(saved["case"])


def test_a_crash_in_a_worker_side_hook_is_shrunk_like_a_crash_in_run(tmp_path):
    name = "p_expected_segfaults"
    plugin = write(tmp_path / f"{name}.py", plugin_text(name, EXPECTED_SEGFAULTS))
    code, out, err = run(["check", "--plugin", plugin, "--lowering", name, "--report", tmp_path / "r",
                          "--case-timeout", "20", "--max-examples", "10", "--device", "cpu", "--quiet",
                          "--limit", "max_batch=2", "--limit", "max_context=70", "--limit", "head_dims=64"])
    assert code == 1, out + err
    saved = json.loads((tmp_path / "r" / "failures" / f"{name}-1.json").read_text())
    assert saved["failures"] == ["crashed: worker killed by SIGSEGV (signal 11) while running this case"]
    case = Case.from_json_dict(saved["case"])
    assert saved["shrunk"] and case.batch_size == 1 and case.context_lens == (case.page_size + 1,), case.short()


PLUGIN_IMPORT_ROWS = [
    # (id, plugin text, verb and options, first line after "dflash-parity: error: --plugin FILE: ")
    ("import sys.exit(0), check", "import sys\nsys.exit(0)\n", ["check", "--lowering", "sdpa", *QUICK],
     "exited at import (SystemExit 0)"),
    ("import sys.exit(0), check --no-isolate", "import sys\nsys.exit(0)\n",
     ["check", "--lowering", "sdpa", "--no-isolate", *QUICK], "exited at import (SystemExit 0)"),
    ("import sys.exit(0), list", "import sys\nsys.exit(0)\n", ["list", "--device", "cpu"],
     "exited at import (SystemExit 0)"),
    ("import loops, check", "while True:\n    pass\n", ["check", "--lowering", "sdpa", *QUICK],
     "did not finish importing within 1 s"),
    ("import loops, list", "while True:\n    pass\n", ["list", "--device", "cpu", "--hook-timeout", "1"],
     "did not finish importing within 1 s"),
    ("import segfaults, check", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
     ["check", "--lowering", "sdpa", *QUICK], "crashed the process importing it: killed by SIGSEGV (signal 11)"),
]


@pytest.mark.parametrize("text,argv,first", [pytest.param(t, a, f, id=i) for i, t, a, f in PLUGIN_IMPORT_ROWS])
def test_a_plugin_that_exits_hangs_or_crashes_at_import_is_refused(tmp_path, text, argv, first):
    plugin = write(tmp_path / "bad_plugin.py", text)
    report = tmp_path / "r"
    extra = ["--report", report] if argv[0] == "check" else []
    code, out, err = run(argv[:1] + ["--plugin", plugin] + argv[1:] + extra)
    assert code == 2, out + err
    assert err.splitlines()[0] == f"dflash-parity: error: --plugin {plugin}: {first}" or \
        err.splitlines()[0].startswith(f"dflash-parity: error: --plugin {plugin}: {first}"), err
    assert not (report / "parity.json").exists()


# ---- item 6: bad input is refused before anything is allocated --------------------------------------------

@dataclass(frozen=True)
class InputRow:
    id: str
    setup: Callable[[Path], list]  # tmp dir -> argv (after the verb's own options are added)
    first: str  # the message's first line after "dflash-parity: error: ", with {tmp} for the directory


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def link(path: Path, target: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def deep(n: int) -> str:
    return "[" * n + "]" * n


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


REPRO_ROWS = [
    InputRow("pages is a number", lambda t: [write(t / "c.json", failure_text(pages=3))],
             "{tmp}/c.json: pages: an array of arrays of page ids (one per request), got 3"),
    InputRow("window is a number", lambda t: [write(t / "c.json", failure_text(window=5))],
             "{tmp}/c.json: window: an array [left, right] of two integers, got 5"),
    InputRow("context_lens null", lambda t: [write(t / "c.json", failure_text(context_lens=None))],
             "{tmp}/c.json: context_lens: an array of integers, got null"),
    InputRow("block_size a string", lambda t: [write(t / "c.json", failure_text(block_size="2"))],
             "{tmp}/c.json: block_size: an integer, got a string '2'"),
    InputRow("page id a string", lambda t: [write(t / "c.json", failure_text(pages=[[0, "1"]]))],
             "{tmp}/c.json: pages[0]: an array of integer page ids, holding a string '1'"),
    InputRow("scale a string", lambda t: [write(t / "c.json", failure_text(scale="big"))],
             "{tmp}/c.json: scale: a number or null, got a string 'big'"),
    InputRow("dtype a number", lambda t: [write(t / "c.json", failure_text(dtype=16))],
             "{tmp}/c.json: dtype: a string, got 16"),
    InputRow("case not an object", lambda t: [write(t / "c.json", json.dumps({"lowering": "sdpa", "case": 3}))],
             "{tmp}/c.json: case: a JSON object (the case), got int"),
    InputRow("nested 100000 deep", lambda t: [write(t / "c.json", deep(100000))],
             "{tmp}/c.json: JSON nested too deeply"),
    InputRow("pages nested 500 deep", lambda t: [write(t / "c.json", failure_text().replace('"pages": [[0, 1]]',
                                                                                         '"pages": [' + deep(500) + "]"))],
             "{tmp}/c.json: pages[0]: an array of integer page ids, holding an array of 1"),
    InputRow("B = 10**6", lambda t: [write(t / "c.json", big_batch_text(10 ** 6))],
             "{tmp}/c.json: batch_size: batch_size at most 65536 in a case read from JSON"),
    InputRow("K = 10**5", lambda t: [write(t / "c.json", failure_text(block_size=10 ** 5, pages=[[0, 1, 2]],
                                                                      num_pages=30000))],
             "{tmp}/c.json: block_size: block_size at most 4096 in a case read from JSON"),
    InputRow("head_dim = 10**5", lambda t: [write(t / "c.json", failure_text(head_dim=10 ** 5))],
             "{tmp}/c.json: head_dim: head_dim at most 1024 in a case read from JSON"),
    InputRow("num_pages = 10**9", lambda t: [write(t / "c.json", failure_text(num_pages=10 ** 9))],
             "{tmp}/c.json: num_pages: num_pages at most 16777216 in a case read from JSON"),
    InputRow("a pool of 8 PiB", lambda t: [write(t / "c.json", failure_text(
        context_lens=[0], block_size=1, pages=[[0]], num_pages=1 << 24, page_size=1 << 14, num_q_heads=8,
        num_kv_heads=8, head_dim=1024))], "{tmp}/c.json: num_pages: this case needs about"),
    InputRow("a FIFO", lambda t: [fifo(t / "c.json")],
             "{tmp}/c.json: is a FIFO (named pipe), not a regular case file; refused without reading it"),
    InputRow("a link to /dev/zero", lambda t: [link(t / "c.json", "/dev/zero")],
             "{tmp}/c.json: is a character device, not a regular case file; refused without reading it"),
    InputRow("a directory", lambda t: [(t / "c.json").mkdir() or t / "c.json"],
             "{tmp}/c.json: is a directory, not a regular case file"),
    InputRow("a 300 MB file", lambda t: [sparse(t / "c.json", 300 << 20)],
             "{tmp}/c.json: 314572800 bytes, more than the 268435456 a case file may have"),
    InputRow("recorded plugins malformed", lambda t: [write(t / "c.json", json.dumps(
        {"lowering": "sdpa", "case": case_dict(), "plugins": "x.py"}))],
             '{tmp}/c.json: plugins: an array of {{"path": str, "sha256": str}} objects'),
]


@pytest.mark.parametrize("row", REPRO_ROWS, ids=[r.id for r in REPRO_ROWS])
def test_a_bad_case_file_is_refused_before_anything_is_built(tmp_path, row, monkeypatch):
    built = []
    monkeypatch.setattr("parity.engine.invocation.materialize", lambda *a, **k: built.append(a))
    t0 = time.perf_counter()
    code, out, err = run(["repro", *row.setup(tmp_path), "--device", "cpu", "--no-isolate"])
    assert code == 2, out + err
    first = err.splitlines()[0]
    assert first.startswith("dflash-parity: error: " + row.first.format(tmp=tmp_path)), first
    assert len(err.splitlines()) == 1 and "Traceback" not in err and not built
    assert time.perf_counter() - t0 < 15


def planted(t: Path, name: str, make: Callable[[Path], object]) -> list:
    make(t / "r" / name)
    return ["--report", t / "r"]


CHECK_ROWS = [
    InputRow("planted FIFO failure file", lambda t: planted(t, "failures/sdpa-1.json", fifo),
             "{tmp}/r/failures/sdpa-1.json: is a FIFO (named pipe), not a regular case file"),
    InputRow("planted link to /dev/zero", lambda t: planted(t, "failures/sdpa-1.json", lambda p: link(p, "/dev/zero")),
             "{tmp}/r/failures/sdpa-1.json: is a character device, not a regular case file"),
    InputRow("planted pages = 3", lambda t: planted(t, "failures/sdpa-2.json", lambda p: write(p, failure_text(pages=3))),
             "{tmp}/r/failures/sdpa-2.json: pages: an array of arrays of page ids"),
    InputRow("planted B = 10**6", lambda t: planted(t, "failures/sdpa-1.json",
                                                     lambda p: write(p, big_batch_text(10 ** 6))),
             "{tmp}/r/failures/sdpa-1.json: batch_size: batch_size at most 65536"),
    InputRow("planted 8 PiB pool", lambda t: planted(t, "failures/sdpa-1.json", lambda p: write(p, failure_text(
        context_lens=[0], block_size=1, pages=[[0]], num_pages=1 << 24, page_size=1 << 14, num_q_heads=8,
        num_kv_heads=8, head_dim=1024))), "{tmp}/r/failures/sdpa-1.json: num_pages: this case needs about"),
    InputRow("in-flight window = 5", lambda t: planted(t, "inflight/sdpa.json", lambda p: write(p, failure_text(window=5))),
             "{tmp}/r/inflight/sdpa.json: window: an array [left, right] of two integers, got 5"),
    InputRow("in-flight FIFO", lambda t: planted(t, "inflight/sdpa.json", fifo),
             "{tmp}/r/inflight/sdpa.json: is a FIFO (named pipe)"),
    InputRow("failures/ links outside", lambda t: planted(t, "failures", lambda p: link(p, str(t / "outside"))),
             "--report {tmp}/r: failures is a symbolic link (to {tmp}/outside)"),
    InputRow("inflight/ links outside", lambda t: planted(t, "inflight", lambda p: link(p, str(t / "outside"))),
             "--report {tmp}/r: inflight is a symbolic link"),
    InputRow("a shard dir links outside", lambda t: planted(t, "parts/sdpa.shard-0-of-2",
                                                             lambda p: link(p, str(t / "outside"))),
             "--report {tmp}/r: parts/sdpa.shard-0-of-2 is a symbolic link"),
    InputRow("failures is a file", lambda t: planted(t, "failures", lambda p: write(p, "")),
             "--report {tmp}/r: failures exists and is not a directory"),
    InputRow("--report /proc/x", lambda t: ["--report", "/proc/x"],
             "--report /proc/x: cannot create the report directory"),
    InputRow("--report is a file", lambda t: ["--report", write(t / "f", "")],
             "--report {tmp}/f: exists and is not a directory"),
]


@pytest.mark.parametrize("row", CHECK_ROWS, ids=[r.id for r in CHECK_ROWS])
def test_a_bad_report_directory_or_planted_file_is_refused_before_the_first_case(tmp_path, row, monkeypatch):
    outside = tmp_path / "outside"
    outside.mkdir()
    keep = write(outside / "sdpa-1.json", failure_text())  # what a link out of the report must never delete
    ran = []
    monkeypatch.setattr("parity.engine.sweep.check_lowering", lambda *a, **k: ran.append(a))
    code, out, err = run(["check", "--lowering", "sdpa", "--no-isolate", *QUICK, *row.setup(tmp_path)])
    assert code == 2, out + err
    first = err.splitlines()[0]
    assert first.startswith("dflash-parity: error: " + row.first.format(tmp=tmp_path)), first
    assert "Traceback" not in err and not ran
    assert keep.read_text() == failure_text()
    assert not (tmp_path / "r" / "parity.json").exists()


def test_a_read_only_report_directory_is_refused_before_the_first_case(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *a):
        if ".write-test-" in str(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a)

    monkeypatch.setattr(report_dir_mod.os, "open", read_only)
    code, out, err = run(["check", "--lowering", "sdpa", "--no-isolate", *QUICK, "--report", tmp_path])
    assert code == 2
    assert err.splitlines()[0] == (f"dflash-parity: error: --report {tmp_path}: not writable (Read-only file "
                                   f"system); the report could not be written there")


def test_a_full_disk_at_the_end_is_one_message_and_no_verdict(tmp_path, monkeypatch):
    real = report_mod.atomic_write

    def full(path, text):
        if path.name in ("junit.xml", "parity.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, text)

    monkeypatch.setattr(report_mod, "atomic_write", full)
    code, out, err = run(["check", "--lowering", "sdpa", "--no-isolate", *QUICK, "--report", tmp_path])
    assert code == 2, out + err
    assert err.splitlines()[0] == (f"dflash-parity: error: --report {tmp_path}: could not write the report: No "
                                   f"space left on device ({tmp_path}/junit.xml); no parity.json was written by "
                                   f"this run")
    assert not (tmp_path / "parity.json").exists() and "Traceback" not in err


def test_a_second_check_into_a_locked_directory_is_refused_with_the_holder(tmp_path):
    d = report_dir_mod.prepare(tmp_path / "r")
    keep = write(d / "failures" / "sdpa-1.json", failure_text())
    with report_dir_mod.locked(d):
        code, out, err = run(["check", "--lowering", "sdpa", "--no-isolate", *QUICK, "--report", d])
    assert code == 2
    assert err.splitlines()[0].startswith(f"dflash-parity: error: --report {d}: another check is writing to this "
                                          f"report directory (pid {os.getpid()}, started "), err
    assert keep.read_text() == failure_text()  # the holder's failure files are untouched
    code, out, err = run(["check", "--lowering", "sdpa", "--no-isolate", *QUICK, "--report", d])
    assert code == 0, out + err  # released: this run replays the saved case (it passes) and takes over


# ---- item 7: failure artifacts that stand on their own ------------------------------------------------------

def test_a_plugin_failure_replays_as_printed_with_its_frames_and_whole_example(tmp_path):
    plugin = write(tmp_path / "p_run.py", plugin_text("p_run", RUN_RAISES_IN_TORCH))
    report = tmp_path / "r"
    code, out, err = run(["check", "--plugin", plugin, "--lowering", "p_run", "--no-isolate", *QUICK, "--report",
                          report])
    assert code == 1
    saved = json.loads((report / "failures" / "p_run-1.json").read_text())
    msg = saved["failures"][0]
    # the frame in the plugin's own file, then the innermost one (torch's)
    assert msg.startswith("p_run raised RuntimeError: einsum(): ") and "(p_run.py:12 in helper -> torch/functional.py:" in msg, msg
    assert saved["plugins"] == [{"path": str(plugin.resolve()), "sha256": report_mod.file_sha256(plugin)}]
    replay = f"dflash-parity repro {report}/failures/p_run-1.json --device cpu"
    assert saved["replay"] == replay
    entry = json.loads((report / "parity.json").read_text())["lowerings"]["p_run"]["failures"][0]
    summary = (report / "summary.md").read_text()
    assert f"replay: `{replay}`" in summary and f"`{entry['example']}`" in summary
    assert f"  {entry['example']}" in out.splitlines() and entry["example"].endswith("}))")  # whole, not cut
    assert f"  replay: {replay}" in out.splitlines()
    # as printed: no --plugin; the plugin recorded in the file is loaded again
    registry.unregister("p_run")
    code, out2, err2 = run(replay.split()[1:])
    assert code == 1, out2 + err2
    assert f"FAIL: {msg}" in out2 and err2 == ""
    # the plugin changed since: said, and replayed with the file as it is now
    registry.unregister("p_run")
    write(plugin, plugin.read_text() + "# edited\n")
    code, out3, err3 = run(replay.split()[1:])
    assert code == 1 and err3.startswith(f"dflash-parity: warning: the plugin {plugin.resolve()} changed since this "
                                         f"failure was saved"), err3
    # the plugin is gone: said, and the lowering is unknown (exit 2)
    registry.unregister("p_run")
    plugin.unlink()
    code, out4, err4 = run(replay.split()[1:])
    assert code == 2 and "is no longer there; pass --plugin FILE" in err4 and "unknown lowering 'p_run'" in err4


def test_repro_runs_isolated_by_default_and_in_process_with_no_isolate(tmp_path):
    pid_plugin = (f"    def run(self, inputs):\n        open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
                  "        return super().run(inputs)\n")
    plugin = write(tmp_path / "p_pid.py", plugin_text("p_pid", pid_plugin))
    case = write(tmp_path / "c.json", failure_text("p_pid"))
    code, out, err = run(["repro", case, "--plugin", plugin, "--device", "cpu", "--no-isolate"])
    assert code == 0, out + err
    assert int((tmp_path / "pid").read_text()) == os.getpid()
    registry.unregister("p_pid")
    code, out, err = run(["repro", case, "--plugin", plugin, "--device", "cpu"])
    assert code == 0, out + err
    assert int((tmp_path / "pid").read_text()) != os.getpid()
    code, out, err = run(["repro", case, "--plugin", plugin, "--device", "cpu", "--no-isolate", "--case-timeout", "3"])
    assert code == 2 and "--case-timeout: applies to isolated runs only" in err


def test_a_fail_row_shows_the_failing_case_figures(tmp_path):
    plugin = ROOT / "examples" / "plugin_window_off_by_one.py"
    code, out, err = run(["check", "--plugin", plugin, "--lowering", "my_windowed_merge", "--no-isolate",
                          "--device", "cpu", "--quiet", "--report", tmp_path, "--limit", "max_batch=3",
                          "--limit", "max_context=40", "--limit", "head_dims=64"])
    assert code == 1
    v = json.loads((tmp_path / "parity.json").read_text())["lowerings"]["my_windowed_merge"]
    figs = v["failures"][0]["figures"]
    assert figs["margin"] > 1 and v["worst_margin"] <= 1  # the failing case's, not the worst passing one's
    row = next(r for r in report_mod.table_rows(json.loads((tmp_path / "parity.json").read_text()))
               if r[0] == "my_windowed_merge")
    assert row[1] == "FAIL" and row[5] == f"{figs['out_ulp']:.2f}" and row[7] == f"{figs['margin']:.2f}"
    assert f"| {row[5]} |" in (tmp_path / "summary.md").read_text()


def test_a_crash_in_one_lowering_leaves_the_finished_ones_on_disk(tmp_path, monkeypatch):
    """Serial runs write each finished lowering's results before the next starts (a segfault in a hook
    that runs in this process cannot be contained; simulated here by the process 'dying' in the second)."""
    from parity.engine import sweep

    real = sweep.check_lowering
    calls = []

    class ProcessGone(BaseException):  # a segfault: nothing in the process runs after it (no handler sees it)
        pass

    def dies_in_the_second(lw, *a, **k):
        calls.append(lw.name)
        if len(calls) == 2:
            raise ProcessGone()
        return real(lw, *a, **k)

    monkeypatch.setattr(sweep, "check_lowering", dies_in_the_second)
    with pytest.raises(ProcessGone):
        run(["check", "--lowering", "sdpa", "--lowering", "context", "--no-isolate", *QUICK, "--report", tmp_path])
    partial = json.loads((tmp_path / report_mod.PARTIAL_NAME).read_text())
    assert partial["partial"] and partial["lowerings"]["sdpa"]["status"] == "pass"
    assert partial["lowerings"]["sdpa"]["cases"] == quick_cases("sdpa") and not (tmp_path / "parity.json").exists()
    # the next run removes it, and its verdict replaces it
    code, _, _ = run(["check", "--lowering", "sdpa", "--no-isolate", *QUICK, "--report", tmp_path])
    assert code == 0 and not (tmp_path / report_mod.PARTIAL_NAME).exists()


@pytest.mark.parity_gpu
def test_a_case_larger_than_the_gpu_is_refused_by_the_gpu_memory(tmp_path):
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    num_pages = total // (1 << 20)  # 1 MiB of K and V per page: the pool alone fills the device
    case = write(tmp_path / "c.json", failure_text(context_lens=[0], block_size=1, pages=[[0]], num_pages=num_pages,
                                                   page_size=256, num_q_heads=8, num_kv_heads=8, head_dim=128))
    code, out, err = run(["repro", case, "--device", "cuda", "--no-isolate"])
    assert code == 2, out + err
    assert err.startswith(f"dflash-parity: error: {case}: num_pages: this case needs about") and \
        "the GPU memory of this cuda machine; refused before allocating" in err, err
