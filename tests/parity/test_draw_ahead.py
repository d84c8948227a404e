"""`--draw-ahead`: a forked process draws the cases while the check judges them (the drawer port
`parity.engine.ports.DrawAhead`: `parity.engine.draws`, and its process-aware implementation `parity.exec.draw_ahead`).

It must change nothing a run finds: the seeded CPU run of `test_figures_unchanged` (a mutant's failure found
and shrunk) gives the recorded figures with the drawer on, through both of its paths (every case passed; a
failure handed back to hypothesis). The search's own paths are tested on a toy prop: every case judged once
in order, a failure and an exception replayed to hypothesis (never judged twice), a drawer that ends with an
error, a draw that diverges, and the drawer reaped.
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from parity.engine import draws, ports
from parity.exec import draw_ahead, ports_impl
from parity.engine.outcome import SKIPPED, CaseOutcome
from tests.parity import test_figures_unchanged as fixture_run


class _Named:
    name = "toy"


class _Case(int):
    def short(self) -> str:
        return f"case {int(self)}"


class _DrawerStopped(BaseException):
    """What ends a drawer's search with an error in the toy (as a hook failure in `supports()` would)."""


def _toy_search(fail_at=None, raise_at=None, *, enabled=True, drawer_error_after=None, shared=None, drawer_delay=0.0):
    """A derandomized hypothesis search over `_Case` ints through `draw_ahead.search`, as `check_lowering`
    wires it; returns the judged calls, what `resume` was given and the exception the search ended with."""
    judged_calls: list[tuple[str, int]] = []
    state = {"run_case": None, "resumed": None, "in_drawer": False, "drawn": 0}

    def drawn(x: int) -> _Case:
        if state["in_drawer"] and drawer_delay:
            time.sleep(drawer_delay)  # a slow drawer: still drawing when the judge's search ends
        if state["in_drawer"] and drawer_error_after is not None:
            state["drawn"] += 1
            if state["drawn"] > drawer_error_after:
                raise _DrawerStopped("no case it can draw")
        return _Case(x)

    def real_run_case(lowering, case, *_):
        judged_calls.append(("judged", int(case)))
        if raise_at is not None and int(case) == raise_at:
            raise ValueError(f"raised at {int(case)}")
        return CaseOutcome(lowering.name, case, "fail" if fail_at is not None and int(case) == fail_at else "pass")

    state["run_case"] = real_run_case
    lw = _Named()

    # No deadline, no health checks: on a loaded machine a slow draw or send must not end the drawer's search
    # early. The full suite once saw a shard's search handed back to hypothesis (the same cases judged, so only
    # `resumed2 is None` failed); a deadline or health check in the drawer is the timing-dependent way there.
    @settings(max_examples=30, derandomize=True, database=None, phases=[Phase.generate, Phase.shrink], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=st.integers(0, 10**6).map(drawn))
    def prop(case):
        out = state["run_case"](lw, case, None, None, None)
        if out.status == "fail":
            raise AssertionError(f"failed at {int(case)}")

    def draw(send):  # in the drawer process
        state["run_case"], state["in_drawer"] = send, True
        prop()

    def judge(case):
        return real_run_case(lw, case)

    def resume(judged, last):
        state["resumed"] = (list(judged), last)
        state["run_case"] = draws.replaying(real_run_case, judged, last)
        prop()

    ended = None
    try:
        draw_ahead.search(prop, enabled=enabled, draw=draw, judge=judge, resume=resume, shared=shared)
    except Exception as err:  # noqa: BLE001
        ended = err
    return judged_calls, state["resumed"], ended


def _first_draws(n: int) -> list[int]:
    seen: list[int] = []
    calls, _, _ = _toy_search(enabled=False)
    for _, c in calls:
        seen.append(c)
    return seen[:n]


def test_every_drawn_case_is_judged_once_in_the_order_hypothesis_draws_them():
    alone, _, ended_alone = _toy_search(enabled=False)
    ahead, resumed, ended = _toy_search()
    assert ended is None and ended_alone is None and resumed is None
    assert ahead == alone and len(ahead) == 30


@pytest.mark.parametrize("how", ["fail", "raise"])
def test_a_failure_goes_back_to_hypothesis_which_shrinks_it_without_judging_it_twice(how):
    draws = _first_draws(30)
    k = 11  # the case drawn 12th fails (every case with its value fails, so the shrinker keeps it)
    kw = {"fail_at": draws[k]} if how == "fail" else {"raise_at": draws[k]}
    alone, _, ended_alone = _toy_search(enabled=False, **kw)
    ahead, resumed, ended = _toy_search(**kw)
    assert type(ended) is type(ended_alone) and str(ended) == str(ended_alone)
    assert ahead == alone  # the same calls: the first 12 once each (by the judge), then hypothesis's own
    judged, last = resumed
    assert judged == draws[:k] and int(last[0]) == draws[k]
    assert isinstance(last[1], ValueError if how == "raise" else CaseOutcome)


def test_a_drawer_that_ends_with_an_error_leaves_the_search_to_hypothesis():
    alone, _, _ = _toy_search(enabled=False)
    ahead, resumed, ended = _toy_search(drawer_error_after=4)
    assert ended is None
    assert resumed == (_first_draws(4), None)  # the four it drew were judged; hypothesis drew them again
    assert ahead == alone


def test_a_draw_that_diverges_is_refused_naming_the_draw():
    run = draws.replaying(lambda *a: CaseOutcome("toy", a[1], "pass"), [_Case(5), _Case(6)], None)
    assert run(_Named(), _Case(5), None, None, None).status == SKIPPED
    with pytest.raises(draws.DrawDiverged, match=r"draw 1: hypothesis drew case 7 where the drawer drew case 6"):
        run(_Named(), _Case(7), None, None, None)


class _Diverging:
    """A drawer port whose search ends as one that diverged does."""

    def search(self, *_a, **_kw):
        raise draws.DrawDiverged("draw 3: hypothesis drew case A where the drawer drew case B")


def test_a_diverged_draw_fails_the_lowering_saying_so():
    """Through `check_lowering` and the drawer port: the lowering fails with the divergence named, and hypothesis
    does not shrink it (a BaseException)."""
    from parity.engine import policy, sweep

    import lowerings
    from strategies import cases, profile_settings

    lw = lowerings.get("sdpa")
    with ports.installed(draw_ahead=_Diverging()):
        rep = sweep.check_lowering(lw, policy.load(), strategy=cases(lw),
                                   settings=profile_settings("ci", max_examples=3), flaky_runs=0)
    assert rep.status == "fail" and any("draw 3: hypothesis drew case A" in e for e in rep.extra), rep.extra


def test_without_the_process_machinery_the_search_draws_here():
    """The drawer port's pure default draws in this process (no fork), whatever is asked: `prop()` alone."""
    called = []
    draws.DrawHere().search(lambda: called.append("prop"), enabled=True, draw=lambda send: called.append("drawer"),
                            judge=lambda case: called.append("judge"), resume=lambda *a: called.append("resume"),
                            shared=None)
    assert called == ["prop"]


def test_a_platform_without_fork_searches_here(monkeypatch):
    """`parity.exec.draw_ahead.search` forks no drawer where `os.fork` is missing: `prop()` alone."""
    forks = []
    monkeypatch.setattr(draw_ahead.Drawer, "fork", classmethod(lambda cls, *a, **k: forks.append(1)))
    monkeypatch.delattr(os, "fork")
    called = []
    draw_ahead.search(lambda: called.append(1), enabled=True, draw=None, judge=None, resume=None)
    assert called == [1] and forks == []


def test_the_replay_answers_skipped_then_the_failure_then_judges():
    seen = []
    fail = CaseOutcome("toy", _Case(3), "fail")
    run = draws.replaying(lambda *a: seen.append(int(a[1])) or CaseOutcome("toy", a[1], "pass"),
                               [_Case(1), _Case(2)], (_Case(3), fail))
    assert [run(_Named(), _Case(c), None, None, None).status for c in (1, 2)] == [SKIPPED, SKIPPED]
    assert run(_Named(), _Case(3), None, None, None) is fail
    assert run(_Named(), _Case(3), None, None, None).status == "pass" and seen == [3]


def test_the_drawer_is_reaped():
    pids = []
    real = draw_ahead.Drawer.fork.__func__

    def fork(cls, draw):
        d = real(cls, draw)
        pids.append(d.pid)
        return d

    mp = pytest.MonkeyPatch()
    mp.setattr(draw_ahead.Drawer, "fork", classmethod(fork))
    try:
        _toy_search()
        _toy_search(fail_at=_first_draws(3)[2])
    finally:
        mp.undo()
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("mode,kw,want", [
    ("on", {}, True), ("off", {}, False), ("auto", {}, False), ("auto", {"max_examples": 100}, True),
    ("on", {"derandomize": False}, False), ("on", {"database": "db", "derandomize": False, "seed": 3}, False),
    ("on", {"target": True}, False),
    ("on", {"derandomize": False, "seed": 3}, True), ("on", {"phases": [Phase.explicit]}, False),
])
def test_when_the_drawer_is_used(mode, kw, want, tmp_path):
    from hypothesis.database import DirectoryBasedExampleDatabase

    db = DirectoryBasedExampleDatabase(str(tmp_path)) if kw.get("database") else None
    s = settings(max_examples=kw.get("max_examples", 60), derandomize=kw.get("derandomize", True), database=db,
                 phases=kw.get("phases", [Phase.generate]))
    assert draws.wanted(mode, s, kw.get("seed"), kw.get("target", False)) is want
    with pytest.raises(ValueError, match="one of auto, on, off"):
        draws.wanted("sometimes", s, None, False)


@pytest.mark.usefixtures("single_threaded_torch")
def test_a_seeded_cpu_run_finds_the_same_with_the_drawer(tmp_path, monkeypatch):
    """`test_figures_unchanged`'s run with `--draw-ahead on`: the same verdicts, cases, figures and shrunk
    failure as recorded without it; the drawer ran for every lowering, and the mutant's failure went back to
    hypothesis."""
    import json

    from parity.engine import search

    forks, resumes = [], []
    real_fork, real_replaying = draw_ahead.Drawer.fork.__func__, draws.replaying
    monkeypatch.setattr(draw_ahead.Drawer, "fork", classmethod(lambda cls, d: forks.append(1) or real_fork(cls, d)))
    monkeypatch.setattr(search, "replaying", lambda *a: resumes.append(len(a[1])) or real_replaying(*a))
    monkeypatch.setattr(fixture_run, "ARGS", [*fixture_run.ARGS, "--draw-ahead", "on"])
    with ports.installed(**ports_impl.implementations()):  # as the front ends' start-up installs them: a drawer forks
        got = fixture_run.figures(tmp_path / "report")
    want = json.loads(fixture_run.FIXTURE.read_text())
    assert got["lowerings"]["my_windowed_merge"]["failures"][0]["shrunk"]
    diff = fixture_run.differences(want, got)
    assert not diff, "the drawer changed what the run found:\n" + "\n".join(diff[:20])
    assert len(forks) == len(fixture_run.LOWERINGS)
    assert len(resumes) == 1  # the mutant's failing case, handed back to hypothesis after the cases it passed


@pytest.mark.parametrize("jobs,threads,cpus,want", [
    (1, None, 16, "auto"), (15, None, 16, "off"), (8, None, 16, "auto"), (1, 1, 16, "off"), (1, None, 2, "auto"),
])
def test_auto_turns_off_where_this_process_has_fewer_than_two_cores(jobs, threads, cpus, want, monkeypatch):
    from parity.front.config import CheckConfig

    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    cfg = CheckConfig(jobs=jobs, threads=threads)
    assert cfg.draw_ahead_mode() == want
    assert cfg.replace(draw_ahead="on").draw_ahead_mode() == "on"  # asked for: used even so
    assert CheckConfig(jobs=1, threads=None).draw_ahead_mode(workers=cpus) == "off"  # one xdist worker a core


def test_shards_share_one_drawer_and_judge_what_each_would_have_drawn(tmp_path, monkeypatch):
    """Two shards (one after the other here): the first claims the file and forks the one drawer, the second
    only reads; each judges the cases hypothesis alone would have drawn, in its order; the drawer is reaped."""
    forks = []
    real_fork = draw_ahead.Drawer.fork.__func__
    monkeypatch.setattr(draw_ahead.Drawer, "fork", classmethod(lambda cls, d, path=None: forks.append(path) or
                                                               real_fork(cls, d, path)))
    alone, _, _ = _toy_search(enabled=False)
    path = tmp_path / "toy.draws-of-2"
    first, resumed1, ended1 = _toy_search(shared=path)
    second, resumed2, ended2 = _toy_search(shared=path)
    assert forks == [path]  # one drawer for both
    assert first == alone and second == alone
    assert resumed1 is resumed2 is None and ended1 is ended2 is None


def test_a_shard_that_fails_leaves_the_shared_drawer_to_the_others(tmp_path):
    draws = _first_draws(30)
    path = tmp_path / "toy.draws-of-2"
    alone_failing, _, _ = _toy_search(enabled=False, fail_at=draws[5])
    # The owner fails at the 6th case, and its shrink ends (raising the failure) while the drawer still draws: the
    # drawer must be left to finish (a full suite under load once saw it killed there, and the other shard resume).
    first, resumed, _ = _toy_search(shared=path, fail_at=draws[5], drawer_delay=0.03)
    assert first == alone_failing and resumed[0] == draws[:5]
    second, resumed2, _ = _toy_search(shared=path)  # the drawer drew on: the other shard gets every case
    assert second == _toy_search(enabled=False)[0] and resumed2 is None


def test_a_reader_whose_drawer_died_ends_and_hypothesis_draws_as_always(tmp_path):
    """A drawer killed before its last record: the reader waits, finds it dead, ends; no record lost."""
    import subprocess

    path = tmp_path / "toy.draws-of-2"
    dead = subprocess.Popen(["true"])
    dead.wait()
    first = _first_draws(1)[0]
    path.write_bytes(draw_ahead._frame("pid", dead.pid) + draw_ahead._frame("case", _Case(first)))
    reader = draw_ahead.SharedDraws(path)
    got = []
    with pytest.raises(draw_ahead.Ended, match="died"):
        for c in reader.cases(sleep=lambda s: None):
            got.append(c)
    assert got == [first]
    alone, _, _ = _toy_search(enabled=False)
    assert _toy_search(shared=path)[0] == alone  # a second claim loses; the dead drawer's cases are replayed


def test_only_the_first_claim_wins():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        p = draw_ahead.SharedDraws(os.path.join(tmp, "x.draws-of-3"))
        assert p.claim() is True and p.claim() is False
        from parity.exec.pool import process_alive

        assert process_alive(os.getpid()) and not process_alive(None)


@pytest.mark.parametrize("lowering,code", [("decode_rows", 0), ("my_windowed_merge", 1)])
def test_a_sharded_cpu_check_gives_the_same_report_with_one_drawer_for_its_shards(tmp_path, lowering, code,
                                                                                  restore_registry):
    """`check --jobs 2 --shards NAME=2` on CPU, the shards sharing one drawer (on) or drawing their own (off):
    the same cases, verdicts, figures and shrunk failures (the window-off-by-one mutant fails in both shards);
    the shared file removed at the end."""
    import json

    from lowerings import registry
    from tests import cli_runs
    from tests.parity.test_figures_unchanged import FAILURE_KEPT, KEPT, MUTANT

    def run(mode):  # in this process (its children forked or fresh, as always): no interpreter start for the parent
        report = tmp_path / mode
        if "my_windowed_merge" in registry.names():
            registry.unregister("my_windowed_merge")  # the plugin is loaded again
        # 15 draws of small shapes: each shard still judges a dozen cases from the shared drawer (and both shards of
        # the mutant fail and shrink), at half the CPU of 30 draws of max_batch=3, max_context=96
        got, _, err = cli_runs.run(["check", "--device", "cpu", "--plugin", MUTANT, "--lowering", lowering, "--jobs", "2",
                                    "--shards", f"{lowering}=2", "--max-examples", "15", "--seed", "3", "--no-isolate",
                                    "--no-hardening", "--quiet", "--limit", "max_batch=2", "--limit", "max_context=64",
                                    "--report", report, "--draw-ahead", mode])
        assert got == code, err[-2000:]
        assert not list((report / "parts").glob("*.draws-of-*"))
        entry = json.loads((report / "parity.json").read_text())["lowerings"][lowering]
        kept = {k: entry.get(k) for k in KEPT}
        kept["failures"] = [{k: f.get(k) for k in FAILURE_KEPT} for f in entry.get("failures", [])]
        return kept

    on = run("on")
    assert on == run("off")
    assert bool(on["failures"]) == bool(code) and all(f["shrunk"] for f in on["failures"])
