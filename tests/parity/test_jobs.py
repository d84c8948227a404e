"""`check --jobs N` (parity/front/controller.py over parity/exec/jobs.py): lowerings checked side by side give the
serial run's report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from parity.exec import jobs
from parity.front import cli, controller, parts

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "plugin_window_off_by_one.py"

pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py

SAME = ("status", "cases", "passed", "unsupported", "calls_checked", "classes")


def _check(tmp: Path, *extra: str, names=("sdpa", "my_windowed_merge", "decode_rows")) -> tuple[int, dict]:
    # Small shapes and 8 draws: the mutant is still found and shrunk (serially: 76 cases), for 40% of the CPU of the
    # default shapes with 12 draws (145 cases; its shrinking is the bulk of a run).
    code = cli.main(["check", "--plugin", str(PLUGIN), *[x for n in names for x in ("--lowering", n)], "--max-examples",
                     "8", "--limit", "max_batch=2", "--limit", "max_context=64", "--no-isolate", "--quiet", "--device",
                     "cpu", "--report", str(tmp), *extra])
    return code, json.loads((tmp / "parity.json").read_text())


def test_jobs_report_is_the_serial_report(tmp_path, capsys, monkeypatch):
    """Same cases drawn per lowering, same verdicts and figures, the same shrunk failure (a plugin's
    mutant, so plugins reach the children), entries in the order asked for."""
    import torch

    # The children run with this process's CPU thread count. Their figures are still compared to
    # rounding only: a torch lowering's fp32 sums depend on the thread count and on the buffers'
    # alignment (another process), and one bf16 rounding flip moves an error by up to 1 ulp (measured
    # here: worst ulp 0.4998 vs 0.4976, 0.6085 vs 0.5721; rel L2 equal to 6 digits).
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))
    code1, serial = _check(tmp_path / "serial")
    from lowerings import registry
    registry.unregister("my_windowed_merge")  # the parent loads the plugin again
    code2, par = _check(tmp_path / "par", "--jobs", "3")
    out = capsys.readouterr().out
    assert code1 == code2 == 1, out
    assert list(par["lowerings"]) == ["sdpa", "my_windowed_merge", "decode_rows"]
    for name, v in serial["lowerings"].items():
        w = par["lowerings"][name]
        assert {k: w[k] for k in SAME} == {k: v[k] for k in SAME}, name
        # one bf16 rounding flip moves a worst error by at most 1 ulp (1/8 of the 8-ulp bound)
        assert abs(w["worst_ulp"] - v["worst_ulp"]) <= 1.0 and abs(w["worst_margin"] - v["worst_margin"]) <= 0.15, name
        assert w["worst_rel_l2"] == pytest.approx(v["worst_rel_l2"], rel=0.1), name
        assert [f["case"] for f in w["failures"]] == [f["case"] for f in v["failures"]], name
    assert par["lowerings"]["my_windowed_merge"]["status"] == "fail"
    saved = json.loads((tmp_path / "par" / "failures" / "my_windowed_merge-1.json").read_text())
    assert saved["case"] == par["lowerings"]["my_windowed_merge"]["failures"][0]["case"]
    assert "# dflash-parity: FAIL" in (tmp_path / "par" / "summary.md").read_text()
    assert (tmp_path / "par" / "parts" / "sdpa.json").is_file()
    assert "my_windowed_merge: shrunk failing case" in out


def test_a_child_that_wrote_nothing_is_a_failed_entry(tmp_path):
    """A killed child (no part written) is reported as a failure saying how it exited and where its log is."""
    part_dir = tmp_path / "parts"
    part_dir.mkdir()
    (part_dir / "decode_rows.log").write_text("loading...\nSegmentation fault\n")
    header = {"schema": "dflash-parity/report", "version": 1, "device": "cuda", "profile": "gpu", "torch": "x",
              "tolerances": "t", "created": "now"}
    data = parts.merge_parts(tmp_path, ["decode_rows", "never"], {"decode_rows": -9}, header)
    v = data["lowerings"]["decode_rows"]
    assert v["status"] == "fail" and v["cases"] == 0
    assert "killed by signal 9" in v["notes"][0] and "Segmentation fault" in v["notes"][0]
    assert "was never started (the run was interrupted first)" in data["lowerings"]["never"]["notes"][0]
    from parity.report.files import junit_xml, summary_md
    assert 'failures="2"' in junit_xml(data) and "FAIL" in summary_md(data)


def test_children_get_their_share_of_the_cores():
    env = jobs.child_env(4, environ={"PATH": "/bin"}, cpus=16)
    assert env["OMP_NUM_THREADS"] == "4" and env["MKL_NUM_THREADS"] == "4" and env["PATH"] == "/bin"
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "4"  # not a pool of every core in every child
    assert jobs.child_env(15, environ={"TORCHINDUCTOR_COMPILE_THREADS": "16"}, cpus=16)[
        "TORCHINDUCTOR_COMPILE_THREADS"] == "16"  # the user's
    assert jobs.child_env(8, environ={}, cpus=2)["OMP_NUM_THREADS"] == "1"
    assert jobs.child_env(2, environ={"OMP_NUM_THREADS": "3"}, cpus=16)["OMP_NUM_THREADS"] == "3"  # the user's


def test_children_get_the_config_as_json():
    """A child's command line carries the run's whole config (plugins made absolute) and its one part: no
    option is re-spelled on the way."""
    from parity.front.config import CheckConfig
    from parity.front.part import Part, child_argv

    config = CheckConfig(lowerings=("decode_rows", "sdpa"), plugins=("p.py",), profile="gpu", report="rep",
                         kernel_names_every=0, tolerances="t.toml", max_examples=500, seed=3, case_timeout=30.0,
                         hardening=False, warm_up=True, limits=("head_dims=128",), flaky_runs=2, jobs=4,
                         shards=("sdpa=2",), shard=(1, 3), gate_baseline="base", device="cuda")
    argv = child_argv(config, Part("sdpa", (1, 2)))
    assert argv[1:4] == ["-m", "parity.front.child", "--part"]
    spec = json.loads(argv[4])
    child = CheckConfig.from_json(spec["config"])
    assert spec["part"] == {"lowering": "sdpa", "shard": [1, 2]}
    assert child == config.replace(lowerings=("sdpa",), plugins=(str(Path("p.py").resolve()),), jobs=1, shards=(),
                                   gate_baseline=None, threads=config.threads_per_process())


def test_a_bad_part_spec_is_a_usage_error(capsys):
    from parity.front.child import main as part_main

    assert part_main(["--part", '{"config": {"profile": "nope"}, "part": {"lowering": "x", "shard": null}}']) == 2
    assert "--profile: one of" in capsys.readouterr().err
    assert part_main(["--part"]) == 2


@pytest.mark.parametrize("how", ["spawn", "prefork"])
def test_jobs_children_spread_over_the_visible_gpus(tmp_path, monkeypatch, how):
    """On cuda with 3 GPUs (faked), 4 children at once: each gets CUDA_VISIBLE_DEVICES naming one GPU, the
    least busy when it starts (the parent's own view stays whole), started fresh or forked from the prefork."""
    import types

    from parity.front.config import CheckConfig

    monkeypatch.setattr(controller, "visible_gpus", lambda: 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6,7")
    started = []

    class Child:
        def __init__(self, argv, env, *args, **kw):
            started.append((json.loads(argv[4])["part"]["lowering"], env.get("CUDA_VISIBLE_DEVICES")))

        def poll(self):
            return 0

    class FakePrefork:
        def __init__(self, preload=()):
            pass

        ready_cpu = ready_seconds = waited = 0.0
        modules, skipped, early = ["torch"], [], False

        def start(self, env, exclude=()):
            assert env["CUDA_VISIBLE_DEVICES"] == "5,6,7"  # the prefork never picks a GPU: each child does
            return self

        def spawn(self, argv, env, log):
            return Child(argv, env)

        def close(self):
            pass

    monkeypatch.setattr(jobs.subprocess, "Popen", Child if how == "spawn" else None)
    monkeypatch.setattr(jobs, "Prefork", FakePrefork)
    session = types.SimpleNamespace(config=CheckConfig(report=str(tmp_path), jobs=4, jobs_start=how), device="cuda",
                                    say=lambda line: None, top=lambda: {"device": "cuda", "lowerings": {}})
    data, interrupted = controller.run_jobs(session, ["a", "b", "c", "d"], poll=0.01)
    assert started == [("a", "5"), ("b", "6"), ("c", "7"), ("d", "5")] and not interrupted
    assert list(data["lowerings"]) == ["a", "b", "c", "d"]  # no part written: each a failed entry saying so
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,6,7"


def test_report_json_keeps_flat_lists_on_one_line():
    from parity.report.files import dumps

    data = {"a": [1, 2.5, "x"], "b": {"pages": [[3, 4], [5]], "e": {}, "n": None}, "c": []}
    text = dumps(data)
    assert json.loads(text) == data
    assert '"a": [1, 2.5, "x"]' in text and "[3, 4]" in text and '"e": {}' in text and '"c": []' in text
    assert text.splitlines()[1] == '  "a": [1, 2.5, "x"],'


# --- --shards: one lowering's cases over several processes (parity/front/shards.py) -----------------------------

def _judge_only():
    """`RunOptions` judging each case's numbers only: the shard tests are about which cases (and compile families) a
    shard runs, which the hardening checks do not change; without them a run costs 40% less."""
    from parity.engine.runner import RunOptions

    return RunOptions(check_calls=False, check_inputs_untouched=False, check_determinism=False, yardstick=False,
                      profile_every=0, check_output_buffers=False)


def test_shards_run_each_case_of_the_serial_run_once():
    """Shard i of 3 runs the draws i, i+3, ...: together the three run the serial run's cases, once each."""
    import lowerings
    from parity.engine import policy
    from parity.engine.runner import check_lowering
    from strategies import cases, profile_settings

    lw = lowerings.get("decode_rows")

    def run(shard):
        seen = []
        rep = check_lowering(lw, policy.load(None), strategy=cases(lw), settings=profile_settings("ci", max_examples=15),
                             opts=_judge_only(), progress=lambda r, o: seen.append(o.case.to_json()), shard=shard)
        assert rep.cases == len(seen) and rep.status == "pass"
        return seen

    serial = run(None)
    parts = [run((i, 3)) for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(serial) and len(serial) == 15
    assert parts[1] == serial[1::3]  # every third draw, from the shard's index


class _Compiling:
    """decode_rows as a lowering that compiles (`max_compiles`): it notes each compile family it runs."""

    max_compiles = 1

    def __init__(self, lw):
        self._lw, self.families = lw, set()

    def __getattr__(self, name):
        return getattr(self._lw, name)

    def run(self, inputs):
        from parity.engine.case_run import compile_family

        self.families.add(compile_family(self._lw, inputs.case))
        return self._lw.run(inputs)


def test_shards_of_a_compiling_lowering_split_its_families():
    """A lowering that compiles is sharded by compile family: each family is run (so compiled) in one shard
    only, the shards together run the serial run's cases once each, and the families compiled over all
    shards are the serial run's: 11 here, against 16 for the modulo split of the same draws."""
    import lowerings
    from parity.engine import policy
    from oracle.case import Case
    from parity.engine.case_run import compile_family
    from parity.engine.runner import check_lowering
    from strategies import cases, profile_settings

    base = lowerings.get("decode_rows")

    def run(shard):
        lw, seen = _Compiling(base), []
        rep = check_lowering(lw, policy.load(None), strategy=cases(base),
                             settings=profile_settings("ci", max_examples=24),
                             opts=_judge_only(), progress=lambda r, o: seen.append(o.case.to_json()), shard=shard)
        assert rep.cases == len(seen) and rep.status == "pass"
        return seen, lw.families

    serial, families = run(None)
    parts = [run((i, 3)) for i in range(3)]
    assert sorted(sum((p[0] for p in parts), [])) == sorted(serial) and len(serial) == 24
    assert sum(len(p[1]) for p in parts) == len(families) > 3  # each family in one shard
    order = list(dict.fromkeys(compile_family(base, Case.from_json(c)) for c in serial))  # first appearance
    for i, (_, fams) in enumerate(parts):
        assert fams == set(order[i::3])  # the k-th new family drawn goes to shard k mod 3
    by_index = [{compile_family(base, Case.from_json(c)) for c in serial[i::3]} for i in range(3)]
    assert sum(map(len, by_index)) > len(families)


def test_shards_that_draw_different_cases_split_families_by_their_hash():
    """Shards of a random profile (no seed, or targeted) draw different sequences: ordering families by first
    appearance would let each shard own a different 1/S of them, leaving about (1 - 1/S)^S of the families
    judged by none. There a family goes to the shard its hash names: every family drawn is judged by exactly
    one shard, whatever order each shard drew them in."""
    import random
    from types import SimpleNamespace

    from parity.engine.case_runners import shard_of_family, sharded_run_case

    lw = SimpleNamespace(name="x")
    families = [(k, "bf16", 128) for k in range(40)]
    judged: dict[int, set] = {}
    for i in range(4):
        seq = families * 2
        random.Random(i).shuffle(seq)  # each shard its own draws
        seen: set = set()
        run = sharded_run_case(lambda lw, case, *a: seen.add(case) or SimpleNamespace(status="pass"), (i, 4),
                               family=lambda c: c, shared_draws=False)
        for case in seq:
            run(lw, case, None, None, None)
        judged[i] = seen
    assert set().union(*judged.values()) == set(families)
    assert sum(map(len, judged.values())) == len(families)  # each in one shard
    assert all(shard_of_family(f, 4) == i for i, fams in judged.items() for f in fams)
    # the order of first appearance, with these different sequences, would leave families unjudged
    owned = set()
    for i in range(4):
        seq = families * 2
        random.Random(i).shuffle(seq)
        order = list(dict.fromkeys(seq))
        owned |= set(order[i::4])
    assert owned != set(families)


def test_sharded_check_shrinks_a_failure_into_the_one_report(tmp_path, capsys):
    """A plugin's mutant checked in 3 shards: it fails, shrunk, its file numbered as a serial run's and
    replayable; the entry counts every case once and says it was sharded."""
    # no sdpa: one child less; decode_rows is the lowering not sharded beside the sharded one
    code, data = _check(tmp_path / "sh", "--jobs", "4", "--shards", "my_windowed_merge=3",
                        names=("my_windowed_merge", "decode_rows"))
    out = capsys.readouterr().out
    v = data["lowerings"]["my_windowed_merge"]
    assert code == 1 and v["status"] == "fail" and v["shards"] == 3, out
    assert v["cases"] >= 1 and v["failures"] and all(f["shrunk"] for f in v["failures"])
    first = v["failures"][0]
    assert first["file"] == "failures/my_windowed_merge-1.json"
    saved = json.loads((tmp_path / "sh" / first["file"]).read_text())
    assert saved["case"] == first["case"] and saved["lowering"] == "my_windowed_merge"
    assert not list((tmp_path / "sh" / "parts").glob("*/failures/*.json"))  # moved, not copied
    assert data["lowerings"]["decode_rows"]["status"] == "pass" and "shards" not in data["lowerings"]["decode_rows"]
    assert "checked in 3 shard processes" in (tmp_path / "sh" / "summary.md").read_text()


def test_merged_shards_add_up_and_keep_the_worst():
    from parity.front import shards
    from parity.engine.outcome import LoweringReport
    from tests.parity.report_fixture import reports

    alpha, beta, _ = reports()
    a = alpha.to_json(family_counts=True)
    b = beta.to_json(family_counts=True)
    b["compile_family_counts"] = {"('fam', 1)": 5, "('fam', 2)": 1}  # one family shared with alpha's, one new
    v = shards.merge_entries([a, b], "x")
    assert (v["cases"], v["unsupported"], v["seconds"], v["status"]) == (11, 1, 2.5, "fail")
    assert v["worst_margin"] == max(alpha.worst_margin, beta.worst_margin)
    assert v["worst_case"] == (alpha if alpha.worst_margin > beta.worst_margin else beta).worst.case.to_json_dict()
    assert v["worst_ulp"] == max(alpha.worst_ulp, beta.worst_ulp)
    # compile counts per process: a shared family counts once, at the most any shard compiled it
    assert (v["compile_families"], v["max_compiles_in_a_family"]) == (3, 5)
    assert v["compiles"] == {"k": alpha.compiles["k"] + beta.compiles["k"]}
    assert v["notes"] == ["shard 2/2: a note"] and shards.FAMILY_KEYS not in v and v["shards"] == 2
    assert v["phase_seconds"]["draw"] > 0 and LoweringReport.from_json("x", v).cases == 11


def test_merged_shards_keep_every_per_lowering_key():
    """Both sides of the per-lowering entry survive a shard merge: judged and bounds (the tolerance entries),
    drawn and skipped (production scale), and each failure with its extras (figures, runs, classification)."""
    from parity.engine import drawn
    from parity.front import shards
    from parity.report.files import to_json
    from parity.engine.runner import LoweringReport
    from strategies import Limits, build_case
    from strategies._boundaries import _base, _keyed

    case = build_case(_keyed(dict(_base(Limits()), context_lens=[3, 5])))
    sk = {"untouched": {"cases": 2, "why": "needs 1 GiB, 0.5 GiB free"}}
    reps = [LoweringReport("x", "cpu", "pass", cases=4, unsupported=1, bounds={"[defaults.bfloat16]": {"cases": 3, "why": "d"}},
                           skipped=sk),
            LoweringReport("x", "cpu", "pass", cases=2, bounds={"[defaults.bfloat16]": {"cases": 2, "why": "d"}})]
    for r in reps:
        drawn.add(r.drawn, case)
    entries = [to_json([r], device="cpu", profile="ci", tolerances="t")["lowerings"]["x"] for r in reps]
    failure = {"file": "f.json", "shrunk": True, "case": case.to_json_dict(), "failures": ["output"], "example": "",
               "figures": {"out_ulp": 9.0}, "runs": "failed 4 of 4 runs", "classification": {"kind": "deterministic"}}
    entries[1]["failures"] = [failure]
    v = shards.merge_entries(entries)
    assert (v["cases"], v["judged"], v["unsupported"]) == (6, 5, 1)
    assert v["bounds"] == {"[defaults.bfloat16]": {"cases": 5, "why": "d"}}
    assert v["skipped"] == sk and sum(v["drawn"]["context"].values()) == 2 and v["drawn"]["dtype"] == {"bf16": 2}
    assert v["failures"] == [failure]


@pytest.mark.parametrize("argv, says", [
    (["--shards", "decode_rows=3"], "give --jobs N"),
    (["--jobs", "2", "--shards", "context=3"], "'context' is not among the lowerings checked"),
    (["--jobs", "2", "--shards", "decode_rows=1"], "from 2 to 64, got '1'"),
    (["--jobs", "2", "--shards", "decode_rows"], "expected NAME=S"),
    (["--shard", "2/2"], "expected I/S with 0 <= I < S"),
])
def test_bad_shards_are_named(tmp_path, capsys, argv, says):
    code = cli.main(["check", "--lowering", "decode_rows", "--device", "cpu", "--report", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and says in err, err


def test_a_lost_shard_fails_the_entry_and_keeps_the_others(tmp_path):
    """Shard 2 of 3 died without a part: the merged entry fails naming that shard and how it exited, and
    keeps the cases and figures of the two shards that wrote theirs."""
    from parity.report import files as report
    from parity.engine.runner import LoweringReport

    name = "decode_rows"
    header = {"schema": "dflash-parity/report", "version": 1, "device": "cuda", "profile": "gpu", "torch": "x",
              "tolerances": "t", "created": "now"}
    for i in (0, 2):
        rep = LoweringReport(name, "cuda", "pass", cases=7, passed=7, max_compiles=2)
        report.write_reports(tmp_path, [rep], device="cuda", profile="gpu", tolerances="t",
                             part=parts.part_path(tmp_path, name, (i, 3)))
    data = parts.merge_parts(tmp_path, [name], {f"{name} [shard 2/3]": -9}, header, {name: 3})
    v = data["lowerings"][name]
    assert (v["status"], v["cases"], v["shards"], v["max_compiles"]) == ("fail", 14, 3, 2)
    assert len(v["notes"]) == 1 and v["notes"][0].startswith("shard 2/3: the check process for this lowering was "
                                                            "killed by signal 9"), v["notes"]


def test_the_start_up_line_splits_a_childs_time_before_its_first_case():
    """Each phase's seconds run from its mark to the next; the total from the session's creation to the last mark
    (a phase named after the wrong interval, or the session's own time left out, shows here)."""
    from parity.front.progress import start_up_line

    marks = [("load", 10.5), ("planning", 10.75), ("precompile", 12.0), ("warm-up", 12.25), ("", 14.0)]
    assert start_up_line("x [shard 1/2]", 10.0, marks) == (
        "  x [shard 1/2]: its cases start 4.0 s after this process began: session 0.5 s, load 0.2 s, planning 1.2 s, "
        "precompile 0.2 s, warm-up 1.8 s")


def test_a_jobs_child_says_where_its_start_up_went(tmp_path, capfd):
    """Each child's line, in its log (relayed to this process's stderr)."""
    from parity.front import cli

    code = cli.main(["check", "--device", "cpu", "--lowering", "sdpa", "--lowering", "decode_rows", "--max-examples",
                     "2", "--no-hardening", "--no-isolate", "--jobs", "2", "--report", str(tmp_path)])
    said = capfd.readouterr()
    said = said.out + said.err
    assert code == 0, said
    import re

    lines = re.findall(r"  (sdpa|decode_rows): its cases start [\d.]+ s after this process began: session [\d.]+ s, "
                       r"load [\d.]+ s, planning [\d.]+ s, precompile [\d.]+ s, warm-up [\d.]+ s", said)
    assert sorted(lines) == ["decode_rows", "sdpa"], said
